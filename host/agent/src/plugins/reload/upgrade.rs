//! Upgrading a served plugin to a new instance without a restart, as a reload
//! decides ([`Catalog::reload`]): the new instance is configured, proves with
//! `RecoverTask` that it can take every running task while the old one serves, then
//! replaces the old one in its [`LoadedPlugin`] (a generation bump, the new instance on
//! probation); every task of the driver is handed over to it (by the task runners,
//! through the [`TaskHandover`] seam), and only then is the old instance shut down. A
//! new instance that fails anywhere before the swap leaves the old one serving, with
//! the reason on both rows; one that refuses a task after the swap is rolled back.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use drover_api::{PluginChangeKind, PluginStatus};

use super::{Changes, pid_text, removed, same_file};
use crate::plugins::candidate;
use crate::plugins::catalog::{
    Catalog, HandoverProgress, Live, LoadedPlugin, ReloadEnv, live_from,
};
use crate::plugins::loader::Fingerprinted;
use crate::plugins::supervise::configure;

/// How long an upgrade waits for every task of the driver to move to the new instance
/// before it shuts the old one down all the same (a task still behind then finds the
/// old instance gone and attaches to the new one, as after a crash).
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// `RecoverTask` probes of a new instance in flight at once, before it replaces the
/// serving one.
const PROBE_CONCURRENCY: usize = 8;

