//! Start-up: [`Catalog::load`] brings every plugin to serve, taking over the plugin
//! processes an earlier agent left running.
//!
//! Every candidate is obtained concurrently: its stored process is reattached to (same
//! binary, same pid and start time, identity proven over RPC) or, failing that, a fresh
//! one is checked, launched and fingerprinted. One plugin is picked per name, the
//! winners are configured and handed to their supervisors ([`super::supervise`]).
//! Records no candidate claims are retired, and plugin sockets no serving plugin uses
//! are swept. A process that cannot be proven to be our plugin is never signalled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_api::PluginSource;
use drover_plugin_sdk::client::PluginProcess;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::candidate::{self, Candidate};
use super::catalog::{Catalog, LoadContext, LoadedPlugin, Progress, Records};
use super::loader::{self, Fingerprinted};
use super::supervise::{configure, launch_checked, supervise};
use super::trust;
use crate::config::AgentConfig;
use crate::state::PluginRecord;

/// At most this many stored plugin processes are being reattached at once, so a start
/// with many records (or hung plugins) stays bounded.
const REATTACH_CONCURRENCY: usize = 8;

/// Marks initial loading finished when dropped, so waiters never hang on a load that
/// was cancelled (agent stopping).
struct DoneOnDrop<'a>(&'a watch::Sender<Progress>);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|p| p.done = true);
    }
}

