//! Nomad's HCL2 job files, read into the JSON of Nomad's API: exactly what
//! `nomad job run -output FILE` prints (`{"Job": {...}}`, PascalCase keys, durations in
//! nanoseconds), less the keys Nomad prints as `null`.
//!
//! ```
//! use drover_server_api::hcl::{self, VarInputs};
//! let text = r#"
//! job "web" {
//!   group "app" {
//!     task "main" {
//!       driver = "raw_exec"
//!       config {
//!         command = "/bin/sleep"
//!         args    = ["${NOMAD_ALLOC_ID}"]
//!       }
//!     }
//!   }
//! }
//! "#;
//! let job = hcl::parse("web.nomad.hcl", std::path::Path::new("."), text, &VarInputs::default())
//!     .unwrap();
//! assert_eq!(job["Job"]["ID"], "web");
//! assert_eq!(job["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["args"][0], "${NOMAD_ALLOC_ID}");
//! ```
//!
//! Syntax and expressions are hcl-rs's (its `hcl-edit` parser keeps the spans every
//! error is placed with); the job's schema, the conversion of values to the types of
//! Nomad's API and the functions Nomad's job files use are here.
//!
//! What is filled: the keys Nomad's parser sets, whatever the file says: `ID` and `Name`
//! from the job's label, `Dispatched: false`; on a task `User: ""`, `Leader: false`,
//! `ShutdownDelay: 0`, `KillSignal: ""`, `Kind: ""`; a constraint always has `LTarget`,
//! `RTarget` and `Operand` (`"="` when none is given). Everything else appears only when
//! the file sets it. So Nomad's output with its `null`s removed is ours, key for key.
//!
//! Runtime references stay text for the client, as Nomad's HCL2 parser leaves them: a
//! reference whose root is not `var`, `local` (or a `for` variable) — `attr.kernel.name`,
//! `node.unique.name`, `meta.rack`, `env["HOME"]`, `NOMAD_PORT_http` — becomes the string
//! `${...}` of its source text, inside a template or not.
//!
//! Errors are one line, `FILE:LINE:COL: message`: a syntax error, an unknown argument
//! (with a "did you mean"), an unknown block, a block or argument of Nomad's that Drover
//! does not support yet ([`UNSUPPORTED_BLOCKS`], [`UNSUPPORTED_ARGUMENTS`]), a value of the
//! wrong type, an expression that cannot be evaluated, a variable without a value.
//!
//! Evaluation is bounded (job files come from users, and from the network through
//! `/v1/jobs/parse`): a value nests at most [`MAX_VALUE_DEPTH`] levels and takes at most
//! [`MAX_VALUE_BYTES`]; variables and locals together at most [`MAX_VARIABLES_BYTES`];
//! a `for` (or a template's `%{ for }`) cannot sit inside another, and may build at most
//! [`MAX_FOR_BYTES`], bounded before it runs; the functions and expressions of one parse
//! do at most [`MAX_PARSE_WORK_BYTES`] of work.

mod budget;
mod eval;
mod funcs;
mod job;
mod source;
mod vars;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use source::HclError;

/// Nomad's blocks that Drover does not support yet: a job file using one is refused
/// (never silently dropped). Remove a name here when its support lands (issue 25 adds
/// `network` and `service`).
pub const UNSUPPORTED_BLOCKS: &[&str] = &[
    "affinity",
    "connect",
    "consul",
    "csi",
    "csi_plugin",
    "dns",
    "dynamic",
    "dispatch_payload",
    "ephemeral_disk",
    "migrate",
    "multiregion",
    "parameterized",
    "periodic",
    "scaling",
    "spread",
    "vault",
];

/// Nomad's arguments that Drover does not support yet (refused like
/// [`UNSUPPORTED_BLOCKS`]).
pub const UNSUPPORTED_ARGUMENTS: &[&str] = &[
    "address",
    "address_mode",
    "all_at_once",
    "body",
    "canary_tags",
    "consul_token",
    "cores",
    "disk",
    "enable_tag_override",
    "failures_before_critical",
    "grpc_service",
    "grpc_use_tls",
    "hostname",
    "id",
    "initial_status",
    "iops",
    "kind",
    "leader",
    "max_client_disconnect",
    "mbits",
    "name",
    "on_update",
    "shutdown_delay",
    "stop_after_client_disconnect",
    "success_before_passing",
    "tagged_addresses",
    "tls_skip_verify",
    "user",
    "vault_namespace",
    "vault_token",
];

/// The largest job file (and variable file) read.
pub const MAX_JOB_FILE_BYTES: u64 = 4 << 20;

/// The largest file the `file()` function reads.
pub const MAX_INCLUDED_FILE_BYTES: u64 = 1 << 20;

/// The largest value one expression, variable or local may evaluate to (its JSON size,
/// about): a job file cannot make the parser build an unbounded value out of small
/// text (`concat(local.x, local.x)` doubling through locals).
pub const MAX_VALUE_BYTES: usize = 4 << 20;

/// The deepest nesting of lists and objects a value may have: the evaluator and the
/// parser's helpers recurse on values, and locals could otherwise wrap each other
/// without end (each within hcl-edit's limit on a literal's nesting).
pub const MAX_VALUE_DEPTH: usize = 64;

