//! Adding, upgrading and removing plugins while the agent runs: [`Catalog::reload`],
//! called by the `plugin_dir` watcher and by `drover plugin reload`.
//!
//! A reload compares the files in `plugin_dir` with what serves (path and sha256; the
//! hash cache keyed by file identity avoids hashing unchanged files again) and acts
//! only on what changed:
//!
//! - a new file is checked, launched, fingerprinted and configured, then serves;
//! - a file that wins a name already served (a higher version, or the serving file
//!   replaced in place) is an upgrade: the new instance is launched, fingerprinted and
//!   configured first, proves that it can take every running task, replaces the old
//!   one and takes its tasks over, or the old one keeps serving (`reload/upgrade.rs`).
//!   A file other than the serving one takes a name over only when it is named after
//!   the plugin or pinned ([`takeover_consent`]): plugins say their own names;
//! - a removed file hands its tasks to another candidate for the name if there is one
//!   (the built-in, say), or else stops taking new tasks and leaves once its running
//!   tasks have ended.

use std::sync::{Arc, Weak};
use std::time::Instant;

use drover_api::{PluginChange, PluginChangeKind, PluginSource, PluginStatus};

use super::candidate::{self, Candidate};
use super::catalog::{Catalog, LoadedPlugin, ReloadEnv, Skipped, TaskHandover, lock};
use super::instance::PluginInstance;
use super::loader::{self, Fingerprinted};
use super::supervise::{configure, launch_checked, supervise};
use super::trust;

mod upgrade;

/// Launches (or library loads) one reload runs at once: each may be a plugin process
/// starting or a library of up to 256 MiB being copied, and a 2-core machine given
/// dozens at once times their handshakes out.
const RELOAD_LAUNCHES: usize = 4;

/// The changes of one reload, each logged as it is made.
#[derive(Default)]
struct Changes(Vec<PluginChange>);

impl Changes {
    fn push(
        &mut self,
        kind: PluginChangeKind,
        name: &str,
        path: &std::path::Path,
        message: String,
    ) {
        match kind {
            PluginChangeKind::Failed | PluginChangeKind::Skipped => {
                tracing::warn!(plugin = %name, path = %path.display(), change = kind.as_str(), "{message}")
            }
            _ => {
                tracing::info!(plugin = %name, path = %path.display(), change = kind.as_str(), "{message}")
            }
        }
        self.0.push(PluginChange {
            name: name.to_owned(),
            path: path.to_owned(),
            kind,
            message,
        });
    }
}

/// Same file and arguments.
fn same_file(a: &Candidate, b: &Candidate) -> bool {
    a.path == b.path && a.args == b.args
}

/// Does the serving plugin (`source`, `version`) keep its name against `new`? The
/// rule of [`loader::prefer`], which picks the winner at start: an external file beats
/// a built-in unless `prefer_builtin`, then the higher version wins, a tie keeps the
/// serving one.
fn serving_keeps(
    serving: (PluginSource, &str),
    offered: (PluginSource, &str),
    prefer_builtin: bool,
) -> bool {
    if serving.0 != offered.0 {
        return (serving.0 == PluginSource::Builtin) == prefer_builtin;
    }
    let parse = |v| drover_plugin_sdk::version::parse_version(v).ok();
    parse(serving.1) >= parse(offered.1)
}

fn removed(path: &std::path::Path) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

impl Catalog {
    fn serving(&self) -> Vec<Arc<LoadedPlugin>> {
        self.loaded
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default()
    }

    fn handover(&self) -> Option<Arc<dyn TaskHandover>> {
        self.handover
            .read()
            .ok()
            .and_then(|h| h.as_ref().and_then(Weak::upgrade))
    }

