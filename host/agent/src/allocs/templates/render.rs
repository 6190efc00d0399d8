//! Rendering a template: Go's `text/template` syntax (as consul-template writes it) by
//! the `gtmpl` crate, with consul-template's functions for Nomad.
//!
//! gtmpl's functions are plain `fn` pointers, so what they read (the task's
//! environment, the services and variables fetched from the server) is put in a
//! thread-local for the duration of one render; rendering runs on one thread. A
//! render also records what it asked for and did not have ([`Wanted`]): the caller
//! fetches that from the server and renders again (consul-template's dependency
//! discovery).
//!
//! gtmpl knows only `{{` and `}}`: other delimiters are translated before parsing
//! (a literal `{{` in the text is kept as text).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

use base64::Engine as _;
use gtmpl_value::{FuncError, Value};

/// Largest rendered file.
pub(crate) const MAX_RENDERED: usize = 1 << 20;

/// What the functions read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inputs {
    /// The task's environment (`env "NAME"`).
    pub env: BTreeMap<String, String>,
    /// Instances of each service asked for (`nomadService`), as Nomad's API lists them.
    pub services: BTreeMap<String, Vec<serde_json::Value>>,
    /// Items of each variable asked for (`nomadVar`); `None`: it does not exist.
    pub vars: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// Paths under each prefix asked for (`nomadVarList`).
    pub var_lists: BTreeMap<String, Vec<String>>,
}

/// What a render asked for that [`Inputs`] did not have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub services: BTreeSet<String>,
    pub vars: BTreeSet<String>,
    pub var_lists: BTreeSet<String>,
}

impl Wanted {
    pub(crate) fn is_empty(&self) -> bool {
        self.services.is_empty() && self.vars.is_empty() && self.var_lists.is_empty()
    }
}

thread_local! {
    static CURRENT: RefCell<Option<(Inputs, Wanted)>> = const { RefCell::new(None) };
}

fn with_inputs<R>(f: impl FnOnce(&Inputs, &mut Wanted) -> R) -> Option<R> {
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        let (inputs, wanted) = c.as_mut()?;
        Some(f(inputs, wanted))
    })
}

fn generic(msg: impl Into<String>) -> FuncError {
    FuncError::Generic(msg.into())
}

fn string_arg(name: &str, args: &[Value], i: usize) -> Result<String, FuncError> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        Some(other) => Err(generic(format!(
            "{name}: argument {} must be a string, got {other}",
            i + 1
        ))),
        None => Err(FuncError::AtLeastXArgs(name.into(), i + 1)),
    }
}

fn exactly(name: &str, args: &[Value], n: usize) -> Result<(), FuncError> {
    if args.len() != n {
        return Err(FuncError::ExactlyXArgs(name.into(), n));
    }
    Ok(())
}

fn env(args: &[Value]) -> Result<Value, FuncError> {
    exactly("env", args, 1)?;
    let name = string_arg("env", args, 0)?;
    Ok(Value::String(
        with_inputs(|i, _| i.env.get(&name).cloned())
            .flatten()
            .unwrap_or_default(),
    ))
}

fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i),
            None => Value::from(n.as_f64().unwrap_or_default()),
        },
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().map(json_to_value).collect()),
        serde_json::Value::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        ),
    }
}

fn value_to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::NoValue | Value::Nil | Value::Function(_) => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.into(),
            None => serde_json::Number::from_f64(n.as_f64().unwrap_or_default())
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
        },
        Value::Array(a) => serde_json::Value::Array(a.iter().map(value_to_json).collect()),
        Value::Object(o) | Value::Map(o) => serde_json::Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), value_to_json(v)))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect(),
        ),
    }
}

/// `nomadService "name"`: the service's instances (`.Address`, `.Port`, `.ID`,
/// `.Tags`, ...), empty until fetched.
fn nomad_service(args: &[Value]) -> Result<Value, FuncError> {
    exactly("nomadService", args, 1)?;
    let name = string_arg("nomadService", args, 0)?;
    let found = with_inputs(|i, w| match i.services.get(&name) {
        Some(list) => list.iter().map(json_to_value).collect(),
        None => {
            w.services.insert(name.clone());
            Vec::new()
        }
    });
    Ok(Value::Array(found.unwrap_or_default()))
}

