//! Keeping a plugin's instance running: every launch of a plugin goes through
//! [`launch_checked`] (checks, policy, launch, fingerprint) and [`configure`], and
//! [`supervise`] follows each serving plugin's fingerprints and relaunches its process,
//! with backoff, whenever it dies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_api::PluginState;
use drover_plugin_sdk::Health;
use drover_plugin_sdk::client::PluginClient;
use tokio_stream::StreamExt as _;

use super::candidate::Candidate;
use super::catalog::{LoadContext, LoadedPlugin, Records, live_from};
use super::loader::{self, Fingerprinted};
use super::trust;

/// Backoff between relaunches of a crashed plugin: doubles from the first to the last.
const RELAUNCH_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(250), Duration::from_secs(30));
/// A plugin that ran this long before dying starts over at the shortest backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// A plugin whose first fingerprint has not come after this long is said to hang in
/// `Fingerprint` (it stays unusable, and the watcher keeps waiting for it).
const FIRST_FINGERPRINT_WAIT: Duration = Duration::from_secs(10);

/// Open and check `c`'s binary, check it against `policy`, and launch and fingerprint
/// exactly the bytes checked (the launcher executes the checked descriptor). Every
/// launch goes through here: the first one, and each relaunch after a crash.
pub(super) async fn launch_checked(
    c: &Candidate,
    ctx: &LoadContext,
    records: &Records,
    policy: &trust::Policy,
) -> Result<Fingerprinted, String> {
    let binary = records.check(c).await?;
    policy.before_exec(c, &binary.sha256)?;
    let launch = ctx.launch_settings(&c.label);
    loader::fingerprint(
        c,
        &binary,
        ctx.timeout,
        &ctx.socket_dir,
        &ctx.accepted,
        &launch,
    )
    .await
}

/// Validate and apply the plugin's configuration.
pub(super) async fn configure(
    fp: &Fingerprinted,
    settings: &crate::config::PluginSettings,
    ctx: &LoadContext,
    policy: &trust::Policy,
) -> Result<(), String> {
    policy.before_serve(&fp.info.name, fp.candidate.source, &fp.sha256)?;
    fp.config_schema
        .validate(&settings.config)
        .map_err(|e| format!("invalid [plugin.{}] config: {e}", fp.info.name))?;
    let mut agent = ctx.agent.clone();
    agent.api_version = fp.api_version.to_string();
    fp.process
        .client()
        .set_config(settings.config.to_string(), &agent)
        .await
        .map_err(|e| format!("SetConfig failed: {e}"))
}

/// Keep the plugin's state current from its fingerprints, and relaunch its process
/// with backoff whenever it dies. An instance replaced by an upgrade is not relaunched:
/// the supervisor follows the new one. Ends when the plugin's `stop` fires.
pub(super) async fn supervise(
    plugin: Arc<LoadedPlugin>,
    ctx: Arc<LoadContext>,
    records: Arc<Records>,
    policy: Arc<trust::Policy>,
) {
    let stop = plugin.stop.clone();
    let mut generation = plugin.generation();
    let mut backoff = RELAUNCH_BACKOFF.0;
    loop {
        let seen = *generation.borrow_and_update();
        let process = plugin.process();
        let watcher = if plugin.kind() == drover_api::PluginKind::Device {
            tokio::spawn(watch_device_fingerprints(plugin.clone(), process.client()))
        } else {
            tokio::spawn(watch_fingerprints(plugin.clone(), process.client()))
        };
        let launched = Instant::now();
        let mut how = tokio::select! {
            biased;
            () = stop.cancelled() => {
                watcher.abort();
                return;
            }
            changed = generation.changed() => {
                watcher.abort();
                if changed.is_err() {
                    return;
                }
                // Replaced (an upgrade): follow the new instance.
                continue;
            }
            how = process.exited() => how.to_string(),
        };
        watcher.abort();
        if *plugin.generation.borrow() != seen {
            // Replaced meanwhile: this exit is the old instance being shut down.
            continue;
        }
        if plugin.on_probation(seen) {
            // An upgrade's new instance died during its hand-over: the upgrade rolls
            // back to the old instance (a generation change); relaunching the file
            // that just failed would end the probation instead.
            tracing::warn!(plugin = %plugin.name, pid = ?process.pid(), "plugin process exited during its hand-over ({how})");
            tokio::select! {
                () = stop.cancelled() => return,
                _ = generation.changed() => {}
            }
            continue;
        }
        if launched.elapsed() > STABLE_AFTER {
            backoff = RELAUNCH_BACKOFF.0;
        }
        tracing::warn!(plugin = %plugin.name, pid = ?process.pid(), "plugin process exited ({how})");
        loop {
            plugin.set_state(
                PluginState::Unhealthy,
                format!("plugin process exited ({how}); relaunching in {backoff:?}"),
            );
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(RELAUNCH_BACKOFF.1);
            match relaunch(&plugin, seen, &ctx, &records, &policy).await {
                Ok(()) => break,
                Err(reason) => how = reason,
            }
        }
    }
}

