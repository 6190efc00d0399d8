//! # drover-metrics
//!
//! What the server's and the agent's `GET /v1/metrics` share. Each keeps its metrics
//! in a [`prometheus_client`] registry (prefix [`PREFIX`], units in names, histograms
//! for latencies); this crate renders registries in the format a request asks for:
//!
//! - `?format=prometheus`: Prometheus' text format 0.0.4, what Nomad's
//!   `format=prometheus` answers and what every scraper reads; or OpenMetrics when the
//!   request's `Accept` asks for `application/openmetrics-text` (as Prometheus does,
//!   and as client_golang's handler in Nomad negotiates).
//! - no `format`: Nomad's JSON shape (`Timestamp`, `Gauges`, `Counters`, `Samples`),
//!   for Nomad's API clients.
//!
//! `prometheus_client` writes OpenMetrics only. The two text formats differ in how a
//! counter family is named (OpenMetrics: `# TYPE x counter` with samples `x_total`;
//! 0.0.4: `# TYPE x_total counter`), in `# UNIT` lines and in the closing `# EOF`;
//! [`render`] turns one into the other. Expositions of several registries (the dev
//! agent's server and agent, in one answer as Nomad's single agent gives) are joined
//! as OpenMetrics families without `# EOF` ([`families`], [`strip_eof`]) and rendered
//! once.

use std::fmt::Write as _;

pub use prometheus_client;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Every metric's prefix: `drover_…`.
pub const PREFIX: &str = "drover";

/// Prometheus' text format, version 0.0.4.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics 1.0 text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Nomad's JSON.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Buckets of every latency histogram, in seconds: 0.5 ms doubling up to ~262 s (a
/// blocking query or an event stream lasts up to minutes; a store commit a few ms).
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 20))
}

/// A format a `/v1/metrics` request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus' text format 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Nomad's JSON.
    Json,
}

impl Format {
    /// The format of a request with query parameter `format` and header `Accept`:
    /// `prometheus` is Prometheus text unless `Accept` asks for OpenMetrics; none is
    /// Nomad's JSON. Anything else is refused with the reason.
    pub fn negotiate(format: Option<&str>, accept: Option<&str>) -> Result<Format, String> {
        match format {
            None | Some("") | Some("json") => Ok(Format::Json),
            Some("prometheus") => {
                if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
                    Ok(Format::OpenMetrics)
                } else {
                    Ok(Format::Prometheus)
                }
            }
            Some("openmetrics") => Ok(Format::OpenMetrics),
            Some(other) => Err(format!(
                "unknown metrics format {other:?}: give format=prometheus, or no format \
                 for Nomad's JSON"
            )),
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => PROMETHEUS_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Json => JSON_CONTENT_TYPE,
        }
    }
}

/// `registry`'s families as OpenMetrics text, without the closing `# EOF` (to be
/// joined with others and rendered by [`render`]).
pub fn families(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String fails only if a metric's encoder does, which ours never
    // do; a failed family would be cut short, never a panic.
    if prometheus_client::encoding::text::encode_registry(&mut out, registry).is_err() {
        out.push_str("# drover: a metric family failed to encode\n");
    }
    out
}

/// An OpenMetrics exposition without its closing `# EOF` (another one's, joined).
pub fn strip_eof(text: &str) -> &str {
    let trimmed = text.trim_end();
    trimmed
        .strip_suffix("# EOF")
        .map_or(text, |rest| rest)
        .trim_end_matches(' ')
}

/// Joined OpenMetrics `families` (no `# EOF`) as a whole exposition in `format`.
pub fn render(families: &str, format: Format) -> String {
    match format {
        Format::OpenMetrics => {
            let mut out = String::with_capacity(families.len() + 8);
            out.push_str(families);
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str("# EOF\n");
            out
        }
        Format::Prometheus => to_prometheus(families),
        Format::Json => to_nomad_json(families, std::time::SystemTime::now()),
    }
}

