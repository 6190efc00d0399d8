//! `drover`: the agent daemon, its CLI, and (re-executed) the built-in drivers.

mod commands;
mod render;
mod service;

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use commands::agent::{AgentArgs, run_agent};
use commands::plugin::{PluginCommand, serve_builtin};
use commands::task::{TaskCommand, task_command};
use commands::{client_main, cluster_main, server};

/// Built-in plugins (drivers and one device plugin): name and how to serve it. Only
/// this file names them.
const BUILTINS: &[(&str, fn() -> !)] = &[
    // Nomad's name; `rawexec`, its name before, is an alias (drover_api::DRIVER_ALIASES).
    ("raw_exec", || {
        drover_plugin_sdk::serve(drover_driver_rawexec::RawExecDriver::new())
    }),
    ("docker", || {
        drover_plugin_sdk::serve(drover_driver_docker::DockerDriver::new())
    }),
    ("exec", || {
        drover_plugin_sdk::serve(drover_driver_exec::ExecDriver::new())
    }),
    ("java", || {
        drover_plugin_sdk::serve(drover_driver_java::JavaDriver::new())
    }),
    ("qemu", || {
        drover_plugin_sdk::serve(drover_driver_qemu::QemuDriver::new())
    }),
    // A device plugin: host device nodes (by default /dev/kvm) offered to tasks.
    (drover_device_nodes::PLUGIN_NAME, || {
        drover_plugin_sdk::server::serve_device(drover_device_nodes::DeviceNodes::default())
    }),
];

#[derive(Parser)]
#[command(
    name = "drover",
    version,
    about = "Run tasks through out-of-process driver plugins"
)]
struct Cli {
    /// Agent API address (unix:///path/to/api.sock); the cluster commands (job, node,
    /// alloc, eval) also take a server's (http://HOST:PORT).
    #[arg(long, global = true, env = "DROVER_ADDR")]
    address: Option<String>,
    /// The namespace of the jobs, allocations, evaluations, deployments, services and
    /// variables the cluster commands act on (default `default`; `*`: every one, in
    /// lists). Else `DROVER_NAMESPACE`, else `NOMAD_NAMESPACE`.
    #[arg(long, global = true, env = "DROVER_NAMESPACE")]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent daemon.
    Agent(AgentArgs),
    /// Inspect plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Run and manage tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Run a cluster server: jobs, scheduling, the HTTP API and the node RPCs (or
    /// `drover server status`: the servers, the leader and the store).
    Server(server::ServerArgs),
    /// Submit, inspect and stop cluster jobs.
    #[command(subcommand)]
    Job(commands::job::JobCommand),
    /// Inspect and drain cluster nodes.
    #[command(subcommand)]
    Node(commands::node::NodeCommand),
    /// Inspect allocations and read their tasks' logs.
    #[command(subcommand)]
    Alloc(commands::alloc::AllocCommand),
    /// Inspect evaluations.
    #[command(subcommand)]
    Eval(commands::eval::EvalCommand),
    /// List registered services and show their instances.
    #[command(subcommand)]
    Service(commands::service::ServiceCommand),
    /// Inspect, promote and fail deployments (the rollouts of service jobs).
    #[command(subcommand)]
    Deployment(commands::deployment::DeploymentCommand),
    /// ACLs: bootstrap, policies and tokens (with `--acl-enabled` servers).
    Acl(commands::acl::AclArgs),

    /// Create, list, show and delete namespaces (what ACL policies grant per team).
    #[command(subcommand)]
    Namespace(commands::namespace::NamespaceCommand),
    /// Create, register, show, deregister and delete CSI volumes.
    #[command(subcommand)]
    Volume(commands::volume::VolumeCommand),
    /// Read, write, list and purge variables (encrypted at rest).
    #[command(subcommand)]
    Var(commands::var::VarCommand),
    /// Operate the cluster: `operator root keyring list|rotate`.
    #[command(subcommand)]
    Operator(commands::var::OperatorCommand),
}

