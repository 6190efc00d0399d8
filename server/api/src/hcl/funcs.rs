//! The functions job files call, with the meaning of Nomad's (cty's standard library):
//! upper, lower, title, format, join, split, concat, length, lookup, merge, replace,
//! regex_replace,
//! trim, trimspace, trimprefix, trimsuffix, chomp, substr, jsonencode, jsondecode,
//! tostring, tonumber, tobool, tolist, toset, tomap, coalesce, coalescelist, compact,
//! distinct, flatten, reverse, index, min, max, abs, ceil, floor, range, keys, values,
//! contains, element, file, uuidv4, timestamp.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use hcl::eval::{Context, FuncArgs, FuncDef, ParamType};
use hcl::{Map, Value};

use super::MAX_INCLUDED_FILE_BYTES;
use super::budget;
use super::eval::{describe, number_text, to_int, to_number, to_string};

type Func = fn(FuncArgs) -> Result<Value, String>;

thread_local! {
    /// The directory `file()` reads from: the job file's. hcl-rs's functions are plain
    /// `fn`s (no captured state), so the parse sets it for its own duration.
    static BASE_DIR: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// Sets the directory of `file()` until dropped; `None`: `file()` is refused.
pub(crate) struct BaseDirGuard(Option<PathBuf>);

impl BaseDirGuard {
    pub(crate) fn set(dir: Option<&Path>) -> Self {
        BaseDirGuard(BASE_DIR.with(|b| b.replace(dir.map(Path::to_path_buf))))
    }
}

impl Drop for BaseDirGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        BASE_DIR.with(|b| *b.borrow_mut() = previous);
    }
}

/// A function of `n` parameters whose every call is charged to the parse's budget
/// ([`budget::charge_result`]). hcl-rs takes plain `fn`s, hence the `const` and a macro.
macro_rules! fixed {
    ($n:expr, $f:expr) => {{
        const F: Func = $f;
        FuncDef::builder()
            .params((0..$n).map(|_| ParamType::Any))
            .build(|a| budget::charge_result(F(a)))
    }};
}

/// [`fixed!`] with any number of further parameters.
macro_rules! variadic {
    ($n:expr, $f:expr) => {{
        const F: Func = $f;
        FuncDef::builder()
            .params((0..$n).map(|_| ParamType::Any))
            .variadic_param(ParamType::Any)
            .build(|a| budget::charge_result(F(a)))
    }};
}