/// `nomadVar "path"`: the variable's items by key.
fn nomad_var(args: &[Value]) -> Result<Value, FuncError> {
    exactly("nomadVar", args, 1)?;
    let path = string_arg("nomadVar", args, 0)?;
    let found = with_inputs(|i, w| match i.vars.get(&path) {
        Some(Some(items)) => Ok(Value::Map(
            items
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )),
        Some(None) => Err(generic(format!(
            "nomadVar: variable {path:?} does not exist"
        ))),
        None => {
            w.vars.insert(path.clone());
            Ok(Value::Map(HashMap::new()))
        }
    });
    found.unwrap_or_else(|| Ok(Value::Map(HashMap::new())))
}

/// `nomadVarList "prefix"`: the variables under it (`.Path`).
fn nomad_var_list(args: &[Value]) -> Result<Value, FuncError> {
    if args.len() > 1 {
        return Err(FuncError::ExactlyXArgs("nomadVarList".into(), 1));
    }
    let prefix = if args.is_empty() {
        String::new()
    } else {
        string_arg("nomadVarList", args, 0)?
    };
    let found = with_inputs(|i, w| match i.var_lists.get(&prefix) {
        Some(paths) => paths
            .iter()
            .map(|p| {
                Value::Map(HashMap::from([(
                    "Path".to_owned(),
                    Value::String(p.clone()),
                )]))
            })
            .collect(),
        None => {
            w.var_lists.insert(prefix.clone());
            Vec::new()
        }
    });
    Ok(Value::Array(found.unwrap_or_default()))
}

fn to_lower(args: &[Value]) -> Result<Value, FuncError> {
    exactly("toLower", args, 1)?;
    Ok(Value::String(
        string_arg("toLower", args, 0)?.to_lowercase(),
    ))
}

fn to_upper(args: &[Value]) -> Result<Value, FuncError> {
    exactly("toUpper", args, 1)?;
    Ok(Value::String(
        string_arg("toUpper", args, 0)?.to_uppercase(),
    ))
}

fn trim_space(args: &[Value]) -> Result<Value, FuncError> {
    exactly("trimSpace", args, 1)?;
    Ok(Value::String(
        string_arg("trimSpace", args, 0)?.trim().to_owned(),
    ))
}

/// `split SEP STRING` (consul-template's order: `{{ "a,b" | split "," }}`).
fn split(args: &[Value]) -> Result<Value, FuncError> {
    exactly("split", args, 2)?;
    let sep = string_arg("split", args, 0)?;
    let s = string_arg("split", args, 1)?;
    if s.is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    Ok(Value::Array(
        s.split(sep.as_str())
            .map(|p| Value::String(p.to_owned()))
            .collect(),
    ))
}

/// `join SEP LIST`.
fn join(args: &[Value]) -> Result<Value, FuncError> {
    exactly("join", args, 2)?;
    let sep = string_arg("join", args, 0)?;
    let Value::Array(items) = &args[1] else {
        return Err(generic("join: the second argument must be a list"));
    };
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    let size = items
        .iter()
        .map(String::len)
        .sum::<usize>()
        .saturating_add(sep.len().saturating_mul(items.len()));
    within_bound("join", size)?;
    Ok(Value::String(items.join(&sep)))
}

/// A function's result may not outgrow what a template may render: a template that
/// nests growing calls (`replaceAll` of `replaceAll` ...) fails, instead of taking the
/// agent's memory.
fn within_bound(name: &str, size: usize) -> Result<(), FuncError> {
    if size > MAX_RENDERED {
        return Err(generic(format!(
            "{name}: the result would be larger than {MAX_RENDERED} bytes"
        )));
    }
    Ok(())
}

fn parse_int(args: &[Value]) -> Result<Value, FuncError> {
    exactly("parseInt", args, 1)?;
    let s = string_arg("parseInt", args, 0)?;
    s.trim()
        .parse::<i64>()
        .map(Value::from)
        .map_err(|e| generic(format!("parseInt {s:?}: {e}")))
}

fn to_json(args: &[Value]) -> Result<Value, FuncError> {
    exactly("toJSON", args, 1)?;
    serde_json::to_string(&value_to_json(&args[0]))
        .map(Value::String)
        .map_err(|e| generic(format!("toJSON: {e}")))
}

fn base64_encode(args: &[Value]) -> Result<Value, FuncError> {
    exactly("base64Encode", args, 1)?;
    Ok(Value::String(
        base64::engine::general_purpose::STANDARD.encode(string_arg("base64Encode", args, 0)?),
    ))
}

fn base64_decode(args: &[Value]) -> Result<Value, FuncError> {
    exactly("base64Decode", args, 1)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(string_arg("base64Decode", args, 0)?.trim())
        .map_err(|e| generic(format!("base64Decode: {e}")))?;
    String::from_utf8(bytes)
        .map(Value::String)
        .map_err(|_| generic("base64Decode: the result is not UTF-8 text"))
}