/// Bound on one `RecoverTask` probe of a new instance. A probe that does not answer in
/// time says nothing about the task (the hand-over's own recovery retries it).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Catalog {
    /// Replace `p`'s instance with `fp`'s and hand every task over to it; on any
    /// failure before the swap the old instance keeps serving, and so it does when the
    /// new one refuses a task after the swap (the swap is rolled back). Returns whether
    /// `fp` now serves.
    pub(super) async fn upgrade(
        &self,
        p: &Arc<LoadedPlugin>,
        fp: Fingerprinted,
        env: &ReloadEnv,
        changes: &mut Changes,
    ) -> bool {
        let started = Instant::now();
        let (old_c, old_sha, old_version) = {
            let live = p.live();
            (
                live.candidate.clone(),
                live.sha256.clone(),
                live.version.clone(),
            )
        };
        let (new_c, new_version) = (fp.candidate.clone(), fp.info.version.clone());
        if let Err(reason) = configure(&fp, &env.ctx.settings(&p.name), &env.ctx, &env.policy).await
        {
            self.upgrade_failed(p, &fp, &old_version, reason, changes)
                .await;
            fp.process.shutdown().await;
            return false;
        }
        // While the old instance still serves, the new one proves it can take every
        // running task: a refusal here (a handle encoding it cannot read, say) must not
        // turn the tasks into lost ones after the swap.
        if let Err(reason) = self.probe(&p.name, &fp).await {
            self.upgrade_failed(p, &fp, &old_version, reason, changes)
                .await;
            fp.process.shutdown().await;
            return false;
        }
        let moving = self
            .handover()
            .map_or(0, |h| h.handover_progress(&p.name, 0).tasks);
        if !same_file(&old_c, &new_c) {
            tracing::warn!(
                plugin = %p.name,
                from = %old_c.path.display(),
                to = %new_c.path.display(),
                tasks = moving,
                "{} takes {:?} over: {moving} running tasks move to it",
                new_c.path.display(),
                p.name
            );
        }
        let new_pid = pid_text(&fp.process);
        // Recorded before the swap: an agent killed during the hand-over finds the new
        // instance at its next start (and sweeps the old one as a stray).
        self.records.save(&fp).await;
        self.drop_rows_of(&new_c);
        let fp_row = candidate::skipped_status(&fp.candidate, String::new());
        let (old, generation) = {
            let _swap = p.swap.lock().await;
            let mut live = p.live();
            let mut next = live_from(fp);
            // The old instance's health stands until the new one's first fingerprint,
            // which its supervisor asks for at once: no gap where StartTask is refused.
            next.state = live.state;
            next.reason = live.reason.clone();
            next.attributes = live.attributes.clone();
            let old = std::mem::replace(&mut *live, next);
            drop(live);
            let generation = *p.generation.borrow() + 1;
            p.probation.store(generation, Ordering::SeqCst);
            p.generation.send_replace(generation);
            (old, generation)
        };
        self.changes.send_modify(|n| *n += 1);
        let new_process = p.process();
        let progress = match self.wait_handover(p, generation, &new_process).await {
            Ok(progress) => progress,
            Err(why) => {
                let reason = format!("version {new_version} {why}");
                self.roll_back(p, old, fp_row, &new_version, &reason, changes)
                    .await;
                return false;
            }
        };
        p.probation.store(0, Ordering::SeqCst);
        let handover_ms = started.elapsed().as_millis();
        let old_pid = pid_text(&old.process);
        let how = old.process.shutdown().await;
        if !same_file(&old_c, &new_c) && !removed(&old_c.path) {
            let mut row = candidate::skipped_status(
                &old_c,
                format!(
                    "another binary also provides {:?}: {} (version {new_version}, {:?}) serves \
                     it instead",
                    p.name,
                    new_c.path.display(),
                    new_c.source
                ),
            );
            row.name = p.name.clone();
            row.version = old_version.clone();
            self.skip_lost(&old_c, old_sha, row);
        }
        // A hand-over that ends with tasks still behind is rolled back instead.
        let moved = format!("{} running tasks handed over", progress.tasks);
        changes.push(
            PluginChangeKind::Upgraded,
            &p.name,
            &new_c.path,
            format!(
                "version {old_version} ({}, pid {old_pid}) replaced by version {new_version} \
                 (pid {new_pid}) without a restart: {moved} in {handover_ms} ms; old instance \
                 stopped ({how})",
                old_c.path.display()
            ),
        );
        true
    }

    /// The rows of an upgrade that did not happen: a skipped row for the new file and
    /// a note on the serving row, both saying why.
    async fn upgrade_failed(
        &self,
        p: &LoadedPlugin,
        fp: &Fingerprinted,
        old_version: &str,
        reason: String,
        changes: &mut Changes,
    ) {
        let why = format!(
            "upgrade to version {} from {} failed: {reason}",
            fp.info.version,
            fp.candidate.path.display()
        );
        self.skip_fingerprinted(
            fp,
            format!("{why}; version {old_version} keeps serving"),
            false,
        );
        p.set_upgrade_failed(Some((
            fp.candidate.path.clone(),
            format!("{why}; this version keeps serving"),
        )));
        changes.push(PluginChangeKind::Failed, &p.name, &fp.candidate.path, why);
    }

    /// `RecoverTask` on `fp`'s new instance with the handle of every live task of
    /// `driver`, while the old instance still serves. Fails on the first answer other
    /// than `Ok` (a refusal, an error, a transport failure: a new instance that
    /// crashes or errors on a task it must take is no better than one that refuses
    /// it), when the probes together take longer than [`HANDOVER_TIMEOUT`], and when
    /// the new instance has exited by the end.
    async fn probe(&self, driver: &str, fp: &Fingerprinted) -> Result<(), String> {
        let version = fp.info.version.clone();
        let handles = self
            .handover()
            .map(|h| h.live_handles(driver))
            .unwrap_or_default();
        let client = fp.process.client();
        let slots = Arc::new(tokio::sync::Semaphore::new(PROBE_CONCURRENCY));
        let mut probes = tokio::task::JoinSet::new();
        for (id, handle) in handles {
            let (client, slots) = (client.clone(), slots.clone());
            probes.spawn(async move {
                // Never closed: acquiring cannot fail.
                let _slot = slots.acquire_owned().await.ok();
                let answer = tokio::time::timeout(PROBE_TIMEOUT, client.recover_task(handle)).await;
                (id, answer)
            });
        }
        let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
        let mut probed = 0;
        // Dropping the set on a failure aborts the probes still running.
        loop {
            let joined = match tokio::time::timeout_at(deadline, probes.join_next()).await {
                Ok(Some(joined)) => joined,
                Ok(None) => break,
                Err(_) => {
                    return Err(format!(
                        "version {version} did not recover the running tasks within \
                         {HANDOVER_TIMEOUT:?} ({probed} recovered)"
                    ));
                }
            };
            let (id, answer) = joined
                .map_err(|e| format!("a RecoverTask probe of version {version} failed: {e}"))?;
            match answer {
                Ok(Ok(())) => probed += 1,
                Ok(Err(e)) => return Err(format!("version {version} cannot take task {id}: {e}")),
                Err(_) => {
                    return Err(format!(
                        "version {version} did not answer RecoverTask for task {id} within \
                         {PROBE_TIMEOUT:?}"
                    ));
                }
            }
        }
        if fp.process.has_exited() {
            return Err(format!(
                "version {version} exited while it recovered the running tasks ({probed} recovered)"
            ));
        }
        tracing::debug!(plugin = %driver, probed, "new instance recovered every running task");
        Ok(())
    }

    /// The new instance refused a task after the swap: put the old instance back (a
    /// generation bump, so that every task attaches to it again), shut the new one
    /// down, and say why on both rows.
    async fn roll_back(
        &self,
        p: &Arc<LoadedPlugin>,
        old: Live,
        mut new_row: PluginStatus,
        new_version: &str,
        reason: &str,
        changes: &mut Changes,
    ) {
        // Its record first (the new instance's replaced it before the swap), so that
        // an agent killed now reattaches to the instance that keeps the tasks.
        if old.process.reattach_config().is_some() {
            self.records.save_live(&p.name, &old).await;
        } else {
            self.records.forget(&p.name).await;
        }
        let new = {
            let _swap = p.swap.lock().await;
            let mut live = p.live();
            let mut old = old;
            old.state = live.state;
            old.reason = live.reason.clone();
            let new = std::mem::replace(&mut *live, old);
            drop(live);
            p.probation.store(0, Ordering::SeqCst);
            p.generation.send_modify(|g| *g += 1);
            new
        };
        let old_version = p.live().version.clone();
        let why = format!(
            "upgrade to version {new_version} from {} rolled back: {reason}",
            new.candidate.path.display()
        );
        tracing::warn!(plugin = %p.name, "{why}; version {old_version} keeps serving");
        let how = new.process.shutdown().await;
        tracing::info!(plugin = %p.name, "refused instance stopped ({how})");
        new_row.name = p.name.clone();
        new_row.version = new_version.to_owned();
        new_row.reason = format!("{why}; version {old_version} keeps serving");
        self.drop_rows_of(&new.candidate);
        self.skip_of(&new.candidate, Some(new.sha256.clone()), new_row);
        p.set_upgrade_failed(Some((
            new.candidate.path.clone(),
            format!("{why}; this version keeps serving"),
        )));
        self.changes.send_modify(|n| *n += 1);
        changes.push(PluginChangeKind::Failed, &p.name, &new.candidate.path, why);
    }

    /// Wait (bounded) until no running task of `p` is attached to an instance older
    /// than `generation`. Fails (the caller rolls back) when the instance of
    /// `generation` refuses or fails to recover a task, exits, is replaced, or when
    /// tasks are still behind at [`HANDOVER_TIMEOUT`].
    async fn wait_handover(
        &self,
        p: &LoadedPlugin,
        generation: u64,
        new: &crate::plugins::instance::PluginInstance,
    ) -> Result<HandoverProgress, String> {
        let driver = p.name.as_str();
        let mut attachments = self.handover().map(|h| h.attachments());
        let mut generations = p.generation();
        let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
        loop {
            if let Some(a) = attachments.as_mut() {
                a.borrow_and_update();
            }
            generations.borrow_and_update();
            let progress = self
                .handover()
                .map(|h| h.handover_progress(driver, generation))
                .unwrap_or_default();
            if let Some((task, why)) = progress.refused {
                return Err(format!("cannot take task {task}: {why}"));
            }
            if new.has_exited() {
                return Err("exited during the hand-over".to_owned());
            }
            if *p.generation.borrow() != generation {
                return Err("was replaced during the hand-over".to_owned());
            }
            if progress.behind == 0 {
                return Ok(progress);
            }
            let changed = async {
                match attachments.as_mut() {
                    Some(a) => a.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    ok = changed => ok,
                    _ = new.exited() => true,
                    ok = generations.changed() => ok.is_ok(),
                }
            })
            .await;
            if !matches!(woke, Ok(true)) {
                tracing::warn!(
                    plugin = %driver,
                    tasks = progress.tasks,
                    behind = progress.behind,
                    "not every task moved to the new instance within {HANDOVER_TIMEOUT:?}"
                );
                return Err(format!(
                    "did not take {} of {} running tasks over within {HANDOVER_TIMEOUT:?}",
                    progress.behind, progress.tasks
                ));
            }
        }
    }
}