/// A context with every function and no variable.
pub(crate) fn base_context() -> Context<'static> {
    let mut ctx = Context::new();
    let table: Vec<(&str, FuncDef)> = vec![
        (
            "upper",
            fixed!(1, |a| Ok(Value::String(s(&a[0])?.to_uppercase()))),
        ),
        (
            "lower",
            fixed!(1, |a| Ok(Value::String(s(&a[0])?.to_lowercase()))),
        ),
        ("title", fixed!(1, title)),
        ("format", variadic!(1, format)),
        ("join", variadic!(1, join)),
        ("split", fixed!(2, split)),
        ("concat", variadic!(0, concat)),
        ("length", fixed!(1, length)),
        ("lookup", variadic!(2, lookup)),
        ("merge", variadic!(0, merge)),
        ("replace", fixed!(3, replace)),
        ("regex_replace", fixed!(3, regex_replace)),
        (
            "trimspace",
            fixed!(1, |a| Ok(Value::String(s(&a[0])?.trim().to_owned()))),
        ),
        (
            "trim",
            fixed!(2, |a| {
                let cut = s(&a[1])?;
                Ok(Value::String(
                    s(&a[0])?.trim_matches(|c| cut.contains(c)).to_owned(),
                ))
            }),
        ),
        (
            "trimprefix",
            fixed!(2, |a| {
                let text = s(&a[0])?;
                Ok(Value::String(
                    text.strip_prefix(s(&a[1])?.as_str())
                        .unwrap_or(&text)
                        .to_owned(),
                ))
            }),
        ),
        (
            "trimsuffix",
            fixed!(2, |a| {
                let text = s(&a[0])?;
                Ok(Value::String(
                    text.strip_suffix(s(&a[1])?.as_str())
                        .unwrap_or(&text)
                        .to_owned(),
                ))
            }),
        ),
        (
            "chomp",
            fixed!(1, |a| {
                Ok(Value::String(
                    s(&a[0])?.trim_end_matches(['\n', '\r']).to_owned(),
                ))
            }),
        ),
        ("substr", fixed!(3, substr)),
        (
            "jsonencode",
            fixed!(1, |a| {
                serde_json::to_string(&a[0])
                    .map(Value::String)
                    .map_err(|e| e.to_string())
            }),
        ),
        (
            "jsondecode",
            fixed!(1, |a| {
                serde_json::from_str::<Value>(&s(&a[0])?).map_err(|e| format!("jsondecode: {e}"))
            }),
        ),
        (
            "tostring",
            fixed!(1, |a| match &a[0] {
                Value::Null => Ok(Value::Null),
                v => to_string(v).map(Value::String),
            }),
        ),
        (
            "tonumber",
            fixed!(1, |a| match &a[0] {
                Value::Null => Ok(Value::Null),
                v => Ok(num(to_number(v)?)),
            }),
        ),
        (
            "tobool",
            fixed!(1, |a| match &a[0] {
                Value::Null => Ok(Value::Null),
                v => super::eval::to_bool(v).map(Value::Bool),
            }),
        ),
        ("tolist", fixed!(1, |a| list(&a[0]).map(Value::Array))),
        (
            "toset",
            fixed!(1, |a| Ok(Value::Array(dedup(list(&a[0])?)))),
        ),
        (
            "tomap",
            fixed!(1, |a| match &a[0] {
                Value::Object(_) => Ok(a[0].clone()),
                v => Err(format!("a map is required, found {}", describe(v))),
            }),
        ),
        (
            "coalesce",
            variadic!(0, |a| {
                a.iter()
                    .find(|v| !matches!(v, Value::Null))
                    .cloned()
                    .ok_or_else(|| "no non-null argument".to_owned())
            }),
        ),
        (
            "coalescelist",
            variadic!(0, |a| {
                a.iter()
                    .find(|v| matches!(v, Value::Array(items) if !items.is_empty()))
                    .cloned()
                    .ok_or_else(|| "no non-empty list argument".to_owned())
            }),
        ),
        (
            "compact",
            fixed!(1, |a| {
                Ok(Value::Array(
                    list(&a[0])?
                        .into_iter()
                        .filter(|v| {
                            !matches!(v, Value::Null)
                                && !matches!(v, Value::String(s) if s.is_empty())
                        })
                        .collect(),
                ))
            }),
        ),
        (
            "distinct",
            fixed!(1, |a| Ok(Value::Array(dedup(list(&a[0])?)))),
        ),
        (
            "flatten",
            fixed!(1, |a| Ok(Value::Array(flatten(list(&a[0])?)))),
        ),
        (
            "reverse",
            fixed!(1, |a| {
                Ok(Value::Array(list(&a[0])?.into_iter().rev().collect()))
            }),
        ),
        (
            "index",
            fixed!(2, |a| {
                list(&a[0])?
                    .iter()
                    .position(|v| *v == a[1])
                    .map(|i| Value::from(i as u64))
                    .ok_or_else(|| "item not found".to_owned())
            }),
        ),
        ("min", variadic!(0, |a| extreme(&a, |x, y| x < y))),
        ("max", variadic!(0, |a| extreme(&a, |x, y| x > y))),
        ("abs", fixed!(1, |a| Ok(num(to_number(&a[0])?.abs())))),
        ("ceil", fixed!(1, |a| Ok(num(to_number(&a[0])?.ceil())))),
        ("floor", fixed!(1, |a| Ok(num(to_number(&a[0])?.floor())))),
        ("range", variadic!(0, range)),
        (
            "keys",
            fixed!(1, |a| match &a[0] {
                Value::Object(m) => Ok(Value::Array(
                    sorted_keys(m).into_iter().map(Value::String).collect(),
                )),
                v => Err(format!("a map is required, found {}", describe(v))),
            }),
        ),
        (
            "values",
            fixed!(1, |a| match &a[0] {
                Value::Object(m) => Ok(Value::Array(
                    sorted_keys(m)
                        .iter()
                        .filter_map(|k| m.get(k).cloned())
                        .collect(),
                )),
                v => Err(format!("a map is required, found {}", describe(v))),
            }),
        ),
        (
            "contains",
            fixed!(2, |a| Ok(Value::Bool(list(&a[0])?.contains(&a[1])))),
        ),
        (
            "element",
            fixed!(2, |a| {
                let items = list(&a[0])?;
                if items.is_empty() {
                    return Err("cannot use element() on an empty list".to_owned());
                }
                let i = to_int(&a[1])?;
                if i < 0 {
                    return Err("element() index must not be negative".to_owned());
                }
                Ok(items[(i as usize) % items.len()].clone())
            }),
        ),
        ("file", fixed!(1, file)),
        (
            "uuidv4",
            fixed!(0, |_| Ok(Value::String(uuid::Uuid::new_v4().to_string()))),
        ),
        (
            "timestamp",
            fixed!(0, |_| {
                Ok(Value::String(
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                ))
            }),
        ),
    ];
    for (name, def) in table {
        ctx.declare_func(name, def);
    }
    ctx
}