/// Launch the plugin's file again after its instance of generation `seen` died. An
/// instance installed meanwhile (an upgrade) wins: the relaunched one is shut down.
async fn relaunch(
    plugin: &LoadedPlugin,
    seen: u64,
    ctx: &LoadContext,
    records: &Records,
    policy: &trust::Policy,
) -> Result<(), String> {
    let candidate = plugin.candidate();
    let fp = launch_checked(&candidate, ctx, records, policy).await?;
    if fp.info.name != plugin.name {
        let got = fp.info.name.clone();
        fp.process.shutdown().await;
        return Err(format!("relaunched binary now calls itself {got:?}"));
    }
    if let Err(reason) = configure(&fp, &ctx.settings(&plugin.name), ctx, policy).await {
        fp.process.shutdown().await;
        return Err(reason);
    }
    let _swap = plugin.swap.lock().await;
    if *plugin.generation.borrow() != seen {
        tracing::info!(plugin = %plugin.name, pid = ?fp.process.pid(), "relaunched instance not needed: the plugin was replaced meanwhile");
        fp.process.shutdown().await;
        return Ok(());
    }
    tracing::info!(plugin = %plugin.name, pid = ?fp.process.pid(), "plugin relaunched");
    crate::metrics::metrics()
        .plugin_restarts
        .get_or_create(&crate::metrics::PluginLabel {
            plugin: plugin.name.as_str().into(),
        })
        .inc();
    records.save(&fp).await;
    let mut live = plugin.live();
    let retiring = live.retiring.take();
    *live = live_from(fp);
    live.retiring = retiring;
    drop(live);
    plugin.generation.send_modify(|g| *g += 1);
    Ok(())
}

async fn watch_fingerprints(plugin: Arc<LoadedPlugin>, client: PluginClient) {
    let mut stream = match client.fingerprint().await {
        Ok(s) => Box::pin(s),
        Err(e) => {
            plugin.live().attributes.clear();
            plugin.set_state(PluginState::Unhealthy, format!("Fingerprint failed: {e}"));
            return;
        }
    };
    let first = tokio::time::timeout(FIRST_FINGERPRINT_WAIT, stream.next()).await;
    let mut first = match first {
        Ok(first) => Some(first),
        Err(_) => {
            tracing::warn!(plugin = %plugin.name, "no fingerprint within {FIRST_FINGERPRINT_WAIT:?}");
            plugin.set_state(
                PluginState::Unhealthy,
                format!(
                    "no fingerprint within {FIRST_FINGERPRINT_WAIT:?}: the driver hangs in \
                     Fingerprint; it takes no tasks until one comes"
                ),
            );
            None
        }
    };
    loop {
        let next = match first.take() {
            Some(first) => first,
            None => stream.next().await,
        };
        let Some(next) = next else { break };
        match next {
            Ok(fp) => {
                let state = match fp.health {
                    Health::Healthy => PluginState::Healthy,
                    Health::Unhealthy => PluginState::Unhealthy,
                    // Undetected, and whatever a newer SDK may add: not usable.
                    _ => PluginState::Undetected,
                };
                plugin.set_attributes(fp.attributes);
                plugin.set_state(state, fp.description);
            }
            Err(e) => {
                plugin.live().attributes.clear();
                plugin.set_state(
                    PluginState::Unhealthy,
                    format!("fingerprint stream failed: {e}"),
                );
                return;
            }
        }
    }
}

/// A device plugin's fingerprints: its device groups, kept on the plugin for the
/// node's registration. A failed stream empties them (the devices cannot be reserved
/// while the plugin does not answer) and is opened again; a dead process is the
/// supervisor's to relaunch.
async fn watch_device_fingerprints(plugin: Arc<LoadedPlugin>, client: PluginClient) {
    let mut retry = RELAUNCH_BACKOFF.0;
    loop {
        match client.device_fingerprint().await {
            Ok(mut stream) => {
                let mut first = true;
                loop {
                    let next = if first {
                        match tokio::time::timeout(FIRST_FINGERPRINT_WAIT, stream.next()).await {
                            Ok(n) => n,
                            Err(_) => {
                                plugin.set_state(
                                    PluginState::Unhealthy,
                                    format!(
                                        "no device fingerprint within {FIRST_FINGERPRINT_WAIT:?}"
                                    ),
                                );
                                stream.next().await
                            }
                        }
                    } else {
                        stream.next().await
                    };
                    first = false;
                    match next {
                        Some(Ok(groups)) => {
                            retry = RELAUNCH_BACKOFF.0;
                            if let Err(e) =
                                crate::cluster::fingerprint::check_plugin_devices(&groups)
                            {
                                // Nothing of a fingerprint out of bounds is kept; the
                                // next one may be fine.
                                plugin.set_devices(Vec::new());
                                plugin.set_state(
                                    PluginState::Unhealthy,
                                    format!("device fingerprint refused: {e}"),
                                );
                                continue;
                            }
                            let instances: usize = groups.iter().map(|g| g.instances.len()).sum();
                            plugin.set_devices(groups);
                            plugin.set_state(
                                PluginState::Healthy,
                                format!("{instances} device instance(s)"),
                            );
                        }
                        Some(Err(e)) => {
                            plugin.set_devices(Vec::new());
                            plugin.set_state(
                                PluginState::Unhealthy,
                                format!("device fingerprint stream failed: {e}"),
                            );
                            break;
                        }
                        None => {
                            plugin.set_devices(Vec::new());
                            plugin.set_state(
                                PluginState::Unhealthy,
                                "device fingerprint stream ended".into(),
                            );
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                plugin.set_devices(Vec::new());
                plugin.set_state(
                    PluginState::Unhealthy,
                    format!("device Fingerprint failed: {e}"),
                );
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RELAUNCH_BACKOFF.1);
    }
}
