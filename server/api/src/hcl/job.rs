//! The job block and what it holds, read into Nomad's API JSON.

use hcl::Value;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Attribute, Block, BlockLabel, Body, Structure};
use hcl::eval::Context;
use serde_json::{Map, Value as Json, json};

use super::eval::{self, evaluate};
use super::source::{HclError, Source};
use super::{UNSUPPORTED_ARGUMENTS, UNSUPPORTED_BLOCKS};

type Obj = Map<String, Json>;

/// The `n`th label of a block.
pub(crate) fn label(b: &Block, n: usize) -> Option<String> {
    b.labels.get(n).map(|l| match l {
        BlockLabel::Ident(i) => i.as_str().to_owned(),
        BlockLabel::String(s) => s.as_str().to_owned(),
    })
}

/// A block must have exactly `n` labels.
pub(crate) fn label_count(src: &Source, b: &Block, n: usize) -> Result<(), HclError> {
    if b.labels.len() == n {
        return Ok(());
    }
    let name = b.ident.as_str();
    Err(src.error(
        b,
        match n {
            0 => format!("block \"{name}\" takes no label"),
            1 => format!("block \"{name}\" needs exactly one label (its name), as in {name} \"example\" {{ ... }}"),
            _ => format!("block \"{name}\" needs {n} labels"),
        },
    ))
}

/// Every item of `body` must be one of `attrs` or `blocks`; else the error names it,
/// says whether Drover does not support it yet, or suggests the closest known name.
pub(crate) fn check_body(
    src: &Source,
    body: &Body,
    attrs: &[&str],
    blocks: &[&str],
) -> Result<(), HclError> {
    for item in body.iter() {
        match item {
            Structure::Attribute(a) => {
                let key = a.key.as_str();
                if attrs.contains(&key) {
                    if body
                        .iter()
                        .filter(|i| matches!(i, Structure::Attribute(o) if o.key.as_str() == key))
                        .count()
                        > 1
                    {
                        let first = body
                            .iter()
                            .find_map(|i| match i {
                                Structure::Attribute(o) if o.key.as_str() == key => Some(o),
                                _ => None,
                            })
                            .filter(|o| !std::ptr::eq(*o, a));
                        if first.is_some() {
                            return Err(
                                src.error(&a.key, format!("argument \"{key}\" is set twice"))
                            );
                        }
                    }
                    continue;
                }
                if blocks.contains(&key) {
                    // Nomad takes `meta = {...}` and `env = {...}` too: the callers ask for
                    // those as attributes; any other block written as an attribute is not.
                    return Err(src.error(
                        &a.key,
                        format!("\"{key}\" is a block here: write {key} {{ ... }}"),
                    ));
                }
                if UNSUPPORTED_ARGUMENTS.contains(&key) {
                    return Err(src.error(
                        &a.key,
                        format!("argument \"{key}\" is not supported by Drover yet"),
                    ));
                }
                return Err(src.error(
                    &a.key,
                    match closest(key, attrs) {
                        Some(m) => format!("unsupported argument \"{key}\"; did you mean \"{m}\"?"),
                        None => format!("unsupported argument \"{key}\""),
                    },
                ));
            }
            Structure::Block(b) => {
                let name = b.ident.as_str();
                if blocks.contains(&name) {
                    continue;
                }
                if UNSUPPORTED_BLOCKS.contains(&name) {
                    return Err(src.error(
                        b,
                        format!("block \"{name}\" is not supported by Drover yet"),
                    ));
                }
                if attrs.contains(&name) {
                    return Err(src.error(
                        b,
                        format!("\"{name}\" is an argument here: write {name} = ..."),
                    ));
                }
                return Err(src.error(
                    b,
                    match closest(name, blocks) {
                        Some(m) => format!("unsupported block \"{name}\"; did you mean \"{m}\"?"),
                        None => format!("unsupported block \"{name}\""),
                    },
                ));
            }
        }
    }
    Ok(())
}

/// The known name nearest `word` (Levenshtein distance at most a third of its length,
/// at least 2 for words of 4 letters or more, so that a swap of two letters is found),
/// as a suggestion.
fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (levenshtein(word, k), *k))
        .filter(|(d, _)| {
            let len = word.chars().count();
            *d <= (len / 3).max(if len >= 4 { 2 } else { 1 })
        })
        .min()
        .map(|(_, k)| k)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// The attribute `name` of `body`, if set.
pub(crate) fn attribute<'b>(
    _src: &Source,
    body: &'b Body,
    name: &str,
) -> Result<Option<&'b Attribute>, HclError> {
    Ok(body.iter().find_map(|i| match i {
        Structure::Attribute(a) if a.key.as_str() == name => Some(a),
        _ => None,
    }))
}