fn main() -> ExitCode {
    // A per-task executor is this binary re-executed by a built-in driver. Enter it
    // before anything else (argument parsing included): it exists once per task, so
    // every page it does not touch is memory saved a thousand times over.
    drover_executor::run_if_executor(Some(&drover_isolation::LinuxSandbox));
    // A task's log relay (Nomad drivers' stdout/stderr FIFOs into the log files) is
    // this binary re-executed too, once per task: the same reasons apply.
    drover_plugin_sdk::logs::relay::run_if_relay();
    let argv = commands::jobspec::nomad_style_args(std::env::args_os());
    let cli = match server::with_config_file(Cli::command(), &argv) {
        Ok(command) => command
            .try_get_matches_from(&argv)
            .and_then(|m| Cli::from_arg_matches(&m))
            .unwrap_or_else(|e| e.exit()),
        Err(e) => {
            eprintln!("drover: {e:#}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Plugin(PluginCommand::Serve { name }) => serve_builtin(&name),
        Command::Agent(args) => run_agent(args),
        Command::Plugin(PluginCommand::Status { json }) => {
            client_main(cli.address, |c| commands::plugin::status(c, json))
        }
        Command::Plugin(PluginCommand::Reload { json }) => {
            client_main(cli.address, |c| commands::plugin::reload(c, json))
        }
        Command::Task(cmd) => client_main(cli.address, |c| task_command(c, cmd)),
        Command::Server(args) => match args.command {
            Some(server::ServerCommand::Status { json }) => {
                cluster_main((cli.address, cli.namespace), |c| async move {
                    server::server_status(&c, json).await
                })
            }
            None => server::run(args),
        },
        Command::Job(cmd) if cmd.is_local() => commands::job::local_job_command(cmd),
        Command::Job(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::job::job_command(&c, cmd).await
        }),
        Command::Node(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::node::node_command(&c, cmd).await
        }),
        Command::Alloc(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::alloc::alloc_command(&c, cmd).await
        }),
        Command::Eval(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::eval::eval_command(&c, cmd).await
        }),
        Command::Service(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::service::service_command(&c, cmd).await
        }),
        Command::Deployment(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::deployment::deployment_command(&c, cmd).await
        }),
        Command::Acl(args) => commands::acl::run(cli.address, args),

        Command::Namespace(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::namespace::namespace_command(&c, cmd).await
        }),
        Command::Volume(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::volume::volume_command(&c, cmd).await
        }),
        Command::Var(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::var::var_command(&c, cmd).await
        }),
        Command::Operator(cmd) => cluster_main((cli.address, cli.namespace), |c| async move {
            commands::var::operator_command(&c, cmd).await
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("drover").chain(args.iter().copied()))
    }

    #[test]
    fn acl_commands_take_nomads_single_dash_flags() {
        use commands::acl::{AclCommand, TokenCommand};
        let args: Vec<std::ffi::OsString> = [
            "drover", "acl", "token", "create", "-name", "ci", "-policy", "a", "-policy", "b",
            "-ttl", "1h", "-token", "s3",
        ]
        .iter()
        .map(std::ffi::OsString::from)
        .collect();
        let cli = Cli::try_parse_from(commands::jobspec::nomad_style_args(args)).unwrap();
        let Command::Acl(acl) = cli.command else {
            panic!("not an acl command")
        };
        assert_eq!(acl.token.as_deref(), Some("s3"));
        match acl.command {
            AclCommand::Token(TokenCommand::Create {
                name,
                policies,
                ttl,
                token_type,
                ..
            }) => {
                assert_eq!(name, "ci");
                assert_eq!(policies, ["a", "b"]);
                assert_eq!(ttl, Some(std::time::Duration::from_secs(3600)));
                assert_eq!(token_type, "client");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["acl", "token", "create", "--type", "root"]).is_err());
        assert!(parse(&["acl", "policy", "apply", "p", "f.hcl", "--description", "d"]).is_ok());
        assert!(parse(&["acl", "bootstrap", "--json"]).is_ok());
    }

    #[test]
    fn cluster_commands_parse_as_the_interface_says() {
        let cli = parse(&["job", "run", "web.toml", "--detach", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Job(commands::job::JobCommand::Run { ref job, detach: true, json: true, .. }) if job.file == std::path::Path::new("web.toml")
        ));
        let cli = parse(&[
            "--address",
            "http://127.0.0.1:4646",
            "job",
            "stop",
            "web",
            "--purge",
        ])
        .unwrap();
        assert_eq!(cli.address.as_deref(), Some("http://127.0.0.1:4646"));
        assert!(matches!(
            cli.command,
            Command::Job(commands::job::JobCommand::Stop { purge: true, .. })
        ));
        let cli = parse(&["alloc", "logs", "abc", "main", "-f", "--stderr"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Alloc(commands::alloc::AllocCommand::Logs {
                follow: true,
                stderr: true,
                ..
            })
        ));
        for ok in [
            &["job", "plan", "f.toml"][..],
            &["job", "status", "web", "--json"],
            &["node", "status", "--json"],
            &["node", "drain", "n1"],
            &["alloc", "status", "abc", "--json"],
            &["eval", "status", "e1"],
        ] {
            parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
    }

    #[test]
    fn deployment_and_job_history_commands_parse_with_nomads_flags() {
        use commands::deployment::DeploymentCommand;
        use commands::job::JobCommand;
        let nomad = |args: &[&str]| {
            let argv = std::iter::once("drover")
                .chain(args.iter().copied())
                .map(std::ffi::OsString::from);
            Cli::try_parse_from(commands::jobspec::nomad_style_args(argv))
        };
        let cli = nomad(&[
            "deployment",
            "promote",
            "0b23",
            "-group",
            "api",
            "--group",
            "db",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Deployment(DeploymentCommand::Promote { ref id, ref groups, json: false })
                if id == "0b23" && groups == &["api", "db"]
        ));
        let cli = nomad(&["deployment", "status", "0b23", "-json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Deployment(DeploymentCommand::Status { json: true, .. })
        ));
        for ok in [
            &["deployment", "list"][..],
            &["deployment", "fail", "0b23"],
            &["job", "history", "web", "--json"],
        ] {
            parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        let cli = parse(&["job", "revert", "web", "1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Job(JobCommand::Revert { ref name, version: 1, .. }) if name == "web"
        ));
        let cli = parse(&["job", "scale", "web", "app", "5"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Job(JobCommand::Scale { ref group, count: 5, .. }) if group == "app"
        ));
        let cli = nomad(&["job", "run", "web.hcl", "-no-follow"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Job(JobCommand::Run {
                no_follow: true,
                detach: false,
                ..
            })
        ));
        let err = parse(&["job", "revert", "web", "v1"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("invalid value 'v1'"), "{err}");
        let err = parse(&["job", "scale", "web", "app", "-1"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("-1"), "{err}");
    }

    #[test]
    fn server_flags_are_checked_before_anything_opens() {
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--http-addr",
            "127.0.0.1:1",
            "--rpc-addr",
            "127.0.0.1:2",
            "--heartbeat-ttl",
            "3s",
            "--heartbeat-grace",
            "1m",
            "--workers",
            "4",
            "--scheduler",
            "spread",
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(o.http_addr.port(), 1);
        assert_eq!(o.heartbeat_ttl, std::time::Duration::from_secs(3));
        assert_eq!(o.heartbeat_grace, std::time::Duration::from_secs(60));
        assert_eq!(o.workers, Some(4));
        assert_eq!(
            o.algorithm,
            drover_server::config::SchedulerAlgorithm::Spread
        );
        for (bad, want) in [
            (
                &["--http-addr", "localhost"][..],
                "invalid value 'localhost' for '--http-addr",
            ),
            (&["--heartbeat-ttl", "0s"], "must be more than 0"),
            (
                &["--scheduler", "random"],
                "invalid value 'random' for '--scheduler",
            ),
            (&["--workers", "0"], "invalid value '0' for '--workers"),
            (&["--tls-cert-file", "c.pem"], "--tls-key-file"),
        ] {
            let mut args = vec!["server", "--data-dir", "/d"];
            args.extend_from_slice(bad);
            let err = parse(&args)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"))
                .to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("token");
        std::fs::write(&empty, "  \n").unwrap();
        std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--token-file",
            empty.to_str().unwrap(),
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let err = args.options().unwrap_err().to_string();
        assert_eq!(
            err,
            format!("--token-file: token file {}: it is empty", empty.display())
        );
    }

    #[test]
    fn server_store_flags_and_status() {
        let cli = parse(&[
            "server",
            "--data-dir",
            "/d",
            "--store",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,https://10.0.0.2:2379",
            "--etcd-ca-file",
            "/ca.pem",
            "--etcd-prefix",
            "/c1/",
            "--name",
            "s1",
            "--leader-lease-ttl",
            "3s",
            "--advertise-rpc",
            "10.0.0.1:4647",
        ])
        .unwrap();
        let Command::Server(args) = cli.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(
            o.store,
            server::StoreChoice::Etcd {
                endpoints: vec![
                    "http://127.0.0.1:2379".into(),
                    "https://10.0.0.2:2379".into()
                ],
                prefix: "/c1/".into(),
                lease_ttl: std::time::Duration::from_secs(3),
                tls: Some(drover_server::store::etcd::EtcdTls {
                    ca: "/ca.pem".into(),
                    cert: None,
                    key: None,
                    server_name: None,
                }),
            }
        );
        assert_eq!(o.name, "s1");
        assert_eq!(o.advertise_rpc.as_deref(), Some("10.0.0.1:4647"));
        assert_eq!(o.advertise_http, None);

        let embedded = parse(&["server", "--data-dir", "/d"]).unwrap();
        let Command::Server(args) = embedded.command else {
            panic!("not server")
        };
        let o = args.options().unwrap();
        assert_eq!(o.store, server::StoreChoice::Embedded);
        assert!(!o.name.is_empty(), "the host name by default");

        for (bad, want) in [
            (
                &["--store", "etcd"][..],
                "--store etcd needs --etcd-endpoints",
            ),
            (
                &["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"],
                "must start with http:// or https://",
            ),
            (
                &[
                    "--store",
                    "etcd",
                    "--etcd-endpoints",
                    "http://h:2379",
                    "--etcd-prefix",
                    "x",
                ],
                "ending in /",
            ),
            (
                &["--etcd-endpoints", "http://h:2379"],
                "only used with --store etcd",
            ),
        ] {
            let mut argv = vec!["server", "--data-dir", "/d"];
            argv.extend_from_slice(bad);
            let Command::Server(args) = parse(&argv).unwrap().command else {
                panic!("not server")
            };
            let err = args.options().unwrap_err().to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
        for (bad, want) in [
            (&["--leader-lease-ttl", "1s"][..], "at least 2s"),
            (&["--advertise-http", "nohost"], "is not HOST:PORT"),
            (&["--store", "zookeeper"], "invalid value 'zookeeper'"),
        ] {
            let mut argv = vec!["server", "--data-dir", "/d"];
            argv.extend_from_slice(bad);
            let err = parse(&argv).err().expect("refused").to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
        }

        let status = parse(&["server", "status", "--json", "--address", "http://h:1"]).unwrap();
        assert_eq!(status.address.as_deref(), Some("http://h:1"));
        let Command::Server(args) = status.command else {
            panic!("not server")
        };
        assert!(matches!(
            args.command,
            Some(server::ServerCommand::Status { json: true })
        ));
    }
}