fn s(v: &Value) -> Result<String, String> {
    to_string(v)
}

/// A number value: whole numbers as integers (so they print without a fraction).
fn num(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Value::from(f as i64)
    } else {
        hcl::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

fn list(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items.clone()),
        other => Err(format!("a list is required, found {}", describe(other))),
    }
}

/// `items` without repeats, first ones kept; in linear time (a list may hold a million
/// elements), each element known by its JSON text.
fn dedup(items: Vec<Value>) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    items
        .into_iter()
        .filter(|i| seen.insert(serde_json::to_string(i).unwrap_or_default()))
        .collect()
}

fn flatten(items: Vec<Value>) -> Vec<Value> {
    items
        .into_iter()
        .flat_map(|i| match i {
            Value::Array(inner) => flatten(inner),
            other => vec![other],
        })
        .collect()
}

fn sorted_keys(m: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = m.keys().cloned().collect();
    keys.sort();
    keys
}

fn title(a: FuncArgs) -> Result<Value, String> {
    let mut out = String::new();
    let mut start = true;
    for c in s(&a[0])?.chars() {
        if start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        start = c.is_whitespace();
    }
    Ok(Value::String(out))
}

fn join(a: FuncArgs) -> Result<Value, String> {
    let sep = s(&a[0])?;
    let mut parts = Vec::new();
    for l in a.iter().skip(1) {
        for item in list(l)? {
            parts.push(s(&item)?);
        }
    }
    // The separator repeats: bound the result before building it.
    let size = parts
        .iter()
        .map(|p| p.len().saturating_add(sep.len()))
        .fold(0usize, usize::saturating_add);
    if size > budget::left() {
        return Err(budget::work_error());
    }
    Ok(Value::String(parts.join(&sep)))
}

/// About what one value takes in memory besides its text.
const VALUE_OVERHEAD_BYTES: usize = 32;

fn split(a: FuncArgs) -> Result<Value, String> {
    let sep = s(&a[0])?;
    let text = s(&a[1])?;
    // Every piece is a value of its own (tens of bytes): bound them before making them.
    let pieces = if sep.is_empty() {
        text.chars().count()
    } else {
        text.matches(sep.as_str()).count() + 1
    };
    if pieces.saturating_mul(VALUE_OVERHEAD_BYTES) > budget::left() {
        return Err(budget::work_error());
    }
    if sep.is_empty() {
        return Ok(Value::Array(
            text.chars().map(|c| Value::String(c.to_string())).collect(),
        ));
    }
    Ok(Value::Array(
        text.split(sep.as_str())
            .map(|p| Value::String(p.to_owned()))
            .collect(),
    ))
}

fn concat(a: FuncArgs) -> Result<Value, String> {
    let mut out = Vec::new();
    for l in a.iter() {
        out.extend(list(l)?);
    }
    Ok(Value::Array(out))
}

fn length(a: FuncArgs) -> Result<Value, String> {
    let n = match &a[0] {
        Value::Array(items) => items.len(),
        Value::Object(m) => m.len(),
        Value::String(t) => t.chars().count(),
        other => return Err(format!("length of {} is undefined", describe(other))),
    };
    Ok(Value::from(n as u64))
}

fn lookup(a: FuncArgs) -> Result<Value, String> {
    let Value::Object(m) = &a[0] else {
        return Err(format!(
            "lookup: a map is required, found {}",
            describe(&a[0])
        ));
    };
    let key = s(&a[1])?;
    match (m.get(&key), a.get(2)) {
        (Some(v), _) => Ok(v.clone()),
        (None, Some(default)) => Ok(default.clone()),
        (None, None) => Err(format!("lookup: no key {key:?} and no default")),
    }
}

