//! ACLs as Nomad has them: policies in Nomad's rule language (HCL or JSON), tokens of
//! type `client` or `management`, and [`Acl`], the compiled permissions of a token,
//! which the server checks every request against.
//!
//! A policy's rules:
//!
//! ```hcl
//! namespace "default" {
//!   policy       = "read"                 # deny | read | write | scale
//!   capabilities = ["submit-job"]         # added to what `policy` grants
//!   variables {
//!     path "nomad/jobs/*" { capabilities = ["read", "list"] }
//!   }
//! }
//! namespace "team-*" { policy = "write" }   # globs: the most specific one applies
//! node     { policy = "read" }             # deny | read | write
//! agent    { policy = "read" }
//! operator { policy = "read" }
//! plugin   { policy = "list" }             # deny | read | list
//! ```
//!
//! The rules of Nomad v1.6: a namespace's `policy` expands into capabilities (see
//! [`expand_namespace_policy`]); several policies of one token are merged (the union
//! of the capabilities; `deny` anywhere wins for that namespace); a namespace is
//! matched by its exact rule first, else by the matching glob closest to its name;
//! `node`/`agent`/`operator` take the highest of the levels granted, `deny` winning.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Token type of a token with every permission.
pub const TOKEN_TYPE_MANAGEMENT: &str = "management";
/// Token type of a token with its policies' permissions.
pub const TOKEN_TYPE_CLIENT: &str = "client";
/// The policy that applies to requests without a token, when it exists.
pub const ANONYMOUS_POLICY: &str = "anonymous";

/// Longest rules text taken (a policy is a few lines).
pub const MAX_RULES_BYTES: usize = 64 * 1024;
/// Longest policy or token name.
pub const MAX_NAME_BYTES: usize = 128;
/// Most policies one token may name.
pub const MAX_TOKEN_POLICIES: usize = 64;

/// Every capability a namespace rule may grant (Nomad v1.6's list).
pub const NAMESPACE_CAPABILITIES: &[&str] = &[
    "deny",
    "list-jobs",
    "parse-job",
    "read-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-node-exec",
    "alloc-lifecycle",
    "sentinel-override",
    "csi-register-plugin",
    "csi-write-volume",
    "csi-read-volume",
    "csi-list-volume",
    "csi-mount-volume",
    "list-scaling-policies",
    "read-scaling-policy",
    "read-job-scaling",
    "scale-job",
    "submit-recommendation",
];

/// Capabilities of a variables path rule.
pub const VARIABLE_CAPABILITIES: &[&str] = &["list", "read", "write", "destroy", "deny"];

/// Capabilities of a `node_pool` rule (accepted and kept; drover has no node pools).
const NODE_POOL_CAPABILITIES: &[&str] = &["delete", "deny", "read", "write"];
/// Capabilities of a `host_volume` rule (accepted and kept).
const HOST_VOLUME_CAPABILITIES: &[&str] = &["deny", "mount-readonly", "mount-readwrite"];

/// What `policy = "read"` grants in a namespace (Nomad v1.6's `expandNamespacePolicy`).
const READ_CAPABILITIES: &[&str] = &[
    "list-jobs",
    "parse-job",
    "read-job",
    "csi-list-volume",
    "csi-read-volume",
    "read-job-scaling",
    "list-scaling-policies",
    "read-scaling-policy",
];
/// What `policy = "write"` adds to read.
const WRITE_EXTRA_CAPABILITIES: &[&str] = &[
    "scale-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-lifecycle",
    "csi-mount-volume",
    "csi-write-volume",
    "submit-recommendation",
];
/// What `policy = "scale"` grants.
const SCALE_CAPABILITIES: &[&str] = &[
    "list-scaling-policies",
    "read-scaling-policy",
    "read-job-scaling",
    "scale-job",
];

/// The capabilities a `host_volume` rule's `policy` stands for (Nomad's: `read`
/// mounts read-only, `write` read-only or writable).
pub fn expand_host_volume_policy(policy: &str) -> &'static [&'static str] {
    match policy {
        "deny" => &["deny"],
        "read" => &["mount-readonly"],
        "write" => &["mount-readonly", "mount-readwrite"],
        _ => &[],
    }
}

/// The capabilities a namespace `policy` stands for.
pub fn expand_namespace_policy(policy: &str) -> Vec<&'static str> {
    match policy {
        "deny" => vec!["deny"],
        "read" => READ_CAPABILITIES.to_vec(),
        "write" => READ_CAPABILITIES
            .iter()
            .chain(WRITE_EXTRA_CAPABILITIES)
            .copied()
            .collect(),
        "scale" => SCALE_CAPABILITIES.to_vec(),
        _ => Vec::new(),
    }
}

/// A policy whose rules do not parse or name something unknown; the message names the
/// rule and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError(msg.into()))
}

/// A coarse permission level (`node`, `agent`, `operator`, `quota`, `plugin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing granted (the absence of a rule).
    #[default]
    None,
    /// `list` (plugins only).
    List,
    /// `read`.
    Read,
    /// `write`.
    Write,
    /// `deny`: wins over every other level granted.
    Deny,
}

impl Level {
    /// The level of several policies together (Nomad's `maxPrivilege`): deny wins, then
    /// the highest.
    fn merge(self, other: Level) -> Level {
        self.max(other)
    }

