//! Plugin logs: JSON lines on stderr (plugin side) and their replay into the host's
//! `tracing` (host side).
//!
//! A line is one JSON object with `@level` (trace/debug/info/warn/error), `@message`,
//! `@timestamp` (RFC 3339, UTC, exactly 6 fractional digits) and `@module`; any other
//! keys are fields. This is go-plugin's hclog JSON format, so Go plugins log the same way.

use std::io::Write as _;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, Layered};
use tracing_subscriber::{EnvFilter, Registry};

/// The `tracing` target of plugin log lines replayed in a host.
const FORWARDED_TARGET: &str = "drover::plugin";

/// Environment variable holding the plugin's log filter (`tracing` EnvFilter syntax).
pub const ENV_PLUGIN_LOG: &str = "DROVER_PLUGIN_LOG";

/// A `tracing` layer that writes every event as one hclog-style JSON line to stderr.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// let subscriber = tracing_subscriber::registry().with(drover_plugin_sdk::logging::JsonStderrLayer);
/// tracing::subscriber::with_default(subscriber, || tracing::info!(task = "t1", "started"));
/// ```
#[derive(Debug, Default)]
pub struct JsonStderrLayer;

struct FieldsVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for FieldsVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.insert(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, Value::from(value));
    }
}

impl FieldsVisitor<'_> {
    fn insert(&mut self, field: &Field, value: Value) {
        let key = if field.name() == "message" {
            "@message".to_owned()
        } else {
            field.name().to_owned()
        };
        self.0.insert(key, value);
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// Format one log line. Public so that tests and non-`tracing` code can produce the
/// exact format.
///
/// ```
/// let line = drover_plugin_sdk::logging::format_line("info", "hello", "my_driver", Default::default(),
///     std::time::SystemTime::UNIX_EPOCH);
/// assert_eq!(line, r#"{"@level":"info","@message":"hello","@module":"my_driver","@timestamp":"1970-01-01T00:00:00.000000Z"}"#);
/// ```
pub fn format_line(
    level: &str,
    message: &str,
    module: &str,
    mut fields: Map<String, Value>,
    at: std::time::SystemTime,
) -> String {
    fields.insert("@level".into(), Value::String(level.into()));
    fields.insert("@message".into(), Value::String(message.into()));
    fields.insert("@module".into(), Value::String(module.into()));
    fields.insert(
        "@timestamp".into(),
        Value::String(humantime::format_rfc3339_micros(at).to_string()),
    );
    Value::Object(fields).to_string()
}

/// The JSON line (without its newline) for one event.
fn event_line(event: &Event<'_>) -> String {
    let mut fields = Map::new();
    event.record(&mut FieldsVisitor(&mut fields));
    let message = match fields.remove("@message") {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let meta = event.metadata();
    format_line(
        level_name(meta.level()),
        &message,
        meta.target(),
        fields,
        std::time::SystemTime::now(),
    )
}

impl<S: Subscriber> Layer<S> for JsonStderrLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let line = event_line(event);
        // One write per line so lines from several threads never interleave.
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(format!("{line}\n").as_bytes());
    }
}

/// Where an in-process plugin's log lines go: the pipe its host gave at start, until
/// its runtime stops (then nowhere; closing it is how the host learns the runtime
/// stopped). A library loaded into a host has its own copy of this static (and of
/// `tracing`), so this is never the host's log.
static LOG_SINK: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Send this library's log lines to `sink` (`None`: drop them and close the old one).
pub(crate) fn set_log_sink(sink: Option<std::fs::File>) {
    let old = match LOG_SINK.lock() {
        Ok(mut s) => std::mem::replace(&mut *s, sink),
        Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), sink),
    };
    drop(old);
}

/// The in-process form of [`JsonStderrLayer`]: the same lines, to the log sink.
struct JsonSinkLayer;