fn merge(a: FuncArgs) -> Result<Value, String> {
    let mut out = Map::new();
    for m in a.iter() {
        match m {
            Value::Object(entries) => {
                out.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            Value::Null => {}
            other => {
                return Err(format!(
                    "merge: a map is required, found {}",
                    describe(other)
                ));
            }
        }
    }
    Ok(Value::Object(out))
}

/// `replace(s, substring, replacement)`: plain text, as Nomad's (cty's) `replace`
/// (`regex_replace` takes a regular expression).
fn replace(a: FuncArgs) -> Result<Value, String> {
    let (text, from, to) = (s(&a[0])?, s(&a[1])?, s(&a[2])?);
    // Each match may grow: bound the result before building it.
    let size = text
        .len()
        .saturating_add(text.matches(from.as_str()).count().saturating_mul(to.len()));
    if size > budget::left() {
        return Err(budget::work_error());
    }
    Ok(Value::String(text.replace(&from, &to)))
}

/// `regex_replace(s, pattern, replacement)` (`$1` in the replacement).
fn regex_replace(a: FuncArgs) -> Result<Value, String> {
    let re = regex::Regex::new(&s(&a[1])?).map_err(|e| format!("regex_replace: {e}"))?;
    let (text, to) = (s(&a[0])?, s(&a[2])?);
    // Each match becomes the replacement with its groups (parts of the match)
    // substituted: bound the result before building it.
    let dollars = to.matches('$').count();
    let mut size = text.len();
    for m in re.find_iter(&text) {
        size = size.saturating_add(to.len().saturating_add(dollars.saturating_mul(m.len())));
        if size > budget::left() {
            return Err(budget::work_error());
        }
    }
    Ok(Value::String(
        re.replace_all(&text, to.as_str()).into_owned(),
    ))
}

fn substr(a: FuncArgs) -> Result<Value, String> {
    let chars: Vec<char> = s(&a[0])?.chars().collect();
    let mut offset = to_int(&a[1])?;
    let length = to_int(&a[2])?;
    if offset < 0 {
        offset += chars.len() as i64;
    }
    let start = (offset.max(0) as usize).min(chars.len());
    let end = if length < 0 {
        chars.len()
    } else {
        (start + length as usize).min(chars.len())
    };
    Ok(Value::String(chars[start..end].iter().collect()))
}

fn extreme(a: &FuncArgs, better: fn(f64, f64) -> bool) -> Result<Value, String> {
    let mut best: Option<f64> = None;
    for v in a.iter() {
        let n = to_number(v)?;
        if best.is_none_or(|b| better(n, b)) {
            best = Some(n);
        }
    }
    best.map(num)
        .ok_or_else(|| "at least one number is required".to_owned())
}

/// `range(limit)`, `range(start, limit)`, `range(start, limit, step)`; at most 1024
/// elements, as in Nomad.
fn range(a: FuncArgs) -> Result<Value, String> {
    let nums: Vec<f64> = a.iter().map(to_number).collect::<Result<_, _>>()?;
    let (start, limit, step) = match nums.as_slice() {
        [limit] => (0.0, *limit, 1.0),
        [start, limit] => (*start, *limit, if start <= limit { 1.0 } else { -1.0 }),
        [start, limit, step] => (*start, *limit, *step),
        _ => return Err("range takes 1 to 3 numbers".to_owned()),
    };
    if step == 0.0 {
        return Err("range: step must not be zero".to_owned());
    }
    let mut out = Vec::new();
    let mut x = start;
    while (step > 0.0 && x < limit) || (step < 0.0 && x > limit) {
        if out.len() >= 1024 {
            return Err("range: more than 1024 elements".to_owned());
        }
        out.push(num(x));
        x += step;
    }
    Ok(Value::Array(out))
}

/// cty's `format`: `%s`, `%d`, `%v`, `%q`, `%f`, `%t`, `%%`.
fn format(a: FuncArgs) -> Result<Value, String> {
    let spec = s(&a[0])?;
    let mut args = a.iter().skip(1);
    let mut out = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        // cty's (Go's fmt) verb syntax: %[flags][width][.precision]verb.
        let mut flags = FormatFlags::default();
        while let Some(f) = chars.peek().copied() {
            match f {
                '-' => flags.left = true,
                '0' => flags.zero = true,
                '+' => flags.plus = true,
                ' ' => flags.space = true,
                '#' => {}
                _ => break,
            }
            chars.next();
        }
        let width = format_number(&mut chars)?;
        let precision = if chars.peek() == Some(&'.') {
            chars.next();
            Some(format_number(&mut chars)?.unwrap_or(0))
        } else {
            None
        };
        let Some(verb) = chars.next() else {
            return Err("format: a verb is missing after %".to_owned());
        };
        let arg = args
            .next()
            .ok_or_else(|| format!("format: too few arguments for %{verb}"))?;
        let (text, numeric) = match verb {
            's' => {
                let t = s(arg)?;
                match precision {
                    Some(p) => (t.chars().take(p).collect(), false),
                    None => (t, false),
                }
            }
            'v' => match arg {
                Value::String(t) => (t.clone(), false),
                Value::Number(n) => (number_text(n), true),
                other => (
                    serde_json::to_string(other).map_err(|e| e.to_string())?,
                    false,
                ),
            },
            'd' => (signed(to_int(arg)?.to_string(), &flags), true),
            'x' => (format!("{:x}", to_int(arg)?), true),
            'X' => (format!("{:X}", to_int(arg)?), true),
            'o' => (format!("{:o}", to_int(arg)?), true),
            'b' => (format!("{:b}", to_int(arg)?), true),
            'f' => (
                signed(
                    format!("{:.*}", precision.unwrap_or(6), to_number(arg)?),
                    &flags,
                ),
                true,
            ),
            'e' => (
                signed(
                    format!("{:.*e}", precision.unwrap_or(6), to_number(arg)?),
                    &flags,
                ),
                true,
            ),
            'q' => (
                serde_json::to_string(&s(arg)?).map_err(|e| e.to_string())?,
                false,
            ),
            't' => (super::eval::to_bool(arg)?.to_string(), false),
            other => return Err(format!("format: unsupported verb %{other}")),
        };
        out.push_str(&pad(text, width.unwrap_or(0), &flags, numeric));
        // Widths repeat for every verb: bound the result as it grows.
        if out.len() > budget::left() {
            return Err(budget::work_error());
        }
    }
    if args.next().is_some() {
        return Err("format: too many arguments".to_owned());
    }
    Ok(Value::String(out))
}

