//! Task files: `drover task run job.toml`.
//!
//! A task file carries the same fields as the `drover task run` flags, plus the
//! sections that are awkward on a command line:
//!
//! ```toml
//! driver = "rawexec"
//! name = "web"
//! kill_signal = "SIGINT"     # sent by `drover task stop` (default SIGTERM)
//! kill_timeout = "10s"       # then SIGKILL (default 5s)
//!
//! [config]                   # the driver's task config, checked against its schema
//! command = "/bin/sleep"
//! args = ["60"]
//!
//! [env]
//! PORT = "8080"              # integers, floats and booleans are turned into strings
//!
//! [resources]
//! cpu_shares = 100
//! memory_mb = 64
//! memory_max_mb = 128
//!
//! [restart]                  # as in Nomad; leave the section out for no restarts
//! attempts = 2
//! interval = "30m"
//! delay = "15s"
//! mode = "fail"              # or "delay"
//!
//! [logs]
//! max_files = 3
//! max_file_size_mb = 1
//! ```
//!
//! Kill settings are the two top-level keys `kill_signal` and `kill_timeout` (the
//! flag names, the API's field names and what Nomad users write), not a `[kill]` table.
//!
//! Parsing is a pure function of the text, the file's name and the caller's signal
//! check ([`parse`]; the signal names are the plugin SDK's, which the caller links).
//! Every error names the file, the line and the field (`job.toml:7: restart.atempts:
//! unknown field ...`), with the spans, errors and TOML-to-JSON conversion of
//! [`crate::tomlfile`], which the job files' parser shares. The driver's task config is only checked by the agent; its answer is
//! mapped back to the lines of the `[config]` keys with [`TaskFile::locate_config_error`].

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;
use toml::de::DeValue;

use crate::tomlfile::{FileError, Source, entry, escape_pointer};
use crate::{MAX_KILL_TIMEOUT, MAX_RESTART_DURATION, RestartMode, RestartPolicy, RunRequest};

/// A task file that could not be used. Displays as `FILE:LINE: FIELD: MESSAGE`.
pub type TaskFileError = FileError;

/// A parsed spec file: the request it describes, and where each `[config]` key is.
#[derive(Debug, Clone)]
pub struct TaskFile {
    /// The file name as given.
    pub file: String,
    /// The request the file describes. `driver` is empty when the file names none
    /// (the `--driver` flag must then give it).
    pub request: RunRequest,
    /// JSON pointer of each config key and array element → its 1-based line.
    config_lines: BTreeMap<String, usize>,
    /// The line of the `config` key itself (the `[config]` header), if any.
    config_line: Option<usize>,
    /// Top-level config keys a `--config` flag set: problems with them are the flag's.
    flag_keys: std::collections::BTreeSet<String>,
}

