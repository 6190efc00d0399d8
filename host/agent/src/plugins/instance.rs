//! One running plugin, whatever its form: a process the agent launched or reattached
//! to (go-plugin's model), or a driver library loaded into the agent itself.
//!
//! The catalog and the loader only ever hold a [`PluginInstance`]; what differs between
//! the forms (a pid, a reattach record, a socket dir) is answered here.

use std::path::PathBuf;

use drover_api::PluginProtocol as Protocol;
use drover_plugin_sdk::ExitOutcome;
use drover_plugin_sdk::client::{InProcessPlugin, PluginClient, PluginProcess, ReattachConfig};

/// A running plugin.
#[derive(Debug, Clone)]
pub enum PluginInstance {
    /// A plugin process (launched now, or reattached to). Boxed: a process's handle is
    /// a few hundred bytes, a library's a pointer.
    Process(Box<PluginProcess>),
    /// A driver library loaded into the agent.
    InProcess(InProcessPlugin),
}

impl From<PluginProcess> for PluginInstance {
    fn from(p: PluginProcess) -> Self {
        PluginInstance::Process(Box::new(p))
    }
}

impl From<InProcessPlugin> for PluginInstance {
    fn from(p: InProcessPlugin) -> Self {
        PluginInstance::InProcess(p)
    }
}

impl PluginInstance {
    /// A typed client of the current instance.
    pub fn client(&self) -> PluginClient {
        match self {
            PluginInstance::Process(p) => p.client(),
            PluginInstance::InProcess(p) => p.client(),
        }
    }

    /// The driver protocol it speaks (a driver library speaks Drover's), as
    /// `plugin status` shows it.
    pub fn protocol(&self) -> Protocol {
        match self {
            PluginInstance::Process(p) => match p.protocol() {
                drover_plugin_sdk::client::PluginProtocol::Nomad => Protocol::Nomad,
                _ => Protocol::Drover,
            },
            PluginInstance::InProcess(_) => Protocol::Drover,
        }
    }

    /// The plugin's own process; `None` in process (it is the agent's).
    pub fn pid(&self) -> Option<u32> {
        match self {
            PluginInstance::Process(p) => Some(p.pid()),
            PluginInstance::InProcess(_) => None,
        }
    }

    /// Whether it runs inside the agent.
    pub fn in_process(&self) -> bool {
        matches!(self, PluginInstance::InProcess(_))
    }

    /// Whether an earlier agent launched it (processes only).
    pub fn is_reattached(&self) -> bool {
        match self {
            PluginInstance::Process(p) => p.is_reattached(),
            PluginInstance::InProcess(_) => false,
        }
    }

    /// Whether it has stopped (process exited, or in-process runtime stopped).
    pub fn has_exited(&self) -> bool {
        match self {
            PluginInstance::Process(p) => p.has_exited(),
            PluginInstance::InProcess(p) => p.has_exited(),
        }
    }

    /// Resolves when it stops.
    pub async fn exited(&self) -> ExitOutcome {
        match self {
            PluginInstance::Process(p) => p.exited().await,
            PluginInstance::InProcess(p) => p.exited().await,
        }
    }

    /// Ask it to stop (a process is killed after the grace period).
    pub async fn shutdown(&self) -> ExitOutcome {
        match self {
            PluginInstance::Process(p) => p.shutdown().await,
            PluginInstance::InProcess(p) => p.shutdown().await,
        }
    }

    /// Stop it now: SIGKILL for a process; an in-process plugin cannot be killed
    /// without the agent, so it is shut down.
    pub async fn kill(&self) -> ExitOutcome {
        match self {
            PluginInstance::Process(p) => p.kill().await,
            PluginInstance::InProcess(p) => p.shutdown().await,
        }
    }

    /// Start forwarding the plugin's stdout/stderr lines into the agent's log
    /// (processes; an in-process plugin logs through its log pipe from the start).
    pub fn mirror_stdio(&self) {
        if let PluginInstance::Process(p) = self {
            p.mirror_stdio();
        }
    }

    /// What the next agent needs to take the process over; `None` in process (the next
    /// agent loads the library again).
    pub fn reattach_config(&self) -> Option<ReattachConfig> {
        match self {
            PluginInstance::Process(p) => Some(p.reattach_config()),
            PluginInstance::InProcess(_) => None,
        }
    }

    /// The unix socket a plugin process serves on (its directory is the SDK's
    /// `drover-plugin-*`).
    pub fn socket_path(&self) -> Option<PathBuf> {
        match self {
            PluginInstance::Process(p) => match &p.handshake().addr {
                drover_plugin_sdk::handshake::PluginAddr::Unix(s) => Some(s.clone()),
                drover_plugin_sdk::handshake::PluginAddr::Tcp(_) => None,
            },
            PluginInstance::InProcess(_) => None,
        }
    }
}