/// The flags of one `format` verb.
#[derive(Default)]
struct FormatFlags {
    left: bool,
    zero: bool,
    plus: bool,
    space: bool,
}

/// Widths and precisions are bounded: a format string must not make a huge value.
const MAX_FORMAT_WIDTH: usize = 4096;

fn format_number(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Result<Option<usize>, String> {
    let mut n: Option<usize> = None;
    while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
        chars.next();
        let v = n.unwrap_or(0) * 10 + d as usize;
        if v > MAX_FORMAT_WIDTH {
            return Err(format!(
                "format: a width or precision above {MAX_FORMAT_WIDTH}"
            ));
        }
        n = Some(v);
    }
    Ok(n)
}

/// `+` or ` ` before a non-negative number, as the flags ask.
fn signed(text: String, flags: &FormatFlags) -> String {
    if text.starts_with('-') {
        text
    } else if flags.plus {
        format!("+{text}")
    } else if flags.space {
        format!(" {text}")
    } else {
        text
    }
}

/// `text` padded to `width` characters: on the right with `-`, with zeros after the
/// sign for a number with `0`, else with spaces on the left.
fn pad(text: String, width: usize, flags: &FormatFlags, numeric: bool) -> String {
    let len = text.chars().count();
    if len >= width {
        return text;
    }
    let fill = width - len;
    if flags.left {
        format!("{text}{}", " ".repeat(fill))
    } else if flags.zero && numeric {
        let (sign, digits) = match text.chars().next() {
            Some(c @ ('-' | '+' | ' ')) => (c.to_string(), text[1..].to_owned()),
            _ => (String::new(), text),
        };
        format!("{sign}{}{digits}", "0".repeat(fill))
    } else {
        format!("{}{text}", " ".repeat(fill))
    }
}

/// `file(path)`: a UTF-8 file, relative to the job file's directory, at most
/// [`MAX_INCLUDED_FILE_BYTES`].
fn file(a: FuncArgs) -> Result<Value, String> {
    let name = s(&a[0])?;
    let path = Path::new(&name);
    // Without the job file's directory (text from a request, `/v1/jobs/parse`), no
    // path is the submitter's to read: a relative one would be the server's.
    let Some(base) = BASE_DIR.with(|b| b.borrow().clone()) else {
        return Err("file() cannot read files here".to_owned());
    };
    let full = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    super::source::read_bounded(&full, MAX_INCLUDED_FILE_BYTES).map(Value::String)
}
