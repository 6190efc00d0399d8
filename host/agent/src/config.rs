//! Agent configuration: built-in defaults < TOML files < `DROVER_*` environment <
//! command-line flags, merged by figment. Parsing is a pure function of its sources.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format as _, Serialized, Toml};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How the agent writes its own logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Settings for one plugin, `[plugin.NAME]` in TOML. Its `Debug` shows the names of
/// `env` and the keys of `config`, never their values: both may hold credentials.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSettings {
    /// Plugin configuration, validated against the plugin's schema, then `SetConfig`.
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
    /// Expected sha256 (64 hex digits) of the plugin binary, checked on the open file
    /// before every exec. Once any plugin has a pin, external binaries run only when
    /// pinned (see `trust::Policy`).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Load this driver library (`NAME.so` or `libNAME.so` in `plugin_dir`) into the
    /// agent process instead of refusing it. Off by default: an in-process driver
    /// shares the agent's memory, and its crash is the agent's. `NAME` is the file
    /// name without `.so` and a leading `lib`, and the library must serve the plugin
    /// `NAME` (see `docs/in-process.md`). It says nothing about plugin binaries.
    #[serde(default)]
    pub in_process: bool,
    /// Names of the agent's environment variables this plugin also gets (besides
    /// `PATH` and the agent-wide `plugin_pass_env`), e.g. `["DOCKER_HOST"]`. Applies to
    /// the plugin whose file (or built-in) is named `NAME`.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Variables set in this plugin's environment, e.g. `{ JAVA_HOME = "/opt/jdk" }`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Talk to this plugin over go-plugin's automatic mutual TLS; unset: the agent-wide
    /// `plugin_auto_mtls`. Applies to the plugin whose file (or built-in) is `NAME`.
    #[serde(default)]
    pub auto_mtls: Option<bool>,
}

impl std::fmt::Debug for PluginSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let config_keys: Vec<&String> = self
            .config
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        let env_names: Vec<&String> = self.env.keys().collect();
        f.debug_struct("PluginSettings")
            .field("config_keys", &config_keys)
            .field("sha256", &self.sha256)
            .field("in_process", &self.in_process)
            .field("pass_env", &self.pass_env)
            .field("env_names", &env_names)
            .field("auto_mtls", &self.auto_mtls)
            .finish()
    }
}

impl Default for PluginSettings {
    fn default() -> Self {
        PluginSettings {
            config: empty_object(),
            sha256: None,
            in_process: false,
            pass_env: Vec::new(),
            env: BTreeMap::new(),
            auto_mtls: None,
        }
    }
}

/// Why `name` cannot be a plugin environment variable's name, if it cannot.
fn bad_env_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    if name.contains(['=', '\0']) {
        return Some("is not a variable name (it contains '=' or a NUL byte)");
    }
    if name.starts_with("PLUGIN_")
        || name == drover_plugin_sdk::handshake::MAGIC_COOKIE_KEY
        || name == drover_plugin_sdk::handshake::NOMAD_MAGIC_COOKIE_KEY
    {
        return Some(
            "is a go-plugin handshake variable, which the agent sets itself for every plugin",
        );
    }
    None
}

/// The docker client's own variables, which the docker driver follows as the `docker`
/// CLI and Nomad's docker driver do: the daemon's address (`DOCKER_HOST`), its TLS
/// settings and the API version. Passed from the agent's environment to the docker
/// plugin (and to no other) by default, whether it is the built-in or its own binary
/// ([`DOCKER_PLUGIN_LABELS`]), so that a `DOCKER_HOST` the operator set reaches it;
/// `[plugin.docker] env` overrides them.
pub const DOCKER_CLIENT_ENV: &[&str] = &[
    "DOCKER_HOST",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "DOCKER_API_VERSION",
];

/// Labels of the docker driver: the built-in, or its binary in `plugin_dir` under the
/// driver's name or the crate's.
pub const DOCKER_PLUGIN_LABELS: &[&str] = &["docker", "drover-driver-docker"];

/// Whether `name` makes glibc's dynamic loader (or iconv) load code from where it
/// says: `LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT` and the rest of `LD_*`, and
/// `GCONV_PATH`.
fn loader_variable(name: &str) -> bool {
    name.starts_with("LD_") || name == "GCONV_PATH"
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// Bounds on what API clients can hold open, `[limits]` in TOML. Each is at least 1.
///
/// A request past a follower cap is refused at once with HTTP 503 (the agent-wide
/// cap) or 429 (the per-task cap) and a message naming the setting; connections past
/// [`Limits::max_connections`] wait in the socket's backlog until one closes, and a
/// connection that sends no request within [`Limits::header_read_timeout`] is closed
/// so that idle ones cannot hold those slots for ever. The
/// defaults keep the descriptors all of them can use together (a connection and up
/// to five open log files per log follower; one inotify instance for all) within a few
/// thousand, well inside the open-file limit the agent raises itself to at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// API connections served at once.
    pub max_connections: usize,
    /// `logs -f` streams served at once, over all tasks.
    pub max_log_followers: usize,
    /// `logs -f` streams served at once for one task.
    pub max_log_followers_per_task: usize,
    /// `stats -f` streams served at once, over all tasks.
    pub max_stats_followers: usize,
    /// `stats -f` streams served at once for one task.
    pub max_stats_followers_per_task: usize,
    /// How long a connection may take to send a request head (from accept, and again
    /// after each answer on a kept-alive connection) before the agent closes it.
    /// Answers themselves, however long (`logs -f`), are not limited.
    #[serde(serialize_with = "ser_duration", deserialize_with = "de_duration")]
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_log_followers: 256,
            max_log_followers_per_task: 64,
            max_stats_followers: 64,
            max_stats_followers_per_task: 8,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    fn check(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("max_connections", self.max_connections),
            ("max_log_followers", self.max_log_followers),
            (
                "max_log_followers_per_task",
                self.max_log_followers_per_task,
            ),
            ("max_stats_followers", self.max_stats_followers),
            (
                "max_stats_followers_per_task",
                self.max_stats_followers_per_task,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError(format!(
                    "limits.{name} must be at least 1 (got 0)"
                )));
            }
        }
        if self.header_read_timeout.is_zero() {
            return Err(ConfigError(
                "limits.header_read_timeout must be more than 0 (e.g. \"10s\")".into(),
            ));
        }
        Ok(())
    }
}

