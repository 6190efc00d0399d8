//! Evaluating one expression of a job file: runtime references kept as text, the
//! value converted to what the job's field needs (as Nomad's decoder converts: `"3"`
//! is a number, `3` a string, `"true"` a bool), errors placed on the expression.

use hcl::Value;
use hcl::edit::Decorated;
use hcl::edit::Span as _;
use hcl::edit::expr::Expression;
use hcl::edit::visit_mut::{VisitMut, visit_expr_mut};
use hcl::eval::{Context, Evaluate as _};
use serde_json::Value as Json;

use super::source::{HclError, Source};

/// Roots the evaluation context defines; any other root is a runtime reference.
const DEFINED_ROOTS: &[&str] = &["var", "local"];

/// Evaluate `expr` (parsed from `src`) in `ctx`.
pub(crate) fn evaluate(src: &Source, ctx: &Context, expr: &Expression) -> Result<Value, HclError> {
    let mut rewritten = expr.clone();
    RuntimeRefs {
        text: src.text,
        scopes: Vec::new(),
    }
    .visit_expr_mut(&mut rewritten);
    let converted: hcl::Expression = rewritten.into();
    let value = converted
        .evaluate(ctx)
        .map_err(|e| src.error(expr, format!("cannot evaluate: {e}")))?;
    let mut budget = super::MAX_VALUE_BYTES;
    if !fits(&value, &mut budget) {
        return Err(src.error(
            expr,
            format!("the value is larger than {} bytes", super::MAX_VALUE_BYTES),
        ));
    }
    Ok(value)
}

/// Whether `v` takes at most `budget` bytes (about: its JSON size), stopping early.
fn fits(v: &Value, budget: &mut usize) -> bool {
    let own = match v {
        Value::String(s) => s.len() + 2,
        Value::Object(m) => m.keys().map(|k| k.len() + 4).sum::<usize>() + 2,
        _ => 8,
    };
    let Some(left) = budget.checked_sub(own) else {
        return false;
    };
    *budget = left;
    match v {
        Value::Array(items) => items.iter().all(|i| fits(i, budget)),
        Value::Object(m) => m.values().all(|i| fits(i, budget)),
        _ => true,
    }
}

/// Replaces every reference whose root is not defined (`attr.kernel.name`,
/// `NOMAD_PORT_http`, `env["x"]`) by the string `${<its source text>}`, which is what
/// Nomad's HCL2 parser makes of them: the client interpolates them when it runs the task.
struct RuntimeRefs<'a> {
    text: &'a str,
    /// Names the enclosing `for` expressions define.
    scopes: Vec<String>,
}

impl RuntimeRefs<'_> {
    fn is_defined(&self, root: &str) -> bool {
        DEFINED_ROOTS.contains(&root) || self.scopes.iter().any(|s| s == root)
    }

    /// Nomad's text for an undefined reference at `span`: the enclosing `${ ... }` when
    /// the reference is all of an interpolation (spaces kept), else `${` + text + `}`.
    fn runtime_text(&self, span: std::ops::Range<usize>) -> String {
        let bytes = self.text.as_bytes();
        let inner = self.text.get(span.clone()).unwrap_or("");
        let mut open = None;
        let mut i = span.start;
        while i >= 2 {
            i -= 1;
            if bytes[i] == b'{' && bytes[i - 1] == b'$' {
                open = Some(i - 1);
                break;
            } else if bytes[i] != b' ' {
                break;
            }
        }
        let Some(open) = open else {
            return format!("${{{inner}}}");
        };
        let mut close = span.end;
        while close < bytes.len() && bytes[close] == b' ' {
            close += 1;
        }
        let trailing = if close < bytes.len() && bytes[close] == b'}' {
            self.text.get(span.end..close).unwrap_or("")
        } else {
            ""
        };
        format!(
            "{}{inner}{trailing}}}",
            self.text.get(open..span.start).unwrap_or("${")
        )
    }
}