/// The top level of a spec file, as serde sees it. `config` and `env` are converted
/// by hand from the spanned tree, so they are only declared here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `config` and `env` exist to be accepted by deny_unknown_fields
struct Doc {
    driver: Option<String>,
    name: Option<String>,
    config: Option<serde::de::IgnoredAny>,
    env: Option<serde::de::IgnoredAny>,
    kill_signal: Option<Spanned<String>>,
    kill_timeout: Option<Spanned<String>>,
    resources: Option<ResourcesDoc>,
    restart: Option<RestartDoc>,
    logs: Option<LogsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesDoc {
    cpu_shares: Option<u32>,
    memory_mb: Option<u32>,
    memory_max_mb: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartDoc {
    attempts: Option<u32>,
    interval: Option<Spanned<String>>,
    delay: Option<Spanned<String>>,
    mode: Option<RestartMode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsDoc {
    max_files: Option<Spanned<u32>>,
    max_file_size_mb: Option<Spanned<u32>>,
}

/// Parse the spec in `text`; `file` is the name errors mention. `check_signal` says
/// why a `kill_signal` is no signal (`Err(message)`), or accepts it.
pub fn parse(
    text: &str,
    file: &str,
    check_signal: &dyn Fn(&str) -> Result<(), String>,
) -> Result<TaskFile, TaskFileError> {
    let source = Source { text, file };
    let err = |span, field, message| source.error(span, field, message);
    let root = source.parse()?;
    let doc: Doc = source.deserialize(&root, |field| {
        (field == "kill")
            .then_some(" (kill settings are the top-level keys kill_signal and kill_timeout)")
    })?;
    let table = root.get_ref();
    let duration = |v, field, max| source.duration(v, field, max);

    let mut request = RunRequest {
        driver: doc.driver.unwrap_or_default(),
        name: doc.name,
        ..Default::default()
    };
    if let Some(sig) = &doc.kill_signal {
        // Validated here so the error names the line; stored as written.
        check_signal(sig.get_ref())
            .map_err(|e| err(Some(sig.span()), Some("kill_signal".into()), e))?;
        request.kill_signal = Some(sig.get_ref().clone());
    }
    if let Some(t) = &doc.kill_timeout {
        request.kill_timeout = Some(duration(t, "kill_timeout", MAX_KILL_TIMEOUT)?);
    }
    if let Some(r) = doc.resources {
        request.resources = Some(crate::Resources {
            cpu_shares: r.cpu_shares.map_or(0, i64::from),
            memory_mb: r.memory_mb.map_or(0, i64::from),
            memory_max_mb: r.memory_max_mb.map_or(0, i64::from),
        });
    }
    if let Some(r) = doc.restart {
        let mut policy = RestartPolicy::default();
        if let Some(a) = r.attempts {
            policy.attempts = a;
        }
        if let Some(i) = &r.interval {
            policy.interval = duration(i, "restart.interval", MAX_RESTART_DURATION)?;
        }
        if let Some(d) = &r.delay {
            policy.delay = duration(d, "restart.delay", MAX_RESTART_DURATION)?;
        }
        if let Some(m) = r.mode {
            policy.mode = m;
        }
        request.restart = Some(policy);
    }
    if let Some(l) = doc.logs {
        let mut logs = crate::LogConfig::default();
        for (value, name, slot) in [
            (&l.max_files, "logs.max_files", &mut logs.max_files),
            (
                &l.max_file_size_mb,
                "logs.max_file_size_mb",
                &mut logs.max_file_size_mb,
            ),
        ] {
            if let Some(v) = value {
                if *v.get_ref() == 0 {
                    return Err(err(
                        Some(v.span()),
                        Some(name.into()),
                        "must be at least 1".into(),
                    ));
                }
                *slot = *v.get_ref();
            }
        }
        if let Err(message) = logs.check() {
            let span = l
                .max_file_size_mb
                .as_ref()
                .or(l.max_files.as_ref())
                .map(Spanned::span);
            return Err(err(span, None, message));
        }
        request.logs = Some(logs);
    }

    if let Some((_, value)) = entry(table, "env") {
        request.env = source.string_map(value, "env")?;
    }

    let mut config_lines = BTreeMap::new();
    let mut config_line = None;
    if let Some((key, value)) = entry(table, "config") {
        config_line = Some(source.line_of(key.span().start));
        let DeValue::Table(_) = value.get_ref() else {
            return Err(err(
                Some(value.span()),
                Some("config".into()),
                format!("expected a table, found {}", value.get_ref().type_str()),
            ));
        };
        request.config = source.to_json(value, "config", &mut |path, span| {
            config_lines.insert(path.to_owned(), source.line_of(span.start));
        })?;
    } else {
        request.config = serde_json::json!({});
    }

    Ok(TaskFile {
        file: file.to_owned(),
        request,
        config_lines,
        config_line,
        flag_keys: Default::default(),
    })
}

impl TaskFile {
    /// Record that a `--config` flag set the top-level config key `key` (replacing the
    /// file's value, if any): problems with it are reported against the flag.
    pub fn forget_config_key(&mut self, key: &str) {
        let pointer = format!("/{}", escape_pointer(key));
        self.config_lines
            .retain(|p, _| p != &pointer && !p.starts_with(&format!("{pointer}/")));
        self.flag_keys.insert(pointer);
    }

    /// Map the agent's answer to a rejected task config back to this file: one line per
    /// problem, `FILE:LINE: config.FIELD: PROBLEM`. `None` when `message` is not about
    /// the task config.
    ///
    /// The agent phrases these as `task config for driver "NAME": P1; P2`, each problem
    /// either `unknown field "KEY" (...)` or `/json/pointer: ...` (see the agent's
    /// `loader::Schema::validate`; a test of `drover task run` runs both to keep them in step).
    pub fn locate_config_error(&self, message: &str) -> Option<String> {
        const MARK: &str = "task config for driver ";
        let start = message.find(MARK)?;
        let rest = &message[start + MARK.len()..];
        let problems = &rest[rest.find("\": ")? + 3..];
        let lines: Vec<String> = problems
            .split("; ")
            .map(|p| self.locate_problem(p))
            .collect();
        Some(lines.join("\n"))
    }

    fn locate_problem(&self, problem: &str) -> String {
        let pointer = if let Some(rest) = problem.strip_prefix("unknown field \"") {
            rest.split_once('"')
                .map(|(key, _)| format!("/{}", escape_pointer(key)))
        } else if problem.starts_with('/') {
            problem.split_once(": ").map(|(p, _)| p.to_owned())
        } else {
            None
        };
        let (line, field, message) = match &pointer {
            Some(p) => {
                let detail = problem
                    .strip_prefix(p.as_str())
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(problem);
                (self.line_of_pointer(p), field_of_pointer(p), detail)
            }
            None => (self.config_line, "config".to_owned(), problem),
        };
        // `/args/1` belongs to the top-level key `/args`.
        let from_flag = pointer.as_deref().is_some_and(|p| {
            let top = p
                .get(1..)
                .and_then(|rest| rest.find('/'))
                .map_or(p, |i| &p[..=i]);
            self.flag_keys.contains(top)
        });
        match line {
            _ if from_flag => format!("--config: {field}: {message}"),
            Some(line) => format!("{}:{line}: {field}: {message}", self.file),
            None => format!("{field}: {message}"),
        }
    }

    /// The line of the deepest key on `pointer`'s path that is in the file.
    fn line_of_pointer(&self, pointer: &str) -> Option<usize> {
        let mut p = pointer;
        loop {
            if let Some(line) = self.config_lines.get(p) {
                return Some(*line);
            }
            match p.rfind('/') {
                Some(0) | None => return self.config_line,
                Some(i) => p = &p[..i],
            }
        }
    }
}

/// `/args/0` → `config.args[0]`; `/env/a~1b` → `config.env.a/b`.
fn field_of_pointer(pointer: &str) -> String {
    let mut field = "config".to_owned();
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
            field.push_str(&format!("[{seg}]"));
        } else {
            field.push('.');
            field.push_str(&seg);
        }
    }
    field
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const FULL: &str = r#"# a web task
driver = "rawexec"
name = "web"
kill_signal = "SIGINT"
kill_timeout = "10s"

[config]
command = "/bin/sh"
args = ["-c", "echo hi"]
nested = { deep = [1, 2.5, true] }

[env]
GREETING = "hello"
PORT = 8080
DEBUG = true

[resources]
cpu_shares = 100
memory_mb = 64

[restart]
attempts = 3
delay = "1s"
mode = "delay"

[logs]
max_files = 3
max_file_size_mb = 1
"#;

    /// A stand-in for the plugin SDK's signal check (the `drover` binary's tests run
    /// the real one).
    fn check_signal(name: &str) -> Result<(), String> {
        match name {
            "SIGINT" | "SIGTERM" => Ok(()),
            other => Err(format!("unknown signal {other:?}")),
        }
    }

    fn parse(text: &str, file: &str) -> Result<TaskFile, TaskFileError> {
        super::parse(text, file, &check_signal)
    }

    fn error(text: &str) -> String {
        parse(text, "job.toml").unwrap_err().to_string()
    }

    #[test]
    fn every_field_maps_onto_the_request() {
        let spec = parse(FULL, "job.toml").unwrap();
        let r = &spec.request;
        assert_eq!(r.driver, "rawexec");
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.kill_signal.as_deref(), Some("SIGINT"));
        assert_eq!(r.kill_timeout, Some(Duration::from_secs(10)));
        assert_eq!(
            r.config,
            serde_json::json!({
                "command": "/bin/sh",
                "args": ["-c", "echo hi"],
                "nested": { "deep": [1, 2.5, true] },
            })
        );
        assert_eq!(r.env["GREETING"], "hello");
        assert_eq!(r.env["PORT"], "8080");
        assert_eq!(r.env["DEBUG"], "true");
        assert_eq!(
            r.resources,
            Some(crate::Resources {
                cpu_shares: 100,
                memory_mb: 64,
                memory_max_mb: 0
            })
        );
        assert_eq!(
            r.restart,
            Some(RestartPolicy {
                attempts: 3,
                interval: Duration::from_secs(30 * 60),
                delay: Duration::from_secs(1),
                mode: RestartMode::Delay,
            })
        );
        assert_eq!(
            r.logs,
            Some(crate::LogConfig {
                max_files: 3,
                max_file_size_mb: 1
            })
        );
    }

