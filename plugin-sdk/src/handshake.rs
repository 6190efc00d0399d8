//! The go-plugin handshake: constants, the handshake line, app protocol negotiation.
//!
//! A host starts a plugin with [`MAGIC_COOKIE_KEY`]=[`MAGIC_COOKIE_VALUE`] and
//! [`ENV_PROTOCOL_VERSIONS`] in its environment. The plugin binds a unix socket and
//! prints one [`HandshakeLine`] on stdout:
//! `CORE-PROTOCOL-VERSION|APP-PROTOCOL-VERSION|NETWORK-TYPE|NETWORK-ADDR|PROTOCOL`, then
//! optionally `|SERVER-CERT` (AutoMTLS, when the host sent [`ENV_CLIENT_CERT`]) and
//! `|MULTIPLEX` (when the host set [`ENV_MULTIPLEX_GRPC`]), as go-plugin 1.6 does.

use std::fmt;
use std::path::PathBuf;

/// Environment key of the magic cookie. A binary started without it is not being run
/// by a host and refuses to serve.
pub const MAGIC_COOKIE_KEY: &str = "DROVER_PLUGIN_MAGIC_COOKIE";
/// Value of the magic cookie.
pub const MAGIC_COOKIE_VALUE: &str = "4d52c1a9e8b7f6035d2c1b0a9f8e7d6c";
/// go-plugin's core protocol version. Fixed at 1.
pub const CORE_PROTOCOL_VERSION: u32 = 1;
/// App protocol versions this SDK speaks (go-plugin level; picks the gRPC service set).
pub const APP_PROTOCOL_VERSIONS: &[u32] = &[1];

/// Environment key of Nomad's plugin magic cookie. A binary started with it (and
/// without [`MAGIC_COOKIE_KEY`]) is being run by a Nomad agent: [`crate::serve`] then
/// speaks Nomad's driver protocol, app protocol [`NOMAD_APP_PROTOCOL_VERSION`].
pub const NOMAD_MAGIC_COOKIE_KEY: &str = "NOMAD_PLUGIN_MAGIC_COOKIE";
/// Value of Nomad's plugin magic cookie (Nomad's `plugins/base.Handshake`).
pub const NOMAD_MAGIC_COOKIE_VALUE: &str =
    "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255";
/// The go-plugin app protocol version of Nomad's plugins (0.9 and later: gRPC).
pub const NOMAD_APP_PROTOCOL_VERSION: u32 = 2;

/// Comma list of app protocol versions the host speaks.
pub const ENV_PROTOCOL_VERSIONS: &str = "PLUGIN_PROTOCOL_VERSIONS";
/// Lowest TCP port a plugin may bind (unused for unix sockets, passed for go-plugin parity).
pub const ENV_MIN_PORT: &str = "PLUGIN_MIN_PORT";
/// Highest TCP port a plugin may bind.
pub const ENV_MAX_PORT: &str = "PLUGIN_MAX_PORT";
/// Directory in which the plugin creates its unix socket (optional).
pub const ENV_UNIX_SOCKET_DIR: &str = "PLUGIN_UNIX_SOCKET_DIR";
/// go-plugin's AutoMTLS: the host's certificate (PEM). A plugin that gets it serves TLS,
/// accepts only that certificate, and prints its own in the handshake's 6th field.
pub const ENV_CLIENT_CERT: &str = "PLUGIN_CLIENT_CERT";
/// go-plugin 1.6's gRPC broker multiplexing: when it parses as true (Go's
/// `strconv.ParseBool`), the host's connection is a yamux session. Whenever it is set
/// at all, a plugin answers with the handshake's 7th field.
pub const ENV_MULTIPLEX_GRPC: &str = "PLUGIN_MULTIPLEX_GRPC";

/// Go's `strconv.ParseBool`: what go-plugin accepts for [`ENV_MULTIPLEX_GRPC`] and the
/// handshake's 7th field.
///
/// ```
/// use drover_plugin_sdk::handshake::parse_go_bool;
/// assert_eq!(parse_go_bool("T"), Some(true));
/// assert_eq!(parse_go_bool("0"), Some(false));
/// assert_eq!(parse_go_bool("yes"), None);
/// ```
pub fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Longest unix socket path: `sun_path` is 108 bytes including the trailing NUL.
pub const MAX_UNIX_SOCKET_PATH: usize = 107;