/// The work one parse's expressions may do, in bytes of values built: what our
/// functions return (and 1 per call), every expression's value, the copies a `for`
/// makes. A job file cannot make the parser spend unbounded memory or time.
pub const MAX_PARSE_WORK_BYTES: usize = 64 << 20;

/// The most one `for` expression may build, bounded before it runs: (elements of its
/// collection) × (sizes of the variables and locals its body references + 1 KiB).
pub const MAX_FOR_BYTES: usize = 16 << 20;

/// The largest the variables and locals of one job file may be, all together.
pub const MAX_VARIABLES_BYTES: usize = 16 << 20;

/// Prefix of the environment variables that give input variables values
/// (`NOMAD_VAR_region=eu`), as Nomad reads them.
pub const ENV_VAR_PREFIX: &str = "NOMAD_VAR_";

/// Values for the file's input variables, from lowest to highest precedence: the
/// variables' defaults, `NOMAD_VAR_x` from `env`, the `-var-file`s in order, the `-var`s
/// in order.
#[derive(Debug, Clone, Default)]
pub struct VarInputs {
    /// `-var` arguments as given: `name=value`.
    pub vars: Vec<String>,
    /// `-var-file` paths: HCL files of `name = value` lines.
    pub var_files: Vec<PathBuf>,
    /// The environment (name, value); only `NOMAD_VAR_*` of declared variables count.
    pub env: Vec<(String, String)>,
}

impl VarInputs {
    /// These inputs, with this process's environment as `env`.
    pub fn with_process_env(mut self) -> Self {
        self.env = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_VAR_PREFIX))
            .collect();
        self
    }
}

/// Read a job file (at most [`MAX_JOB_FILE_BYTES`]) and parse it: see [`parse`]. `file()`
/// reads relative to the file's directory.
pub fn parse_file(path: &Path, inputs: &VarInputs) -> Result<serde_json::Value, HclError> {
    let name = path.display().to_string();
    let text =
        source::read_bounded(path, MAX_JOB_FILE_BYTES).map_err(|e| HclError::whole(&name, e))?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    parse(&name, &base, &text, inputs)
}

/// Parse the text of a job file named `file_name` into `{"Job": {...}}` as Nomad's API
/// takes it. `base_dir` is where `file("x")` looks.
pub fn parse(
    file_name: &str,
    base_dir: &Path,
    text: &str,
    inputs: &VarInputs,
) -> Result<serde_json::Value, HclError> {
    parse_in(file_name, Some(base_dir), text, inputs)
}

/// [`parse`] for a text from elsewhere (an API request, as Nomad's `/v1/jobs/parse`):
/// `file()` fails instead of reading this machine's files, and `inputs.var_files` must
/// be empty.
pub fn parse_without_files(
    file_name: &str,
    text: &str,
    inputs: &VarInputs,
) -> Result<serde_json::Value, HclError> {
    if !inputs.var_files.is_empty() {
        return Err(HclError::whole(
            file_name,
            "variable files cannot be read here",
        ));
    }
    parse_in(file_name, None, text, inputs)
}

fn parse_in(
    file_name: &str,
    base_dir: Option<&Path>,
    text: &str,
    inputs: &VarInputs,
) -> Result<serde_json::Value, HclError> {
    let _budget = budget::ParseBudget::start();
    let src = source::Source::new(file_name, text);
    let body = src.parse_body()?;
    let _base = funcs::BaseDirGuard::set(base_dir);
    let ctx = vars::context(&src, &body, inputs)?;
    let job = job::read_job(&src, &body, &ctx)?;
    Ok(serde_json::json!({ "Job": job }))
}

/// Read a job file into Nomad's API job ([`crate::nomad::Job`]), ready to submit or to
/// convert into a [`crate::JobSpec`] (`Job::to_spec`).
pub fn parse_job_file(path: &Path, inputs: &VarInputs) -> Result<crate::nomad::Job, HclError> {
    let name = path.display().to_string();
    to_job(&name, parse_file(path, inputs)?)
}

/// [`parse`], into Nomad's API job ([`crate::nomad::Job`]).
pub fn parse_job(
    file_name: &str,
    base_dir: &Path,
    text: &str,
    inputs: &VarInputs,
) -> Result<crate::nomad::Job, HclError> {
    to_job(file_name, parse(file_name, base_dir, text, inputs)?)
}

fn to_job(file_name: &str, mut wrapped: serde_json::Value) -> Result<crate::nomad::Job, HclError> {
    let job = wrapped
        .get_mut("Job")
        .map(serde_json::Value::take)
        .unwrap_or_default();
    // The parser writes only what the wire type has: a failure here is a bug of ours.
    serde_json::from_value(job).map_err(|e| {
        HclError::whole(
            file_name,
            format!("internal error: the parsed job is not Nomad's job shape: {e}"),
        )
    })
}

/// Whether a file name says HCL: it ends `.hcl` or `.nomad`.
pub fn is_hcl_name(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("hcl" | "nomad")
    )
}
