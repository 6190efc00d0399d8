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

use hcl::edit::expr::TraversalOperator;
use hcl::edit::visit::Visit as _;

use super::budget;
use super::source::{HclError, Source};

/// Roots the evaluation context defines; any other root is a runtime reference.
const DEFINED_ROOTS: &[&str] = &["var", "local"];

/// Evaluate `expr` (parsed from `src`) in `ctx`. The value is refused when nested
/// deeper than [`MAX_VALUE_DEPTH`](super::MAX_VALUE_DEPTH) or larger than
/// [`MAX_VALUE_BYTES`](super::MAX_VALUE_BYTES); the work it takes is charged to the
/// parse's budget, and bounded before it starts where hcl-rs does it (`for`s and the
/// copies of variables and locals it makes for each reference).
pub(crate) fn evaluate(src: &Source, ctx: &Context, expr: &Expression) -> Result<Value, HclError> {
    let mut rewritten = expr.clone();
    RuntimeRefs {
        text: src.text,
        scopes: Vec::new(),
    }
    .visit_expr_mut(&mut rewritten);
    let mut cost = Cost {
        src,
        ctx,
        in_for: false,
        bytes: 0,
        error: None,
    };
    cost.visit_expr(&rewritten);
    if let Some(e) = cost.error {
        return Err(e);
    }
    // The copies and loops hcl-rs will make, charged before it makes them.
    budget::charge(cost.bytes).map_err(|e| src.error(expr, e))?;
    let converted: hcl::Expression = rewritten.into();
    let value = converted
        .evaluate(ctx)
        .map_err(|e| src.error(expr, format!("cannot evaluate: {e}")))?;
    // Measured before anything recurses on it (`sorted`, the job's conversions).
    let size = budget::measure(&value, super::MAX_VALUE_BYTES)
        .map_err(|why| src.error(expr, budget::too_big_message(why, super::MAX_VALUE_BYTES)))?;
    budget::charge(size).map_err(|e| src.error(expr, e))?;
    Ok(sorted(value))
}

/// `v` with every object's keys in order: cty's maps and objects are ordered by key,
/// and a `for` over one (or its JSON) follows that order in Nomad. Only for measured
/// values (at most `MAX_VALUE_DEPTH` levels).
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// An upper bound of the bytes an expression copies out of variables and locals (each
/// reference copies its value), with each `for` multiplying its body's by the length
/// of its collection; refuses a `for` inside another and a `for` whose bound exceeds
/// [`MAX_FOR_BYTES`](super::MAX_FOR_BYTES). hcl-rs runs the loops, so this is the only
/// place to bound them before they run.
struct Cost<'a> {
    src: &'a Source<'a>,
    ctx: &'a Context<'a>,
    in_for: bool,
    bytes: usize,
    error: Option<HclError>,
}

/// What one iteration of a `for` may build besides the values it references.
const FOR_ITERATION_BYTES: usize = 1024;

impl Cost<'_> {
    fn nested(&self) -> Self {
        Cost {
            src: self.src,
            ctx: self.ctx,
            in_for: true,
            bytes: 0,
            error: None,
        }
    }

    fn for_expr(&mut self, whole: &Expression, f: &hcl::edit::expr::ForExpr) {
        self.bounded_loop(whole, &f.intro.collection_expr, 0, |body| {
            if let Some(k) = &f.key_expr {
                body.visit_expr(k);
            }
            body.visit_expr(&f.value_expr);
            if let Some(c) = &f.cond {
                body.visit_expr(&c.expr);
            }
        });
    }

    /// A `for` expression or a template's `%{ for }` at `at`, over `collection`, each
    /// iteration building `literal` bytes of text and what `body` visits.
    fn bounded_loop(
        &mut self,
        at: &dyn hcl::edit::Span,
        collection_expr: &Expression,
        literal: usize,
        visit_body: impl FnOnce(&mut Self),
    ) {
        if self.in_for {
            self.error = Some(self.src.error(
                at,
                "a for expression inside another is not supported by Drover",
            ));
            return;
        }
        let mut collection = self.nested();
        collection.visit_expr(collection_expr);
        if collection.error.is_some() {
            self.error = collection.error;
            return;
        }
        if collection.bytes > budget::left() {
            self.error = Some(self.src.error(at, budget::work_error()));
            return;
        }
        // The collection is evaluated once here and once by hcl-rs; an error is left
        // for hcl-rs to report in its words.
        let converted: hcl::Expression = collection_expr.clone().into();
        let length = match converted.evaluate(self.ctx) {
            Ok(Value::Array(items)) => items.len(),
            Ok(Value::Object(m)) => m.len(),
            _ => 0,
        };
        let mut body = self.nested();
        visit_body(&mut body);
        if body.error.is_some() {
            self.error = body.error;
            return;
        }
        let each = body
            .bytes
            .saturating_add(literal)
            .saturating_add(FOR_ITERATION_BYTES);
        let bound = length.saturating_mul(each);
        if bound > super::MAX_FOR_BYTES {
            self.error = Some(self.src.error(
                at,
                format!(
                    "this for expression may build {bound} bytes ({length} elements, {each} bytes each), more than Drover's limit of {} bytes",
                    super::MAX_FOR_BYTES
                ),
            ));
            return;
        }
        // The collection's copies are made twice: here and by hcl-rs.
        self.bytes = self
            .bytes
            .saturating_add(collection.bytes.saturating_mul(2))
            .saturating_add(bound);
    }
}