/// The agent's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Dev mode: defaults suited to a laptop (data under the temp dir).
    pub dev: bool,
    /// Where state, task directories and the API socket live.
    pub data_dir: Option<PathBuf>,
    /// Where third-party plugin binaries are found. Default: `<data_dir>/plugins`.
    pub plugin_dir: Option<PathBuf>,
    /// The API socket. Default: `<data_dir>/api.sock`.
    pub api_socket: Option<PathBuf>,
    /// Time from launching a plugin to its first successful RPC.
    #[serde(serialize_with = "ser_duration", deserialize_with = "de_duration")]
    pub handshake_timeout: Duration,
    /// Only plugins with these names (file or plugin name) load. Empty: all.
    pub plugin_allow: Vec<String>,
    /// Plugins with these names (file or plugin name) never load.
    pub plugin_deny: Vec<String>,
    /// When an external plugin and a built-in share a name, the built-in wins.
    pub prefer_builtin: bool,
    /// Watch `plugin_dir` (inotify) and add, upgrade and remove plugins as their files
    /// come and go, without a restart. Off: only `drover plugin reload` does it.
    pub watch_plugin_dir: bool,
    /// Names of the agent's environment variables every plugin gets. Plugins (and so
    /// their tasks' executors) start with a clean environment: `PATH`,
    /// `DROVER_PLUGIN_LOG`, the handshake's own variables, this list and their
    /// `[plugin.NAME] pass_env` / `env`; nothing else of the agent's environment
    /// (its secrets included) reaches a plugin. `DROVER_PLUGIN_PASS_ENV=A,B`. The
    /// docker driver alone also gets the docker client's variables by default
    /// (`DOCKER_HOST`, `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`, `DOCKER_API_VERSION`:
    /// [`DOCKER_CLIENT_ENV`]), as Nomad's docker driver follows them.
    pub plugin_pass_env: Vec<String>,
    /// Launch plugin processes with go-plugin's automatic mutual TLS: each gets a fresh
    /// client certificate and answers with its own, and every connection to it is TLS
    /// pinned to exactly those two (the pair is kept in the reattach record, so a
    /// restarted agent reconnects with it). A plugin without AutoMTLS then fails its
    /// launch with a reason. Per plugin: `[plugin.NAME] auto_mtls`.
    pub plugin_auto_mtls: bool,
    /// Per-plugin settings, by plugin name.
    pub plugin: BTreeMap<String, PluginSettings>,
    /// Log filter (`tracing` EnvFilter syntax), e.g. `info` or `drover=debug`.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// On a graceful stop, stop every task and plugin. Default: leave them running for
    /// the next agent to reattach to (an agent upgrade or restart does not touch tasks).
    pub drain_on_shutdown: bool,
    /// Bounds on API connections and streams.
    pub limits: Limits,
    /// Cluster servers' RPC addresses (`HOST:PORT`): with any, the agent is a client
    /// node that registers with them and runs the allocations they place on it.
    pub servers: Vec<String>,
    /// The node's name in the cluster (default: the host name).
    pub node_name: Option<String>,
    /// The node's datacenter (Nomad's `datacenter`, default `dc1`): jobs whose
    /// `datacenters` it does not match are not placed on the node. `DROVER_DATACENTER`,
    /// `--datacenter`.
    pub datacenter: String,
    /// Node metadata for constraints (`${node.meta.KEY}`), `--meta k=v`.
    pub meta: BTreeMap<String, String>,
    /// File holding the cluster token sent with every RPC and forwarded request.
    pub token_file: Option<PathBuf>,
    /// TLS towards the servers (rustls); plain TCP when absent.
    pub tls: Option<ClientTls>,
    /// The bridge groups in `network { mode = "bridge" }` are attached to (Nomad's
    /// `bridge_network_name`; default `drover`).
    pub bridge_network_name: String,
    /// The bridge's subnet, allocations' addresses come from it (Nomad's
    /// `bridge_network_subnet`; default 172.26.80.0/20).
    pub bridge_network_subnet: String,
    /// Directories holding the CNI plugins (Nomad's `cni_path`; default
    /// `/usr/lib/cni`, Debian's `containernetworking-plugins`, then `/opt/cni/bin`).
    pub cni_path: Vec<PathBuf>,

    /// The network interface whose first IPv4 address is the node's address: where
    /// allocations' ports are (Nomad's `network_interface`, `--network-interface`).
    /// Unset: the address the agent reaches its first server from (127.0.0.1 with
    /// `--dev`).
    pub network_interface: Option<String>,
    /// Lowest port the scheduler picks for a dynamic port (Nomad's
    /// `min_dynamic_port`, 20000).
    pub min_dynamic_port: u32,
    /// Highest port the scheduler picks for a dynamic port (Nomad's
    /// `max_dynamic_port`, 32000).
    pub max_dynamic_port: u32,
    /// What the node keeps for itself (Nomad's `reserved` block): ports never given
    /// to allocations.
    pub reserved: Reserved,
    /// Bounds on the tasks' artifacts (`[artifact]`: download and unpacked bytes,
    /// archive entries, time).
    pub artifact: crate::allocs::ArtifactLimits,
    /// ACLs of the in-process server of `--dev` (Nomad's `acl` block).
    #[serde(default)]
    pub acl: AclSettings,
    /// Host volumes the node offers, by name: `[host_volume.NAME] path = "/srv/data"`,
    /// `read_only = false` (Nomad's `host_volume "NAME" { ... }`). Each path must be
    /// an absolute directory owned by root with no link in it, checked at start.
    #[serde(default)]
    pub host_volume: BTreeMap<String, drover_server_api::HostVolume>,
    /// CSI plugins the agent runs itself, by plugin id: `[csi_plugin.ID] type =
    /// "monolith"`, `command`, `args`, `mount_dir` (see
    /// [`crate::csi::plugins::CsiPluginConfig`]).
    #[serde(default)]
    pub csi_plugin: BTreeMap<String, crate::csi::plugins::CsiPluginConfig>,
}