    fn allows_read(self) -> bool {
        matches!(self, Level::Read | Level::Write)
    }

    fn allows_write(self) -> bool {
        self == Level::Write
    }
}

/// A variables path rule inside a namespace rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariablePathRule {
    /// The path (may hold `*` globs).
    pub path: String,
    /// Its capabilities, expanded (`read` implies `list`; `deny` alone).
    pub capabilities: BTreeSet<String>,
}

/// A namespace rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRule {
    /// The namespace's name, or a glob (`*`, `team-*`).
    pub name: String,
    /// The shorthand, as written.
    pub policy: Option<String>,
    /// The capabilities granted: those listed and those of `policy`.
    pub capabilities: BTreeSet<String>,
    /// Variables path rules.
    pub variables: Vec<VariablePathRule>,
}

/// A rule with a name, a policy and capabilities that drover keeps but does not use
/// (`node_pool`, `host_volume`): a Nomad policy holding one still applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedRule {
    /// Name or glob.
    pub name: String,
    /// The shorthand, as written.
    pub policy: Option<String>,
    /// Capabilities listed.
    pub capabilities: BTreeSet<String>,
}

/// A parsed policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Namespace rules, in order.
    pub namespaces: Vec<NamespaceRule>,
    /// `node { policy }`.
    pub node: Option<Level>,
    /// `agent { policy }`.
    pub agent: Option<Level>,
    /// `operator { policy }`.
    pub operator: Option<Level>,
    /// `quota { policy }`.
    pub quota: Option<Level>,
    /// `plugin { policy }` (deny, read, list).
    pub plugin: Option<Level>,
    /// `node_pool "x" { ... }` rules (kept, not enforced: no node pools).
    pub node_pools: Vec<NamedRule>,
    /// `host_volume "x" { ... }` rules: which host volumes a job may mount (checked
    /// when a job is submitted).
    pub host_volumes: Vec<NamedRule>,
}

impl Policy {
    fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.node.is_none()
            && self.agent.is_none()
            && self.operator.is_none()
            && self.quota.is_none()
            && self.plugin.is_none()
            && self.node_pools.is_empty()
            && self.host_volumes.is_empty()
    }
}

/// One item of a rules body, HCL or JSON alike.
#[derive(Debug)]
enum Item {
    Attr(String, Lit),
    Block(String, Vec<String>, Vec<Item>),
}