    #[test]
    fn minimal_spec_leaves_the_rest_to_defaults() {
        let spec = parse("driver = \"rawexec\"\n", "a.toml").unwrap();
        assert_eq!(spec.request.config, serde_json::json!({}));
        assert!(spec.request.restart.is_none());
        assert!(spec.request.logs.is_none());
        assert!(parse("", "a.toml").unwrap().request.driver.is_empty());
    }

    #[test]
    fn syntax_errors_name_file_line_and_column() {
        assert_eq!(
            error("driver = \"rawexec\"\nname = \n"),
            "job.toml:2: invalid TOML at column 8: string values must be quoted, expected literal string",
        );
        let e = error("driver = \"rawexec\"\n\n[config\ncommand = 1\n");
        assert!(e.starts_with("job.toml:3: invalid TOML at column "), "{e}");
    }

    #[test]
    fn unknown_fields_are_named_with_their_section() {
        let e = error("driver = \"rawexec\"\ndrvier = \"x\"\n");
        assert!(
            e.starts_with("job.toml:2: drvier: unknown field `drvier`"),
            "{e}"
        );
        let e = error("driver = \"x\"\n[restart]\nattempts = 1\natempts = 2\n");
        assert!(
            e.starts_with("job.toml:4: restart.atempts: unknown field `atempts`, expected one of"),
            "{e}"
        );
        let e = error("[resources]\nmemory = 5\n");
        assert!(
            e.starts_with("job.toml:2: resources.memory: unknown field `memory`"),
            "{e}"
        );
        let e = error("[logs]\nmax_size = 5\n");
        assert!(
            e.starts_with("job.toml:2: logs.max_size: unknown field"),
            "{e}"
        );
        let e = error("driver = \"x\"\n[kill]\nsignal = \"SIGINT\"\n");
        assert!(
            e.starts_with("job.toml:2: kill: unknown field `kill`") && e.contains("kill_signal"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_and_values_are_named() {
        let e = error("driver = 5\n");
        assert!(
            e.starts_with("job.toml:1: driver: invalid type: integer"),
            "{e}"
        );
        let e = error("[restart]\nattempts = \"three\"\n");
        assert!(
            e.starts_with("job.toml:2: restart.attempts: invalid type: string"),
            "{e}"
        );
        let e = error("[restart]\nattempts = -1\n");
        assert!(e.starts_with("job.toml:2: restart.attempts: "), "{e}");
        let e = error("[restart]\nmode = \"retry\"\n");
        assert!(
            e.starts_with(
                "job.toml:2: restart.mode: unknown variant `retry`, expected `fail` or `delay`"
            ),
            "{e}"
        );
        let e = error("\n[restart]\ndelay = \"soon\"\n");
        assert!(
            e.starts_with("job.toml:3: restart.delay: \"soon\" is not a duration"),
            "{e}"
        );
        let e = error("kill_timeout = \"5 parsecs\"\n");
        assert!(e.starts_with("job.toml:1: kill_timeout: "), "{e}");
        let e = error("\nkill_timeout = \"2days\"\n");
        assert_eq!(
            e,
            "job.toml:2: kill_timeout: \"2days\" is longer than the maximum of 1day"
        );
        let e = error("[restart]\ninterval = \"2years\"\n");
        assert!(
            e.starts_with("job.toml:2: restart.interval: \"2years\" is longer than the maximum"),
            "{e}"
        );
        let e = error("kill_signal = \"SIGNOPE\"\n");
        assert!(
            e.starts_with("job.toml:1: kill_signal: ") && e.contains("SIGNOPE"),
            "{e}"
        );
        let e = error("[logs]\nmax_files = 0\n");
        assert_eq!(e, "job.toml:2: logs.max_files: must be at least 1");
        let e = error("[logs]\nmax_files = 100\nmax_file_size_mb = 100\n");
        assert_eq!(
            e,
            "job.toml:3: logs.max_files × logs.max_file_size_mb is 100 × 100 = 10000 MiB \
             per stream, more than the maximum of 1024 MiB"
        );
        let e = error("config = \"x\"\n");
        assert_eq!(e, "job.toml:1: config: expected a table, found string");
        let e = error("[env]\nA = [1]\n");
        assert_eq!(e, "job.toml:2: env.A: expected a string, found array");
        let e = error("[config]\nwhen = 1979-05-27\nratio = nan\n");
        assert_eq!(
            e,
            "job.toml:3: config.ratio: float cannot be represented in JSON"
        );
    }

    #[test]
    fn config_errors_from_the_agent_point_at_the_key() {
        let spec = parse(FULL, "job.toml").unwrap();
        let msg = "invalid config: task config for driver \"rawexec\": unknown field \"comand\" \
                   (expected one of: args, command, cwd)";
        // Not in the file: the problem is reported on the [config] header line.
        assert_eq!(
            spec.locate_config_error(msg).unwrap(),
            "job.toml:7: config.comand: unknown field \"comand\" (expected one of: args, command, cwd)"
        );
        let text = FULL.replace("command = \"/bin/sh\"", "comand = \"/bin/sh\"");
        let spec = parse(&text, "job.toml").unwrap();
        assert_eq!(
            spec.locate_config_error(msg).unwrap(),
            "job.toml:8: config.comand: unknown field \"comand\" (expected one of: args, command, cwd)"
        );
        let msg = "invalid config: task config for driver \"rawexec\": /args/1: 5 is not of type \
                   \"string\"; \"command\" is a required property";
        assert_eq!(
            spec.locate_config_error(msg).unwrap(),
            "job.toml:9: config.args[1]: 5 is not of type \"string\"\n\
             job.toml:7: config: \"command\" is a required property"
        );
        assert_eq!(spec.locate_config_error("not found: no task"), None);
    }

    #[test]
    fn config_keys_replaced_by_flags_are_not_blamed_on_the_file() {
        let mut spec = parse(FULL, "job.toml").unwrap();
        spec.forget_config_key("args");
        spec.forget_config_key("comand");
        let msg = "invalid config: task config for driver \"rawexec\": /args/1: bad; \
                   unknown field \"comand\" (expected one of: args); /nested/deep/0: worse";
        assert_eq!(
            spec.locate_config_error(msg).unwrap(),
            "--config: config.args[1]: bad\n\
             --config: config.comand: unknown field \"comand\" (expected one of: args)\n\
             job.toml:10: config.nested.deep[0]: worse"
        );
    }

    #[test]
    fn positions() {
        assert_eq!(field_of_pointer("/a~1b/0/c"), "config.a/b[0].c");
    }
}