/// Whether `path` is a usable unix socket path (fits `sun_path`).
///
/// ```
/// use std::path::Path;
/// assert!(drover_plugin_sdk::handshake::socket_path_fits(Path::new("/run/drover/p.sock")));
/// assert!(!drover_plugin_sdk::handshake::socket_path_fits(&Path::new("/").join("x".repeat(200))));
/// ```
pub fn socket_path_fits(path: &std::path::Path) -> bool {
    path.as_os_str().len() <= MAX_UNIX_SOCKET_PATH
}

/// A malformed handshake line. The message quotes what was received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The line does not have 5, 6 or 7 `|`-separated fields.
    #[error(
        "handshake line {line:?} has {fields} fields, expected 5 to 7 \
         (CORE|APP|NETWORK|ADDR|PROTOCOL[|SERVER-CERT[|MULTIPLEX]])"
    )]
    FieldCount {
        /// The line received.
        line: String,
        /// How many fields it had.
        fields: usize,
    },
    /// A version field is not an unsigned integer.
    #[error("handshake line {line:?}: {what} {value:?} is not a number")]
    NotANumber {
        /// The line received.
        line: String,
        /// Which field.
        what: &'static str,
        /// The field's text.
        value: String,
    },
    /// The core protocol version is not [`CORE_PROTOCOL_VERSION`].
    #[error(
        "plugin speaks go-plugin core protocol {got}, this host speaks {CORE_PROTOCOL_VERSION}"
    )]
    CoreVersion {
        /// The version the plugin sent.
        got: u32,
    },
    /// The network type is neither `unix` nor `tcp`.
    #[error("handshake line {line:?}: unknown network type {network:?} (expected unix or tcp)")]
    Network {
        /// The line received.
        line: String,
        /// The network field.
        network: String,
    },
    /// The protocol field is not `grpc` (go-plugin's `netrpc` is not supported).
    #[error("plugin offers protocol {protocol:?}; only grpc is supported")]
    Protocol {
        /// The protocol field.
        protocol: String,
    },
    /// The 7th field (multiplexing support) is not a boolean.
    #[error("handshake line {line:?}: multiplexing field {value:?} is not true or false")]
    Multiplex {
        /// The line received.
        line: String,
        /// The field's text.
        value: String,
    },
    /// The address is empty or unusable.
    #[error("handshake line {line:?}: bad address {addr:?}")]
    Address {
        /// The line received.
        line: String,
        /// The address field.
        addr: String,
    },
}

/// Where a plugin listens.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "network", content = "address", rename_all = "lowercase")]
pub enum PluginAddr {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP `host:port` (accepted from go-plugin plugins; Drover plugins use unix).
    Tcp(String),
}

impl fmt::Display for PluginAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            PluginAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// The single line a plugin prints on stdout once it is ready to serve.
///
/// ```
/// use drover_plugin_sdk::handshake::{HandshakeLine, PluginAddr};
/// let line: HandshakeLine = "1|1|unix|/run/drover/p.sock|grpc".parse().unwrap();
/// assert_eq!(line.app_protocol_version, 1);
/// assert_eq!(line.addr, PluginAddr::Unix("/run/drover/p.sock".into()));
/// assert_eq!(line.to_string(), "1|1|unix|/run/drover/p.sock|grpc");
///
/// // A go-plugin 1.6 plugin asked for multiplexing, without AutoMTLS:
/// let mux: HandshakeLine = "1|1|unix|/run/drover/p.sock|grpc||true".parse().unwrap();
/// assert_eq!((mux.server_cert, mux.multiplex_grpc), (None, Some(true)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeLine {
    /// go-plugin core protocol version; always [`CORE_PROTOCOL_VERSION`] once parsed.
    pub core_protocol_version: u32,
    /// The app protocol version the plugin chose.
    pub app_protocol_version: u32,
    /// Where it listens.
    pub addr: PluginAddr,
    /// The plugin's AutoMTLS certificate, DER as base64 without padding (Go's
    /// `RawStdEncoding`), if any (the 6th field; empty is none).
    pub server_cert: Option<String>,
    /// Whether it multiplexes gRPC connections (the 7th field), if it said: go-plugin
    /// plugins say `true` whenever the host set [`ENV_MULTIPLEX_GRPC`].
    pub multiplex_grpc: Option<bool>,
}

