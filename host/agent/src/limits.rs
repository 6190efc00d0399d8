//! Bounds on what API clients hold open: long-lived streams (`logs -f`, `stats -f`)
//! per agent and per task, API connections, and the agent's own open-file limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Limits;

/// Why a stream was refused: a cap is reached. The message names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapError {
    /// The agent serves as many streams of this kind as it may, over all tasks.
    #[error(
        "the agent already serves {max} {kind}, its limit (limits.{setting} in the agent \
         config); try again when one ends"
    )]
    Agent {
        /// "log followers" or "stats followers".
        kind: &'static str,
        /// The cap.
        max: usize,
        /// The config key.
        setting: &'static str,
    },
    /// The task has as many streams of this kind as one task may.
    #[error(
        "task {task} already has {max} {kind}, the limit per task (limits.{setting} in \
         the agent config); close one first"
    )]
    Task {
        /// The task id.
        task: String,
        /// "log followers" or "stats followers".
        kind: &'static str,
        /// The cap.
        max: usize,
        /// The config key.
        setting: &'static str,
    },
}

/// Counts of one kind of stream, capped per agent and per task.
#[derive(Debug)]
pub struct StreamCap {
    kind: &'static str,
    setting: &'static str,
    setting_per_task: &'static str,
    max: usize,
    max_per_task: usize,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_task: HashMap<String, usize>,
}

/// One stream counted against its caps until dropped.
#[derive(Debug)]
pub struct StreamPermit {
    task: String,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_task.get_mut(&self.task) {
            *n -= 1;
            if *n == 0 {
                c.by_task.remove(&self.task);
            }
        }
    }
}

impl StreamCap {
    /// A stream for `task`, or the cap it would exceed.
    pub fn acquire(&self, task: &str) -> Result<StreamPermit, CapError> {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if c.by_task.get(task).copied().unwrap_or(0) >= self.max_per_task {
            return Err(CapError::Task {
                task: task.to_owned(),
                kind: self.kind,
                max: self.max_per_task,
                setting: self.setting_per_task,
            });
        }
        if c.total >= self.max {
            return Err(CapError::Agent {
                kind: self.kind,
                max: self.max,
                setting: self.setting,
            });
        }
        c.total += 1;
        *c.by_task.entry(task.to_owned()).or_default() += 1;
        Ok(StreamPermit {
            task: task.to_owned(),
            counts: self.counts.clone(),
        })
    }

    /// Streams served now.
    pub fn active(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

/// The caps on the API's long-lived streams.
#[derive(Debug)]
pub struct StreamCaps {
    /// `logs -f`.
    pub logs: StreamCap,
    /// `stats -f`.
    pub stats: StreamCap,
}

impl StreamCaps {
    /// Caps as configured.
    pub fn new(limits: &Limits) -> StreamCaps {
        StreamCaps {
            logs: StreamCap {
                kind: "log followers",
                setting: "max_log_followers",
                setting_per_task: "max_log_followers_per_task",
                max: limits.max_log_followers,
                max_per_task: limits.max_log_followers_per_task,
                counts: Default::default(),
            },
            stats: StreamCap {
                kind: "stats followers",
                setting: "max_stats_followers",
                setting_per_task: "max_stats_followers_per_task",
                max: limits.max_stats_followers,
                max_per_task: limits.max_stats_followers_per_task,
                counts: Default::default(),
            },
        }
    }
}

impl Default for StreamCaps {
    fn default() -> Self {
        StreamCaps::new(&Limits::default())
    }
}

/// A unix listener that serves at most `max` connections at once: past that, accepting
/// waits until one closes, and new clients wait in the socket's backlog. Each
/// connection holds a permit until it is dropped.
pub struct LimitedListener {
    inner: tokio::net::UnixListener,
    permits: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl LimitedListener {
    /// Serve `inner` with at most `max` connections at once.
    pub fn new(inner: tokio::net::UnixListener, max: usize) -> LimitedListener {
        LimitedListener {
            inner,
            permits: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                tracing::warn!(
                    max = self.max,
                    "the API serves as many connections as limits.max_connections allows; \
                     new ones wait until one closes"
                );
                match self.permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    // Never closed; if it were, serving on without a bound is wrong too.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (
            LimitedStream {
                io,
                _permit: permit,
            },
            addr,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection counted against [`LimitedListener`]'s bound until dropped.
pub struct LimitedStream {
    io: tokio::net::UnixStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tokio::io::AsyncRead for LimitedStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for LimitedStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The open-file limit before and after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit the agent was started with.
    pub was: u64,
    /// The soft limit now (the hard limit, when raising worked).
    pub now: u64,
}

/// Raise this process's open-file soft limit to its hard limit, as Go programs do at
/// start: the default soft limit (often 1024) is sized for `select(2)`, which the
/// agent does not use, and every connection, log follower, plugin and task handle
/// costs the agent descriptors. An unlimited hard limit is left alone (the kernel
/// refuses an unlimited soft one for files).
pub fn raise_nofile_limit() -> std::io::Result<NofileLimit> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let was = limit.current.unwrap_or(u64::MAX);
    let Some(hard) = limit.maximum else {
        return Ok(NofileLimit { was, now: was });
    };
    if limit.current == Some(hard) {
        return Ok(NofileLimit { was, now: was });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    )?;
    Ok(NofileLimit { was, now: hard })
}

/// Descriptors the configured bounds can take together, for a warning when the
/// open-file limit is lower: a connection each, and per log follower up to five open
/// log files (the current one and the look-ahead) and one more descriptor, plus the
/// pool of extra look-ahead files shared by all readers. An upper bound: the extra
/// descriptor was an inotify instance per follower once; all followers now share one.
pub fn descriptor_budget(limits: &Limits) -> u64 {
    let per_follower = 2 + crate::logs::LOOKAHEAD as u64;
    limits.max_connections as u64
        + limits.max_log_followers as u64 * per_follower
        + 512 // the readers' shared look-ahead pool (`LOOKAHEAD_EXTRA_FILES_TOTAL` in logs)
        + 256 // plugins, their sockets, the state store, task handles
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_task_then_per_agent_and_frees_on_drop() {
        let caps = StreamCaps::new(&Limits {
            max_log_followers: 3,
            max_log_followers_per_task: 2,
            ..Limits::default()
        });
        let a1 = caps.logs.acquire("a").unwrap();
        let _a2 = caps.logs.acquire("a").unwrap();
        let e = caps.logs.acquire("a").unwrap_err().to_string();
        assert!(
            e.contains("task a already has 2 log followers")
                && e.contains("limits.max_log_followers_per_task"),
            "{e}"
        );
        let _b1 = caps.logs.acquire("b").unwrap();
        let e = caps.logs.acquire("b").unwrap_err().to_string();
        assert!(
            e.contains("already serves 3 log followers") && e.contains("limits.max_log_followers "),
            "{e}"
        );
        // Stats are counted apart.
        let _s = caps.stats.acquire("b").unwrap();
        drop(a1);
        assert_eq!(caps.logs.active(), 2);
        let _b2 = caps.logs.acquire("b").unwrap();
    }
}