/// An attribute's value.
#[derive(Debug)]
enum Lit {
    Str(String),
    List(Vec<Lit>),
    Other(&'static str),
}

/// How many labels a block takes, by its parent and name (`None`: not a block).
fn block_labels(parent: &str, name: &str) -> Option<usize> {
    match (parent, name) {
        ("", "namespace" | "node_pool" | "host_volume") => Some(1),
        ("", "node" | "agent" | "operator" | "quota" | "plugin") => Some(0),
        ("namespace", "variables") => Some(0),
        ("variables", "path") => Some(1),
        _ => None,
    }
}

fn hcl_items(body: ::hcl::Body) -> Result<Vec<Item>, PolicyError> {
    let mut items = Vec::new();
    for s in body.into_inner() {
        match s {
            ::hcl::Structure::Attribute(a) => {
                let key = a.key.as_str().to_owned();
                items.push(Item::Attr(key, hcl_lit(a.expr)))
            }
            ::hcl::Structure::Block(b) => {
                let labels = b.labels.iter().map(|l| l.as_str().to_owned()).collect();
                items.push(Item::Block(
                    b.identifier.as_str().to_owned(),
                    labels,
                    hcl_items(b.body)?,
                ));
            }
        }
    }
    Ok(items)
}

fn hcl_lit(e: ::hcl::Expression) -> Lit {
    use ::hcl::Expression as E;
    match e {
        E::String(s) => Lit::Str(s),
        E::Array(v) => Lit::List(v.into_iter().map(hcl_lit).collect()),
        E::Bool(_) => Lit::Other("a bool"),
        E::Number(_) => Lit::Other("a number"),
        E::Null => Lit::Other("null"),
        E::Object(_) => Lit::Other("an object"),
        E::TemplateExpr(_) => Lit::Other("a template (interpolation)"),
        _ => Lit::Other("an expression"),
    }
}

fn json_lit(v: serde_json::Value) -> Lit {
    use serde_json::Value as V;
    match v {
        V::String(s) => Lit::Str(s),
        V::Array(v) => Lit::List(v.into_iter().map(json_lit).collect()),
        V::Bool(_) => Lit::Other("a bool"),
        V::Number(_) => Lit::Other("a number"),
        V::Null => Lit::Other("null"),
        V::Object(_) => Lit::Other("an object"),
    }
}

/// The items of a JSON rules object under `parent` (Nomad's JSON form: a block's
/// labels are nested object keys; a repeated block may be a list of objects).
fn json_items(
    parent: &str,
    obj: serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<Item>, PolicyError> {
    fn block(
        name: &str,
        labels: Vec<String>,
        want: usize,
        v: serde_json::Value,
        out: &mut Vec<Item>,
    ) -> Result<(), PolicyError> {
        match v {
            serde_json::Value::Array(vs) => {
                for v in vs {
                    block(name, labels.clone(), want, v, out)?;
                }
                Ok(())
            }
            serde_json::Value::Object(o) if labels.len() < want => {
                for (label, v) in o {
                    let mut l = labels.clone();
                    l.push(label);
                    block(name, l, want, v, out)?;
                }
                Ok(())
            }
            serde_json::Value::Object(o) => {
                out.push(Item::Block(name.to_owned(), labels, json_items(name, o)?));
                Ok(())
            }
            _ => err(format!("{name}: must be an object (a block)")),
        }
    }
    let mut items = Vec::new();
    for (k, v) in obj {
        match block_labels(parent, &k) {
            Some(n) => block(&k, Vec::new(), n, v, &mut items)?,
            None => items.push(Item::Attr(k, json_lit(v))),
        }
    }
    Ok(items)
}

fn string(at: &str, field: &str, v: Lit) -> Result<String, PolicyError> {
    match v {
        Lit::Str(s) => Ok(s),
        Lit::List(_) => err(format!("{at}: {field} must be a string, not a list")),
        Lit::Other(what) => err(format!("{at}: {field} must be a string, not {what}")),
    }
}

fn strings(at: &str, field: &str, v: Lit) -> Result<Vec<String>, PolicyError> {
    match v {
        Lit::List(vs) => vs
            .into_iter()
            .enumerate()
            .map(|(i, v)| string(at, &format!("{field}[{i}]"), v))
            .collect(),
        Lit::Str(_) => err(format!("{at}: {field} must be a list of strings")),
        Lit::Other(what) => err(format!("{at}: {field} must be a list, not {what}")),
    }
}

/// Nomad's namespace names in rules: letters, digits, `-`, and `*` for globs.
fn valid_rule_name(name: &str, extra: &[char]) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*' || extra.contains(&c))
}

/// `policy`, `capabilities` (checked against `valid`) of a named rule; anything else
/// but the `allowed_blocks` is an error naming it.
struct RuleBody {
    policy: Option<String>,
    capabilities: Vec<String>,
    blocks: Vec<(String, Vec<String>, Vec<Item>)>,
}

fn rule_body(
    at: &str,
    items: Vec<Item>,
    policies: &[&str],
    valid_caps: &[&str],
    allowed_blocks: &[&str],
) -> Result<RuleBody, PolicyError> {
    let mut body = RuleBody {
        policy: None,
        capabilities: Vec::new(),
        blocks: Vec::new(),
    };
    for item in items {
        match item {
            Item::Attr(k, v) if k == "policy" => {
                let p = string(at, "policy", v)?;
                if !policies.contains(&p.as_str()) {
                    return err(format!(
                        "{at}: policy {p:?} is not one of {}",
                        policies.join(", ")
                    ));
                }
                body.policy = Some(p);
            }
            Item::Attr(k, v) if k == "capabilities" && !valid_caps.is_empty() => {
                for (i, c) in strings(at, "capabilities", v)?.into_iter().enumerate() {
                    if !valid_caps.contains(&c.as_str()) {
                        return err(format!(
                            "{at}: capabilities[{i}]: unknown capability {c:?} (one of {})",
                            valid_caps.join(", ")
                        ));
                    }
                    body.capabilities.push(c);
                }
            }
            Item::Attr(k, _) => {
                let expected = if valid_caps.is_empty() {
                    "policy".to_owned()
                } else {
                    let mut e = vec!["policy", "capabilities"];
                    e.extend(allowed_blocks);
                    e.join(", ")
                };
                return err(format!("{at}: unknown field {k:?} (expected {expected})"));
            }
            Item::Block(k, labels, items) if allowed_blocks.contains(&k.as_str()) => {
                body.blocks.push((k, labels, items));
            }
            Item::Block(k, _, _) => {
                return err(format!("{at}: unknown block {k:?}"));
            }
        }
    }
    Ok(body)
}

fn label(at: &str, kind: &str, labels: &[String]) -> Result<String, PolicyError> {
    match labels {
        [one] => Ok(one.clone()),
        _ => err(format!(
            "{at}{kind}: takes exactly one label (its name), got {}",
            labels.len()
        )),
    }
}

fn variables(at: &str, items: Vec<Item>) -> Result<Vec<VariablePathRule>, PolicyError> {
    let at = format!("{at}.variables");
    let mut rules = Vec::new();
    for item in items {
        match item {
            Item::Block(k, labels, items) if k == "path" => {
                let path = label(&format!("{at}."), "path", &labels)?;
                if path.is_empty() {
                    return err(format!("{at}: a path block with an empty path"));
                }
                let pat = format!("{at}.path {path:?}");
                let mut caps = BTreeSet::new();
                for item in items {
                    match item {
                        Item::Attr(k, v) if k == "capabilities" => {
                            for (i, c) in strings(&pat, "capabilities", v)?.into_iter().enumerate()
                            {
                                if !VARIABLE_CAPABILITIES.contains(&c.as_str()) {
                                    return err(format!(
                                        "{pat}: capabilities[{i}]: unknown capability {c:?} \
                                         (one of {})",
                                        VARIABLE_CAPABILITIES.join(", ")
                                    ));
                                }
                                caps.insert(c);
                            }
                        }
                        Item::Attr(k, _) | Item::Block(k, _, _) => {
                            return err(format!(
                                "{pat}: unknown field {k:?} (expected capabilities)"
                            ));
                        }
                    }
                }
                // Nomad's expandVariablesCapabilities: deny alone; read implies list.
                if caps.contains("deny") {
                    caps = BTreeSet::from(["deny".to_owned()]);
                } else if caps.contains("read") {
                    caps.insert("list".to_owned());
                }
                rules.push(VariablePathRule {
                    path,
                    capabilities: caps,
                });
            }
            Item::Attr(k, _) | Item::Block(k, _, _) => {
                return err(format!("{at}: unknown field {k:?} (expected path blocks)"));
            }
        }
    }
    if rules.is_empty() {
        return err(format!("{at}: no path blocks"));
    }
    Ok(rules)
}

fn level(at: &str, items: Vec<Item>, allowed: &[&str]) -> Result<Level, PolicyError> {
    let body = rule_body(at, items, allowed, &[], &[])?;
    match body.policy.as_deref() {
        Some("deny") => Ok(Level::Deny),
        Some("read") => Ok(Level::Read),
        Some("write") => Ok(Level::Write),
        Some("list") => Ok(Level::List),
        // Nomad accepts `scale` for these levels but grants nothing with it.
        Some(_) => Ok(Level::None),
        None => err(format!("{at}: policy is required")),
    }
}

/// Parse a policy's rules: HCL, or JSON (text starting with `{`).
pub fn parse_policy(rules: &str) -> Result<Policy, PolicyError> {
    if rules.len() > MAX_RULES_BYTES {
        return err(format!("rules: larger than {} KiB", MAX_RULES_BYTES / 1024));
    }
    let items = if rules.trim_start().starts_with('{') {
        let v: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(rules).map_err(|e| PolicyError(format!("rules (JSON): {e}")))?;
        json_items("", v)?
    } else {
        let body = ::hcl::parse(rules).map_err(|e| PolicyError(format!("rules (HCL): {e}")))?;
        hcl_items(body)?
    };
    let mut p = Policy::default();
    for item in items {
        let (kind, labels, items) = match item {
            Item::Block(k, l, i) => (k, l, i),
            Item::Attr(k, _) => {
                return err(format!(
                    "unknown field {k:?} (expected namespace, node, agent, operator, \
                     quota, plugin, node_pool or host_volume blocks)"
                ));
            }
        };
        match kind.as_str() {
            "namespace" => {
                let name = label("", "namespace", &labels)?;
                let at = format!("namespace {name:?}");
                if !valid_rule_name(&name, &[]) {
                    return err(format!(
                        "{at}: invalid namespace name (letters, digits, '-' and '*' globs, \
                         at most 128)"
                    ));
                }
                let body = rule_body(
                    &at,
                    items,
                    &["deny", "read", "write", "scale"],
                    NAMESPACE_CAPABILITIES,
                    &["variables"],
                )?;
                let mut capabilities: BTreeSet<String> = body.capabilities.into_iter().collect();
                if let Some(policy) = &body.policy {
                    capabilities.extend(
                        expand_namespace_policy(policy)
                            .into_iter()
                            .map(str::to_owned),
                    );
                }
                let mut vars = Vec::new();
                for (_, _, items) in body.blocks {
                    vars.extend(variables(&at, items)?);
                }
                p.namespaces.push(NamespaceRule {
                    name,
                    policy: body.policy,
                    capabilities,
                    variables: vars,
                });
            }
            "node_pool" | "host_volume" => {
                let name = label("", &kind, &labels)?;
                let at = format!("{kind} {name:?}");
                let extra: &[char] = if kind == "node_pool" { &['_'] } else { &[] };
                if !valid_rule_name(&name, extra) {
                    return err(format!("{at}: invalid name"));
                }
                let caps = if kind == "node_pool" {
                    NODE_POOL_CAPABILITIES
                } else {
                    HOST_VOLUME_CAPABILITIES
                };
                let body = rule_body(&at, items, &["deny", "read", "write", "scale"], caps, &[])?;
                let rule = NamedRule {
                    name,
                    policy: body.policy,
                    capabilities: body.capabilities.into_iter().collect(),
                };
                if kind == "node_pool" {
                    p.node_pools.push(rule);
                } else {
                    p.host_volumes.push(rule);
                }
            }
            "node" | "agent" | "operator" | "quota" | "plugin" => {
                if !labels.is_empty() {
                    return err(format!("{kind}: takes no label"));
                }
                let allowed: &[&str] = if kind == "plugin" {
                    &["deny", "read", "list"]
                } else {
                    &["deny", "read", "write", "scale"]
                };
                let l = level(&kind, items, allowed)?;
                let slot = match kind.as_str() {
                    "node" => &mut p.node,
                    "agent" => &mut p.agent,
                    "operator" => &mut p.operator,
                    "quota" => &mut p.quota,
                    _ => &mut p.plugin,
                };
                *slot = Some(slot.map_or(l, |old| old.merge(l)));
            }
            other => {
                return err(format!(
                    "unknown block {other:?} (expected namespace, node, agent, operator, \
                     quota, plugin, node_pool or host_volume)"
                ));
            }
        }
    }
    if p.is_empty() {
        return err("rules: the policy grants nothing (no rule in it)");
    }
    Ok(p)
}

/// Does `pattern` (with `*` for any run of characters, `/` included) match `name`?
/// (go-glob's, as Nomad uses.)
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() {
        return false;
    }
    if !name[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Of the globs in `globs` matching `name`, the closest one: the least characters
/// matched by its `*`s (Nomad's `findClosestMatchingGlob`; ties go to the first in
/// key order, as Nomad's radix walk).
fn closest_glob<'a, V>(globs: &'a BTreeMap<String, V>, name: &str) -> Option<&'a V> {
    let mut best: Option<(isize, &V)> = None;
    for (k, v) in globs {
        if !glob_match(k, name) {
            continue;
        }
        let diff = name.len() as isize - k.len() as isize + k.matches('*').count() as isize;
        if best.is_none_or(|(d, _)| diff < d) {
            best = Some((diff, v));
        }
    }
    best.map(|(_, v)| v)
}