/// Nomad's `acl` block: `[acl] enabled = true` enforces ACLs on the HTTP API of the
/// server this agent runs (`--dev`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AclSettings {
    /// Enforce ACLs.
    pub enabled: bool,
}

/// Nomad's client `reserved` block: only `reserved_ports` has a meaning here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Reserved {
    /// Ports and ranges, comma-separated: `"22,80,8000-8100"`. Unset, the
    /// privileged ports [`DEFAULT_RESERVED_PORTS`]; set, exactly what it says (`""`
    /// reserves none).
    pub reserved_ports: String,
}

/// The ports a node reserves unless `reserved.reserved_ports` says otherwise: the
/// privileged ones, where the host's own services listen (a task given static port
/// 22 in bridge mode would receive the node's SSH connections).
pub const DEFAULT_RESERVED_PORTS: &str = "1-1023";

impl Default for Reserved {
    fn default() -> Self {
        Reserved {
            reserved_ports: DEFAULT_RESERVED_PORTS.to_owned(),
        }
    }
}

impl Reserved {
    /// Adds `port` to the reserved ports: one the agent itself listens on.
    pub fn add_port(&mut self, port: u16) {
        if self.reserved_ports.trim().is_empty() {
            self.reserved_ports = port.to_string();
        } else {
            self.reserved_ports = format!("{},{port}", self.reserved_ports);
        }
    }
}

/// How a client agent verifies its servers, and proves itself to them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// CA the servers' certificates must chain to (PEM).
    pub ca_file: PathBuf,
    /// Client certificate for mutual TLS (PEM), with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The name the servers' certificates must carry (default: the host of the
    /// address).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            dev: false,
            data_dir: None,
            plugin_dir: None,
            api_socket: None,
            handshake_timeout: Duration::from_secs(5),
            plugin_allow: Vec::new(),
            plugin_deny: Vec::new(),
            prefer_builtin: false,
            watch_plugin_dir: true,
            plugin_pass_env: Vec::new(),
            plugin_auto_mtls: false,
            plugin: BTreeMap::new(),
            log_level: "info".into(),
            log_format: LogFormat::Human,
            drain_on_shutdown: false,
            limits: Limits::default(),
            servers: Vec::new(),
            node_name: None,
            datacenter: drover_server_api::DEFAULT_DATACENTER.to_owned(),
            meta: BTreeMap::new(),
            token_file: None,
            tls: None,
            bridge_network_name: crate::network::DEFAULT_BRIDGE.into(),
            bridge_network_subnet: crate::network::DEFAULT_SUBNET.into(),
            cni_path: crate::network::DEFAULT_CNI_PATH
                .iter()
                .map(PathBuf::from)
                .collect(),

            network_interface: None,
            min_dynamic_port: u32::from(drover_server_api::DEFAULT_MIN_DYNAMIC_PORT),
            max_dynamic_port: u32::from(drover_server_api::DEFAULT_MAX_DYNAMIC_PORT),
            reserved: Reserved::default(),
            acl: AclSettings::default(),
            host_volume: BTreeMap::new(),
            csi_plugin: BTreeMap::new(),

            artifact: crate::allocs::ArtifactLimits::default(),
        }
    }
}

pub(crate) fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

pub(crate) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Millis(u64),
    }
    match Raw::deserialize(d)? {
        Raw::Text(t) => humantime::parse_duration(&t).map_err(|e| {
            serde::de::Error::custom(format!("{t:?} is not a duration like \"5s\": {e}"))
        }),
        Raw::Millis(ms) => Ok(Duration::from_millis(ms)),
    }
}

/// Environment keys (after `DROVER_`) that configure the agent. Others, such as
/// `DROVER_ADDR` for the CLI, are not agent settings.
const ENV_KEYS: &[&str] = &[
    "dev",
    "data_dir",
    "plugin_dir",
    "api_socket",
    "handshake_timeout",
    "log_level",
    "log_format",
    "prefer_builtin",
    "watch_plugin_dir",
    "drain_on_shutdown",
    "servers",
    "plugin_pass_env",
    "plugin_auto_mtls",
    "node_name",
    "datacenter",
    "token_file",
    "network_interface",
    "min_dynamic_port",
    "max_dynamic_port",
];