    /// Bring the catalog in line with `plugin_dir` (see the module docs): add new
    /// plugins, upgrade served ones, retire removed ones. Returns what changed; a file
    /// that fails is a change of kind `Failed` and a row in [`Catalog::status`], never
    /// an error. Waits for initial loading first; one reload runs at a time.
    ///
    /// Files are tried again only when their bytes change, except with `retry_failed`
    /// (`drover plugin reload`): then unchanged files that failed (a handshake that
    /// timed out on a busy machine, a refused configuration) are tried again too.
    pub async fn reload(self: &Arc<Self>, retry_failed: bool) -> Vec<PluginChange> {
        // No environment: initial loading has not started (or never runs, in tests),
        // and there is nothing to compare with yet.
        let Some(env) = lock(&self.reload_env).clone() else {
            return Vec::new();
        };
        let mut progress = self.progress.subscribe();
        let _ = progress.wait_for(|p| p.done).await;
        let _one = self.reloading.lock().await;
        let started = Instant::now();
        let mut changes = Changes::default();
        let fresh = self.rescan(&env, retry_failed, &mut changes).await;
        let mut launches = tokio::task::JoinSet::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(RELOAD_LAUNCHES));
        for c in fresh {
            let (env, records, slots) = (env.clone(), self.records.clone(), slots.clone());
            launches.spawn(async move {
                // Never closed: acquiring cannot fail.
                let _slot = slots.acquire_owned().await.ok();
                let r = launch_checked(&c, &env.ctx, &records, &env.policy).await;
                (c, r)
            });
        }
        let mut launched = Vec::new();
        while let Some(joined) = launches.join_next().await {
            if let Ok(done) = joined {
                launched.push(done);
            }
        }
        // In file order, so that two files offering one name meet in a stable order.
        launched.sort_by(|a, b| a.0.path.cmp(&b.0.path));
        for (c, result) in launched {
            match result {
                Ok(fp) => self.offer(fp, &env, &mut changes).await,
                Err(reason) => self.launch_failed(&c, reason, &mut changes),
            }
        }
        for p in self.serving() {
            let c = p.candidate();
            if c.source == PluginSource::External && removed(&c.path) {
                self.file_removed(&p, &env, &mut changes).await;
            }
        }
        if !changes.0.is_empty() {
            tracing::info!(
                changes = changes.0.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "plugin reload finished"
            );
        }
        changes.0
    }

    /// List `plugin_dir` again: rows for files refused by the scan, rows kept for files
    /// unchanged since they were last tried. Returns the new or changed files.
    async fn rescan(
        &self,
        env: &ReloadEnv,
        retry_failed: bool,
        changes: &mut Changes,
    ) -> Vec<Candidate> {
        let (scanned, refused) = loader::scan_plugin_dir(&env.plugin_dir);
        let old: Vec<Skipped> = self.skipped.read().map(|s| s.clone()).unwrap_or_default();
        let is_new_row = |row: &PluginStatus| {
            !old.iter()
                .any(|o| o.row.path == row.path && o.row.reason == row.reason)
        };
        // Built-ins run from the agent's own binary, which does not change under it.
        let mut rows: Vec<Skipped> = old
            .iter()
            .filter(|s| s.row.source == PluginSource::Builtin)
            .cloned()
            .collect();
        let mut refuse = |row: PluginStatus, rows: &mut Vec<Skipped>| {
            if is_new_row(&row) {
                changes.push(
                    PluginChangeKind::Skipped,
                    &row.name,
                    &row.path,
                    row.reason.clone(),
                );
            }
            rows.push(Skipped::refused(row));
        };
        for row in refused {
            refuse(row, &mut rows);
        }
        let serving = self.serving();
        let mut fresh = Vec::new();
        for c in scanned {
            if let Err(reason) = trust::allowed(&c.label, &env.policy.allow, &env.policy.deny) {
                refuse(candidate::skipped_status(&c, reason), &mut rows);
                continue;
            }
            let sha = match self.records.check(&c).await {
                Ok(binary) => binary.sha256,
                Err(reason) => {
                    refuse(candidate::skipped_status(&c, reason), &mut rows);
                    continue;
                }
            };
            let serves = serving.iter().any(|p| {
                let live = p.live();
                same_file(&live.candidate, &c) && live.sha256 == sha
            });
            if serves {
                continue;
            }
            if let Some(kept) = old
                .iter()
                .find(|o| o.is_of(&c) && o.sha256.as_deref() == Some(sha.as_str()))
                && (kept.lost || !retry_failed)
            {
                rows.push(kept.clone());
                continue;
            }
            fresh.push(c);
        }
        for p in &serving {
            let own = p.candidate();
            let refused_now = rows.iter().find(|r| {
                r.is_of(&own) && r.sha256.is_none() && own.source == PluginSource::External
            });
            let failed_file = p.live().upgrade_failed.as_ref().map(|(f, _)| f.clone());
            if let Some(row) = refused_now {
                // Its file now fails the checks (mode, owner): the instance started
                // from it keeps serving, but could not be launched from it again.
                p.set_upgrade_failed(Some((
                    own.path.clone(),
                    format!(
                        "its file now fails the checks: {}; the running instance keeps serving",
                        row.row.reason
                    ),
                )));
            } else if let Some(file) = failed_file {
                // The file that failed to replace it is gone, or will be tried again.
                let still_failing = rows.iter().any(|r| r.row.path == file);
                if !still_failing {
                    p.set_upgrade_failed(None);
                }
            }
        }
        if let Ok(mut s) = self.skipped.write() {
            *s = rows;
        }
        fresh
    }

    /// A new or changed file did not get as far as a fingerprint.
    fn launch_failed(&self, c: &Candidate, reason: String, changes: &mut Changes) {
        for p in self.serving() {
            if same_file(&p.candidate(), c) {
                // The serving file was replaced by bytes that do not run: the instance
                // started from the old bytes keeps serving.
                let version = p.live().version.clone();
                p.set_upgrade_failed(Some((
                    c.path.clone(),
                    format!(
                        "upgrade failed: its file was replaced, but the new one fails: {reason}; \
                         version {version} keeps serving"
                    ),
                )));
            }
        }
        changes.push(PluginChangeKind::Failed, &c.label, &c.path, reason.clone());
        self.skip_of(c, None, candidate::skipped_status(c, reason));
    }

    /// A new or changed file was fingerprinted: add it, upgrade to it, or skip it.
    async fn offer(
        self: &Arc<Self>,
        fp: Fingerprinted,
        env: &Arc<ReloadEnv>,
        changes: &mut Changes,
    ) {
        let name = fp.info.name.clone();
        // A serving plugin whose file now provides another name has lost its file.
        let displaced = self
            .serving()
            .into_iter()
            .find(|p| p.name != name && same_file(&p.candidate(), &fp.candidate));
        match self.get(&name) {
            None => self.add(fp, env, changes).await,
            Some(p) => {
                let (serving_c, serving_version) = {
                    let live = p.live();
                    (live.candidate.clone(), live.version.clone())
                };
                let wins = same_file(&serving_c, &fp.candidate)
                    || p.retiring().is_some()
                    || !serving_keeps(
                        (serving_c.source, &serving_version),
                        (fp.candidate.source, &fp.info.version),
                        env.prefer_builtin,
                    );
                let consent = if same_file(&serving_c, &fp.candidate) {
                    Ok(())
                } else {
                    takeover_consent(&fp, &serving_c, &env.policy)
                };
                if let (true, Err(reason)) = (wins, &consent) {
                    changes.push(
                        PluginChangeKind::Skipped,
                        &name,
                        &fp.candidate.path,
                        reason.clone(),
                    );
                    self.skip_fingerprinted(&fp, reason.clone(), true);
                    fp.process.shutdown().await;
                } else if wins {
                    self.upgrade(&p, fp, env, changes).await;
                } else {
                    let reason = format!(
                        "another binary also provides {name:?}: {} (version {serving_version}, \
                         {:?}) serves it instead",
                        serving_c.path.display(),
                        serving_c.source
                    );
                    changes.push(
                        PluginChangeKind::Skipped,
                        &name,
                        &fp.candidate.path,
                        reason.clone(),
                    );
                    self.skip_fingerprinted(&fp, reason, true);
                    fp.process.shutdown().await;
                }
            }
        }
        if let Some(p) = displaced {
            self.file_removed(&p, env, changes).await;
        }
    }

    /// The row of a fingerprinted candidate that does not serve.
    /// `lost`: it works, but another file serves its name.
    fn skip_fingerprinted(&self, fp: &Fingerprinted, reason: String, lost: bool) {
        let mut row = candidate::skipped_status(&fp.candidate, reason);
        row.name = fp.info.name.clone();
        row.version = fp.info.version.clone();
        row.protocol = fp.process.protocol();
        self.drop_rows_of(&fp.candidate);
        if lost {
            self.skip_lost(&fp.candidate, fp.sha256.clone(), row);
        } else {
            self.skip_of(&fp.candidate, Some(fp.sha256.clone()), row);
        }
    }

    fn drop_rows_of(&self, c: &Candidate) {
        if let Ok(mut s) = self.skipped.write() {
            s.retain(|row| !row.is_of(c));
        }
    }

    /// A name nobody serves: configure the new plugin and serve it.
    async fn add(self: &Arc<Self>, fp: Fingerprinted, env: &Arc<ReloadEnv>, changes: &mut Changes) {
        let name = fp.info.name.clone();
        if let Err(reason) = configure(&fp, &env.ctx.settings(&name), &env.ctx, &env.policy).await {
            changes.push(
                PluginChangeKind::Failed,
                &name,
                &fp.candidate.path,
                reason.clone(),
            );
            self.skip_fingerprinted(&fp, reason, false);
            fp.process.shutdown().await;
            return;
        }
        self.drop_rows_of(&fp.candidate);
        changes.push(
            PluginChangeKind::Added,
            &name,
            &fp.candidate.path,
            format!(
                "plugin added without a restart: version {} (pid {})",
                fp.info.version,
                pid_text(&fp.process)
            ),
        );
        self.records.save(&fp).await;
        let plugin = self.insert(fp, &env.stop);
        tokio::spawn(supervise(
            plugin,
            env.ctx.clone(),
            self.records.clone(),
            env.policy.clone(),
        ));
    }

    /// `p`'s file is gone: hand its tasks to another file that provides the name, or
    /// retire it (no new tasks; it leaves once its running tasks end).
    async fn file_removed(
        self: &Arc<Self>,
        p: &Arc<LoadedPlugin>,
        env: &ReloadEnv,
        changes: &mut Changes,
    ) {
        let gone = p.candidate();
        for alt in self.alternatives(&p.name, env) {
            match launch_checked(&alt, &env.ctx, &self.records, &env.policy).await {
                Ok(fp) if fp.info.name == p.name => {
                    // A built-in needs no consent; another file claiming the name does.
                    if fp.candidate.source == PluginSource::External
                        && let Err(reason) = takeover_consent(&fp, &gone, &env.policy)
                    {
                        tracing::info!(plugin = %p.name, path = %alt.path.display(), "cannot take over a removed plugin's tasks: {reason}");
                        fp.process.shutdown().await;
                        continue;
                    }
                    if self.upgrade(p, fp, env, changes).await {
                        changes.push(
                            PluginChangeKind::Removed,
                            &p.name,
                            &gone.path,
                            format!(
                                "its file was removed; {} serves {:?} instead",
                                alt.path.display(),
                                p.name
                            ),
                        );
                        return;
                    }
                }
                Ok(fp) => {
                    fp.process.shutdown().await;
                }
                Err(reason) => tracing::info!(
                    plugin = %p.name,
                    path = %alt.path.display(),
                    "cannot take over a removed plugin's tasks: {reason}"
                ),
            }
        }
        self.retire_plugin(p, &gone.path, changes).await;
    }

    /// Other candidates known to provide `name`: external files that lost it (their
    /// rows carry its name and a version), and the built-in of that name; in the order
    /// the start-up rule prefers them.
    fn alternatives(&self, name: &str, env: &ReloadEnv) -> Vec<Candidate> {
        let mut external: Vec<(Option<semver::Version>, Candidate)> = self
            .skipped
            .read()
            .map(|s| {
                s.iter()
                    .filter(|s| {
                        s.row.source == PluginSource::External
                            && s.row.name == name
                            && !s.row.version.is_empty()
                            && !removed(&s.row.path)
                    })
                    .map(|s| {
                        (
                            drover_plugin_sdk::version::parse_version(&s.row.version).ok(),
                            s.candidate.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        external.sort_by(|a, b| b.0.cmp(&a.0));
        let builtin = env
            .builtins
            .iter()
            .filter(|b| b.name == name)
            .map(|b| Candidate {
                path: b.command.clone(),
                args: b.args.clone(),
                source: PluginSource::Builtin,
                label: b.name.clone(),
            });
        let external = external.into_iter().map(|(_, c)| c);
        if env.prefer_builtin {
            builtin.chain(external).collect()
        } else {
            external.chain(builtin).collect()
        }
    }

    /// No new tasks for `p`; it leaves the catalog once its running tasks have ended
    /// (at once when it has none).
    async fn retire_plugin(
        self: &Arc<Self>,
        p: &Arc<LoadedPlugin>,
        path: &std::path::Path,
        changes: &mut Changes,
    ) {
        let handover = self.handover();
        let live = handover
            .as_ref()
            .map_or(0, |h| h.handover_progress(&p.name, 0).tasks);
        if live == 0 {
            self.unload(p).await;
            changes.push(
                PluginChangeKind::Removed,
                &p.name,
                path,
                "its file was removed and it runs no task: it left the catalog".into(),
            );
            return;
        }
        let why = format!(
            "its file {} was removed: it takes no new tasks, and leaves once its running \
             tasks have ended",
            path.display()
        );
        p.set_retiring(why.clone());
        changes.push(
            PluginChangeKind::Removing,
            &p.name,
            path,
            format!("{why} ({live} running)"),
        );
        let (me, p, generation) = (self.clone(), p.clone(), *p.generation.borrow());
        let Some(handover) = handover else { return };
        tokio::spawn(async move {
            let mut attachments = handover.attachments();
            loop {
                attachments.borrow_and_update();
                if p.retiring().is_none() || *p.generation.borrow() != generation {
                    // A new file took the name over meanwhile.
                    return;
                }
                if handover.handover_progress(&p.name, 0).tasks == 0 {
                    break;
                }
                tokio::select! {
                    changed = attachments.changed() => if changed.is_err() { return },
                    () = p.stop.cancelled() => return,
                }
            }
            let _one = me.reloading.lock().await;
            if p.retiring().is_some() && *p.generation.borrow() == generation {
                me.unload(&p).await;
                tracing::info!(plugin = %p.name, change = "removed", "the last task of a removed plugin ended: it left the catalog");
            }
        });
    }

    /// Take `p` out of the catalog: supervisor stopped, instance shut down, record gone.
    async fn unload(&self, p: &Arc<LoadedPlugin>) {
        if let Ok(mut l) = self.loaded.write()
            && l.get(&p.name).is_some_and(|q| Arc::ptr_eq(q, p))
        {
            l.remove(&p.name);
        }
        p.stop.cancel();
        let how = p.process().shutdown().await;
        self.records.forget(&p.name).await;
        self.changes.send_modify(|n| *n += 1);
        tracing::info!(plugin = %p.name, "plugin instance stopped ({how})");
    }
}

/// May `fp`, a file other than the one serving its name (`serving`), take that name
/// over with its running tasks? A plugin says its own name, and plugins may lie: the
/// operator consents by naming the file after the plugin (`NAME`,
/// `drover-driver-NAME`, `NAME.so`), or by pinning its bytes under `[plugin.NAME]`.
/// The agent's own binary (a built-in) needs no consent.
fn takeover_consent(
    fp: &Fingerprinted,
    serving: &Candidate,
    policy: &trust::Policy,
) -> Result<(), String> {
    let name = fp.info.name.as_str();
    if consents(&fp.candidate, name, &fp.sha256, &policy.pins) {
        return Ok(());
    }
    // The names the file may have: the plugin's, and an older name of it (`rawexec`
    // for `raw_exec`: the raw exec driver's binary is `drover-driver-rawexec`).
    let spellings: Vec<&str> = std::iter::once(name)
        .chain(
            drover_api::DRIVER_ALIASES
                .iter()
                .filter(|(_, new)| *new == name)
                .map(|(old, _)| *old),
        )
        .collect();
    let files: Vec<String> = spellings
        .iter()
        .flat_map(|n| [(*n).to_owned(), format!("drover-driver-{n}")])
        .collect();
    Err(format!(
        "{} calls itself {name:?}, which {} serves: a file takes over a served name only \
         when it is named {}, or {name}.so (a library), or when [plugin.{name}] sha256 pins \
         its bytes; rename the file, or pin it, to allow the takeover",
        fp.candidate.path.display(),
        serving.path.display(),
        files.join(", ")
    ))
}

/// [`takeover_consent`]'s rule: may candidate `c`, whose bytes hash to `sha256`, serve
/// `name` in place of another file?
fn consents(
    c: &Candidate,
    name: &str,
    sha256: &str,
    pins: &std::collections::BTreeMap<String, String>,
) -> bool {
    let label = c.label.as_str();
    // Names compared as the driver names they stand for: `drover-driver-rawexec` (the
    // raw exec driver's binary) serves `raw_exec`, the driver's name since `rawexec`.
    let names =
        |n: &str| drover_api::canonical_driver_name(n) == drover_api::canonical_driver_name(name);
    c.source == PluginSource::Builtin
        || names(label)
        || label.strip_prefix("drover-driver-").is_some_and(names)
        || pins.get(name).is_some_and(|pin| pin == sha256)
}

fn pid_text(p: &PluginInstance) -> String {
    p.pid()
        .map_or_else(|| "in the agent".to_owned(), |pid| pid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use PluginSource::{Builtin, External};

    #[test]
    fn a_file_takes_a_served_name_over_only_when_named_after_it_or_pinned() {
        let file = |name: &str| Candidate::external(std::path::Path::new("/plugins").join(name));
        let none = std::collections::BTreeMap::new();
        assert!(consents(&file("rawexec"), "rawexec", "aa", &none));
        // The raw exec driver's binary and Nomad's name for it.
        assert!(consents(
            &file("drover-driver-rawexec"),
            "raw_exec",
            "aa",
            &none
        ));
        assert!(consents(&file("raw_exec"), "raw_exec", "aa", &none));
        assert!(consents(&file("rawexec"), "raw_exec", "aa", &none));
        assert!(consents(
            &file("drover-driver-rawexec"),
            "rawexec",
            "aa",
            &none
        ));
        assert!(consents(&file("rawexec.so"), "rawexec", "aa", &none));
        assert!(consents(&file("librawexec.so"), "rawexec", "aa", &none));
        assert!(!consents(&file("acme-gpu"), "rawexec", "aa", &none));
        assert!(!consents(&file("rawexec-2"), "rawexec", "aa", &none));
        assert!(!consents(
            &file("drover-driver-rawexec"),
            "exec",
            "aa",
            &none
        ));
        let pins = [("rawexec".to_owned(), "aa".to_owned())].into();
        assert!(consents(&file("acme-gpu"), "rawexec", "aa", &pins));
        assert!(!consents(&file("acme-gpu"), "rawexec", "bb", &pins));
        let builtin = Candidate {
            path: "/usr/bin/drover".into(),
            args: vec!["plugin".into(), "serve".into(), "rawexec".into()],
            source: Builtin,
            label: "rawexec".into(),
        };
        assert!(consents(&builtin, "rawexec", "cc", &pins));
    }

    #[test]
    fn a_file_takes_a_served_name_over_by_the_start_up_rule() {
        // Same source: only a higher version wins; a tie keeps what serves.
        assert!(!serving_keeps(
            (External, "1.0.0"),
            (External, "1.1.0"),
            false
        ));
        assert!(serving_keeps(
            (External, "1.1.0"),
            (External, "1.1.0"),
            false
        ));
        assert!(serving_keeps(
            (External, "1.10.0"),
            (External, "1.9.0"),
            false
        ));
        // An external file beats the built-in whatever its version, unless
        // prefer_builtin.
        assert!(!serving_keeps(
            (Builtin, "9.0.0"),
            (External, "0.1.0"),
            false
        ));
        assert!(serving_keeps((Builtin, "0.1.0"), (External, "9.0.0"), true));
        assert!(serving_keeps(
            (External, "0.1.0"),
            (Builtin, "9.0.0"),
            false
        ));
        assert!(!serving_keeps(
            (External, "9.0.0"),
            (Builtin, "0.1.0"),
            true
        ));
    }
}