/// An operation on a variable (Nomad's variables path capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableOp {
    /// `list`.
    List,
    /// `read`.
    Read,
    /// `write`.
    Write,
    /// `destroy`.
    Destroy,
}

impl VariableOp {
    fn capability(self) -> &'static str {
        match self {
            VariableOp::List => "list",
            VariableOp::Read => "read",
            VariableOp::Write => "write",
            VariableOp::Destroy => "destroy",
        }
    }
}

type CapSet = BTreeSet<String>;

/// The permissions of one token: management, or the merge of its policies.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    management: bool,
    namespaces: BTreeMap<String, CapSet>,
    wildcard_namespaces: BTreeMap<String, CapSet>,
    /// Keyed by `namespace \0 path`.
    variables: BTreeMap<String, CapSet>,
    wildcard_variables: BTreeMap<String, CapSet>,
    /// `host_volume` rules by name, and by glob.
    host_volumes: BTreeMap<String, CapSet>,
    wildcard_host_volumes: BTreeMap<String, CapSet>,
    node: Level,
    agent: Level,
    operator: Level,
    quota: Level,
    plugin: Level,
}

impl Acl {
    /// Every permission.
    pub fn management() -> Acl {
        Acl {
            management: true,
            ..Acl::default()
        }
    }

    /// No permission at all (anonymous without an `anonymous` policy).
    pub fn deny_all() -> Acl {
        Acl::default()
    }