/// `replaceAll OLD NEW STRING`.
fn replace_all(args: &[Value]) -> Result<Value, FuncError> {
    exactly("replaceAll", args, 3)?;
    let old = string_arg("replaceAll", args, 0)?;
    let new = string_arg("replaceAll", args, 1)?;
    let s = string_arg("replaceAll", args, 2)?;
    if old.is_empty() {
        return Ok(Value::String(s));
    }
    // Measured before anything is built.
    let n = s.matches(old.as_str()).count();
    within_bound(
        "replaceAll",
        (s.len() - n * old.len()).saturating_add(n.saturating_mul(new.len())),
    )?;
    Ok(Value::String(s.replace(&old, &new)))
}

/// `contains NEEDLE HAYSTACK`: an element of a list, or a substring.
fn contains(args: &[Value]) -> Result<Value, FuncError> {
    exactly("contains", args, 2)?;
    Ok(Value::Bool(match &args[1] {
        Value::Array(items) => items.contains(&args[0]),
        _ => string_arg("contains", args, 1)?.contains(&string_arg("contains", args, 0)?),
    }))
}

/// Widest field `printf` may pad to (a `%999999999d` would allocate that much before
/// the output bound sees it).
const MAX_PRINTF_WIDTH: usize = 1024;

/// Go's `printf`, with its widths and precisions bounded.
fn bounded_printf(args: &[Value]) -> Result<Value, FuncError> {
    let format = string_arg("printf", args, 0)?;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        while chars.peek().is_some_and(|c| "-+# 0".contains(*c)) {
            chars.next();
        }
        for _ in 0..2 {
            let mut digits = String::new();
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                digits.push(d);
                chars.next();
            }
            if chars.peek() == Some(&'*') || chars.peek() == Some(&'[') {
                return Err(generic("printf: `*` and `[n]` widths are not supported"));
            }
            if digits.parse::<usize>().is_ok_and(|w| w > MAX_PRINTF_WIDTH) || digits.len() > 6 {
                return Err(generic(format!(
                    "printf: widths and precisions are at most {MAX_PRINTF_WIDTH}"
                )));
            }
            if chars.peek() == Some(&'.') {
                chars.next();
            } else {
                break;
            }
        }
        chars.next();
    }
    // The arguments bound the result (widths are bounded above).
    let args_size = args.iter().map(|a| a.to_string().len()).sum::<usize>();
    within_bound(
        "printf",
        args_size.saturating_add(MAX_PRINTF_WIDTH.saturating_mul(args.len())),
    )?;
    let out = gtmpl::funcs::printf(args)?;
    within_bound("printf", out.to_string().len())?;
    Ok(out)
}

/// `timestamp`: now, RFC 3339 in UTC.
fn timestamp(args: &[Value]) -> Result<Value, FuncError> {
    if !args.is_empty() {
        return Err(generic(
            "timestamp: a format argument is not supported (RFC 3339 only)",
        ));
    }
    Ok(Value::String(
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    ))
}

const FUNCS: &[(&str, gtmpl_value::Func)] = &[
    ("printf", bounded_printf),
    ("env", env),
    ("nomadService", nomad_service),
    ("nomadVar", nomad_var),
    ("nomadVarList", nomad_var_list),
    ("toLower", to_lower),
    ("toUpper", to_upper),
    ("trimSpace", trim_space),
    ("split", split),
    ("join", join),
    ("parseInt", parse_int),
    ("toJSON", to_json),
    ("base64Encode", base64_encode),
    ("base64Decode", base64_decode),
    ("replaceAll", replace_all),
    ("contains", contains),
    ("timestamp", timestamp),
];

/// `text` with `left`/`right` delimiters rewritten to gtmpl's `{{`/`}}`, and a literal
/// `{{` outside actions kept as text.
fn translate(text: &str, left: &str, right: &str) -> Result<String, String> {
    if left == "{{" && right == "}}" {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let Some(at) = rest.find(left) else {
            out.push_str(&rest.replace("{{", "{{\"{{\"}}"));
            return Ok(out);
        };
        out.push_str(&rest[..at].replace("{{", "{{\"{{\"}}"));
        let inner = &rest[at + left.len()..];
        let Some(end) = inner.find(right) else {
            return Err(format!(
                "an action opened with {left:?} is not closed with {right:?}"
            ));
        };
        out.push_str("{{");
        out.push_str(&inner[..end]);
        out.push_str("}}");
        rest = &inner[end + right.len()..];
    }
}