impl Catalog {
    /// Scan, launch and fingerprint every candidate concurrently, pick one plugin per
    /// name, configure the winners and start their supervisors. Every outcome is
    /// logged, one line per binary.
    pub async fn load(
        self: &Arc<Self>,
        config: &AgentConfig,
        builtins: &[candidate::Builtin],
        ctx: Arc<LoadContext>,
        stop: CancellationToken,
    ) {
        let _done = DoneOnDrop(&self.progress);
        let started = Instant::now();
        let policy = Arc::new(trust::Policy::from_config(config));
        self.set_reload_env(config, builtins, &ctx, &policy, &stop);
        let candidates = self.candidates(config, builtins);
        let records = match self.records.store.plugins() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot read plugin records; launching every plugin afresh: {e}");
                Vec::new()
            }
        };
        let slots = Arc::new(Semaphore::new(REATTACH_CONCURRENCY));
        let (launches, unclaimed) = self.launch_all(candidates, records, &policy, &ctx, &slots);
        let mut retiring = self.retire_all(unclaimed, &ctx, &slots);
        let winners = self.pick_winners(launches, config).await;
        let serving = self.configure_all(winners, &policy, &ctx, &stop).await;
        while retiring.join_next().await.is_some() {}
        // Every process this start adopted or launched is known now, and supervisors
        // (which create new socket dirs when they relaunch) have not started: what else
        // is in the socket dir is left over from an earlier agent.
        let strays = stray_sockets(&ctx.socket_dir, &serving);
        for plugin in serving {
            tokio::spawn(supervise(
                plugin,
                ctx.clone(),
                self.records.clone(),
                policy.clone(),
            ));
        }
        // Waiters for a plugin that did not load need not wait for the sweep.
        self.progress.send_modify(|p| p.done = true);
        sweep_all(strays, &ctx, &slots).await;
        tracing::info!(
            loaded = self.names().len(),
            skipped = self.skipped.read().map(|s| s.len()).unwrap_or(0),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plugin loading finished"
        );
    }

    /// Every binary in `plugin_dir` that may be a plugin, then the built-ins; files
    /// that cannot be are skipped here, with their reason.
    fn candidates(&self, config: &AgentConfig, builtins: &[candidate::Builtin]) -> Vec<Candidate> {
        let (mut candidates, skipped) = loader::scan_plugin_dir(&config.plugin_dir());
        for row in skipped {
            self.skip(row);
        }
        candidates.extend(builtins.iter().map(|b| Candidate {
            path: b.command.clone(),
            args: b.args.clone(),
            source: PluginSource::Builtin,
            label: b.name.clone(),
        }));
        candidates
    }

    /// Start obtaining (reattaching to, or checking, launching and fingerprinting)
    /// every allowed candidate, concurrently. Returns the launches under way and the
    /// plugin records no candidate claims.
    fn launch_all(
        &self,
        candidates: Vec<Candidate>,
        mut records: Vec<PluginRecord>,
        policy: &Arc<trust::Policy>,
        ctx: &Arc<LoadContext>,
        slots: &Arc<Semaphore>,
    ) -> (Launches, Vec<PluginRecord>) {
        let mut launches = tokio::task::JoinSet::new();
        for c in candidates {
            if let Err(reason) = trust::allowed(&c.label, &policy.allow, &policy.deny) {
                self.skip_of(&c, None, candidate::skipped_status(&c, reason));
                continue;
            }
            let record = records
                .iter()
                .position(|r| record_matches(r, &c))
                .map(|i| records.swap_remove(i));
            let ctx = ctx.clone();
            let (store, slots, policy) = (self.records.clone(), slots.clone(), policy.clone());
            launches.spawn(async move {
                let r = obtain(&c, record, &ctx, &store, &slots, &policy).await;
                (c, r)
            });
        }
        (launches, records)
    }

    /// Records no candidate claims: the binary is gone, renamed, denied or no longer
    /// pinned. A process proven to be that plugin is no longer wanted.
    fn retire_all(
        &self,
        unclaimed: Vec<PluginRecord>,
        ctx: &LoadContext,
        slots: &Arc<Semaphore>,
    ) -> tokio::task::JoinSet<()> {
        let mut retiring = tokio::task::JoinSet::new();
        for rec in unclaimed {
            let (store, slots, timeout) = (self.records.clone(), slots.clone(), ctx.timeout);
            let nomad = ctx.nomad.clone();
            retiring.spawn(async move {
                let _slot = slots.acquire_owned().await;
                retire(
                    &rec,
                    timeout,
                    nomad,
                    "its binary is no longer a plugin candidate",
                )
                .await;
                store.forget(&rec.name).await;
            });
        }
        retiring
    }

    /// Collect the launches and keep one plugin per name (the highest version, or as
    /// `prefer_builtin` says); the others are shut down and listed as skipped, naming
    /// the binary that won.
    async fn pick_winners(
        &self,
        mut launches: Launches,
        config: &AgentConfig,
    ) -> BTreeMap<String, Fingerprinted> {
        let mut by_name: BTreeMap<String, Fingerprinted> = BTreeMap::new();
        let mut losers = Vec::new();
        while let Some(joined) = launches.join_next().await {
            let Ok((c, result)) = joined else { continue };
            let fp = match result {
                Ok(fp) => fp,
                Err(reason) => {
                    self.skip_of(&c, None, candidate::skipped_status(&c, reason));
                    continue;
                }
            };
            match by_name.remove(&fp.info.name) {
                None => {
                    by_name.insert(fp.info.name.clone(), fp);
                }
                Some(other) => {
                    let (win, lose) = if loader::prefer(&other, &fp, config.prefer_builtin) {
                        (other, fp)
                    } else {
                        (fp, other)
                    };
                    losers.push((lose, format!(
                        "another binary also provides {:?}: {} (version {}, {:?}) serves it instead",
                        win.info.name,
                        win.candidate.path.display(),
                        win.info.version,
                        win.candidate.source
                    )));
                    by_name.insert(win.info.name.clone(), win);
                }
            }
        }
        for (fp, reason) in losers {
            let mut row = candidate::skipped_status(&fp.candidate, reason);
            row.name = fp.info.name.clone();
            row.version = fp.info.version.clone();
            row.protocol = fp.process.protocol();
            if fp.process.is_reattached() {
                // The record is under the winner's name, which the winner rewrites.
                tracing::info!(plugin = %fp.info.name, pid = ?fp.process.pid(), "shutting down a reattached plugin that no longer wins its name");
            }
            fp.process.shutdown().await;
            self.skip_lost(&fp.candidate, fp.sha256.clone(), row);
        }
        by_name
    }

    /// Validate each winner's configuration against its schema and send it
    /// (concurrently); a plugin that refuses it is shut down and skipped. Returns the
    /// plugins now serving, recorded and in the catalog.
    async fn configure_all(
        &self,
        winners: BTreeMap<String, Fingerprinted>,
        policy: &Arc<trust::Policy>,
        ctx: &Arc<LoadContext>,
        stop: &CancellationToken,
    ) -> Vec<Arc<LoadedPlugin>> {
        let mut configuring = tokio::task::JoinSet::new();
        for (name, fp) in winners {
            let settings = ctx.settings(&name);
            let (ctx, policy, records) = (ctx.clone(), policy.clone(), self.records.clone());
            configuring.spawn(async move {
                let r = configure(&fp, &settings, &ctx, &policy).await;
                // A reattached process that fails now may be on its way out (a call
                // can fail on the closing connection before the exit is seen): give
                // the exit a moment to show.
                if r.is_err()
                    && fp.process.is_reattached()
                    && tokio::time::timeout(EXIT_GRACE, fp.process.exited())
                        .await
                        .is_ok()
                {
                    return relaunch_exited(fp, &ctx, &records, &policy).await;
                }
                (fp, r)
            });
        }
        let mut serving = Vec::new();
        while let Some(joined) = configuring.join_next().await {
            let Ok((fp, result)) = joined else { continue };
            if let Err(reason) = result {
                let mut row = candidate::skipped_status(&fp.candidate, reason);
                row.name = fp.info.name.clone();
                row.version = fp.info.version.clone();
                row.protocol = fp.process.protocol();
                fp.process.shutdown().await;
                self.records.forget(&fp.info.name).await;
                self.skip_of(&fp.candidate, Some(fp.sha256.clone()), row);
                continue;
            }
            tracing::info!(
                plugin = %fp.info.name,
                version = %fp.info.version,
                api_version = %fp.api_version,
                source = ?fp.candidate.source,
                path = %fp.candidate.path.display(),
                pid = ?fp.process.pid(),
                in_process = fp.process.in_process(),
                reattached = fp.process.is_reattached(),
                "plugin loaded"
            );
            self.records.save(&fp).await;
            let plugin = self.insert(fp, stop);
            self.progress.send_modify(|p| p.inserted += 1);
            serving.push(plugin);
        }
        serving
    }
}