impl<S: Subscriber> Layer<S> for JsonSinkLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        // A host's replay of plugin logs is never the plugin's own line. Where host and
        // plugin share one `tracing` (a driver linked into its host, in tests), writing
        // it back to the pipe would feed it to the replay again, for ever.
        if event.metadata().target() == FORWARDED_TARGET {
            return;
        }
        let line = format!("{}\n", event_line(event));
        let mut sink = match LOG_SINK.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(f) = sink.as_mut() {
            // One write per line (a pipe write under PIPE_BUF is atomic; longer ones
            // are serialised by the lock).
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Install the in-process logger (this library's own `tracing`): the same JSON lines
/// as [`init_plugin_logging`], written to the log sink, at `info`. The filter is not
/// read from the environment: that is the host's, shared by every library in it.
pub(crate) fn init_inproc_logging() {
    use tracing_subscriber::prelude::*;
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(JsonSinkLayer)
        .try_init();
}

/// Install the JSON stderr logger as the global `tracing` subscriber, filtered by
/// [`ENV_PLUGIN_LOG`] (default `info`). [`crate::serve`] calls this; call it yourself
/// only if you serve by other means.
///
/// ```no_run
/// drover_plugin_sdk::logging::init_plugin_logging();
/// tracing::info!("visible in the agent's log under this plugin's name");
/// ```
pub fn init_plugin_logging() {
    use tracing_subscriber::util::SubscriberInitExt as _;
    let spec = std::env::var(ENV_PLUGIN_LOG).ok();
    let _ = plugin_subscriber(spec.as_deref(), JsonStderrLayer).try_init();
}

/// A plugin's logger: `output` under the filter `spec` (EnvFilter syntax; `info` when
/// unset or invalid), over [`Spanless`] unless a directive names a span
/// (`target[span{field=value}]=level`), which needs spans tracked from creation to
/// close: then over the registry.
fn plugin_subscriber<L>(spec: Option<&str>, output: L) -> Box<dyn Subscriber + Send + Sync>
where
    L: Layer<Layered<EnvFilter, Registry>>
        + Layer<Layered<EnvFilter, Spanless>>
        + Send
        + Sync
        + 'static,
{
    use tracing_subscriber::layer::SubscriberExt as _;
    let filter = spec
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if spec.is_some_and(|s| s.contains('[')) {
        Box::new(tracing_subscriber::registry().with(filter).with(output))
    } else {
        Box::new(Spanless::default().with(filter).with(output))
    }
}

/// The subscriber under a plugin's logger when no directive names a span: it keeps
/// nothing of spans, because a log line carries no span's fields (see
/// [`JsonStderrLayer`]).
///
/// The registry, which would keep them, costs a launch its first-use allocations
/// (a sharded slab, tens of pages faulted in before the handshake line), and every
/// span of the libraries under the plugin (h2, tonic, tower at debug and trace) then
/// a slot in it.
#[derive(Debug)]
struct Spanless {
    /// The next span's id: never reused, as `tracing` wants ids of open spans to be
    /// unique.
    next_id: std::sync::atomic::AtomicU64,
}

impl Default for Spanless {
    fn default() -> Self {
        Spanless {
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }
}

impl Subscriber for Spanless {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Zero is not an id; u64 ids do not run out.
        tracing::span::Id::from_u64(id.max(1))
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// A parsed plugin log line (host side: feature `launcher`).
#[cfg(feature = "launcher")]
#[derive(Debug, Clone, PartialEq)]
pub struct PluginLogLine {
    /// Its level.
    pub level: Level,
    /// `@message`.
    pub message: String,
    /// `@module`, if any.
    pub module: Option<String>,
    /// Every other key, as compact JSON (`{}` when none).
    pub fields: String,
}

#[cfg(feature = "launcher")]
impl PluginLogLine {
    /// Parse one stderr line; `None` when it is not an hclog-style JSON object.
    ///
    /// ```
    /// use drover_plugin_sdk::logging::PluginLogLine;
    /// let l = PluginLogLine::parse(r#"{"@level":"warn","@message":"disk low","free":3}"#).unwrap();
    /// assert_eq!(l.level, tracing::Level::WARN);
    /// assert_eq!(l.fields, r#"{"free":3}"#);
    /// assert!(PluginLogLine::parse("panicked at main.rs").is_none());
    /// ```
    pub fn parse(line: &str) -> Option<Self> {
        let Value::Object(mut map) = serde_json::from_str::<Value>(line.trim()).ok()? else {
            return None;
        };
        let level = match map.remove("@level")?.as_str()? {
            "trace" => Level::TRACE,
            "debug" => Level::DEBUG,
            "info" => Level::INFO,
            "warn" | "warning" => Level::WARN,
            "error" => Level::ERROR,
            _ => return None,
        };
        let message = match map.remove("@message")? {
            Value::String(s) => s,
            other => other.to_string(),
        };
        let module = map
            .remove("@module")
            .and_then(|m| m.as_str().map(str::to_owned));
        map.remove("@timestamp");
        let fields = Value::Object(map).to_string();
        Some(PluginLogLine {
            level,
            message,
            module,
            fields,
        })
    }
}

/// Replay one line of a plugin's stderr as a host `tracing` event with field
/// `plugin = name`. Lines that are not plugin JSON are logged verbatim at info (host
/// side: feature `launcher`).
///
/// ```
/// drover_plugin_sdk::logging::forward_plugin_log("docker", r#"{"@level":"warn","@message":"slow pull"}"#);
/// drover_plugin_sdk::logging::forward_plugin_log("docker", "panicked at src/main.rs:3");
/// ```
#[cfg(feature = "launcher")]
pub fn forward_plugin_log(plugin: &str, line: &str) {
    let Some(l) = PluginLogLine::parse(line) else {
        tracing::info!(target: "drover::plugin", plugin, "{}", line.trim_end());
        return;
    };
    let module = l.module.as_deref().unwrap_or("");
    let fields = if l.fields == "{}" { "" } else { &l.fields };
    match l.level {
        Level::TRACE => {
            tracing::trace!(target: "drover::plugin", plugin, module, fields, "{}", l.message)
        }
        Level::DEBUG => {
            tracing::debug!(target: "drover::plugin", plugin, module, fields, "{}", l.message)
        }
        Level::INFO => {
            tracing::info!(target: "drover::plugin", plugin, module, fields, "{}", l.message)
        }
        Level::WARN => {
            tracing::warn!(target: "drover::plugin", plugin, module, fields, "{}", l.message)
        }
        Level::ERROR => {
            tracing::error!(target: "drover::plugin", plugin, module, fields, "{}", l.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps the `@message` of every event that reached the output.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Captured {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let line: Value = serde_json::from_str(&event_line(event)).unwrap();
            let message = line["@message"].as_str().unwrap_or_default().to_owned();
            self.0.lock().unwrap().push(message);
        }
    }

    fn logged(spec: Option<&str>, log: impl FnOnce()) -> Vec<String> {
        let out = Captured::default();
        tracing::subscriber::with_default(plugin_subscriber(spec, out.clone()), log);
        out.0.lock().unwrap().clone()
    }

    #[test]
    fn the_plugin_filter_holds_with_and_without_spans() {
        let log = || {
            tracing::info!("plain info");
            tracing::debug!("plain debug");
            let span = tracing::info_span!("rpc", task = "t1");
            let _in = span.enter();
            tracing::info!("info in a span");
            let inner = tracing::debug_span!("inner");
            inner.in_scope(|| tracing::debug!("debug in a span"));
            tracing::warn!("warn in a span");
        };
        assert_eq!(
            logged(None, log),
            ["plain info", "info in a span", "warn in a span"]
        );
        assert_eq!(
            logged(Some("not a filter=="), log),
            ["plain info", "info in a span", "warn in a span"],
            "an invalid filter is `info`"
        );
        assert_eq!(logged(Some("warn"), log), ["warn in a span"]);
        assert_eq!(
            logged(Some("debug"), log),
            [
                "plain info",
                "plain debug",
                "info in a span",
                "debug in a span",
                "warn in a span"
            ]
        );
        // A directive naming a span: debug inside `inner` alone (the registry tracks
        // which span an event is in).
        assert_eq!(
            logged(Some("info,[inner]=debug"), log),
            [
                "plain info",
                "info in a span",
                "debug in a span",
                "warn in a span"
            ]
        );
    }

    #[test]
    fn timestamp_has_six_fraction_digits() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_234_567_891);
        let line = format_line("info", "m", "x", Map::new(), at);
        assert!(
            line.contains(r#""@timestamp":"1970-01-01T00:00:01.234567Z""#),
            "{line}"
        );
    }

    #[cfg(feature = "launcher")]
    #[test]
    fn round_trip_through_parser() {
        let mut f = Map::new();
        f.insert("task".into(), Value::String("t1".into()));
        let line = format_line("error", "boom", "drv", f, std::time::SystemTime::now());
        let parsed = PluginLogLine::parse(&line).unwrap();
        assert_eq!(parsed.level, Level::ERROR);
        assert_eq!(parsed.message, "boom");
        assert_eq!(parsed.module.as_deref(), Some("drv"));
        assert_eq!(parsed.fields, r#"{"task":"t1"}"#);
    }
}