/// Refuse `define`, `template` and `block` actions: a template calling itself recurses
/// as deep as the engine lets it (100,000 calls), past the render thread's stack, and
/// would take the agent down. consul-template users rarely need them in a job file.
/// (After [`translate`], every `{{` opens an action.)
fn refuse_nested_templates(source: &str) -> Result<(), String> {
    for (at, _) in source.match_indices("{{") {
        let action = source[at + 2..].trim_start_matches('-').trim_start();
        for keyword in ["define", "template", "block"] {
            if action.strip_prefix(keyword).is_some_and(|rest| {
                rest.starts_with(|c: char| c.is_whitespace() || c == '"' || c == '`' || c == '}')
            }) {
                return Err(format!(
                    "`{{{{ {keyword} }}}}` actions are not supported in templates (a template \
                     that calls itself would recurse without bound)"
                ));
            }
        }
    }
    Ok(())
}

/// A writer that refuses to grow past [`MAX_RENDERED`].
struct Bounded(Vec<u8>);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED {
            return Err(std::io::Error::other(format!(
                "the rendered template is larger than {MAX_RENDERED} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Render `text` against `inputs`: the result, and what it asked for that `inputs`
/// lacked (render again once fetched).
pub(crate) fn render(
    text: &str,
    left: &str,
    right: &str,
    error_on_missing_key: bool,
    inputs: &Inputs,
) -> Result<(String, Wanted), String> {
    let source = translate(text, left, right)?;
    refuse_nested_templates(&source)?;
    let mut tmpl = gtmpl::Template::default();
    tmpl.add_funcs(FUNCS);
    tmpl.parse(source)
        .map_err(|e| format!("parsing the template: {e}"))?;
    CURRENT.with(|c| *c.borrow_mut() = Some((inputs.clone(), Wanted::default())));
    let mut out = Bounded(Vec::new());
    let result = tmpl.execute(&mut out, &gtmpl::Context::empty());
    let wanted = CURRENT
        .with(|c| c.borrow_mut().take())
        .map(|(_, w)| w)
        .unwrap_or_default();
    result.map_err(|e| format!("rendering the template: {e}"))?;
    let text =
        String::from_utf8(out.0).map_err(|_| "the rendered template is not UTF-8".to_owned())?;
    if error_on_missing_key && wanted.is_empty() && text.contains("<no value>") {
        return Err("a key the template reads is missing (error_on_missing_key)".into());
    }
    Ok((text, wanted))
}

/// The `KEY=VALUE` lines of a rendered `env = true` template (blank lines and `#`
/// comments skipped, `export ` and matching quotes around a value dropped).
pub(crate) fn parse_env(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: not KEY=VALUE", n + 1));
        };
        let k = k.trim();
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("line {}: {k:?} is not a variable name", n + 1));
        }
        let v = v.trim();
        let v = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(v);
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        let mut i = Inputs::default();
        i.env.insert("NOMAD_TASK_NAME".into(), "web".into());
        i.services.insert(
            "db".into(),
            vec![
                serde_json::json!({"Address": "10.0.0.1", "Port": 5432, "Tags": ["a"]}),
                serde_json::json!({"Address": "10.0.0.2", "Port": 5433, "Tags": []}),
            ],
        );
        i.vars.insert(
            "nomad/jobs/web".into(),
            Some(BTreeMap::from([("password".into(), "s3cret".into())])),
        );
        i
    }

    fn r(text: &str) -> String {
        render(text, "{{", "}}", false, &inputs()).unwrap().0
    }