/// How long a reattached process whose configuration failed is watched for its exit.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A reattached plugin process that exited before it could be configured: launch a
/// fresh one and configure that. Go plugins (Nomad's) die of SIGPIPE at their next log
/// line once the agent that held their stderr is gone, so after a `kill -9` of the
/// agent a reattach can succeed and the process be gone a moment later; Nomad's
/// client launches such a plugin again, and so does this.
async fn relaunch_exited(
    old: Fingerprinted,
    ctx: &LoadContext,
    records: &Records,
    policy: &trust::Policy,
) -> (Fingerprinted, Result<(), String>) {
    tracing::info!(
        plugin = %old.info.name,
        pid = ?old.process.pid(),
        "the reattached plugin process exited before it was configured; launching a fresh one"
    );
    records.forget(&old.info.name).await;
    match launch_checked(&old.candidate, ctx, records, policy).await {
        // The binary may have been replaced meanwhile: the fresh process must be the
        // plugin it replaces (same name and kind), or two would serve one name.
        Ok(fresh) if fresh.info.name != old.info.name || fresh.kind != old.kind => {
            let why = format!(
                "the reattached process exited, and the fresh one is another plugin \
                 ({:?} of type {:?})",
                fresh.info.name, fresh.kind
            );
            fresh.process.shutdown().await;
            (old, Err(why))
        }
        Ok(fresh) => {
            records.save(&fresh).await;
            let settings = ctx.settings(&fresh.info.name);
            let r = configure(&fresh, &settings, ctx, policy).await;
            (fresh, r)
        }
        Err(e) => (
            old,
            Err(format!(
                "the reattached process exited, and launching a fresh one failed: {e}"
            )),
        ),
    }
}

/// Launches under way: each candidate with what obtaining it gave.
type Launches = tokio::task::JoinSet<(Candidate, Result<Fingerprinted, String>)>;

/// Sweep every stray socket an earlier agent left (bounded by `slots`).
async fn sweep_all(strays: Vec<(PathBuf, PathBuf)>, ctx: &LoadContext, slots: &Arc<Semaphore>) {
    let mut sweeping = tokio::task::JoinSet::new();
    for (dir, sock) in strays {
        let (slots, timeout) = (slots.clone(), ctx.timeout);
        sweeping.spawn(async move {
            let _slot = slots.acquire_owned().await;
            sweep(&dir, &sock, timeout).await;
        });
    }
    while sweeping.join_next().await.is_some() {}
}

/// Plugin socket dirs in `socket_dir` (`drover-plugin-*/plugin.sock`, made by the SDK's
/// `serve`) that no serving plugin uses.
fn stray_sockets(socket_dir: &Path, serving: &[Arc<LoadedPlugin>]) -> Vec<(PathBuf, PathBuf)> {
    let in_use: Vec<PathBuf> = serving
        .iter()
        .filter_map(|p| p.process().socket_path())
        .collect();
    let Ok(entries) = std::fs::read_dir(socket_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("drover-plugin-")
        })
        .map(|e| (e.path(), e.path().join("plugin.sock")))
        .filter(|(_, sock)| !in_use.contains(sock))
        .collect()
}