/// The bytes of text a template's literals (and its `%{ if }`s') hold.
fn literal_bytes(template: &hcl::edit::template::Template) -> usize {
    use hcl::edit::template::{Directive, Element};
    template
        .iter()
        .map(|e| match e {
            Element::Literal(l) => l.len(),
            Element::Interpolation(_) => 0,
            Element::Directive(d) => match d.as_ref() {
                Directive::If(i) => literal_bytes(&i.if_expr.template).saturating_add(
                    i.else_expr
                        .as_ref()
                        .map_or(0, |x| literal_bytes(&x.template)),
                ),
                Directive::For(f) => literal_bytes(&f.for_expr.template),
            },
        })
        .fold(0, usize::saturating_add)
}

impl hcl::edit::visit::Visit for Cost<'_> {
    fn visit_expr(&mut self, expr: &Expression) {
        if self.error.is_some() {
            return;
        }
        match expr {
            Expression::ForExpr(f) => self.for_expr(expr, f),
            Expression::Variable(v) if DEFINED_ROOTS.contains(&v.as_str()) => {
                self.bytes = self
                    .bytes
                    .saturating_add(budget::named_size(v.as_str(), None));
            }
            Expression::Traversal(t) => {
                if let Expression::Variable(v) = &t.expr
                    && DEFINED_ROOTS.contains(&v.as_str())
                {
                    let name = match t.operators.first().map(|o| o.value()) {
                        Some(TraversalOperator::GetAttr(i)) => Some(i.as_str()),
                        _ => None,
                    };
                    self.bytes = self
                        .bytes
                        .saturating_add(budget::named_size(v.as_str(), name));
                } else {
                    self.visit_expr(&t.expr);
                }
                for op in &t.operators {
                    if let TraversalOperator::Index(i) = op.value() {
                        self.visit_expr(i);
                    }
                }
            }
            _ => hcl::edit::visit::visit_expr(self, expr),
        }
    }

    fn visit_for_directive(&mut self, node: &hcl::edit::template::ForDirective) {
        if self.error.is_some() {
            return;
        }
        let f = &node.for_expr;
        self.bounded_loop(
            node,
            &f.collection_expr,
            literal_bytes(&f.template),
            |body| body.visit_template(&f.template),
        );
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
        if let Expression::Object(o) = expr {
            // Object literals in key order, as cty has them (a `for` over one follows it).
            let key_text = |k: &hcl::edit::expr::ObjectKey| match k {
                hcl::edit::expr::ObjectKey::Ident(i) => Some(i.as_str().to_owned()),
                hcl::edit::expr::ObjectKey::Expression(Expression::String(s)) => {
                    Some(s.as_str().to_owned())
                }
                hcl::edit::expr::ObjectKey::Expression(_) => None,
            };
            if o.iter().all(|(k, _)| key_text(k).is_some()) {
                let mut entries: Vec<_> = std::mem::take(o).into_iter().collect();
                entries.sort_by_key(|(k, _)| key_text(k));
                *o = entries.into_iter().collect();
            }
            visit_expr_mut(self, expr);
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

    /// A template's `%{ for }`: its variables are defined inside it, as a `for`'s.
    fn visit_for_template_expr_mut(&mut self, node: &mut hcl::edit::template::ForTemplateExpr) {
        self.visit_expr_mut(&mut node.collection_expr);
        let depth = self.scopes.len();
        self.scopes.push(node.value_var.as_str().to_owned());
        if let Some(k) = &node.key_var {
            self.scopes.push(k.as_str().to_owned());
        }
        self.visit_template_mut(&mut node.template);
        self.scopes.truncate(depth);
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