    /// The merge of `policies` (Nomad v1.6's `NewACL`).
    pub fn new<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> Acl {
        let mut acl = Acl::default();
        for p in policies {
            for ns in &p.namespaces {
                let glob = ns.name.contains('*');
                for v in &ns.variables {
                    let key = format!("{}\0{}", ns.name, v.path);
                    let map = if glob || v.path.contains('*') {
                        &mut acl.wildcard_variables
                    } else {
                        &mut acl.variables
                    };
                    // Deny wins across policies, as for namespaces.
                    let caps = map.entry(key).or_default();
                    if caps.contains("deny") {
                        continue;
                    }
                    if v.capabilities.contains("deny") {
                        *caps = BTreeSet::from(["deny".to_owned()]);
                        continue;
                    }
                    caps.extend(v.capabilities.iter().cloned());
                }
                let map = if glob {
                    &mut acl.wildcard_namespaces
                } else {
                    &mut acl.namespaces
                };
                let caps = map.entry(ns.name.clone()).or_default();
                if caps.contains("deny") {
                    continue;
                }
                if ns.capabilities.contains("deny") {
                    *caps = BTreeSet::from(["deny".to_owned()]);
                    continue;
                }
                caps.extend(ns.capabilities.iter().cloned());
            }
            for hv in &p.host_volumes {
                let mut granted: CapSet = hv.capabilities.clone();
                granted.extend(
                    expand_host_volume_policy(hv.policy.as_deref().unwrap_or(""))
                        .iter()
                        .map(|c| (*c).to_owned()),
                );
                let map = if hv.name.contains('*') {
                    &mut acl.wildcard_host_volumes
                } else {
                    &mut acl.host_volumes
                };
                // Deny wins across policies, as for namespaces.
                let caps = map.entry(hv.name.clone()).or_default();
                if caps.contains("deny") {
                    continue;
                }
                if granted.contains("deny") {
                    *caps = BTreeSet::from(["deny".to_owned()]);
                    continue;
                }
                caps.extend(granted);
            }
            for (slot, l) in [
                (&mut acl.node, p.node),
                (&mut acl.agent, p.agent),
                (&mut acl.operator, p.operator),
                (&mut acl.quota, p.quota),
                (&mut acl.plugin, p.plugin),
            ] {
                if let Some(l) = l {
                    *slot = slot.merge(l);
                }
            }
        }
        acl
    }

    /// Is this a management token's ACL?
    pub fn is_management(&self) -> bool {
        self.management
    }

    fn namespace_caps(&self, ns: &str) -> Option<&CapSet> {
        self.namespaces
            .get(ns)
            .or_else(|| closest_glob(&self.wildcard_namespaces, ns))
    }

    /// May `capability` be used in namespace `ns`? `*` (all namespaces) is allowed
    /// when any namespace rule allows it, as Nomad's.
    pub fn allow_namespace_op(&self, ns: &str, capability: &str) -> bool {
        if self.management {
            return true;
        }
        if ns == "*"
            && self
                .namespaces
                .values()
                .chain(self.wildcard_namespaces.values())
                .any(|c| c.contains(capability))
        {
            return true;
        }
        self.namespace_caps(ns)
            .is_some_and(|c| c.contains(capability))
    }