/// Deal with a socket dir no serving plugin uses. Nobody listening: a plugin that died
/// without cleaning up (kill -9), so the dir goes. A plugin answering: a process an
/// earlier agent launched but was killed before recording (or whose record was lost);
/// it lives in our private socket dir and proves to be a plugin over RPC, so it is shut
/// down. One of our uid that cannot be asked (launched with AutoMTLS, whose key went
/// with the record) loses its socket dir instead: an SDK plugin exits by itself once
/// no host is connected and its socket is gone. Anything else is left alone.
async fn sweep(dir: &Path, sock: &Path, timeout: Duration) {
    let (peer, peer_uid) = match tokio::net::UnixStream::connect(sock).await {
        Ok(s) => match s.peer_cred() {
            Ok(c) => (c.pid(), Some(c.uid())),
            Err(_) => (None, None),
        },
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) =>
        {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "removed a dead plugin's socket dir")
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), "cannot remove a dead plugin's socket dir: {e}")
                }
            }
            return;
        }
        Err(e) => {
            tracing::debug!(socket = %sock.display(), "leaving socket alone: {e}");
            return;
        }
    };
    let Some(pid) = peer.and_then(|p| u32::try_from(p).ok()) else {
        return;
    };
    let Ok(start_time) = drover_plugin_sdk::client::process_start_time(pid) else {
        return;
    };
    let config = drover_plugin_sdk::client::ReattachConfig {
        addr: drover_plugin_sdk::handshake::PluginAddr::Unix(sock.to_owned()),
        pid,
        start_time,
        app_protocol_version: 1,
        path: std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default(),
        tls: None,
        multiplex_grpc: false,
    };
    // Its name is unknown: ask under a name no plugin can have ("?" is outside
    // [a-z0-9_-]) and take the one it answers with; then prove identity under it.
    let name = match PluginProcess::reattach("?", config.clone(), timeout).await {
        Err(drover_plugin_sdk::client::ReattachError::WrongPlugin { found, .. }) => found,
        Ok(_) => return,
        Err(e @ drover_plugin_sdk::client::ReattachError::Identity(_))
            if peer_uid == Some(rustix::process::geteuid().as_raw()) =>
        {
            // It answered the connection but not the question. Only a process of our
            // uid can have bound in our private (0700) socket dir, and nothing serving
            // uses this socket: its socket goes, then the directory if that is empty.
            let removed = std::fs::remove_file(sock).and_then(|()| std::fs::remove_dir(dir));
            match removed {
                Ok(()) => tracing::warn!(
                    pid,
                    socket = %sock.display(),
                    "a stray plugin process an earlier agent launched cannot be asked who \
                     it is ({e}; launched with AutoMTLS, its key went with its lost \
                     record): removed its socket, so that it exits once idle"
                ),
                Err(e) => tracing::warn!(
                    pid,
                    dir = %dir.display(),
                    "cannot remove a stray plugin's socket dir: {e}"
                ),
            }
            return;
        }
        Err(e) => {
            tracing::warn!(pid, socket = %sock.display(), "unknown process on a plugin socket left alone: {e}");
            return;
        }
    };
    match PluginProcess::reattach(name.clone(), config, timeout).await {
        Ok(p) => {
            let how = p.shutdown().await;
            tracing::warn!(
                plugin = %name,
                pid,
                "shut down a stray plugin process an earlier agent launched but never recorded ({how})"
            );
        }
        Err(e) => tracing::warn!(pid, plugin = %name, "stray plugin process left alone: {e}"),
    }
}

/// Does the stored record describe a process of this candidate (same binary, same
/// arguments)? Built-ins share the `drover` binary and differ by arguments.
fn record_matches(rec: &PluginRecord, c: &Candidate) -> bool {
    rec.reattach.path == c.path
        && rec.args.len() == c.args.len()
        && rec
            .args
            .iter()
            .zip(&c.args)
            .all(|(a, b)| std::ffi::OsStr::new(a) == b.as_os_str())
}