    #[test]
    fn functions_render_as_consul_template_writes_them() {
        assert_eq!(r(r#"T={{ env "NOMAD_TASK_NAME" }}"#), "T=web");
        assert_eq!(
            r(r#"{{ range nomadService "db" }}{{ .Address }}:{{ .Port }} {{ end }}"#),
            "10.0.0.1:5432 10.0.0.2:5433 "
        );
        assert_eq!(
            r(r#"{{ with nomadVar "nomad/jobs/web" }}P={{ .password }}{{ end }}"#),
            "P=s3cret"
        );
        assert_eq!(r(r#"{{ "AbC" | toLower }}{{ "x" | toUpper }}"#), "abcX");
        assert_eq!(r(r#"{{ "a,b,c" | split "," | join ";" }}"#), "a;b;c");
        assert_eq!(r(r#"{{ "  x " | trimSpace }}"#), "x");
        assert_eq!(r(r#"{{ parseInt "42" }}"#), "42");
        assert_eq!(r(r#"{{ "aXa" | replaceAll "a" "b" }}"#), "bXb");
        assert_eq!(r(r#"{{ if "hello" | contains "ell" }}y{{ end }}"#), "y");
        assert_eq!(r(r#"{{ "hi" | base64Encode }}"#), "aGk=");
        assert_eq!(r(r#"{{ "aGk=" | base64Decode }}"#), "hi");
        assert_eq!(
            r(r#"{{ nomadVar "nomad/jobs/web" | toJSON }}"#),
            r#"{"password":"s3cret"}"#
        );
        assert!(r("{{ timestamp }}").ends_with('Z'));
        assert_eq!(r(r#"{{ printf "%3d|%.2f" 7 1.5 }}"#), "  7|1.50");
        let e = render(
            r#"{{ printf "%999999999d" 1 }}"#,
            "{{",
            "}}",
            false,
            &inputs(),
        )
        .unwrap_err();
        assert!(e.contains("at most"), "{e}");
    }

    /// Hostile templates fail with a reason instead of taking the agent down: one that
    /// calls itself (stack), one whose calls multiply a string (memory).
    #[test]
    fn recursion_and_growing_calls_are_refused() {
        let fail = |text: &str| render(text, "{{", "}}", false, &inputs()).unwrap_err();
        for text in [
            r#"{{define "x"}}{{template "x"}}{{end}}{{template "x"}}"#,
            r#"{{- block "b" . }}x{{ end }}"#,
            r#"{{ template "t" }}"#,
        ] {
            let e = fail(text);
            assert!(e.contains("not supported"), "{text}: {e}");
        }
        // Custom delimiters are translated first: the same actions are caught.
        let e = render(r#"[[define "x"]][[end]]"#, "[[", "]]", false, &inputs()).unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        // Text that merely says the words is fine.
        assert_eq!(r("define template block"), "define template block");
        assert_eq!(r(r#"{{ "template" }}"#), "template");

        let big = "a".repeat(20_000);
        let e = fail(&format!(
            r#"{{{{ "aaaaaaaaaa" | replaceAll "a" "{big}" | replaceAll "a" "{big}" }}}}"#
        ));
        assert!(e.contains("larger than"), "{e}");
        let e = fail(&format!(
            r#"{{{{ printf "%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s" {} }}}}"#,
            vec![format!("\"{big}\""); 56].join(" ")
        ));
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn unknown_dependencies_are_reported_for_fetching() {
        let (text, wanted) = render(
            r#"{{ range nomadService "api" }}x{{ end }}{{ with nomadVar "nomad/jobs/x" }}{{ end }}{{ range nomadVarList "nomad/jobs" }}{{ .Path }}{{ end }}"#,
            "{{",
            "}}",
            false,
            &inputs(),
        )
        .unwrap();
        assert_eq!(text, "");
        assert!(wanted.services.contains("api"));
        assert!(wanted.vars.contains("nomad/jobs/x"));
        assert!(wanted.var_lists.contains("nomad/jobs"));
        let mut i = inputs();
        i.vars.insert("nomad/jobs/gone".into(), None);
        let e = render(r#"{{ nomadVar "nomad/jobs/gone" }}"#, "{{", "}}", false, &i).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn other_delimiters_missing_keys_and_size() {
        let (t, _) = render(
            r#"[[ env "NOMAD_TASK_NAME" ]] {{ literal }}"#,
            "[[",
            "]]",
            false,
            &inputs(),
        )
        .unwrap();
        assert_eq!(t, "web {{ literal }}");
        let e = render(
            r#"{{ with nomadVar "nomad/jobs/web" }}{{ .nope }}{{ end }}"#,
            "{{",
            "}}",
            true,
            &inputs(),
        )
        .unwrap_err();
        assert!(e.contains("missing"), "{e}");
        let big = format!(
            "{{{{ range split \",\" \"{}\" }}}}{}{{{{ end }}}}",
            ",".repeat(2000),
            "x".repeat(1024)
        );
        let e = render(&big, "{{", "}}", false, &inputs()).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
        assert!(render("{{ if }}", "{{", "}}", false, &inputs()).is_err());
    }

    #[test]
    fn env_files_parse() {
        let env = parse_env("# c\nA=1\nexport B=\"two words\"\n\nC='x=y'\n").unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words");
        assert_eq!(env["C"], "x=y");
        assert!(parse_env("not a pair").is_err());
        assert!(parse_env("BAD-NAME=1").is_err());
    }
}