fn blocks<'b, 'n>(body: &'b Body, name: &'n str) -> impl Iterator<Item = &'b Block> + use<'b, 'n> {
    body.iter().filter_map(move |i| match i {
        Structure::Block(b) if b.ident.as_str() == name => Some(b),
        _ => None,
    })
}

/// The one block `name` of `body` (with no label), if any.
fn single_block<'b>(
    src: &Source,
    body: &'b Body,
    name: &str,
) -> Result<Option<&'b Block>, HclError> {
    let mut found = blocks(body, name);
    let first = found.next();
    if let Some(second) = found.next() {
        return Err(src.error(second, format!("only one \"{name}\" block is allowed here")));
    }
    if let Some(b) = first {
        label_count(src, b, 0)?;
    }
    Ok(first)
}

/// Reads the attributes of one body, converting and placing errors.
struct Reader<'r, 's> {
    src: &'r Source<'s>,
    ctx: &'r Context<'static>,
}

/// (HCL argument, API key, kind) of a block of plain arguments.
type Field = (&'static str, &'static str, Kind);

#[derive(Clone, Copy)]
enum Kind {
    String,
    Int,
    Bool,
    Duration,
    StringList,
    StringMap,
}

impl Reader<'_, '_> {
    fn value(&self, expr: &Expression) -> Result<Value, HclError> {
        evaluate(self.src, self.ctx, expr)
    }

    /// Set `out[key]` from the attribute `name` of `body` converted to `kind`, when the
    /// attribute is there and not null.
    fn put(
        &self,
        out: &mut Obj,
        body: &Body,
        name: &str,
        key: &str,
        kind: Kind,
    ) -> Result<(), HclError> {
        let Some(a) = attribute(self.src, body, name)? else {
            return Ok(());
        };
        let v = self.value(&a.value)?;
        if matches!(v, Value::Null) {
            return Ok(());
        }
        let converted = match kind {
            Kind::String => eval::to_string(&v).map(Json::String),
            Kind::Int => eval::to_int(&v).map(Json::from),
            Kind::Bool => eval::to_bool(&v).map(Json::Bool),
            Kind::Duration => eval::to_duration_ns(&v).map(Json::from),
            Kind::StringList => eval::to_string_list(&v).map(Json::from),
            Kind::StringMap => eval::to_string_map(&v).map(Json::Object),
        }
        .map_err(|e| self.src.error(&a.value, format!("\"{name}\": {e}")))?;
        out.insert(key.to_owned(), converted);
        Ok(())
    }

    /// `meta`, `env`: a block of `KEY = value` lines, or an attribute `name = { ... }`
    /// (which also takes keys that are not identifiers), as Nomad takes both.
    fn put_map(&self, out: &mut Obj, body: &Body, name: &str, key: &str) -> Result<(), HclError> {
        let attr = attribute(self.src, body, name)?;
        let mut found = blocks(body, name);
        match (attr, found.next()) {
            (Some(_), Some(b)) => Err(self.src.error(
                b,
                format!("\"{name}\" is given twice (as an argument and a block)"),
            )),
            (Some(_), None) => self.put(out, body, name, key, Kind::StringMap),
            (None, Some(b)) => {
                if let Some(second) = found.next() {
                    return Err(self
                        .src
                        .error(second, format!("only one \"{name}\" block is allowed here")));
                }
                label_count(self.src, b, 0)?;
                let mut map = Obj::new();
                for item in b.body.iter() {
                    match item {
                        Structure::Attribute(a) => {
                            let v = self.value(&a.value)?;
                            let text = eval::to_string(&v).map_err(|e| {
                                self.src
                                    .error(&a.value, format!("{name} \"{}\": {e}", a.key.as_str()))
                            })?;
                            map.insert(a.key.as_str().to_owned(), Json::String(text));
                        }
                        Structure::Block(inner) => {
                            return Err(self.src.error(
                                inner,
                                format!("unsupported block \"{}\" in {name}", inner.ident.as_str()),
                            ));
                        }
                    }
                }
                out.insert(key.to_owned(), Json::Object(map));
                Ok(())
            }
            (None, None) => Ok(()),
        }
    }