impl fmt::Display for HandshakeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (network, addr) = match &self.addr {
            PluginAddr::Unix(p) => ("unix", p.display().to_string()),
            PluginAddr::Tcp(a) => ("tcp", a.clone()),
        };
        write!(
            f,
            "{}|{}|{}|{}|grpc",
            self.core_protocol_version, self.app_protocol_version, network, addr
        )?;
        if self.server_cert.is_some() || self.multiplex_grpc.is_some() {
            write!(f, "|{}", self.server_cert.as_deref().unwrap_or(""))?;
        }
        if let Some(multiplex) = self.multiplex_grpc {
            write!(f, "|{multiplex}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for HandshakeLine {
    type Err = HandshakeError;

    /// Strict parse: 5, 6 or 7 fields, numeric versions, core version 1, network
    /// `unix`/`tcp`, protocol `grpc`, a 7th field that Go's `ParseBool` accepts. A
    /// trailing `\n` or `\r\n` is accepted.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let fields: Vec<&str> = line.split('|').collect();
        if !(5..=7).contains(&fields.len()) {
            return Err(HandshakeError::FieldCount {
                line: line.to_owned(),
                fields: fields.len(),
            });
        }
        let number = |what: &'static str, value: &str| {
            value
                .parse::<u32>()
                .map_err(|_| HandshakeError::NotANumber {
                    line: line.to_owned(),
                    what,
                    value: value.to_owned(),
                })
        };
        let core = number("core protocol version", fields[0])?;
        let app = number("app protocol version", fields[1])?;
        if core != CORE_PROTOCOL_VERSION {
            return Err(HandshakeError::CoreVersion { got: core });
        }
        let addr_text = fields[3];
        if addr_text.is_empty() {
            return Err(HandshakeError::Address {
                line: line.to_owned(),
                addr: addr_text.to_owned(),
            });
        }
        let addr = match fields[2] {
            "unix" => PluginAddr::Unix(PathBuf::from(addr_text)),
            "tcp" => PluginAddr::Tcp(addr_text.to_owned()),
            other => {
                return Err(HandshakeError::Network {
                    line: line.to_owned(),
                    network: other.to_owned(),
                });
            }
        };
        if fields[4] != "grpc" {
            return Err(HandshakeError::Protocol {
                protocol: fields[4].to_owned(),
            });
        }
        let server_cert = fields
            .get(5)
            .filter(|c| !c.is_empty())
            .map(|c| (*c).to_owned());
        let multiplex_grpc = match fields.get(6) {
            None => None,
            Some(value) => Some(
                parse_go_bool(value).ok_or_else(|| HandshakeError::Multiplex {
                    line: line.to_owned(),
                    value: (*value).to_owned(),
                })?,
            ),
        };
        Ok(HandshakeLine {
            core_protocol_version: core,
            app_protocol_version: app,
            addr,
            server_cert,
            multiplex_grpc,
        })
    }
}

