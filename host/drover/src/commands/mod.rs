//! One module per top-level command: its clap definitions next to the code that runs
//! it. What they share lives here: finding the agent's socket or a server's address,
//! building the client, and saying what to check when it cannot connect.
//!
//! The cluster commands (`job`, `node`, `alloc`, `eval`, `server status`) use the
//! servers' HTTP API ([`drover_server_api::client::Client`]) at
//! `--address`/`DROVER_ADDR`: a server (`http://HOST:PORT`, `https://...` with
//! `DROVER_CACERT`) or an agent's socket (`unix:///.../api.sock`), which forwards to its
//! servers. The token comes from `DROVER_TOKEN`. Nomad's `NOMAD_ADDR`, `NOMAD_TOKEN`,
//! `NOMAD_CACERT`, ... are read where Drover's are not set. The others (`task`, `plugin`) use the
//! agent's API ([`drover_api::Client`]).

pub mod acl;
pub mod agent;
pub mod alloc;
pub mod alloc_exec;
pub mod deployment;
pub mod eval;
pub mod job;
pub mod jobspec;
pub mod namespace;
pub mod node;
pub mod plugin;
pub mod server;
pub mod service;
pub mod task;
pub mod var;
pub mod volume;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, anyhow, bail};
use drover_host::config::default_api_socket;
use drover_server_api::client::{Client, ClientOptions, Error as ClientError};

/// Resolve the agent address: `--address`/`DROVER_ADDR` (`unix:///path` or a path),
/// else the system agent's socket if present, else the dev agent's.
pub fn resolve_address(given: Option<&str>) -> anyhow::Result<PathBuf> {
    if let Some(a) = given {
        let path = a
            .strip_prefix("unix://")
            .or_else(|| a.strip_prefix("unix:"))
            .unwrap_or(a);
        if a.starts_with("http://") || a.starts_with("tcp://") {
            bail!("address {a:?}: only unix sockets are supported (unix:///path/to/api.sock)");
        }
        return Ok(PathBuf::from(path));
    }
    // An agent with the default data dir, then the packaged agent's (its data dir is
    // /var/lib/drover/agent, beside the server's: see packaging/etc/agent.toml).
    for data_dir in ["/var/lib/drover", "/var/lib/drover/agent"] {
        let system = default_api_socket(Path::new(data_dir));
        if system.exists() {
            return Ok(system);
        }
    }
    let dev = drover_host::config::AgentConfig {
        dev: true,
        ..Default::default()
    };
    Ok(dev.api_socket())
}

/// An API error as the CLI reports it: a connection failure says what to check.
pub fn api_error(e: drover_api::Error) -> anyhow::Error {
    match e {
        drover_api::Error::Connect { .. } => {
            anyhow!("{e} (is `drover agent` running? set --address or DROVER_ADDR)")
        }
        e => anyhow::Error::new(e),
    }
}

/// The address the cluster commands use: `--address`/`DROVER_ADDR` as given (a bare
/// path is an agent's socket), else the local agent's socket as for `task` commands.
pub fn cluster_address(given: Option<&str>) -> anyhow::Result<String> {
    match given {
        Some(a)
            if a.starts_with("http://")
                || a.starts_with("https://")
                || a.starts_with("unix://") =>
        {
            Ok(a.to_owned())
        }
        Some(a) if a.starts_with("tcp://") => {
            bail!(
                "address {a:?}: use http://HOST:PORT for a server, unix:///path/api.sock for an agent"
            )
        }
        other => {
            let socket = resolve_address(other)?;
            Ok(format!("unix://{}", socket.display()))
        }
    }
}

/// A cluster setting of the environment: `DROVER_<NAME>`, else Nomad's `NOMAD_<NAME>`
/// (so that a Nomad user's `NOMAD_ADDR`, `NOMAD_TOKEN`, ... work unchanged; Drover's
/// name wins when both are set). Empty values count as unset.
pub fn cluster_setting(env: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    [format!("DROVER_{name}"), format!("NOMAD_{name}")]
        .iter()
        .find_map(|k| env(k).filter(|v| !v.trim().is_empty()))
}

