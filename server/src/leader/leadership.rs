//! Whether this server leads, and who does: the current [`LeaderTerm`] (`None` while
//! following), the election it campaigns in, and the leader as last seen (what a
//! "not the leader" answer names, and where writes are forwarded).

use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::error::ServerError;
use crate::leader::term::LeaderTerm;
use crate::store::election::{Election, ServerInfo};

pub(crate) struct Leadership {
    pub election: Arc<dyn Election>,
    /// This server as the others see it.
    pub me: ServerInfo,
    term: RwLock<Option<Arc<LeaderTerm>>>,
    /// The id of the term this server leads in, `None` while it follows.
    leading: watch::Sender<Option<u64>>,
    known_leader: Mutex<Option<ServerInfo>>,
}

impl Leadership {
    pub(crate) fn new(election: Arc<dyn Election>, me: ServerInfo) -> Leadership {
        Leadership {
            election,
            me,
            term: RwLock::new(None),
            leading: watch::channel(None).0,
            known_leader: Mutex::new(None),
        }
    }

    /// The term this server leads in, if it leads.
    pub(crate) fn term(&self) -> Option<Arc<LeaderTerm>> {
        self.term.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The term this server leads in; `NotLeader` while it follows.
    pub(crate) fn require(&self) -> Result<Arc<LeaderTerm>, ServerError> {
        self.term().ok_or_else(|| self.not_leader())
    }

    /// Whether this server leads now.
    pub(crate) fn is_leader(&self) -> bool {
        self.term
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The error for a write on a follower, naming the leader it knows of.
    pub(crate) fn not_leader(&self) -> ServerError {
        ServerError::NotLeader {
            leader: self
                .known_leader()
                .map(|l| format!("{} ({})", l.name, l.rpc_addr)),
        }
    }

    /// `term` starts: writes are accepted from here on.
    pub(crate) fn begin(&self, term: Arc<LeaderTerm>) {
        *self.term.write().unwrap_or_else(|p| p.into_inner()) = Some(term);
    }

    /// This server announces it leads in `id` (once its loops run).
    pub(crate) fn announce(&self, id: u64) {
        self.leading.send_replace(Some(id));
    }

    /// The term is over: writes are refused from here on.
    pub(crate) fn end(&self) {
        *self.term.write().unwrap_or_else(|p| p.into_inner()) = None;
        self.leading.send_replace(None);
        self.set_known_leader(None);
    }

    /// The id of the term this server leads in; `None` while it follows.
    pub(crate) fn leading(&self) -> Option<u64> {
        *self.leading.borrow()
    }

    /// Changes of [`Leadership::leading`].
    pub(crate) fn watch_leading(&self) -> watch::Receiver<Option<u64>> {
        self.leading.subscribe()
    }

    /// The leader as last seen.
    pub(crate) fn known_leader(&self) -> Option<ServerInfo> {
        self.known_leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_known_leader(&self, leader: Option<ServerInfo>) {
        *self.known_leader.lock().unwrap_or_else(|p| p.into_inner()) = leader;
    }

    /// Forget the leader as last seen if it is `name` (a call to it failed).
    pub(crate) fn forget_known_leader(&self, name: &str) {
        let mut leader = self.known_leader.lock().unwrap_or_else(|p| p.into_inner());
        if leader.as_ref().is_some_and(|l| l.name == name) {
            *leader = None;
        }
    }
}