/// OpenMetrics families as Prometheus text 0.0.4: a counter family `x` becomes
/// `x_total` (its samples' name) in `# HELP` and `# TYPE`; `unknown` is `untyped`;
/// `# UNIT` and `# EOF` are left out. Samples are the same in both.
fn to_prometheus(families: &str) -> String {
    let mut out = String::with_capacity(families.len());
    let mut help: Option<(&str, &str)> = None;
    for line in families.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "unknown" => (name.to_owned(), "untyped"),
                k => (name.to_owned(), k),
            };
            if let Some((help_name, text)) = help.take() {
                let help_name = if help_name == name.trim_end_matches("_total") {
                    name.as_str()
                } else {
                    help_name
                };
                let _ = writeln!(out, "# HELP {help_name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// One sample line of an exposition: name, labels, value.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: serde_json::Map<String, serde_json::Value>,
    value: f64,
}

/// A sample line as this crate's registries write it: `name{k="v",...} value`, label
/// values escaped as OpenMetrics says (`\\`, `\"`, `\n`). `None` for anything else.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = serde_json::Map::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i + 1);
                    break;
                }
                ',' => {}
                '=' => {
                    let mut value = String::new();
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value.into());
                }
                c => key.push(c),
            }
        }
        rest = &inner[end?..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// OpenMetrics families in Nomad's JSON shape (go-metrics' `DisplayMetrics`): gauges
/// with their value; counters with `Count` and `Sum` both the total since start
/// (Drover's counters are totals, not go-metrics' per-interval aggregates);
/// histograms as `Samples` with their count, sum and mean. Names are the Prometheus
/// names; labels are a map. Only this crate's own output is read here (see
/// [`parse_sample`]).
fn to_nomad_json(families: &str, now: std::time::SystemTime) -> String {
    use serde_json::{Value, json};
    let mut gauges = Vec::new();
    let mut counters = Vec::new();
    let mut samples = Vec::new();
    let mut kind = "unknown";
    let mut family = String::new();
    // A histogram's `_sum` comes before its `_count` per label set in
    // prometheus_client's output; both are kept until the family ends.
    let mut hist: Vec<(serde_json::Map<String, Value>, f64, f64)> = Vec::new();
    let flush = |family: &str,
                 hist: &mut Vec<(serde_json::Map<String, Value>, f64, f64)>,
                 samples: &mut Vec<Value>| {
        for (labels, sum, count) in hist.drain(..) {
            let mean = if count > 0.0 { sum / count } else { 0.0 };
            samples.push(json!({
                "Name": family, "Count": count, "Sum": sum, "Mean": mean,
                "Rate": 0.0, "Min": 0.0, "Max": 0.0, "Stddev": 0.0, "Labels": labels,
            }));
        }
    };
    for line in families.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            flush(&family, &mut hist, &mut samples);
            let (name, k) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = name.to_owned();
            kind = match k {
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" => "histogram",
                _ => "unknown",
            };
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some(s) = parse_sample(line) else {
            continue;
        };
        match kind {
            "counter" if s.name.ends_with("_total") => counters.push(json!({
                "Name": s.name, "Count": s.value, "Sum": s.value, "Rate": 0.0,
                "Min": s.value, "Max": s.value, "Mean": s.value, "Stddev": 0.0,
                "Labels": s.labels,
            })),
            "histogram" => {
                let is_sum = s.name.ends_with("_sum");
                let is_count = s.name.ends_with("_count");
                if !is_sum && !is_count {
                    continue;
                }
                let at = match hist.iter().position(|(l, _, _)| *l == s.labels) {
                    Some(i) => i,
                    None => {
                        hist.push((s.labels.clone(), 0.0, 0.0));
                        hist.len() - 1
                    }
                };
                if is_sum {
                    hist[at].1 = s.value;
                } else {
                    hist[at].2 = s.value;
                }
            }
            "gauge" => gauges.push(json!({"Name": s.name, "Value": s.value, "Labels": s.labels})),
            _ => {}
        }
    }
    flush(&family, &mut hist, &mut samples);
    // go-metrics' timestamp: the start of the interval, as Go prints a time.
    let timestamp = humantime::format_rfc3339_seconds(now).to_string();
    json!({
        "Timestamp": timestamp,
        "Gauges": gauges,
        "Counters": counters,
        "Samples": samples,
        "Points": [],
    })
    .to_string()
}

/// A label value from outside (a task's name, a plugin's, a route): escaped as both
/// text formats require (`\\`, `\"`, `\n`). `prometheus_client` 0.24 writes
/// `String` label values as they are, so a quote in a task name would end the value
/// and break the whole exposition.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LabelText(pub String);