/// Choose the app protocol version, as the plugin does: the highest of `ours` that
/// appears in the host's comma list `offered`; if none does (or the list is absent or
/// unparsable), our lowest, and the host will report the mismatch.
///
/// ```
/// use drover_plugin_sdk::handshake::negotiate_app_protocol;
/// assert_eq!(negotiate_app_protocol(&[1, 2, 3], Some("3,1")), 3);
/// assert_eq!(negotiate_app_protocol(&[1, 2], Some("5")), 1);
/// ```
pub fn negotiate_app_protocol(ours: &[u32], offered: Option<&str>) -> u32 {
    let lowest = ours.iter().copied().min().unwrap_or(1);
    let Some(offered) = offered else {
        return ours.iter().copied().max().unwrap_or(1);
    };
    let theirs: Vec<u32> = offered
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    ours.iter()
        .copied()
        .filter(|v| theirs.contains(v))
        .max()
        .unwrap_or(lowest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_unix_line() {
        let l: HandshakeLine = "1|1|unix|/tmp/a.sock|grpc\n".parse().unwrap();
        assert_eq!(l.addr, PluginAddr::Unix("/tmp/a.sock".into()));
        assert_eq!(l.server_cert, None);
        assert_eq!(l.to_string(), "1|1|unix|/tmp/a.sock|grpc");
        let tls: HandshakeLine = "1|2|tcp|127.0.0.1:1234|grpc|Q0VSVA==".parse().unwrap();
        assert_eq!(tls.app_protocol_version, 2);
        assert_eq!(tls.server_cert.as_deref(), Some("Q0VSVA=="));
        assert_eq!(tls.multiplex_grpc, None);
        assert_eq!(tls.to_string(), "1|2|tcp|127.0.0.1:1234|grpc|Q0VSVA==");
    }

    #[test]
    fn six_and_seven_fields_as_go_plugin_prints_them() {
        // go-plugin 1.6 prints an empty 6th field without AutoMTLS: "%s" of "".
        let empty6: HandshakeLine = "1|1|unix|/tmp/a.sock|grpc|".parse().unwrap();
        assert_eq!(
            (empty6.server_cert.as_deref(), empty6.multiplex_grpc),
            (None, None)
        );
        assert_eq!(empty6.to_string(), "1|1|unix|/tmp/a.sock|grpc");
        // Multiplexing asked, no AutoMTLS.
        let mux: HandshakeLine = "1|1|unix|/tmp/a.sock|grpc||true\n".parse().unwrap();
        assert_eq!(
            (mux.server_cert.as_deref(), mux.multiplex_grpc),
            (None, Some(true))
        );
        assert_eq!(mux.to_string(), "1|1|unix|/tmp/a.sock|grpc||true");
        // Both; Go's ParseBool spellings.
        let both: HandshakeLine = "1|1|unix|/tmp/a.sock|grpc|QUJD|T".parse().unwrap();
        assert_eq!(
            (both.server_cert.as_deref(), both.multiplex_grpc),
            (Some("QUJD"), Some(true))
        );
        assert_eq!(both.to_string(), "1|1|unix|/tmp/a.sock|grpc|QUJD|true");
        let off: HandshakeLine = "1|1|unix|/tmp/a.sock|grpc||0".parse().unwrap();
        assert_eq!(off.multiplex_grpc, Some(false));
        assert_eq!(off.to_string(), "1|1|unix|/tmp/a.sock|grpc||false");
    }

    #[test]
    fn rejects_bad_lines_with_reasons() {
        let cases = [
            ("hello world", "has 1 fields"),
            ("2|1|unix|/x|grpc", "core protocol 2"),
            (
                "1|x|unix|/x|grpc",
                "app protocol version \"x\" is not a number",
            ),
            ("1|1|udp|/x|grpc", "unknown network type \"udp\""),
            ("1|1|unix|/x|netrpc", "only grpc"),
            ("1|1|unix||grpc", "bad address"),
            (
                "1|1|unix|/x|grpc|c|extra",
                "multiplexing field \"extra\" is not true or false",
            ),
            (
                "1|1|unix|/x|grpc|c|",
                "multiplexing field \"\" is not true or false",
            ),
            ("1|1|unix|/x|grpc|c|true|x", "has 8 fields"),
        ];
        for (line, want) in cases {
            let err = line.parse::<HandshakeLine>().unwrap_err().to_string();
            assert!(err.contains(want), "{line:?}: {err:?} lacks {want:?}");
        }
    }

    #[test]
    fn app_protocol_negotiation_both_ways() {
        // Plugin newer than host: host offers 1, plugin speaks 1,2 -> 1.
        assert_eq!(negotiate_app_protocol(&[1, 2], Some("1")), 1);
        // Host newer than plugin: host offers 1,2,3 -> plugin's highest common, 2.
        assert_eq!(negotiate_app_protocol(&[1, 2], Some("3,2,1")), 2);
        // No common version: plugin answers its lowest; the host sees the mismatch.
        assert_eq!(negotiate_app_protocol(&[4, 5], Some("1,2")), 4);
        // No list at all: plugin's highest (go-plugin's legacy default).
        assert_eq!(negotiate_app_protocol(&[1, 2], None), 2);
        // Garbage entries are ignored.
        assert_eq!(negotiate_app_protocol(&[1], Some(" 1 , zz")), 1);
    }
}