/// A fingerprinted process for `c`: the stored one if it can be taken over, otherwise
/// a freshly launched one.
async fn obtain(
    c: &Candidate,
    record: Option<PluginRecord>,
    ctx: &LoadContext,
    records: &Records,
    slots: &Semaphore,
    policy: &trust::Policy,
) -> Result<Fingerprinted, String> {
    if let Some(rec) = record {
        let attempt = {
            // Bounded: a semaphore slot, and `ctx.timeout` per step inside.
            let _slot = slots.acquire().await;
            try_reattach(c, &rec, ctx, records, policy).await
        };
        match attempt {
            Ok(fp) => return Ok(fp),
            Err(reason) => {
                let still_there = drover_plugin_sdk::client::process_start_time(rec.reattach.pid)
                    .is_ok_and(|t| t == rec.reattach.start_time);
                if still_there {
                    tracing::warn!(
                        plugin = %rec.name,
                        pid = rec.reattach.pid,
                        "not reattaching: {reason}; the process still runs and is left alone \
                         (never signalled unless proven to be the plugin); launching a fresh one"
                    );
                } else {
                    tracing::info!(
                        plugin = %rec.name,
                        pid = rec.reattach.pid,
                        "not reattaching: {reason}; launching a fresh process"
                    );
                }
                records.forget(&rec.name).await;
            }
        }
    }
    let fp = launch_checked(c, ctx, records, policy).await?;
    // Recorded as soon as it is identified, not only once it serves: an agent killed in
    // between must still find this process at its next start.
    records.save(&fp).await;
    Ok(fp)
}

/// Take over the process `rec` describes, or say why not. A binary that changed since
/// the process was launched is an upgrade: the old process is shut down (only once its
/// identity is proven) so that a fresh one runs the new code; tasks live in their
/// executors and survive that.
async fn try_reattach(
    c: &Candidate,
    rec: &PluginRecord,
    ctx: &LoadContext,
    records: &Records,
    policy: &trust::Policy,
) -> Result<Fingerprinted, String> {
    let sha = match records.check(c).await {
        Ok(binary) => binary.sha256,
        Err(reason) => {
            // Not supervised by anyone otherwise, and its file may not run any more.
            retire(
                rec,
                ctx.timeout,
                ctx.nomad.clone(),
                &format!("its binary fails the checks: {reason}"),
            )
            .await;
            return Err(reason);
        }
    };
    if !sha.eq_ignore_ascii_case(&rec.sha256) {
        retire(
            rec,
            ctx.timeout,
            ctx.nomad.clone(),
            "its binary changed (upgrade)",
        )
        .await;
        return Err(format!(
            "{} changed since pid {} was launched",
            c.path.display(),
            rec.reattach.pid
        ));
    }
    // The pins may have changed since it was launched: a binary that may not run now
    // does not keep running either.
    if let Err(reason) = policy.before_exec(c, &sha) {
        retire(
            rec,
            ctx.timeout,
            ctx.nomad.clone(),
            &format!("its binary may no longer run: {reason}"),
        )
        .await;
        return Err(reason);
    }
    // So may `plugin_auto_mtls`: a plugin keeps the transport it was launched with, so
    // one that no longer matches the config is replaced, as a binary that changed is.
    let auto_mtls = ctx.auto_mtls(&c.label);
    if auto_mtls != rec.reattach.tls.is_some() {
        let why = if auto_mtls {
            "AutoMTLS is now on for it (plugin_auto_mtls)"
        } else {
            "AutoMTLS is now off for it (plugin_auto_mtls)"
        };
        retire(rec, ctx.timeout, ctx.nomad.clone(), why).await;
        return Err(format!(
            "pid {} was launched with another transport: {why}",
            rec.reattach.pid
        ));
    }
    let process = PluginProcess::reattach_with(
        rec.name.clone(),
        rec.reattach.clone(),
        ctx.timeout,
        ctx.nomad.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    // Proven to be our plugin: from here on a failure shuts it down (adopt does).
    let fp = loader::adopt(c, process.into(), sha, ctx.timeout, &ctx.accepted).await?;
    tracing::info!(
        plugin = %rec.name,
        pid = rec.reattach.pid,
        "reattached to the running plugin process (not launched again)"
    );
    Ok(fp)
}

/// Shut down the process `rec` describes if, and only if, it proves to be that plugin.
async fn retire(
    rec: &PluginRecord,
    timeout: Duration,
    nomad: Option<drover_plugin_sdk::client::NomadHostOptions>,
    why: &str,
) {
    let reattached =
        PluginProcess::reattach_with(rec.name.clone(), rec.reattach.clone(), timeout, nomad);
    match reattached.await {
        Ok(p) => {
            tracing::info!(plugin = %rec.name, pid = p.pid(), "shutting down the old plugin process: {why}");
            let how = p.shutdown().await;
            tracing::info!(plugin = %rec.name, pid = p.pid(), "old plugin process stopped ({how})");
        }
        Err(e) => tracing::info!(
            plugin = %rec.name,
            pid = rec.reattach.pid,
            "old plugin process left alone ({why}), as it is not provably ours: {e}"
        ),
    }
}