/// A client for `address` with the token of `DROVER_TOKEN` and the CA of
/// `DROVER_CACERT` (client certificate: `DROVER_CLIENT_CERT` + `DROVER_CLIENT_KEY`),
/// each else Nomad's `NOMAD_*` variable of the same name.
pub fn client(address: &str, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Client> {
    client_in(address, None, env)
}

/// [`client`] whose requests name namespace `namespace` (`-namespace`), else
/// `DROVER_NAMESPACE`, else `NOMAD_NAMESPACE` (none: the server's `default`).
pub fn client_in(
    address: &str,
    namespace: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Client> {
    let token = cluster_setting(&env, "TOKEN");
    let client_cert = match (
        cluster_setting(&env, "CLIENT_CERT"),
        cluster_setting(&env, "CLIENT_KEY"),
    ) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (None, None) => None,
        _ => bail!("set both DROVER_CLIENT_CERT and DROVER_CLIENT_KEY, or neither"),
    };
    let options = ClientOptions {
        token,
        ca_file: cluster_setting(&env, "CACERT").map(PathBuf::from),
        client_cert,
        namespace: namespace
            .filter(|n| !n.trim().is_empty())
            .or_else(|| cluster_setting(&env, "NAMESPACE")),
    };
    Ok(Client::new(address, options)?)
}

/// A client error as the CLI reports it: an unreachable address says what to check.
pub fn cluster_error(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Connect { ref address, .. } if address.starts_with("unix://") => {
            anyhow!("{e} (is `drover agent` running? set --address or DROVER_ADDR)")
        }
        ClientError::Connect { .. } => {
            anyhow!("{e} (is `drover server` running there? set --address or DROVER_ADDR)")
        }
        ClientError::Status { status, .. } if status.as_u16() == 401 => {
            anyhow!("{e} (set DROVER_TOKEN to the cluster token)")
        }
        e => anyhow::Error::new(e),
    }
}

pub fn client_main<F, Fut>(address: Option<String>, f: F) -> ExitCode
where
    F: FnOnce(drover_api::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let result = (|| {
        let socket = resolve_address(address.as_deref())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(f(drover_api::Client::new(socket)))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run a cluster command with a client for `--address`/`DROVER_ADDR` (else
/// `NOMAD_ADDR`) and the `DROVER_TOKEN`/`DROVER_CACERT` (else `NOMAD_TOKEN`/
/// `NOMAD_CACERT`) of the environment.
pub fn cluster_main<F, Fut>(
    (address, namespace): (Option<String>, Option<String>),
    f: F,
) -> ExitCode
where
    F: FnOnce(drover_server_api::client::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let result = (|| {
        let env = |k: &str| std::env::var(k).ok();
        // `--address` or DROVER_ADDR (clap reads it), else Nomad's NOMAD_ADDR.
        let address = address.or_else(|| cluster_setting(&env, "ADDR"));
        let address = cluster_address(address.as_deref())?;
        let client = client_in(&address, namespace, env)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(f(client))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_keep_servers_and_agents_apart() {
        assert_eq!(
            cluster_address(Some("http://127.0.0.1:4646")).unwrap(),
            "http://127.0.0.1:4646"
        );
        assert_eq!(
            cluster_address(Some("unix:///x/api.sock")).unwrap(),
            "unix:///x/api.sock"
        );
        // A bare path is an agent's socket, as for `task` commands.
        assert_eq!(
            cluster_address(Some("/x/api.sock")).unwrap(),
            "unix:///x/api.sock"
        );
        assert!(
            cluster_address(Some("tcp://h:1"))
                .unwrap_err()
                .to_string()
                .contains("http://HOST:PORT")
        );
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(client("http://127.0.0.1:1", env(&[("DROVER_TOKEN", "t")])).is_ok());
        let err = client("https://127.0.0.1:1", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DROVER_CACERT"), "{err}");
        let err = client(
            "https://127.0.0.1:1",
            env(&[("DROVER_CACERT", "/nonexistent/ca.pem")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("cannot read the CA file /nonexistent/ca.pem"),
            "{err}"
        );
        let err = client("http://127.0.0.1:1", env(&[("DROVER_CLIENT_CERT", "c")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "set both DROVER_CLIENT_CERT and DROVER_CLIENT_KEY, or neither"
        );
        // Nomad's variables work, Drover's win.
        let both = env(&[
            ("DROVER_TOKEN", "d"),
            ("NOMAD_TOKEN", "n"),
            ("NOMAD_ADDR", "a"),
        ]);
        assert_eq!(cluster_setting(&both, "TOKEN").as_deref(), Some("d"));
        assert_eq!(cluster_setting(&both, "ADDR").as_deref(), Some("a"));
        let nomad = env(&[("DROVER_TOKEN", " "), ("NOMAD_TOKEN", "n")]);
        assert_eq!(cluster_setting(&nomad, "TOKEN").as_deref(), Some("n"));
        let err = client(
            "https://127.0.0.1:1",
            env(&[("NOMAD_CACERT", "/nonexistent/nomad-ca.pem")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/nomad-ca.pem"), "{err}");
        let err = client("ftp://h", env(&[])).unwrap_err().to_string();
        assert!(
            err.starts_with("address \"ftp://h\": expected http://"),
            "{err}"
        );
    }
}
