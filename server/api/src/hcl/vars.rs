//! Input variables (`variable "x" { type, default, description }`, `variables { x = 1 }`),
//! their values (`NOMAD_VAR_x`, `-var-file`, `-var`), and `locals { ... }`: the context
//! the job block is evaluated in, with `var.x`, `local.x` and the functions.

use std::collections::BTreeMap;

use hcl::edit::expr::Expression;
use hcl::edit::structure::{Body, Structure};
use hcl::eval::Context;
use hcl::{Map, Value};

use super::eval::{describe, evaluate};
use super::job::{check_body, label_count};
use super::source::{HclError, Source, read_bounded};
use super::{ENV_VAR_PREFIX, MAX_JOB_FILE_BYTES, VarInputs, funcs};

/// A variable's type constraint, as Nomad's `type = ...` (cty's type expressions).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum VarType {
    Any,
    String,
    Number,
    Bool,
    List(Box<VarType>),
    Map(Box<VarType>),
    Object(Vec<(String, VarType)>),
    Tuple(Vec<VarType>),
}

impl VarType {
    fn parse(expr: &Expression) -> Result<VarType, String> {
        let bad = || {
            "not a type (string, number, bool, any, list(T), set(T), map(T), object({...}), tuple([...]))".to_owned()
        };
        match expr {
            Expression::Variable(v) => match v.as_str() {
                "string" => Ok(VarType::String),
                "number" => Ok(VarType::Number),
                "bool" => Ok(VarType::Bool),
                "any" => Ok(VarType::Any),
                _ => Err(bad()),
            },
            Expression::FuncCall(call) if call.name.namespace.is_empty() => {
                let args: Vec<&Expression> = call.args.iter().collect();
                let [arg] = args.as_slice() else {
                    return Err(bad());
                };
                match call.name.name.as_str() {
                    "list" | "set" => Ok(VarType::List(Box::new(VarType::parse(arg)?))),
                    "map" => Ok(VarType::Map(Box::new(VarType::parse(arg)?))),
                    "object" => match arg {
                        Expression::Object(o) => o
                            .iter()
                            .map(|(k, v)| {
                                let key = match k {
                                    hcl::edit::expr::ObjectKey::Ident(i) => i.as_str().to_owned(),
                                    hcl::edit::expr::ObjectKey::Expression(Expression::String(
                                        s,
                                    )) => s.as_str().to_owned(),
                                    _ => return Err(bad()),
                                };
                                Ok((key, VarType::parse(v.expr())?))
                            })
                            .collect::<Result<_, _>>()
                            .map(VarType::Object),
                        _ => Err(bad()),
                    },
                    "tuple" => match arg {
                        Expression::Array(a) => a
                            .iter()
                            .map(VarType::parse)
                            .collect::<Result<_, _>>()
                            .map(VarType::Tuple),
                        _ => Err(bad()),
                    },
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// Convert `v` to this type as cty does (numbers and bools to strings, numeric
    /// strings to numbers, ...).
    pub(crate) fn convert(&self, v: Value) -> Result<Value, String> {
        match (self, v) {
            (VarType::Any, v) | (_, v @ Value::Null) => Ok(v),
            (VarType::String, v) => super::eval::to_string(&v).map(Value::String),
            (VarType::Number, v) => match v {
                Value::Number(n) => Ok(Value::Number(n)),
                other => {
                    let f = super::eval::to_number(&other)?;
                    hcl::Number::from_f64(f)
                        .map(|n| {
                            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                                Value::from(f as i64)
                            } else {
                                Value::Number(n)
                            }
                        })
                        .ok_or_else(|| format!("a number is required, found {}", describe(&other)))
                }
            },
            (VarType::Bool, v) => super::eval::to_bool(&v).map(Value::Bool),
            (VarType::List(t), Value::Array(items)) => items
                .into_iter()
                .map(|i| t.convert(i))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            (VarType::List(_), other) => {
                Err(format!("a list is required, found {}", describe(&other)))
            }
            (VarType::Map(t), Value::Object(entries)) => entries
                .into_iter()
                .map(|(k, i)| Ok((k.clone(), t.convert(i).map_err(|e| format!("{k:?}: {e}"))?)))
                .collect::<Result<Map<_, _>, String>>()
                .map(Value::Object),
            (VarType::Map(_), other) => {
                Err(format!("a map is required, found {}", describe(&other)))
            }
            (VarType::Object(fields), Value::Object(mut entries)) => {
                let mut out = Map::new();
                for (name, t) in fields {
                    let value = entries.shift_remove(name).unwrap_or(Value::Null);
                    out.insert(
                        name.clone(),
                        t.convert(value).map_err(|e| format!("{name:?}: {e}"))?,
                    );
                }
                Ok(Value::Object(out))
            }
            (VarType::Object(_), other) => {
                Err(format!("an object is required, found {}", describe(&other)))
            }
            (VarType::Tuple(types), Value::Array(items)) if items.len() == types.len() => types
                .iter()
                .zip(items)
                .map(|(t, i)| t.convert(i))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            (VarType::Tuple(types), other) => Err(format!(
                "a tuple of {} elements is required, found {}",
                types.len(),
                describe(&other)
            )),
        }
    }
}

struct Declared<'b> {
    ty: VarType,
    value: Option<Value>,
    /// The declaration, to place "no value" errors.
    at: &'b dyn hcl::edit::Span,
}

/// The context the job block is evaluated in: `var`, `local` and the functions.
pub(crate) fn context(
    src: &Source,
    body: &Body,
    inputs: &VarInputs,
) -> Result<Context<'static>, HclError> {
    let empty = funcs::base_context();
    let mut declared: BTreeMap<String, Declared> = BTreeMap::new();
    for item in body.iter() {
        let Structure::Block(b) = item else { continue };
        match b.ident.as_str() {
            "variable" => {
                label_count(src, b, 1)?;
                let name = super::job::label(b, 0).unwrap_or_default();
                check_body(src, &b.body, &["type", "default", "description"], &[])?;
                let mut decl = Declared {
                    ty: VarType::Any,
                    value: None,
                    at: b,
                };
                if let Some(t) = super::job::attribute(src, &b.body, "type")? {
                    decl.ty = VarType::parse(&t.value).map_err(|e| {
                        src.error(&t.value, format!("variable \"{name}\": type: {e}"))
                    })?;
                }
                if let Some(d) = super::job::attribute(src, &b.body, "default")? {
                    let v = evaluate(src, &empty, &d.value)?;
                    let v = decl.ty.convert(v).map_err(|e| {
                        src.error(&d.value, format!("variable \"{name}\": default: {e}"))
                    })?;
                    decl.value = Some(v);
                }
                if declared.insert(name.clone(), decl).is_some() {
                    return Err(src.error(b, format!("variable \"{name}\" is declared twice")));
                }
            }
            "variables" => {
                label_count(src, b, 0)?;
                for item in b.body.iter() {
                    match item {
                        Structure::Attribute(a) => {
                            let name = a.key.as_str().to_owned();
                            let v = evaluate(src, &empty, &a.value)?;
                            if declared
                                .insert(
                                    name.clone(),
                                    Declared {
                                        ty: VarType::Any,
                                        value: Some(v),
                                        at: a,
                                    },
                                )
                                .is_some()
                            {
                                return Err(
                                    src.error(a, format!("variable \"{name}\" is declared twice"))
                                );
                            }
                        }
                        Structure::Block(inner) => {
                            return Err(src.error(
                                inner,
                                format!(
                                    "unsupported block \"{}\" in variables",
                                    inner.ident.as_str()
                                ),
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }

    // NOMAD_VAR_x of declared variables.
    for (key, text) in &inputs.env {
        let Some(name) = key.strip_prefix(ENV_VAR_PREFIX) else {
            continue;
        };
        if let Some(d) = declared.get_mut(name) {
            d.value = Some(
                value_from_text(&d.ty, text)
                    .map_err(|e| HclError::whole(&src.name, format!("{key}: {e}")))?,
            );
        }
    }
    // -var-file files, in order.
    for path in &inputs.var_files {
        let name = path.display().to_string();
        let text = read_bounded(path, MAX_JOB_FILE_BYTES).map_err(|e| HclError::whole(&name, e))?;
        let file = Source::new(&name, &text);
        let var_body = file.parse_body()?;
        for item in var_body.iter() {
            match item {
                Structure::Attribute(a) => {
                    let key = a.key.as_str();
                    let Some(d) = declared.get_mut(key) else {
                        return Err(file.error(
                            &a.key,
                            format!("no variable \"{key}\" is declared in {}", src.name),
                        ));
                    };
                    let v = evaluate(&file, &empty, &a.value)?;
                    d.value =
                        Some(d.ty.convert(v).map_err(|e| {
                            file.error(&a.value, format!("variable \"{key}\": {e}"))
                        })?);
                }
                Structure::Block(b) => {
                    return Err(file.error(b, "a variable file holds only `name = value` lines"));
                }
            }
        }
    }
    // -var name=value, in order.
    for arg in &inputs.vars {
        let Some((key, text)) = arg.split_once('=') else {
            return Err(HclError::whole(
                &src.name,
                format!("-var {arg:?}: expected name=value"),
            ));
        };
        let Some(d) = declared.get_mut(key) else {
            return Err(HclError::whole(
                &src.name,
                format!("-var {key}: no variable \"{key}\" is declared in this file"),
            ));
        };
        d.value = Some(
            value_from_text(&d.ty, text)
                .map_err(|e| HclError::whole(&src.name, format!("-var {key}: {e}")))?,
        );
    }

    let mut vars = Map::new();
    for (name, d) in declared {
        let Some(v) = d.value else {
            return Err(src.error(d.at, format!(
                "variable \"{name}\" has no value: give it a default, -var {name}=..., a -var-file or {ENV_VAR_PREFIX}{name}"
            )));
        };
        named(src, d.at, "var", &name, &v)?;
        vars.insert(name, v);
    }
    let vars = Value::Object(vars);

    // Locals may use each other in any order: evaluate what can be, until nothing moves.
    let mut pending: Vec<&hcl::edit::structure::Attribute> = Vec::new();
    for item in body.iter() {
        let Structure::Block(b) = item else { continue };
        if b.ident.as_str() != "locals" {
            continue;
        }
        label_count(src, b, 0)?;
        for item in b.body.iter() {
            match item {
                Structure::Attribute(a) => {
                    if pending.iter().any(|p| p.key.as_str() == a.key.as_str()) {
                        return Err(src.error(
                            &a.key,
                            format!("local \"{}\" is defined twice", a.key.as_str()),
                        ));
                    }
                    pending.push(a);
                }
                Structure::Block(inner) => {
                    return Err(src.error(
                        inner,
                        format!("unsupported block \"{}\" in locals", inner.ident.as_str()),
                    ));
                }
            }
        }
    }
    let mut locals = Map::new();
    // The variables are copied into each round's context too.
    let mut context_bytes: usize = super::budget::named_size("var", None);
    while !pending.is_empty() {
        // Each round copies the variables and locals and tries every pending local:
        // charged, so an order that needs one round per local stays bounded.
        super::budget::charge(
            context_bytes.saturating_add(pending.len().saturating_mul(LOCAL_ATTEMPT_BYTES)),
        )
        .map_err(|e| src.error(pending[0], e))?;
        let mut ctx = funcs::base_context();
        ctx.declare_var("var", vars.clone());
        ctx.declare_var("local", Value::Object(locals.clone()));
        let mut first_error = None;
        let before = pending.len();
        let mut refused = None;
        pending.retain(|a| {
            if refused.is_some() {
                return true;
            }
            match evaluate(src, &ctx, &a.value) {
                Ok(v) => match named(src, &a.value, "local", a.key.as_str(), &v) {
                    Ok(size) => {
                        context_bytes = context_bytes.saturating_add(size);
                        locals.insert(a.key.as_str().to_owned(), v);
                        false
                    }
                    Err(e) => {
                        refused = Some(e);
                        true
                    }
                },
                Err(e) => {
                    first_error.get_or_insert(e);
                    true
                }
            }
        });
        if let Some(e) = refused {
            return Err(e);
        }
        if pending.len() == before
            && let Some(e) = first_error
        {
            return Err(e);
        }
    }

    let mut ctx = funcs::base_context();
    ctx.declare_var("var", vars);
    ctx.declare_var("local", Value::Object(locals));
    Ok(ctx)
}

/// The work charged for each try at evaluating a local: a file whose locals need one
/// round each (defined in reverse order) tries n²/2 times.
const LOCAL_ATTEMPT_BYTES: usize = 1024;

/// A value given as text (`-var x=...`, `NOMAD_VAR_x`): the text itself for a string (or
/// untyped) variable, else an HCL expression (`[1, 2]`, `{ a = "b" }`, `3`) converted to
/// the type, as Nomad reads them.
fn value_from_text(ty: &VarType, text: &str) -> Result<Value, String> {
    match ty {
        VarType::String | VarType::Any => Ok(Value::String(text.to_owned())),
        _ => {
            let src = Source::new("-var", text);
            let expr = hcl::edit::parser::parse_expr(text).map_err(|e| e.message().to_owned())?;
            let v = evaluate(&src, &funcs::base_context(), &expr).map_err(|e| e.message)?;
            ty.convert(v)
        }
    }
}

/// Record the variable or local `root.name` (checked and measured): its size for the
/// bounds of later expressions, and refused when all of them together are too large.
fn named(
    src: &Source,
    at: &dyn hcl::edit::Span,
    root: &str,
    name: &str,
    v: &Value,
) -> Result<usize, HclError> {
    let size = super::budget::measure(v, super::MAX_VALUE_BYTES).map_err(|why| {
        src.error(
            at,
            format!(
                "{root}.{name}: {}",
                super::budget::too_big_message(why, super::MAX_VALUE_BYTES)
            ),
        )
    })?;
    super::budget::record_named(root, name, size)
        .map_err(|e| src.error(at, format!("{root}.{name}: {e}")))?;
    Ok(size)
}