impl prometheus_client::encoding::EncodeLabelValue for LabelText {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut rest = self.0.as_str();
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

impl From<&str> for LabelText {
    fn from(s: &str) -> Self {
        LabelText(s.to_owned())
    }
}

/// An HTTP status as a bounded label value: `2xx` … `5xx`.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// An HTTP method as a bounded label value (anything unusual is `OTHER`).
pub fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "PUT" => "PUT",
        "POST" => "POST",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Unit;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Status {
        status: LabelText,
    }

    fn registry() -> Registry {
        let mut r = Registry::with_prefix(PREFIX);
        let starts = Counter::<u64>::default();
        starts.inc_by(5);
        r.register("task_starts", "Tasks started", starts);
        let nodes = Family::<Status, Gauge>::default();
        nodes
            .get_or_create(&Status {
                status: "ready".into(),
            })
            .set(2);
        nodes
            .get_or_create(&Status {
                status: "a \"quoted\" \\ one\nline".into(),
            })
            .set(1);
        r.register("nodes", "Nodes by status", nodes);
        let h = latency_histogram();
        h.observe(0.002);
        h.observe(0.004);
        r.register_with_unit("commit_duration", "Commit latency", Unit::Seconds, h);
        r
    }

    #[test]
    fn prometheus_text_names_counters_by_their_samples_and_has_no_openmetrics_lines() {
        let text = render(&families(&registry()), Format::Prometheus);
        assert!(
            text.contains("# HELP drover_task_starts_total Tasks started.\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE drover_task_starts_total counter\n"),
            "{text}"
        );
        assert!(text.contains("\ndrover_task_starts_total 5\n"), "{text}");
        assert!(text.contains("# TYPE drover_nodes gauge\n"), "{text}");
        assert!(
            text.contains("drover_nodes{status=\"ready\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"drover_nodes{status="a \"quoted\" \\ one\nline"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("# TYPE drover_commit_duration_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("drover_commit_duration_seconds_count 2\n"),
            "{text}"
        );
        assert!(
            text.contains("drover_commit_duration_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(!text.contains("# UNIT"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn openmetrics_ends_once_with_eof_after_joining() {
        let one = families(&registry());
        let agent = render(&one, Format::OpenMetrics);
        assert!(agent.ends_with("# EOF\n"));
        let joined = format!("{one}{}", strip_eof(&agent));
        let both = render(&joined, Format::OpenMetrics);
        assert_eq!(both.matches("# EOF").count(), 1, "{both}");
        assert_eq!(both.matches("# TYPE drover_task_starts counter").count(), 2);
    }

    #[test]
    fn nomad_json_has_gauges_counters_and_samples() {
        let text = to_nomad_json(&families(&registry()), std::time::SystemTime::UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["Timestamp"], "1970-01-01T00:00:00Z");
        let gauges = v["Gauges"].as_array().unwrap();
        let ready = gauges
            .iter()
            .find(|g| g["Labels"]["status"] == "ready")
            .unwrap();
        assert_eq!(ready["Name"], "drover_nodes");
        assert_eq!(ready["Value"], 2.0);
        assert!(
            gauges
                .iter()
                .any(|g| g["Labels"]["status"] == "a \"quoted\" \\ one\nline"),
            "{text}"
        );
        assert_eq!(v["Counters"][0]["Name"], "drover_task_starts_total");
        assert_eq!(v["Counters"][0]["Count"], 5.0);
        let s = &v["Samples"][0];
        assert_eq!(s["Name"], "drover_commit_duration_seconds");
        assert_eq!(s["Count"], 2.0);
        assert!((s["Mean"].as_f64().unwrap() - 0.003).abs() < 1e-9);
    }

    #[test]
    fn formats_are_negotiated_as_nomad_and_prometheus_do() {
        assert_eq!(Format::negotiate(None, None), Ok(Format::Json));
        assert_eq!(
            Format::negotiate(Some("prometheus"), Some("text/plain")),
            Ok(Format::Prometheus)
        );
        assert_eq!(
            Format::negotiate(
                Some("prometheus"),
                Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
            ),
            Ok(Format::OpenMetrics)
        );
        assert!(Format::negotiate(Some("xml"), None).is_err());
    }

    #[test]
    fn labels_stay_bounded() {
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(999), "5xx");
        assert_eq!(method_label("BREW"), "OTHER");
    }
}