    /// May a job mount host volume `name` (read-only when `read_only`)? Nomad's
    /// `host_volume` rules: `mount-readonly` or `mount-readwrite` for a read-only
    /// mount, `mount-readwrite` for a writable one; no rule, or `deny`: no.
    pub fn allow_host_volume(&self, name: &str, read_only: bool) -> bool {
        if self.management {
            return true;
        }
        let Some(caps) = self
            .host_volumes
            .get(name)
            .or_else(|| closest_glob(&self.wildcard_host_volumes, name))
        else {
            return false;
        };
        if caps.contains("deny") {
            return false;
        }
        caps.contains("mount-readwrite") || (read_only && caps.contains("mount-readonly"))
    }

    /// Has the token any capability in namespace `ns` (what listing namespaces
    /// shows, as Nomad's)? A `deny` policy has none.
    pub fn allow_namespace(&self, ns: &str) -> bool {
        self.management
            || self
                .namespace_caps(ns)
                .is_some_and(|c| !c.is_empty() && !c.contains("deny"))
    }

    /// May `op` be done on the variable at `path` in namespace `ns` (by the token's
    /// policies; a workload identity's own paths are the variables code's to grant)?
    pub fn allow_variable(&self, ns: &str, path: &str, op: VariableOp) -> bool {
        if self.management {
            return true;
        }
        let key = format!("{ns}\0{path}");
        self.variables
            .get(&key)
            .or_else(|| closest_glob(&self.wildcard_variables, &key))
            .is_some_and(|c| !c.contains("deny") && c.contains(op.capability()))
    }

    /// Has the token any variables rule in namespace `ns` (a listing is then filtered
    /// path by path)?
    pub fn allow_variable_search(&self, ns: &str) -> bool {
        if self.management {
            return true;
        }
        let prefix = format!("{ns}\0");
        self.variables
            .keys()
            .any(|k| ns == "*" || k.starts_with(&prefix))
            || self
                .wildcard_variables
                .keys()
                .any(|k| ns == "*" || glob_match(k.split('\0').next().unwrap_or(""), ns))
    }

    /// `node:read`.
    pub fn allow_node_read(&self) -> bool {
        self.management || self.node.allows_read()
    }
    /// `node:write`.
    pub fn allow_node_write(&self) -> bool {
        self.management || self.node.allows_write()
    }
    /// `agent:read`.
    pub fn allow_agent_read(&self) -> bool {
        self.management || self.agent.allows_read()
    }
    /// `agent:write`.
    pub fn allow_agent_write(&self) -> bool {
        self.management || self.agent.allows_write()
    }
    /// `operator:read`.
    pub fn allow_operator_read(&self) -> bool {
        self.management || self.operator.allows_read()
    }
    /// `operator:write`.
    pub fn allow_operator_write(&self) -> bool {
        self.management || self.operator.allows_write()
    }
    /// `quota:read`.
    pub fn allow_quota_read(&self) -> bool {
        self.management || self.quota.allows_read()
    }
    /// `plugin:read`.
    pub fn allow_plugin_read(&self) -> bool {
        self.management || self.plugin.allows_read()
    }
    /// `plugin:list` (read implies it).
    pub fn allow_plugin_list(&self) -> bool {
        self.management || matches!(self.plugin, Level::List | Level::Read)
    }
}

/// A policy as the server stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclPolicy {
    /// Its name.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// The rules, as written (HCL or JSON).
    pub rules: String,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

/// A token as the server stores it: the secret only as its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    /// Public id (Nomad's `AccessorID`).
    pub accessor_id: String,
    /// Hex SHA-256 of the secret (Nomad's `SecretID`, which is never stored).
    pub secret_hash: String,
    /// Free text.
    #[serde(default)]
    pub name: String,
    /// `client` or `management`.
    pub token_type: String,
    /// Policies of a client token.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Nomad's: replicated to every region (drover has one).
    #[serde(default)]
    pub global: bool,
    /// Unix nanoseconds.
    pub create_time: i64,
    /// Unix nanoseconds; none: never expires.
    #[serde(default)]
    pub expiration_time: Option<i64>,
    /// The TTL it was created with, in nanoseconds (0: none).
    #[serde(default)]
    pub expiration_ttl: i64,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

impl AclToken {
    /// Is it a management token?
    pub fn is_management(&self) -> bool {
        self.token_type == TOKEN_TYPE_MANAGEMENT
    }

    /// Has it expired at `now` (unix nanoseconds)?
    pub fn expired(&self, now: i64) -> bool {
        self.expiration_time.is_some_and(|t| t <= now)
    }
}