    /// A free-form body (a task's `config`) as JSON: attributes as their values (a map
    /// as a list of one map), blocks as lists of objects under their type (labels nest:
    /// `a "x" {}` is `{"a": [{"x": [{}]}]}`), as Nomad keeps them.
    fn free_form(&self, body: &Body) -> Result<Obj, HclError> {
        let mut out = Obj::new();
        for item in body.iter() {
            match item {
                Structure::Attribute(a) => {
                    // As Nomad keeps them: a map argument becomes a list of that one
                    // map (`a = { b = 1 }` is `"a": [{"b": 1}]`), like a block; null
                    // is no argument.
                    let v = match eval::to_json(&self.value(&a.value)?) {
                        Json::Null => continue,
                        map @ Json::Object(_) => Json::Array(vec![map]),
                        other => other,
                    };
                    out.insert(a.key.as_str().to_owned(), v);
                }
                Structure::Block(b) => {
                    let mut inner = Json::Object(self.free_form(&b.body)?);
                    for n in (0..b.labels.len()).rev() {
                        inner = json!({ label(b, n).unwrap_or_default(): [inner] });
                    }
                    let entry = out
                        .entry(b.ident.as_str().to_owned())
                        .or_insert_with(|| json!([]));
                    match entry {
                        Json::Array(items) => items.push(inner),
                        _ => {
                            return Err(self.src.error(
                                b,
                                format!("\"{}\" is both an argument and a block", b.ident.as_str()),
                            ));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// A task's `device "vendor/type/name" { count, constraint }` as Nomad's
    /// `RequestedDevice` (count 1 when left out; `affinity` is refused as unsupported).
    fn device(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 1)?;
        check_body(self.src, &b.body, &["count"], &["constraint"])?;
        let mut o = Obj::new();
        o.insert("Name".into(), label(b, 0).unwrap_or_default().into());
        o.insert("Count".into(), 1.into());
        self.put(&mut o, &b.body, "count", "Count", Kind::Int)?;
        o.insert(
            "Constraints".into(),
            self.constraints(&b.body)?.unwrap_or(Json::Null),
        );
        o.insert("Affinities".into(), Json::Null);
        Ok(Json::Object(o))
    }

    fn constraints(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let mut list = Vec::new();
        for b in blocks(body, "constraint") {
            label_count(self.src, b, 0)?;
            list.push(self.constraint(b)?);
        }
        Ok((!list.is_empty()).then_some(Json::Array(list)))
    }

    /// A constraint as Nomad reads one: `attribute`/`operator`/`value`, or one of the
    /// shorthands (`version = "> 1.2"`, `regexp = "..."`, `set_contains = "a,b"`,
    /// `distinct_hosts = true`, `distinct_property = "${meta.rack}"`) that set the
    /// operator; `"="` when none is given.
    fn constraint(&self, b: &Block) -> Result<Json, HclError> {
        const SHORTHANDS: &[&str] = &[
            "version",
            "semver",
            "regexp",
            "set_contains",
            "set_contains_all",
            "set_contains_any",
        ];
        let mut names = vec![
            "attribute",
            "operator",
            "value",
            "distinct_hosts",
            "distinct_property",
        ];
        names.extend(SHORTHANDS);
        check_body(self.src, &b.body, &names, &[])?;
        let mut o = Obj::new();
        let text = |name: &str| -> Result<String, HclError> {
            let mut tmp = Obj::new();
            self.put(&mut tmp, &b.body, name, "v", Kind::String)?;
            Ok(tmp
                .get("v")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned())
        };
        let mut l_target = text("attribute")?;
        let mut r_target = text("value")?;
        let mut operand = text("operator")?;
        for short in ["version", "semver", "regexp", "set_contains"] {
            let v = text(short)?;
            if !v.is_empty() {
                operand = short.to_owned();
                r_target = v;
            }
        }
        for short in ["set_contains_all", "set_contains_any"] {
            // Nomad 1.0's HCL2 parser accepts these but sets nothing from them; later
            // versions take them as operators. Take them, as a user would expect.
            let v = text(short)?;
            if !v.is_empty() {
                operand = short.to_owned();
                r_target = v;
            }
        }
        let mut tmp = Obj::new();
        self.put(&mut tmp, &b.body, "distinct_hosts", "v", Kind::Bool)?;
        if tmp.get("v") == Some(&Json::Bool(true)) {
            operand = "distinct_hosts".to_owned();
        }
        let property = text("distinct_property")?;
        if !property.is_empty() {
            operand = "distinct_property".to_owned();
            l_target = property;
        }
        if operand.is_empty() {
            operand = "=".to_owned();
        }
        o.insert("LTarget".into(), l_target.into());
        o.insert("RTarget".into(), r_target.into());
        o.insert("Operand".into(), operand.into());
        Ok(Json::Object(o))
    }

    fn update(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let Some(b) = single_block(self.src, body, "update")? else {
            return Ok(None);
        };
        let fields: &[Field] = &[
            ("stagger", "Stagger", Kind::Duration),
            ("max_parallel", "MaxParallel", Kind::Int),
            ("health_check", "HealthCheck", Kind::String),
            ("min_healthy_time", "MinHealthyTime", Kind::Duration),
            ("healthy_deadline", "HealthyDeadline", Kind::Duration),
            ("progress_deadline", "ProgressDeadline", Kind::Duration),
            ("canary", "Canary", Kind::Int),
            ("auto_revert", "AutoRevert", Kind::Bool),
            ("auto_promote", "AutoPromote", Kind::Bool),
        ];
        self.fields(&b.body, fields).map(Some)
    }

    fn reschedule(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let Some(b) = single_block(self.src, body, "reschedule")? else {
            return Ok(None);
        };
        let fields: &[Field] = &[
            ("attempts", "Attempts", Kind::Int),
            ("interval", "Interval", Kind::Duration),
            ("delay", "Delay", Kind::Duration),
            ("delay_function", "DelayFunction", Kind::String),
            ("max_delay", "MaxDelay", Kind::Duration),
            ("unlimited", "Unlimited", Kind::Bool),
        ];
        self.fields(&b.body, fields).map(Some)
    }

    fn restart(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let Some(b) = single_block(self.src, body, "restart")? else {
            return Ok(None);
        };
        let fields: &[Field] = &[
            ("interval", "Interval", Kind::Duration),
            ("attempts", "Attempts", Kind::Int),
            ("delay", "Delay", Kind::Duration),
            ("mode", "Mode", Kind::String),
        ];
        self.fields(&b.body, fields).map(Some)
    }

    /// A block of plain arguments: (HCL name, API key, kind).
    fn fields(&self, body: &Body, fields: &[Field]) -> Result<Json, HclError> {
        let names: Vec<&str> = fields.iter().map(|f| f.0).collect();
        check_body(self.src, body, &names, &[])?;
        let mut o = Obj::new();
        for (name, key, kind) in fields {
            self.put(&mut o, body, name, key, *kind)?;
        }
        Ok(Json::Object(o))
    }

    /// A group's `network` block: Nomad's `NetworkResource`, static ports as
    /// `ReservedPorts`, the others as `DynamicPorts`.
    fn network(&self, b: &Block) -> Result<Json, HclError> {
        check_body(self.src, &b.body, &["mode"], &["port"])?;
        let mut o = Obj::new();
        o.insert("Mode".into(), "".into());
        self.put(&mut o, &b.body, "mode", "Mode", Kind::String)?;
        o.insert("Device".into(), "".into());
        o.insert("CIDR".into(), "".into());
        o.insert("IP".into(), "".into());
        let mut reserved = Vec::new();
        let mut dynamic = Vec::new();
        for p in blocks(&b.body, "port") {
            label_count(self.src, p, 1)?;
            check_body(self.src, &p.body, &["static", "to", "host_network"], &[])?;
            let mut po = Obj::new();
            po.insert("Label".into(), label(p, 0).unwrap_or_default().into());
            po.insert("Value".into(), 0.into());
            self.put(&mut po, &p.body, "static", "Value", Kind::Int)?;
            po.insert("To".into(), 0.into());
            self.put(&mut po, &p.body, "to", "To", Kind::Int)?;
            po.insert("HostNetwork".into(), "".into());
            self.put(
                &mut po,
                &p.body,
                "host_network",
                "HostNetwork",
                Kind::String,
            )?;
            if po.get("Value").and_then(Json::as_i64).unwrap_or(0) != 0 {
                reserved.push(Json::Object(po));
            } else {
                dynamic.push(Json::Object(po));
            }
        }
        if !reserved.is_empty() {
            o.insert("ReservedPorts".into(), Json::Array(reserved));
        }
        if !dynamic.is_empty() {
            o.insert("DynamicPorts".into(), Json::Array(dynamic));
        }
        Ok(Json::Object(o))
    }

    /// The `service` blocks of a group or task, as Nomad's `Services` (none: `None`).
    fn services(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let mut list = Vec::new();
        for b in blocks(body, "service") {
            label_count(self.src, b, 0)?;
            list.push(self.service(b)?);
        }
        Ok((!list.is_empty()).then_some(Json::Array(list)))
    }

    /// One `service` block. `provider` is Nomad 1.3's: only `"nomad"` (Drover keeps
    /// services itself), printed as `Provider` when the file sets it.
    fn service(&self, b: &Block) -> Result<Json, HclError> {
        let body = &b.body;
        check_body(
            self.src,
            body,
            &["name", "port", "tags", "meta", "provider", "task"],
            &["check", "check_restart", "meta"],
        )?;
        let mut o = Obj::new();
        o.insert("Id".into(), "".into());
        o.insert("Name".into(), "".into());
        self.put(&mut o, body, "name", "Name", Kind::String)?;
        self.put(&mut o, body, "tags", "Tags", Kind::StringList)?;
        o.insert("EnableTagOverride".into(), false.into());
        o.insert("PortLabel".into(), "".into());
        self.put(&mut o, body, "port", "PortLabel", Kind::String)?;
        o.insert("AddressMode".into(), "".into());
        let mut checks = Vec::new();
        for c in blocks(body, "check") {
            label_count(self.src, c, 0)?;
            checks.push(self.check(c)?);
        }
        if !checks.is_empty() {
            o.insert("Checks".into(), Json::Array(checks));
        }
        if let Some(r) = self.check_restart(body)? {
            o.insert("CheckRestart".into(), r);
        }
        self.put_map(&mut o, body, "meta", "Meta")?;
        o.insert("TaskName".into(), "".into());
        self.put(&mut o, body, "task", "TaskName", Kind::String)?;
        if let Some(a) = attribute(self.src, body, "provider")? {
            let mut tmp = Obj::new();
            self.put(&mut tmp, body, "provider", "Provider", Kind::String)?;
            match tmp.get("Provider").and_then(Json::as_str) {
                None => {}
                Some(crate::types::NOMAD_SERVICE_PROVIDER) => {
                    o.insert(
                        "Provider".into(),
                        crate::types::NOMAD_SERVICE_PROVIDER.into(),
                    );
                }
                Some(other) => {
                    return Err(self.src.error(
                        &a.value,
                        format!(
                            "provider {other:?} is not supported: Drover keeps services itself: provider = \"nomad\""
                        ),
                    ));
                }
            }
        }
        Ok(Json::Object(o))
    }

    /// One `check` block of a service, with every key Nomad 1.0 prints.
    fn check(&self, b: &Block) -> Result<Json, HclError> {
        let body = &b.body;
        check_body(
            self.src,
            body,
            &[
                "name", "type", "command", "args", "path", "protocol", "port", "expose",
                "interval", "timeout", "method", "task",
            ],
            &["header", "check_restart"],
        )?;
        let mut o = Obj::new();
        o.insert("Id".into(), "".into());
        let strings: &[(&str, &str)] = &[
            ("name", "Name"),
            ("type", "Type"),
            ("command", "Command"),
            ("path", "Path"),
            ("protocol", "Protocol"),
            ("port", "PortLabel"),
        ];
        for (name, key) in strings {
            o.insert((*key).into(), "".into());
            self.put(&mut o, body, name, key, Kind::String)?;
        }
        self.put(&mut o, body, "args", "Args", Kind::StringList)?;
        o.insert("Expose".into(), false.into());
        self.put(&mut o, body, "expose", "Expose", Kind::Bool)?;
        o.insert("AddressMode".into(), "".into());
        o.insert("Interval".into(), 0.into());
        self.put(&mut o, body, "interval", "Interval", Kind::Duration)?;
        o.insert("Timeout".into(), 0.into());
        self.put(&mut o, body, "timeout", "Timeout", Kind::Duration)?;
        o.insert("InitialStatus".into(), "".into());
        o.insert("TLSSkipVerify".into(), false.into());
        if let Some(h) = single_block(self.src, body, "header")? {
            o.insert("Header".into(), self.header(h)?);
        }
        o.insert("Method".into(), "".into());
        self.put(&mut o, body, "method", "Method", Kind::String)?;
        if let Some(r) = self.check_restart(body)? {
            o.insert("CheckRestart".into(), r);
        }
        o.insert("GRPCService".into(), "".into());
        o.insert("GRPCUseTLS".into(), false.into());
        o.insert("TaskName".into(), "".into());
        self.put(&mut o, body, "task", "TaskName", Kind::String)?;
        o.insert("SuccessBeforePassing".into(), 0.into());
        o.insert("FailuresBeforeCritical".into(), 0.into());
        Ok(Json::Object(o))
    }

    /// A check's `header { Name = ["value", ...] }`.
    fn header(&self, b: &Block) -> Result<Json, HclError> {
        let mut map = Obj::new();
        for item in b.body.iter() {
            match item {
                Structure::Attribute(a) => {
                    let v = self.value(&a.value)?;
                    let values = eval::to_string_list(&v).map_err(|e| {
                        self.src
                            .error(&a.value, format!("header \"{}\": {e}", a.key.as_str()))
                    })?;
                    map.insert(a.key.as_str().to_owned(), values.into());
                }
                Structure::Block(inner) => {
                    return Err(self.src.error(
                        inner,
                        format!("unsupported block \"{}\" in header", inner.ident.as_str()),
                    ));
                }
            }
        }
        Ok(Json::Object(map))
    }

    /// `check_restart { limit, grace, ignore_warnings }` of a service or check.
    fn check_restart(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let Some(b) = single_block(self.src, body, "check_restart")? else {
            return Ok(None);
        };
        check_body(
            self.src,
            &b.body,
            &["limit", "grace", "ignore_warnings"],
            &[],
        )?;
        let mut o = Obj::new();
        o.insert("Limit".into(), 0.into());
        self.put(&mut o, &b.body, "limit", "Limit", Kind::Int)?;
        self.put(&mut o, &b.body, "grace", "Grace", Kind::Duration)?;
        o.insert("IgnoreWarnings".into(), false.into());
        self.put(
            &mut o,
            &b.body,
            "ignore_warnings",
            "IgnoreWarnings",
            Kind::Bool,
        )?;
        Ok(Some(Json::Object(o)))
    }

    /// An `artifact` block (`api.TaskArtifact`), with what Nomad 1.0 prints.
    fn artifact(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 0)?;
        let body = &b.body;
        check_body(
            self.src,
            body,
            &["source", "destination", "mode", "options", "headers"],
            &["options", "headers"],
        )?;
        let mut o = Obj::new();
        self.put(&mut o, body, "source", "GetterSource", Kind::String)?;
        self.put_map(&mut o, body, "options", "GetterOptions")?;
        self.put_map(&mut o, body, "headers", "GetterHeaders")?;
        self.put(&mut o, body, "mode", "GetterMode", Kind::String)?;
        self.put(&mut o, body, "destination", "RelativeDest", Kind::String)?;
        Ok(Json::Object(o))
    }

    /// A `template` block (`api.Template`), with the defaults Nomad 1.0's parser fills
    /// in (`ChangeMode`, `Splay`, `Perms`).
    fn template(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 0)?;
        let body = &b.body;
        check_body(
            self.src,
            body,
            &[
                "source",
                "destination",
                "data",
                "change_mode",
                "change_signal",
                "splay",
                "perms",
                "left_delimiter",
                "right_delimiter",
                "env",
                "error_on_missing_key",
            ],
            &[],
        )?;
        let mut o = Obj::new();
        self.put(&mut o, body, "source", "SourcePath", Kind::String)?;
        self.put(&mut o, body, "destination", "DestPath", Kind::String)?;
        self.put(&mut o, body, "data", "EmbeddedTmpl", Kind::String)?;
        o.insert("ChangeMode".into(), "restart".into());
        self.put(&mut o, body, "change_mode", "ChangeMode", Kind::String)?;
        self.put(&mut o, body, "change_signal", "ChangeSignal", Kind::String)?;
        o.insert("Splay".into(), 5_000_000_000_i64.into());
        self.put(&mut o, body, "splay", "Splay", Kind::Duration)?;
        o.insert("Perms".into(), "0644".into());
        self.put(&mut o, body, "perms", "Perms", Kind::String)?;
        self.put(&mut o, body, "left_delimiter", "LeftDelim", Kind::String)?;
        self.put(&mut o, body, "right_delimiter", "RightDelim", Kind::String)?;
        self.put(&mut o, body, "env", "Envvars", Kind::Bool)?;
        self.put(
            &mut o,
            body,
            "error_on_missing_key",
            "ErrMissingKey",
            Kind::Bool,
        )?;
        Ok(Json::Object(o))
    }

    /// A group's `volume "NAME" { ... }` blocks as Nomad's `Volumes` map (by name),
    /// each as Nomad 1.0 prints it (`Name`, `Type`, `Source`, `ReadOnly`,
    /// `MountOptions`); `access_mode` and `attachment_mode` (Nomad 1.1's) when set.
    fn volumes(&self, body: &Body) -> Result<Option<Json>, HclError> {
        let mut out = Obj::new();
        for b in blocks(body, "volume") {
            label_count(self.src, b, 1)?;
            let name = label(b, 0).unwrap_or_default();
            if out.contains_key(&name) {
                return Err(self.src.error(
                    b,
                    format!("volume \"{name}\" is defined twice in the group"),
                ));
            }
            check_body(
                self.src,
                &b.body,
                &[
                    "type",
                    "source",
                    "read_only",
                    "access_mode",
                    "attachment_mode",
                ],
                &[],
            )?;
            let mut o = Obj::new();
            o.insert("Name".into(), name.clone().into());
            o.insert("Type".into(), "".into());
            self.put(&mut o, &b.body, "type", "Type", Kind::String)?;
            o.insert("Source".into(), "".into());
            self.put(&mut o, &b.body, "source", "Source", Kind::String)?;
            o.insert("ReadOnly".into(), false.into());
            self.put(&mut o, &b.body, "read_only", "ReadOnly", Kind::Bool)?;
            self.put(&mut o, &b.body, "access_mode", "AccessMode", Kind::String)?;
            self.put(
                &mut o,
                &b.body,
                "attachment_mode",
                "AttachmentMode",
                Kind::String,
            )?;
            o.insert("MountOptions".into(), Json::Null);
            out.insert(name, Json::Object(o));
        }
        Ok((!out.is_empty()).then_some(Json::Object(out)))
    }

    /// A task's `volume_mount { ... }` (`api.VolumeMount`), unset fields `null` as
    /// Nomad 1.0 prints them.
    fn volume_mount(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 0)?;
        let body = &b.body;
        check_body(
            self.src,
            body,
            &["volume", "destination", "read_only", "propagation_mode"],
            &[],
        )?;
        let mut o = Obj::new();
        for (name, key, kind) in [
            ("volume", "Volume", Kind::String),
            ("destination", "Destination", Kind::String),
            ("read_only", "ReadOnly", Kind::Bool),
            ("propagation_mode", "PropagationMode", Kind::String),
        ] {
            o.insert(key.into(), Json::Null);
            self.put(&mut o, body, name, key, kind)?;
        }
        Ok(Json::Object(o))
    }

    fn group(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 1)?;
        let body = &b.body;
        check_body(
            self.src,
            body,
            &["count", "meta"],
            &[
                "constraint",
                "meta",
                "restart",
                "reschedule",
                "update",
                "task",
                "network",
                "service",
                "volume",
            ],
        )?;
        let mut o = Obj::new();
        o.insert("Name".into(), label(b, 0).unwrap_or_default().into());
        self.put(&mut o, body, "count", "Count", Kind::Int)?;
        if let Some(v) = self.volumes(body)? {
            o.insert("Volumes".into(), v);
        }
        if let Some(n) = single_block(self.src, body, "network")? {
            o.insert("Networks".into(), json!([self.network(n)?]));
        }
        if let Some(s) = self.services(body)? {
            o.insert("Services".into(), s);
        }
        if let Some(c) = self.constraints(body)? {
            o.insert("Constraints".into(), c);
        }
        let mut tasks = Vec::new();
        for t in blocks(body, "task") {
            tasks.push(self.task(t)?);
        }
        if !tasks.is_empty() {
            o.insert("Tasks".into(), Json::Array(tasks));
        }
        if let Some(r) = self.restart(body)? {
            o.insert("RestartPolicy".into(), r);
        }
        if let Some(r) = self.reschedule(body)? {
            o.insert("ReschedulePolicy".into(), r);
        }
        if let Some(u) = self.update(body)? {
            o.insert("Update".into(), u);
        }
        self.put_map(&mut o, body, "meta", "Meta")?;
        Ok(Json::Object(o))
    }

    fn task(&self, b: &Block) -> Result<Json, HclError> {
        label_count(self.src, b, 1)?;
        let body = &b.body;
        if let Some(n) = blocks(body, "network").next() {
            return Err(self.src.error(
                n,
                "a task has no network: move network { ... } to the group (one network per group, as Nomad 1.0 has it)",
            ));
        }
        check_body(
            self.src,
            body,
            &["driver", "kill_timeout", "kill_signal", "env", "meta"],
            &[
                "config",
                "env",
                "meta",
                "resources",
                "constraint",
                "restart",
                "logs",
                "lifecycle",
                "service",
                "artifact",
                "template",
                "identity",
                "volume_mount",
            ],
        )?;
        let mut o = Obj::new();
        o.insert("Name".into(), label(b, 0).unwrap_or_default().into());
        self.put(&mut o, body, "driver", "Driver", Kind::String)?;
        o.insert("User".into(), "".into());
        if let Some(l) = single_block(self.src, body, "lifecycle")? {
            check_body(self.src, &l.body, &["hook", "sidecar"], &[])?;
            let mut lo = Obj::new();
            self.put(&mut lo, &l.body, "hook", "Hook", Kind::String)?;
            self.put(&mut lo, &l.body, "sidecar", "Sidecar", Kind::Bool)?;
            lo.entry("Hook").or_insert_with(|| "".into());
            lo.entry("Sidecar").or_insert(Json::Bool(false));
            o.insert("Lifecycle".into(), Json::Object(lo));
        }
        if let Some(c) = single_block(self.src, body, "config")? {
            o.insert("Config".into(), Json::Object(self.free_form(&c.body)?));
        }
        if let Some(c) = self.constraints(body)? {
            o.insert("Constraints".into(), c);
        }
        self.put_map(&mut o, body, "env", "Env")?;
        if let Some(r) = single_block(self.src, body, "resources")? {
            if let Some(n) = blocks(&r.body, "network").next() {
                return Err(self.src.error(
                    n,
                    "network in resources: move network { ... } to the group (one network per group, as Nomad 1.0 has it)",
                ));
            }
            check_body(
                self.src,
                &r.body,
                &["cpu", "memory", "memory_max"],
                &["device"],
            )?;
            let mut ro = Obj::new();
            self.put(&mut ro, &r.body, "cpu", "CPU", Kind::Int)?;
            self.put(&mut ro, &r.body, "memory", "MemoryMB", Kind::Int)?;
            self.put(&mut ro, &r.body, "memory_max", "MemoryMaxMB", Kind::Int)?;
            let devices = blocks(&r.body, "device")
                .map(|d| self.device(d))
                .collect::<Result<Vec<_>, _>>()?;
            if !devices.is_empty() {
                ro.insert("Devices".into(), Json::Array(devices));
            }
            o.insert("Resources".into(), Json::Object(ro));
        }
        if let Some(r) = self.restart(body)? {
            o.insert("RestartPolicy".into(), r);
        }
        self.put_map(&mut o, body, "meta", "Meta")?;
        self.put(&mut o, body, "kill_timeout", "KillTimeout", Kind::Duration)?;
        if let Some(l) = single_block(self.src, body, "logs")? {
            let fields: &[Field] = &[
                ("max_files", "MaxFiles", Kind::Int),
                ("max_file_size", "MaxFileSizeMB", Kind::Int),
            ];
            o.insert("LogConfig".into(), self.fields(&l.body, fields)?);
        }
        if let Some(s) = self.services(body)? {
            o.insert("Services".into(), s);
        }
        let artifacts = blocks(body, "artifact")
            .map(|a| self.artifact(a))
            .collect::<Result<Vec<_>, _>>()?;
        if !artifacts.is_empty() {
            o.insert("Artifacts".into(), Json::Array(artifacts));
        }
        let templates = blocks(body, "template")
            .map(|t| self.template(t))
            .collect::<Result<Vec<_>, _>>()?;
        if !templates.is_empty() {
            o.insert("Templates".into(), Json::Array(templates));
        }
        let mounts = blocks(body, "volume_mount")
            .map(|m| self.volume_mount(m))
            .collect::<Result<Vec<_>, _>>()?;
        if !mounts.is_empty() {
            o.insert("VolumeMounts".into(), Json::Array(mounts));
        }
        if let Some(id) = single_block(self.src, body, "identity")? {
            let fields: &[Field] = &[("env", "Env", Kind::Bool), ("file", "File", Kind::Bool)];
            let mut io = match self.fields(&id.body, fields)? {
                Json::Object(io) => io,
                _ => Obj::new(),
            };
            // Nomad prints both, false when left out.
            io.entry("Env").or_insert(Json::Bool(false));
            io.entry("File").or_insert(Json::Bool(false));
            o.insert("Identity".into(), Json::Object(io));
        }
        o.insert("Leader".into(), false.into());
        o.insert("ShutdownDelay".into(), 0.into());
        o.insert("KillSignal".into(), "".into());
        self.put(&mut o, body, "kill_signal", "KillSignal", Kind::String)?;
        o.insert("Kind".into(), "".into());
        Ok(Json::Object(o))
    }
}

/// The file's one `job` block as Nomad's API job (the inside of `{"Job": ...}`).
pub(crate) fn read_job(
    src: &Source,
    body: &Body,
    ctx: &Context<'static>,
) -> Result<Json, HclError> {
    check_body(src, body, &[], &["job", "variable", "variables", "locals"])?;
    let mut jobs = blocks(body, "job");
    let Some(b) = jobs.next() else {
        return Err(HclError::whole(
            &src.name,
            "no job block: the file must hold one job \"NAME\" { ... }",
        ));
    };
    if let Some(second) = jobs.next() {
        return Err(src.error(second, "only one job block is allowed in a file"));
    }
    label_count(src, b, 1)?;
    let id = label(b, 0).unwrap_or_default();
    let r = Reader { src, ctx };
    let body = &b.body;
    check_body(
        src,
        body,
        &[
            "type",
            "priority",
            "datacenters",
            "region",
            "namespace",
            "meta",
        ],
        &[
            "constraint",
            "update",
            "reschedule",
            "group",
            "task",
            "meta",
        ],
    )?;
    let mut o = Obj::new();
    r.put(&mut o, body, "region", "Region", Kind::String)?;
    r.put(&mut o, body, "namespace", "Namespace", Kind::String)?;
    o.insert("ID".into(), id.clone().into());
    o.insert("Name".into(), id.into());
    r.put(&mut o, body, "type", "Type", Kind::String)?;
    r.put(&mut o, body, "priority", "Priority", Kind::Int)?;
    r.put(&mut o, body, "datacenters", "Datacenters", Kind::StringList)?;
    if let Some(c) = r.constraints(body)? {
        o.insert("Constraints".into(), c);
    }
    // A task directly in the job is a group of its own, named after it, placed first
    // (as Nomad does).
    let mut groups = Vec::new();
    for t in blocks(body, "task") {
        let task = r.task(t)?;
        groups.push(json!({ "Name": task["Name"].clone(), "Tasks": [task] }));
    }
    for g in blocks(body, "group") {
        groups.push(r.group(g)?);
    }
    if !groups.is_empty() {
        o.insert("TaskGroups".into(), Json::Array(groups));
    }
    if let Some(u) = r.update(body)? {
        o.insert("Update".into(), u);
    }
    if let Some(u) = r.reschedule(body)? {
        o.insert("Reschedule".into(), u);
    }
    r.put_map(&mut o, body, "meta", "Meta")?;
    o.insert("Dispatched".into(), false.into());
    Ok(Json::Object(o))
}