impl VisitMut for RuntimeRefs<'_> {
    fn visit_expr_mut(&mut self, expr: &mut Expression) {
        let root = match expr {
            Expression::Variable(v) => Some(v.as_str().to_owned()),
            Expression::Traversal(t) => match &t.expr {
                Expression::Variable(v) => Some(v.as_str().to_owned()),
                _ => None,
            },
            _ => None,
        };
        if let Some(root) = root
            && !self.is_defined(&root)
            && let Some(span) = expr.span()
        {
            *expr = Expression::String(Decorated::new(self.runtime_text(span)));
            return;
        }
        if let Expression::ForExpr(f) = expr {
            // The collection is outside the loop's scope; the rest inside it.
            self.visit_expr_mut(&mut f.intro.collection_expr);
            let mut names = vec![f.intro.value_var.as_str().to_owned()];
            if let Some(k) = &f.intro.key_var {
                names.push(k.as_str().to_owned());
            }
            let depth = self.scopes.len();
            self.scopes.extend(names);
            if let Some(k) = &mut f.key_expr {
                self.visit_expr_mut(k);
            }
            self.visit_expr_mut(&mut f.value_expr);
            if let Some(c) = &mut f.cond {
                self.visit_expr_mut(&mut c.expr);
            }
            self.scopes.truncate(depth);
            return;
        }
        visit_expr_mut(self, expr);
    }
}

/// A value's kind, for messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// A number as Nomad (cty) writes it: whole numbers without a fraction.
pub(crate) fn number_text(n: &hcl::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => format!("{}", f as i64),
        Some(f) => f.to_string(),
        None => n.to_string(),
    }
}

/// A string, or a number or bool written as one.
pub(crate) fn to_string(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(number_text(n)),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("a string is required, found {}", describe(other))),
    }
}

/// A number, or a string holding one.
pub(crate) fn to_number(v: &Value) -> Result<f64, String> {
    let err = || format!("a number is required, found {}", describe(v));
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(err),
        Value::String(s) => s.trim().parse::<f64>().map_err(|_| err()),
        _ => Err(err()),
    }
}

/// A whole number.
pub(crate) fn to_int(v: &Value) -> Result<i64, String> {
    let f = to_number(v)?;
    if f.fract() != 0.0 || f.abs() > 9.0e15 {
        return Err(format!("a whole number is required, found {}", describe(v)));
    }
    Ok(f as i64)
}

/// A bool, or the string `"true"` / `"false"`.
pub(crate) fn to_bool(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        other => Err(format!("a bool is required, found {}", describe(other))),
    }
}

/// A list of strings.
pub(crate) fn to_string_list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| to_string(i).map_err(|e| format!("list element: {e}")))
            .collect(),
        other => Err(format!(
            "a list of strings is required, found {}",
            describe(other)
        )),
    }
}

/// A map of strings (numbers and bools written as strings, as Nomad's `map(string)`).
pub(crate) fn to_string_map(v: &Value) -> Result<serde_json::Map<String, Json>, String> {
    match v {
        Value::Object(entries) => entries
            .iter()
            .map(|(k, i)| {
                Ok((
                    k.clone(),
                    Json::String(to_string(i).map_err(|e| format!("{k:?}: {e}"))?),
                ))
            })
            .collect(),
        other => Err(format!(
            "a map of strings is required, found {}",
            describe(other)
        )),
    }
}

/// A duration in nanoseconds: a Go duration string (`"30s"`, `"1h30m"`, `"1.5s"`) or a
/// number of nanoseconds, as Nomad's decoder takes them.
pub(crate) fn to_duration_ns(v: &Value) -> Result<i64, String> {
    match v {
        Value::String(s) => parse_go_duration(s).ok_or_else(|| {
            format!("a duration is required (such as \"30s\" or \"1h30m\"), found string {s:?}")
        }),
        Value::Number(_) => to_int(v),
        other => Err(format!(
            "a duration is required (such as \"30s\"), found {}",
            describe(other)
        )),
    }
}

/// Go's `time.ParseDuration`: a signed sequence of decimal numbers with units ns, us
/// (µs), ms, s, m, h; `"0"` alone is zero.
pub(crate) fn parse_go_duration(text: &str) -> Option<i64> {
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale: f64 = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    if total > i64::MAX as f64 {
        return None;
    }
    let ns = total.round() as i64;
    Some(if negative { -ns } else { ns })
}

/// Any value as JSON (a task's free-form `config`).
pub(crate) fn to_json(v: &Value) -> Json {
    serde_json::to_value(v).unwrap_or(Json::Null)
}