/// A policy or token name as Nomad takes it: at most 128 bytes, no control characters.
pub fn check_name(field: &str, name: &str, required: bool) -> Result<(), PolicyError> {
    if required && name.is_empty() {
        return err(format!("{field}: required"));
    }
    if name.len() > MAX_NAME_BYTES {
        return err(format!("{field}: longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.chars().any(char::is_control) {
        return err(format!("{field}: holds control characters"));
    }
    Ok(())
}

/// A policy name (Nomad's `^[a-zA-Z0-9-]{1,128}$`).
pub fn check_policy_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return err(format!(
            "Name: invalid policy name {name:?} (letters, digits and '-', 1 to 128)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_volume_rules_say_which_volumes_a_job_may_mount() {
        let p = parse_policy(
            r#"host_volume "shared" { policy = "read" }
host_volume "scratch-*" { policy = "write" }
host_volume "scratch-secret" { policy = "deny" }
host_volume "logs" { capabilities = ["mount-readwrite"] }"#,
        )
        .unwrap();
        let acl = Acl::new([&p]);
        assert!(acl.allow_host_volume("shared", true));
        assert!(!acl.allow_host_volume("shared", false), "read is read-only");
        assert!(acl.allow_host_volume("scratch-a", false));
        assert!(!acl.allow_host_volume("scratch-secret", true), "deny wins");
        assert!(acl.allow_host_volume("logs", false) && acl.allow_host_volume("logs", true));
        assert!(!acl.allow_host_volume("other", true), "no rule: no mount");
        assert!(Acl::management().allow_host_volume("other", false));
    }

    fn acl(rules: &[&str]) -> Acl {
        let ps: Vec<Policy> = rules.iter().map(|r| parse_policy(r).unwrap()).collect();
        Acl::new(&ps)
    }

    #[test]
    fn read_policy_expands_to_nomads_read_capabilities() {
        let a = acl(&[r#"namespace "default" { policy = "read" }"#]);
        for c in READ_CAPABILITIES {
            assert!(a.allow_namespace_op("default", c), "{c}");
        }
        assert!(!a.allow_namespace_op("default", "submit-job"));
        assert!(!a.allow_namespace_op("default", "read-logs"));
        assert!(!a.allow_namespace_op("other", "read-job"));
        assert!(!a.allow_node_read());
    }

    #[test]
    fn write_policy_adds_the_write_capabilities() {
        let a = acl(&[r#"namespace "default" { policy = "write" }"#]);
        for c in [
            "submit-job",
            "dispatch-job",
            "read-logs",
            "read-fs",
            "alloc-exec",
            "alloc-lifecycle",
            "scale-job",
            "read-job",
            "list-jobs",
        ] {
            assert!(a.allow_namespace_op("default", c), "{c}");
        }
        // Not in Nomad's write set.
        assert!(!a.allow_namespace_op("default", "alloc-node-exec"));
        assert!(!a.allow_namespace_op("default", "sentinel-override"));
    }

    #[test]
    fn scale_policy_and_capabilities_add_up() {
        let a = acl(&[r#"namespace "d" {
            policy = "scale"
            capabilities = ["read-logs"]
        }"#]);
        assert!(a.allow_namespace_op("d", "scale-job"));
        assert!(a.allow_namespace_op("d", "read-logs"));
        assert!(!a.allow_namespace_op("d", "read-job"));
    }

    #[test]
    fn deny_wins_over_any_grant_in_any_order() {
        let deny = r#"namespace "default" { policy = "deny" }"#;
        let write = r#"namespace "default" { policy = "write" }"#;
        for order in [[deny, write], [write, deny]] {
            let a = acl(&order);
            assert!(!a.allow_namespace_op("default", "read-job"));
        }
        let a = acl(&[r#"namespace "default" {
            policy = "write"
            capabilities = ["deny"]
        }"#]);
        assert!(!a.allow_namespace_op("default", "list-jobs"));
        // Levels: deny wins too.
        let a = acl(&[
            r#"node { policy = "write" }"#,
            r#"node { policy = "deny" }"#,
        ]);
        assert!(!a.allow_node_read());
        let a = acl(&[
            r#"node { policy = "read" }"#,
            r#"node { policy = "write" }"#,
        ]);
        assert!(a.allow_node_write());
    }

    #[test]
    fn the_exact_rule_then_the_closest_glob_applies() {
        let a = acl(&[r#"
            namespace "*" { policy = "read" }
            namespace "team-*" { policy = "write" }
            namespace "team-a*" { policy = "deny" }
            namespace "team-b" { capabilities = ["list-jobs"] }
        "#]);
        assert!(a.allow_namespace_op("other", "read-job"));
        assert!(!a.allow_namespace_op("other", "submit-job"));
        assert!(a.allow_namespace_op("team-x", "submit-job"));
        assert!(!a.allow_namespace_op("team-abc", "read-job"));
        // The exact rule, not merged with the globs.
        assert!(a.allow_namespace_op("team-b", "list-jobs"));
        assert!(!a.allow_namespace_op("team-b", "read-job"));
        // All namespaces: allowed when any rule allows.
        assert!(a.allow_namespace_op("*", "submit-job"));
        assert!(!a.allow_namespace_op("*", "alloc-node-exec"));
    }

    #[test]
    fn globs_match_like_go_glob() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*", "a/b"));
        assert!(glob_match("team-*", "team-"));
        assert!(glob_match("a*c*e", "abcde"));
        assert!(!glob_match("a*c*e", "abde"));
        assert!(glob_match("*b", "ab"));
        assert!(!glob_match("ab*ba", "aba"));
        assert!(glob_match("x", "x"));
        assert!(!glob_match("x", "xy"));
    }

    #[test]
    fn levels_grant_what_nomad_grants() {
        let a = acl(&[r#"agent { policy = "read" }
               operator { policy = "write" }
               plugin { policy = "list" }"#]);
        assert!(a.allow_agent_read() && !a.allow_agent_write());
        assert!(a.allow_operator_read() && a.allow_operator_write());
        assert!(a.allow_plugin_list() && !a.allow_plugin_read());
        assert!(!a.allow_node_read());
        let m = Acl::management();
        assert!(m.allow_node_write() && m.allow_namespace_op("any", "alloc-node-exec"));
        let none = Acl::deny_all();
        assert!(!none.allow_namespace_op("default", "list-jobs") && !none.allow_agent_read());
    }

    #[test]
    fn variables_rules_are_kept_and_checked() {
        let a = acl(&[r#"
            namespace "default" {
              policy = "read"
              variables {
                path "project/*" { capabilities = ["read"] }
                path "project/secret" { capabilities = ["deny"] }
                path "shared" { capabilities = ["write", "destroy"] }
              }
            }
        "#]);
        assert!(a.allow_variable("default", "project/x", VariableOp::Read));
        // read implies list.
        assert!(a.allow_variable("default", "project/x", VariableOp::List));
        assert!(!a.allow_variable("default", "project/x", VariableOp::Write));
        assert!(!a.allow_variable("default", "project/secret", VariableOp::Read));
        assert!(a.allow_variable("default", "shared", VariableOp::Destroy));
        assert!(!a.allow_variable("other", "shared", VariableOp::Write));
        assert!(a.allow_variable_search("default"));
        assert!(!a.allow_variable_search("other"));
        assert!(Acl::management().allow_variable("x", "y", VariableOp::Write));

        // Deny wins across policies, whichever comes first.
        let rule = |caps: &str| {
            format!(
                "namespace \"default\" {{\n  variables {{\n    path \"secret\" {{\n      capabilities = [\"{caps}\"]\n    }}\n  }}\n}}\n"
            )
        };
        let (deny, read) = (rule("deny"), rule("read"));
        let (deny, read) = (deny.as_str(), read.as_str());
        for order in [[deny, read], [read, deny]] {
            let a = acl(&order);
            assert!(
                !a.allow_variable("default", "secret", VariableOp::Read),
                "{order:?}"
            );
            assert!(
                !a.allow_variable("default", "secret", VariableOp::List),
                "{order:?}"
            );
        }
    }

    #[test]
    fn json_rules_are_nomads_json_form() {
        let p = parse_policy(
            r#"{"namespace": {"default": {"policy": "read",
                 "variables": {"path": {"a/*": {"capabilities": ["list"]}}}},
               "ops": {"capabilities": ["submit-job"]}},
               "node": {"policy": "write"}}"#,
        )
        .unwrap();
        let a = Acl::new([&p]);
        assert!(a.allow_namespace_op("default", "read-job"));
        assert!(a.allow_namespace_op("ops", "submit-job"));
        assert!(a.allow_node_write());
        assert!(a.allow_variable("default", "a/b", VariableOp::List));
        // A list of blocks (HCL1's JSON).
        let p = parse_policy(
            r#"{"namespace": [{"a": {"policy": "read"}}, {"b": {"policy": "write"}}]}"#,
        )
        .unwrap();
        assert_eq!(p.namespaces.len(), 2);
    }

    #[test]
    fn mistakes_are_refused_naming_the_field() {
        for (rules, want) in [
            (
                r#"namespace "default" { polcy = "read" }"#,
                r#"namespace "default": unknown field "polcy""#,
            ),
            (
                r#"namespace "default" { policy = "reed" }"#,
                r#"namespace "default": policy "reed""#,
            ),
            (
                r#"namespace "default" { capabilities = ["read-job", "submit-jobs"] }"#,
                r#"namespace "default": capabilities[1]: unknown capability "submit-jobs""#,
            ),
            (r#"nodes { policy = "read" }"#, r#"unknown block "nodes""#),
            (
                r#"node { policy = "scale-job" }"#,
                "node: policy \"scale-job\"",
            ),
            (
                r#"namespace "a b" { policy = "read" }"#,
                "invalid namespace name",
            ),
            (
                "namespace \"d\" {\n variables {\n path \"x\" { capabilities = [\"reed\"] }\n }\n}",
                r#"namespace "d".variables.path "x": capabilities[0]: unknown capability "reed""#,
            ),
            ("namespace \"d\" {\n variables {\n }\n}", "no path blocks"),
            ("", "grants nothing"),
            ("namespace \"d\" {", "rules (HCL)"),
            (
                r#"{"namespace": {"d": {"policy": 1}}}"#,
                "policy must be a string",
            ),
            (
                r#"namespace "d" { policy = "${x}" }"#,
                "policy must be a string",
            ),
        ] {
            let e = parse_policy(rules).unwrap_err().0;
            assert!(e.contains(want), "{rules}: {e}");
        }
    }

    #[test]
    fn policy_names_are_nomads() {
        assert!(check_policy_name("readonly-a1").is_ok());
        assert!(check_policy_name("").is_err());
        assert!(check_policy_name("a b").is_err());
        assert!(check_policy_name(&"a".repeat(129)).is_err());
    }
}