/// The config error, with figment's account of which source and key were wrong.
#[derive(Debug, thiserror::Error)]
#[error("invalid agent configuration: {0}")]
pub struct ConfigError(String);

impl AgentConfig {
    /// Merge defaults < `files` < `DROVER_*` env < `flags` (a map of the flag values
    /// that were given) into a config.
    pub fn load(
        files: &[PathBuf],
        env: impl IntoIterator<Item = (String, String)>,
        flags: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(AgentConfig::default()));
        for file in files {
            if !file.is_file() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(file));
        }
        let env: BTreeMap<String, String> = env.into_iter().collect();
        for key in ENV_KEYS {
            if let Some(v) = env.get(&format!("DROVER_{}", key.to_uppercase())) {
                let value = if *key == "servers" || *key == "plugin_pass_env" {
                    // DROVER_SERVERS=a:4647,b:4647
                    figment::value::Value::from(
                        v.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect::<Vec<String>>(),
                    )
                } else if *key == "min_dynamic_port" || *key == "max_dynamic_port" {
                    // A number; anything else stays text, which the typed extraction
                    // refuses naming the key.
                    v.trim()
                        .parse::<u32>()
                        .map_or_else(|_| v.to_string().into(), figment::value::Value::from)
                } else {
                    parse_env_value(v)
                };
                figment = figment.merge(Serialized::global(key, value));
            }
        }
        // The global profile, as the environment's: a flag given with the same key as
        // a `DROVER_*` variable wins over it (in the default profile it would lose).
        figment = figment.merge(Serialized::globals(flags.clone()));
        let mut config: AgentConfig = figment.extract().map_err(|e| {
            let msgs: Vec<String> = e.into_iter().map(|e| e.to_string()).collect();
            ConfigError(msgs.join("; "))
        })?;
        config.limits.check()?;
        config.artifact.check().map_err(ConfigError)?;
        config.check_datacenter()?;
        config.check_pins()?;
        config.check_plugin_env()?;
        config.bridge().map_err(|e| ConfigError(e.to_string()))?;

        config.port_settings()?;
        // After the checks, so that their errors name the sections as written.
        config.resolve_driver_aliases()?;
        config.dev_enables_raw_exec();
        Ok(config)
    }

    /// A dev agent runs raw_exec unless its config says otherwise, as Nomad's `-dev`
    /// does: it is one machine, its operator's own. Every other agent leaves raw_exec
    /// off until `[plugin.raw_exec] config = { enabled = true }`.
    fn dev_enables_raw_exec(&mut self) {
        if !self.dev {
            return;
        }
        let settings = self.plugin.entry("raw_exec".to_owned()).or_default();
        if let Some(fields) = settings.config.as_object_mut() {
            fields
                .entry("enabled")
                .or_insert(serde_json::Value::Bool(true));
        }
    }

    /// The bridge network of groups in bridge mode, from `bridge_network_name`,
    /// `bridge_network_subnet` and `cni_path` (checked).
    pub fn bridge(&self) -> Result<crate::network::Bridge, crate::network::NetworkError> {
        crate::network::Bridge::new(crate::network::BridgeConfig {
            name: self.bridge_network_name.clone(),
            subnet: self.bridge_network_subnet.clone(),
            cni_path: self.cni_path.clone(),
            ..crate::network::BridgeConfig::default()
        })
    }

    /// A datacenter is a name: not empty, no `*` (jobs match datacenters with `*`
    /// globs), no spaces or control characters.
    fn check_datacenter(&self) -> Result<(), ConfigError> {
        let dc = &self.datacenter;
        let bad = dc.is_empty()
            || dc.len() > 128
            || dc
                .chars()
                .any(|c| c == '*' || c.is_whitespace() || c.is_control());
        if bad {
            return Err(ConfigError(format!(
                "datacenter = {dc:?} is not a datacenter name: expected 1 to 128 \
                 characters without '*', spaces or control characters, e.g. \"dc1\""
            )));
        }
        Ok(())
    }

    /// The node's port settings, checked: `min_dynamic_port` and `max_dynamic_port`
    /// within 1-65535 and in order, `reserved.reserved_ports` a list of ports and
    /// ranges in 1-65535. The address is not part of it (see
    /// [`crate::cluster::network::node_network`]).
    ///
    /// # Errors
    /// A setting out of range or unreadable, named.
    pub fn port_settings(&self) -> Result<PortSettings, ConfigError> {
        let port = |key: &str, v: u32| -> Result<u16, ConfigError> {
            u16::try_from(v).ok().filter(|p| *p != 0).ok_or_else(|| {
                ConfigError(format!("{key} = {v} is not a port: expected 1 to 65535"))
            })
        };
        let min = port("min_dynamic_port", self.min_dynamic_port)?;
        let max = port("max_dynamic_port", self.max_dynamic_port)?;
        if min > max {
            return Err(ConfigError(format!(
                "min_dynamic_port = {min} is above max_dynamic_port = {max}: the dynamic \
                 port range would be empty"
            )));
        }
        let reserved = parse_port_list(&self.reserved.reserved_ports).map_err(|why| {
            ConfigError(format!(
                "reserved.reserved_ports = {:?}: {why} (expected ports and ranges such as \
                 \"22,80,8000-8100\")",
                self.reserved.reserved_ports
            ))
        })?;
        if let Some(name) = &self.network_interface
            && (name.is_empty()
                || name.len() > 15
                || name.contains(['/', '\0'])
                || name.trim() != name)
        {
            return Err(ConfigError(format!(
                "network_interface = {name:?} is not an interface name (1 to 15 characters \
                 without '/' or spaces, e.g. \"eth0\")"
            )));
        }
        Ok(PortSettings {
            min_dynamic_port: min,
            max_dynamic_port: max,
            reserved_ports: reserved,
        })
    }

    /// Configs written for a driver's older name keep working: `[plugin.rawexec]` is
    /// the settings of `raw_exec` (the built-in's name and label now), and `rawexec` in
    /// `plugin_allow` / `plugin_deny` also allows / denies `raw_exec`. Both sections at
    /// once is an error: which one was meant is not ours to guess.
    fn resolve_driver_aliases(&mut self) -> Result<(), ConfigError> {
        for (old, new) in drover_api::DRIVER_ALIASES {
            if let Some(settings) = self.plugin.remove(*old) {
                if self.plugin.contains_key(*new) {
                    return Err(ConfigError(format!(
                        "[plugin.{old}] and [plugin.{new}] are both set, but {old} is the \
                         driver's older name for {new}: merge them into [plugin.{new}]"
                    )));
                }
                self.plugin.insert((*new).to_owned(), settings);
            }
            for list in [&mut self.plugin_allow, &mut self.plugin_deny] {
                if list.iter().any(|n| n == old) && !list.iter().any(|n| n == new) {
                    list.push((*new).to_owned());
                }
            }
        }
        Ok(())
    }

    /// Every `sha256` pin must be a sha256: a typo would otherwise keep a plugin (and,
    /// once any pin is set, every unpinned one) from running, with no hint why.
    fn check_pins(&self) -> Result<(), ConfigError> {
        for (name, settings) in &self.plugin {
            if let Some(pin) = &settings.sha256 {
                let p = pin.trim();
                if p.len() != 64 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ConfigError(format!(
                        "[plugin.{name}] sha256 = {pin:?} is not a sha256: expected 64 hex \
                         digits, as `sha256sum <plugin binary>` prints them"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every variable name in `plugin_pass_env`, `pass_env` and `env` must be one a
    /// process can have, and none may be one the agent sets itself for the handshake
    /// (it would be overwritten, or worse, mislead the plugin about its host).
    fn check_plugin_env(&self) -> Result<(), ConfigError> {
        // A pin binds a name to the bytes of one file; a variable that makes the
        // dynamic loader load more code would run code no pin covers. Refused in every
        // section once any pin is set: the environment follows a file's name, a pin
        // its bytes, so a copy of a pinned binary under another section's name would
        // run with that section's variables.
        let any_pin = self.plugin.values().any(|p| p.sha256.is_some());
        let check = |key: &str, name: &str| -> Result<(), ConfigError> {
            if let Some(why) = bad_env_name(name) {
                return Err(ConfigError(format!("{key}: {name:?} {why}")));
            }
            if any_pin && loader_variable(name) {
                return Err(ConfigError(format!(
                    "{key}: {name:?} makes the dynamic loader load code that no sha256 pin \
                     covers, so it is refused while any plugin is pinned; install the \
                     library where the loader looks by default, or drop the pins"
                )));
            }
            Ok(())
        };
        for name in &self.plugin_pass_env {
            check("plugin_pass_env", name)?;
        }
        for (plugin, settings) in &self.plugin {
            for name in &settings.pass_env {
                check(&format!("[plugin.{plugin}] pass_env"), name)?;
            }
            for (name, value) in &settings.env {
                check(&format!("[plugin.{plugin}] env"), name)?;
                if value.contains('\0') {
                    return Err(ConfigError(format!(
                        "[plugin.{plugin}] env: the value of {name:?} contains a NUL byte"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The data directory, with the dev-mode default.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(d) = &self.data_dir {
            return d.clone();
        }
        if self.dev {
            std::env::temp_dir().join(format!(
                "drover-dev-{}",
                rustix::process::geteuid().as_raw()
            ))
        } else {
            PathBuf::from("/var/lib/drover")
        }
    }

    /// The plugin directory.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugin_dir
            .clone()
            .unwrap_or_else(|| self.data_dir().join("plugins"))
    }

    /// The API socket path.
    pub fn api_socket(&self) -> PathBuf {
        self.api_socket
            .clone()
            .unwrap_or_else(|| default_api_socket(&self.data_dir()))
    }

    /// Settings for plugin `name` (defaults when not configured).
    pub fn plugin_settings(&self, name: &str) -> PluginSettings {
        self.plugin.get(name).cloned().unwrap_or_default()
    }
}

/// The port settings of a node, checked (see [`AgentConfig::port_settings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSettings {
    /// Lowest dynamic port.
    pub min_dynamic_port: u16,
    /// Highest dynamic port.
    pub max_dynamic_port: u16,
    /// Reserved ports, as written (ranges inclusive).
    pub reserved_ports: Vec<drover_server_api::PortRange>,
}

/// Nomad's port list syntax: ports and `first-last` ranges, comma-separated, blanks
/// around them ignored; empty: none.
fn parse_port_list(text: &str) -> Result<Vec<drover_server_api::PortRange>, String> {
    let port = |s: &str| -> Result<u16, String> {
        let s = s.trim();
        s.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{s:?} is not a port from 1 to 65535"))
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => {
                let (first, last) = (port(a)?, port(b)?);
                if first > last {
                    return Err(format!("the range {part:?} ends before it starts"));
                }
                drover_server_api::PortRange { first, last }
            }
            None => {
                let p = port(part)?;
                drover_server_api::PortRange { first: p, last: p }
            }
        };
        out.push(range);
    }
    Ok(out)
}

/// `<data_dir>/api.sock`.
pub fn default_api_socket(data_dir: &Path) -> PathBuf {
    data_dir.join("api.sock")
}

fn parse_env_value(v: &str) -> figment::value::Value {
    match v {
        "true" => true.into(),
        "false" => false.into(),
        _ => v.to_string().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(pairs: &[(&str, serde_json::Value)]) -> serde_json::Map<String, serde_json::Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn layers_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "data_dir = \"/from/file\"\nplugin_dir = \"/file/plugins\"\nhandshake_timeout = \"3s\"\n\
             [plugin.rawexec]\nconfig = { a = 1 }\n",
        )
        .unwrap();
        let env = vec![("DROVER_PLUGIN_DIR".to_owned(), "/env/plugins".to_owned())];
        let c = AgentConfig::load(
            std::slice::from_ref(&file),
            env,
            &flags(&[("api_socket", "/flag/api.sock".into())]),
        )
        .unwrap();
        assert_eq!(c.data_dir(), PathBuf::from("/from/file"));
        assert_eq!(c.plugin_dir(), PathBuf::from("/env/plugins"));
        assert_eq!(c.api_socket(), PathBuf::from("/flag/api.sock"));
        assert_eq!(c.handshake_timeout, Duration::from_secs(3));
        // `rawexec` is raw_exec's older name: its section is raw_exec's.
        assert_eq!(c.plugin_settings("raw_exec").config["a"], 1);

        let c = AgentConfig::load(
            &[file],
            vec![],
            &flags(&[("plugin_dir", "/flag/plugins".into())]),
        )
        .unwrap();
        assert_eq!(c.plugin_dir(), PathBuf::from("/flag/plugins"));
    }

    #[test]
    fn typo_in_file_names_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "plugn_dir = \"/x\"\n").unwrap();
        let err = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugn_dir"), "{err}");
        assert!(err.contains(&file.display().to_string()), "{err}");
    }

    #[test]
    fn a_pin_that_is_not_a_sha256_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "[plugin.skeleton]\nsha256 = \"abc\"\n").unwrap();
        let err = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("[plugin.skeleton] sha256 = \"abc\""), "{err}");
        std::fs::write(
            &file,
            format!("[plugin.skeleton]\nsha256 = \"{}\"\n", "aB".repeat(32)),
        )
        .unwrap();
        assert!(AgentConfig::load(&[file], vec![], &Default::default()).is_ok());
    }

    #[test]
    fn bad_duration_is_explained() {
        let env = vec![("DROVER_HANDSHAKE_TIMEOUT".to_owned(), "soon".to_owned())];
        let err = AgentConfig::load(&[], env, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = AgentConfig::load(
            &[PathBuf::from("/nonexistent/agent.toml")],
            vec![],
            &Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/agent.toml"), "{err}");
    }

    /// raw_exec is off unless configured on, except on a dev agent (as Nomad's).
    #[test]
    fn raw_exec_is_enabled_by_config_or_dev_mode_only() {
        let plain = AgentConfig::load(&[], vec![], &flags(&[])).unwrap();
        assert_eq!(
            plain.plugin_settings("raw_exec").config.get("enabled"),
            None
        );
        let dev = AgentConfig::load(&[], vec![], &flags(&[("dev", true.into())])).unwrap();
        assert_eq!(dev.plugin_settings("raw_exec").config["enabled"], true);
        // The operator's word wins in dev mode too, and other settings are kept.
        let (_dir, file) =
            write_toml("[plugin.raw_exec]\nconfig = { enabled = false, no_cgroups = true }\n");
        let off = AgentConfig::load(&[file], vec![], &flags(&[("dev", true.into())])).unwrap();
        assert_eq!(off.plugin_settings("raw_exec").config["enabled"], false);
        assert_eq!(off.plugin_settings("raw_exec").config["no_cgroups"], true);
        let (_dir, file) = write_toml("[plugin.rawexec]\nconfig = { no_cgroups = true }\n");
        let dev = AgentConfig::load(&[file], vec![], &flags(&[("dev", true.into())])).unwrap();
        assert_eq!(dev.plugin_settings("raw_exec").config["enabled"], true);
        assert_eq!(dev.plugin_settings("raw_exec").config["no_cgroups"], true);
    }

    #[test]
    fn dev_defaults() {
        let c = AgentConfig::load(&[], vec![], &flags(&[("dev", true.into())])).unwrap();
        assert!(c.data_dir().to_string_lossy().contains("drover-dev-"));
        assert_eq!(c.api_socket(), c.data_dir().join("api.sock"));
        assert_eq!(c.plugin_dir(), c.data_dir().join("plugins"));
        assert!(
            !c.drain_on_shutdown,
            "a graceful stop leaves tasks running by default"
        );
    }

    #[test]
    fn limits_from_file_with_defaults_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "[limits]\nmax_log_followers = 10\n").unwrap();
        let c =
            AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default()).unwrap();
        assert_eq!(c.limits.max_log_followers, 10);
        assert_eq!(c.limits.max_connections, Limits::default().max_connections);

        std::fs::write(&file, "[limits]\nmax_connections = 0\n").unwrap();
        let err = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("limits.max_connections must be at least 1"),
            "{err}"
        );
        std::fs::write(&file, "[limits]\nmax_folowers = 1\n").unwrap();
        let err = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_folowers"), "{err}");

        std::fs::write(&file, "[limits]\nheader_read_timeout = \"2s\"\n").unwrap();
        let c =
            AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default()).unwrap();
        assert_eq!(c.limits.header_read_timeout, Duration::from_secs(2));
        std::fs::write(&file, "[limits]\nheader_read_timeout = \"0s\"\n").unwrap();
        let err = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("limits.header_read_timeout must be more than 0"),
            "{err}"
        );
    }

    /// `text` in a TOML file of its own (kept while the dir lives).
    fn write_toml(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, text).unwrap();
        (dir, file)
    }

    fn load_toml(text: &str) -> Result<AgentConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, text).unwrap();
        AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default())
    }

    #[test]
    fn the_bridge_network_is_configurable_and_checked() {
        let c = load_toml(
            "bridge_network_name = \"br-test\"\nbridge_network_subnet = \"10.99.0.0/24\"\n\
             cni_path = [\"/opt/cni/bin\"]\n",
        )
        .unwrap();
        let b = c.bridge().unwrap();
        assert_eq!(b.config().name, "br-test");
        assert_eq!(
            b.conflist().plugins[1]["ipam"]["ranges"][0][0]["subnet"],
            "10.99.0.0/24"
        );
        let d = AgentConfig::default().bridge().unwrap();
        assert_eq!(d.config().name, "drover");
        let e = load_toml("bridge_network_subnet = \"10.99.0.0\"\n").unwrap_err();
        assert!(e.to_string().contains("bridge_network_subnet"), "{e}");
    }

    const PIN: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    /// Configs written for the raw exec driver's older name `rawexec` keep working:
    /// its section, allow and deny entries are `raw_exec`'s; both sections at once are
    /// refused, naming both.
    #[test]
    fn the_older_driver_name_rawexec_configures_raw_exec() {
        let c = load_toml(
            "plugin_deny = [\"rawexec\"]\nplugin_allow = [\"docker\"]\n\
             [plugin.rawexec]\nconfig = { no_cgroups = true }\n",
        )
        .unwrap();
        assert_eq!(c.plugin_settings("raw_exec").config["no_cgroups"], true);
        assert!(!c.plugin.contains_key("rawexec"));
        assert!(c.plugin_deny.contains(&"raw_exec".to_owned()), "{c:?}");
        assert_eq!(c.plugin_allow, ["docker"]);
        let err = load_toml("[plugin.rawexec]\nconfig = {}\n[plugin.raw_exec]\nconfig = {}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[plugin.rawexec] and [plugin.raw_exec] are both set"),
            "{err}"
        );
    }

    /// A pinned plugin runs only the bytes its pin names: `LD_PRELOAD` and the like,
    /// which would load more code into it, are refused in every section and in
    /// `plugin_pass_env` once any pin is set. Without pins they are allowed.
    #[test]
    fn loader_variables_are_refused_for_pinned_plugins() {
        for (text, culprit) in [
            (
                format!(
                    "[plugin.rawexec]\nsha256 = \"{PIN}\"\nenv = {{ LD_PRELOAD = \"/opt/x.so\" }}\n"
                ),
                "LD_PRELOAD",
            ),
            (
                format!("[plugin.rawexec]\nsha256 = \"{PIN}\"\npass_env = [\"LD_LIBRARY_PATH\"]\n"),
                "LD_LIBRARY_PATH",
            ),
            (
                format!(
                    "plugin_pass_env = [\"GCONV_PATH\"]\n[plugin.docker]\nsha256 = \"{PIN}\"\n"
                ),
                "GCONV_PATH",
            ),
            // An unpinned section beside a pinned one: a copy of the pinned binary
            // under this name would run with it.
            (
                format!(
                    "[plugin.docker]\nsha256 = \"{PIN}\"\n[plugin.rawexec]\nenv = {{ LD_AUDIT = \"/opt/a.so\" }}\n"
                ),
                "LD_AUDIT",
            ),
        ] {
            let err = load_toml(&text).unwrap_err().to_string();
            assert!(
                err.contains(culprit) && err.contains("no sha256 pin covers"),
                "{err}"
            );
        }
        let unpinned = load_toml(
            "plugin_pass_env = [\"LD_LIBRARY_PATH\"]\n[plugin.rawexec]\nenv = { LD_PRELOAD = \"/opt/x.so\" }\n",
        )
        .unwrap();
        assert_eq!(unpinned.plugin["raw_exec"].env["LD_PRELOAD"], "/opt/x.so");
    }

    /// `env` values and `config` may be credentials: the settings' `Debug` (the one a
    /// log line of the config would use) names them and shows no value.
    #[test]
    fn debug_of_plugin_settings_shows_no_env_or_config_values() {
        let c = load_toml(
            "[plugin.docker]\nenv = { TOKEN = \"s3cret-env\" }\nconfig = { auth = \"s3cret-config\" }\n",
        )
        .unwrap();
        for shown in [format!("{:?}", c.plugin["docker"]), format!("{c:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("TOKEN") && shown.contains("auth"), "{shown}");
        }
    }

    #[test]
    fn drain_from_file_env_and_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "drain_on_shutdown = true\n").unwrap();
        let c = AgentConfig::load(std::slice::from_ref(&file), vec![], &Default::default());
        assert!(c.unwrap().drain_on_shutdown);
        let env = vec![("DROVER_DRAIN_ON_SHUTDOWN".to_owned(), "true".to_owned())];
        assert!(
            AgentConfig::load(&[], env, &Default::default())
                .unwrap()
                .drain_on_shutdown
        );
        let c = AgentConfig::load(&[], vec![], &flags(&[("drain_on_shutdown", true.into())]));
        assert!(c.unwrap().drain_on_shutdown);
    }

    #[test]
    fn servers_from_the_environment() {
        let env = vec![
            (
                "DROVER_SERVERS".to_owned(),
                "127.0.0.1:4647, 127.0.0.2:4647".to_owned(),
            ),
            ("DROVER_NODE_NAME".to_owned(), "n7".to_owned()),
        ];
        let c = AgentConfig::load(&[], env, &Default::default()).unwrap();
        assert_eq!(c.servers, vec!["127.0.0.1:4647", "127.0.0.2:4647"]);
        assert_eq!(c.node_name.as_deref(), Some("n7"));
    }

    #[test]
    fn datacenter_from_file_env_and_flag_default_dc1() {
        assert_eq!(
            AgentConfig::load(&[], vec![], &Default::default())
                .unwrap()
                .datacenter,
            "dc1"
        );
        assert_eq!(
            load_toml("datacenter = \"eu-west\"\n").unwrap().datacenter,
            "eu-west"
        );
        let env = vec![("DROVER_DATACENTER".to_owned(), "us-east".to_owned())];
        assert_eq!(
            AgentConfig::load(&[], env.clone(), &Default::default())
                .unwrap()
                .datacenter,
            "us-east"
        );
        // The flag wins over the environment.
        let c = AgentConfig::load(&[], env, &flags(&[("datacenter", "ap-1".into())])).unwrap();
        assert_eq!(c.datacenter, "ap-1");
        // A number is a name too.
        let env = vec![("DROVER_DATACENTER".to_owned(), "7".to_owned())];
        assert_eq!(
            AgentConfig::load(&[], env, &Default::default())
                .unwrap()
                .datacenter,
            "7"
        );
        for bad in ["", "dc*", "dc 1"] {
            let e = AgentConfig::load(&[], vec![], &flags(&[("datacenter", bad.into())]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("datacenter") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    /// Nomad's client port settings: the dynamic range and the reserved ports, from
    /// the file and the environment; a wrong one is refused naming its key.
    #[test]
    fn port_settings_are_read_and_checked_by_key() {
        let c = AgentConfig::load(&[], vec![], &Default::default()).unwrap();
        let p = c.port_settings().unwrap();
        assert_eq!((p.min_dynamic_port, p.max_dynamic_port), (20000, 32000));
        // The privileged ports by default; explicitly none when the operator says so.
        let ranges: Vec<(u16, u16)> = p.reserved_ports.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(ranges, [(1, 1023)]);
        let none = load_toml("[reserved]\nreserved_ports = \"\"\n").unwrap();
        assert!(none.port_settings().unwrap().reserved_ports.is_empty());
        let mut dev = c.clone();
        dev.reserved.add_port(4646);
        let ranges: Vec<(u16, u16)> = dev
            .port_settings()
            .unwrap()
            .reserved_ports
            .iter()
            .map(|r| (r.first, r.last))
            .collect();
        assert_eq!(ranges, [(1, 1023), (4646, 4646)]);

        let c = load_toml(
            "min_dynamic_port = 10000\nmax_dynamic_port = 10010\nnetwork_interface = \"eth0\"\n\
             [reserved]\nreserved_ports = \"22,80, 8000-8100\"\n",
        )
        .unwrap();
        let p = c.port_settings().unwrap();
        assert_eq!((p.min_dynamic_port, p.max_dynamic_port), (10000, 10010));
        let ranges: Vec<(u16, u16)> = p.reserved_ports.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(ranges, [(22, 22), (80, 80), (8000, 8100)]);
        assert_eq!(c.network_interface.as_deref(), Some("eth0"));

        let env = vec![
            ("DROVER_MIN_DYNAMIC_PORT".to_owned(), "30000".to_owned()),
            ("DROVER_NETWORK_INTERFACE".to_owned(), "lo".to_owned()),
        ];
        let c = AgentConfig::load(&[], env, &Default::default()).unwrap();
        assert_eq!(c.port_settings().unwrap().min_dynamic_port, 30000);
        assert_eq!(c.network_interface.as_deref(), Some("lo"));

        for (text, named) in [
            (
                "min_dynamic_port = 0\n",
                "min_dynamic_port = 0 is not a port",
            ),
            (
                "max_dynamic_port = 70000\n",
                "max_dynamic_port = 70000 is not a port",
            ),
            (
                "min_dynamic_port = 31000\nmax_dynamic_port = 30000\n",
                "min_dynamic_port = 31000 is above max_dynamic_port = 30000",
            ),
            (
                "[reserved]\nreserved_ports = \"22,http\"\n",
                "reserved.reserved_ports = \"22,http\": \"http\" is not a port",
            ),
            (
                "[reserved]\nreserved_ports = \"90-80\"\n",
                "\"90-80\" ends before it starts",
            ),
            (
                "[reserved]\nreserved_ports = \"0\"\n",
                "\"0\" is not a port from 1 to 65535",
            ),
            ("[reserved]\ncpu = 100\n", "cpu"),
            (
                "network_interface = \"\"\n",
                "network_interface = \"\" is not an interface",
            ),
        ] {
            let err = load_toml(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }

    /// Issue 27: `[host_volume.NAME]` tables; a misspelt key is refused by name.
    #[test]
    fn host_volumes_are_read_from_the_file() {
        let c = load_toml(
            "[host_volume.data]\npath = \"/srv/data\"\n[host_volume.ro]\npath = \"/srv/ro\"\nread_only = true\n",
        )
        .unwrap();
        assert_eq!(c.host_volume["data"].path, "/srv/data");
        assert!(!c.host_volume["data"].read_only && c.host_volume["ro"].read_only);
        let err = load_toml("[host_volume.data]\npth = \"/srv/data\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pth"), "{err}");
    }
}
