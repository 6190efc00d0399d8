//! Job files for `drover job run|plan|validate` and the example of `drover job init`.
//!
//! Which language a file is in: a name ending `.hcl` or `.nomad` is Nomad's HCL2 (read
//! by [`drover_server_api::hcl`] into Nomad's API job, then converted into a
//! [`JobSpec`]); a name ending `.toml` is Drover's TOML job file
//! ([`drover_server_api::jobfile`]); any other name is TOML when its text parses as
//! TOML with a top-level `name` key, else HCL (an HCL job file starts with
//! `job "NAME" {`, which TOML refuses).
//!
//! `-var NAME=VALUE` and `-var-file FILE` (also `--var`, `--var-file`) give an HCL
//! file's input variables, after `NOMAD_VAR_NAME` from the environment, as Nomad.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use drover_server_api::JobSpec;
use drover_server_api::hcl::{self, VarInputs};

/// The job file and its variables, as `run`, `plan` and `validate` take them.
#[derive(Debug, Clone, clap::Args)]
pub struct JobFileArgs {
    /// The job file: Nomad HCL (`.hcl`, `.nomad`) or Drover TOML (`.toml`).
    pub file: PathBuf,
    /// Set an input variable of an HCL job file (repeatable; `-var` works too).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
    /// Read input variables from an HCL file of `NAME = VALUE` lines (repeatable;
    /// `-var-file` works too).
    #[arg(long = "var-file", value_name = "FILE")]
    pub var_files: Vec<PathBuf>,
}

/// The language of a job file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobFileFormat {
    Hcl,
    Toml,
}

/// The language of the job file `path` holding `text` (see the module's rule).
pub fn format_of(path: &Path, text: &str) -> JobFileFormat {
    if hcl::is_hcl_name(path) {
        return JobFileFormat::Hcl;
    }
    if path.extension().and_then(|e| e.to_str()) == Some("toml") {
        return JobFileFormat::Toml;
    }
    match text.parse::<toml::Table>() {
        Ok(t) if t.contains_key("name") => JobFileFormat::Toml,
        _ => JobFileFormat::Hcl,
    }
}

/// A job file read and checked as the server checks it.
#[derive(Debug, Clone)]
pub struct LoadedJob {
    /// The job.
    pub spec: JobSpec,
    /// What was accepted but will not be acted on (from the conversion of Nomad's job).
    pub warnings: Vec<String>,
}

/// Read, convert and validate a job file. Errors name the file and the place: a line
/// and column for HCL's syntax, schema and values; a field path for what Drover cannot
/// run yet and for the server's checks.
pub fn load(args: &JobFileArgs) -> anyhow::Result<LoadedJob> {
    let file = &args.file;
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read job file {}", file.display()))?;
    let name = file.display().to_string();
    match format_of(file, &text) {
        JobFileFormat::Toml => {
            if !args.vars.is_empty() || !args.var_files.is_empty() {
                bail!("{name}: -var and -var-file are for HCL job files; this is a TOML job file");
            }
            let spec = drover_server_api::jobfile::parse_and_validate(&text, &name)?;
            Ok(LoadedJob {
                spec,
                warnings: Vec::new(),
            })
        }
        JobFileFormat::Hcl => {
            let inputs = VarInputs {
                vars: args.vars.clone(),
                var_files: args.var_files.clone(),
                env: Vec::new(),
            }
            .with_process_env();
            let base = match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let wire = hcl::parse_job(&name, &base, &text, &inputs)?;
            let parsed = wire.to_spec().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            drover_server_api::validate(&parsed.spec)
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            Ok(LoadedJob {
                spec: parsed.spec,
                warnings: parsed.warnings,
            })
        }
    }
}

/// The file `drover job init` writes when given none.
pub const DEFAULT_INIT_FILE: &str = "example.nomad.hcl";

/// The example job of `drover job init`: runs as it is on a dev agent (`drover agent
/// -dev`) through the built-in `raw_exec` driver.
pub const EXAMPLE_JOB: &str = r#"# An example job in Nomad's job file language (HCL).
#
#   drover job validate example.nomad.hcl   # check it, no server needed
#   drover job run example.nomad.hcl        # run it (on a dev agent: drover agent -dev)
#   drover job status example
#   drover job stop -purge example

variable "greeting" {
  type        = string
  default     = "hello"
  description = "What the task says (drover job run -var greeting=hi ...)"
}

job "example" {
  datacenters = ["dc1"]
  type        = "service"

  group "app" {
    count = 1

    restart {
      attempts = 2
      interval = "30m"
      delay    = "15s"
      mode     = "fail"
    }

    task "hello" {
      # raw_exec runs the command as it is on the node, without isolation.
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"$GREETING from $NOMAD_TASK_NAME\"; exec sleep 3600"]
      }

      env {
        GREETING = var.greeting
      }

      resources {
        cpu    = 100 # MHz
        memory = 64  # MB
      }

      kill_timeout = "5s"
    }
  }
}
"#;

/// Write the example job to `file` (default [`DEFAULT_INIT_FILE`]); an existing file is
/// never overwritten.
pub fn init(file: Option<&Path>) -> anyhow::Result<PathBuf> {
    use std::io::Write as _;
    let path = file.unwrap_or(Path::new(DEFAULT_INIT_FILE)).to_path_buf();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                anyhow::anyhow!("{} already exists: not overwritten", path.display())
            }
            _ => anyhow::anyhow!("cannot create {}: {e}", path.display()),
        })?;
    f.write_all(EXAMPLE_JOB.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The long flags of `drover job ...` (and `var`, `operator`) that Nomad's CLI spells with one dash
/// (`nomad job run -var x=1 -detach`, `nomad job stop -purge`): accepted so.
const NOMAD_SINGLE_DASH_FLAGS: &[&str] = &[
    "var",
    "var-file",
    "purge",
    "detach",
    "json",
    "group",
    "no-follow",
    // `nomad var ...`, `nomad operator root keyring rotate -full`.
    "item",
    "check-index",
    "out",
    "namespace",
    "full",
    // `nomad namespace apply -description D -meta k=v`.
    "description",
    "meta",
    // `nomad alloc fs -stat -tail`, `nomad alloc exec -task T`.
    "stat",
    "tail",
    "task",
];

/// Nomad's single-dash flags of `nomad acl ...`.
const NOMAD_ACL_SINGLE_DASH_FLAGS: &[&str] = &[
    "name",
    "type",
    "policy",
    "ttl",
    "description",
    "token",
    "json",
];

/// Nomad spells the variable flags with one dash (`-var x=1`, `-var-file f`): rewrite
/// them to the `--var`/`--var-file` clap knows, for `drover job ...`,
/// `drover deployment ...`, `drover acl ...` (its own flags: `-name`, `-policy`, ...),
/// `drover var ...` and `drover operator ...` only and never after a `--`.
pub fn nomad_style_args<I: IntoIterator<Item = OsString>>(args: I) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    // The command is the first word that is neither a flag nor the value of the one
    // global flag that takes one (`--address X`).
    let mut command = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].to_str() {
            Some("--address" | "--namespace") => i += 2,
            Some(a) if a.starts_with('-') => i += 1,
            other => {
                command = other.map(|c| {
                    (
                        matches!(
                            c,
                            "job"
                                | "deployment"
                                | "acl"
                                | "var"
                                | "operator"
                                | "namespace"
                                | "alloc"
                                | "eval"
                                | "service"
                        ),
                        i,
                    )
                });
                break;
            }
        }
    }
    let Some((true, start)) = command else {
        return args;
    };
    let flags = if args[start].to_str() == Some("acl") {
        NOMAD_ACL_SINGLE_DASH_FLAGS
    } else {
        NOMAD_SINGLE_DASH_FLAGS
    };
    for arg in args.iter_mut().skip(start + 1) {
        let Some(text) = arg.to_str() else { continue };
        if text == "--" {
            break;
        }
        let name = text
            .strip_prefix('-')
            .filter(|t| !t.starts_with('-'))
            .map(|t| t.split_once('=').map_or(t, |(n, _)| n));
        if name.is_some_and(|n| flags.contains(&n)) {
            *arg = OsString::from(format!("-{text}"));
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(file: &Path) -> JobFileArgs {
        JobFileArgs {
            file: file.to_path_buf(),
            vars: vec![],
            var_files: vec![],
        }
    }

    #[test]
    fn the_init_example_is_a_valid_raw_exec_job() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(DEFAULT_INIT_FILE);
        assert_eq!(init(Some(&path)).expect("written"), path);
        let job = load(&args(&path)).expect("valid");
        assert_eq!(job.spec.name, "example");
        let task = &job.spec.groups[0].tasks[0];
        assert_eq!(task.driver, "raw_exec");
        assert_eq!(task.env.get("GREETING").map(String::as_str), Some("hello"));
        let again = init(Some(&path)).expect_err("exists");
        assert!(again.to_string().contains("already exists"), "{again}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), EXAMPLE_JOB);

        let mut with_var = args(&path);
        with_var.vars = vec!["greeting=hi".into()];
        let job = load(&with_var).expect("valid");
        assert_eq!(
            job.spec.groups[0].tasks[0]
                .env
                .get("GREETING")
                .map(String::as_str),
            Some("hi")
        );
    }

    #[test]
    fn formats_by_name_then_by_content() {
        assert_eq!(format_of(Path::new("a.hcl"), ""), JobFileFormat::Hcl);
        assert_eq!(format_of(Path::new("a.nomad"), ""), JobFileFormat::Hcl);
        assert_eq!(format_of(Path::new("a.toml"), ""), JobFileFormat::Toml);
        assert_eq!(
            format_of(Path::new("job"), "name = \"web\"\n"),
            JobFileFormat::Toml
        );
        assert_eq!(
            format_of(Path::new("job"), "job \"web\" {\n}\n"),
            JobFileFormat::Hcl
        );
        assert_eq!(
            format_of(Path::new("job"), "type = \"batch\"\n"),
            JobFileFormat::Hcl
        );
    }

    #[test]
    fn errors_name_the_file_and_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.nomad");
        std::fs::write(
            &path,
            "job \"j\" {\n  group \"g\" {\n    cunt = 1\n  }\n}\n",
        )
        .expect("write");
        let e = load(&args(&path)).expect_err("typo");
        assert_eq!(
            e.to_string(),
            format!(
                "{}:3:5: unsupported argument \"cunt\"; did you mean \"count\"?",
                path.display()
            )
        );
        // Parsed, but not runnable: the server's checks, named by field.
        std::fs::write(&path, "job \"j\" {\n  group \"g\" {\n  }\n}\n").expect("write");
        let e = load(&args(&path)).expect_err("no task");
        assert!(
            e.to_string().starts_with(&format!("{}: ", path.display())),
            "{e}"
        );
        // -var is for HCL only.
        let toml = dir.path().join("web.toml");
        std::fs::write(&toml, "name = \"web\"\n").expect("write");
        let mut a = args(&toml);
        a.vars = vec!["x=1".into()];
        assert!(load(&a).expect_err("toml").to_string().contains("-var"));
    }

    #[test]
    fn single_dash_var_flags_become_clap_flags_in_job_commands() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            nomad_style_args(os(&[
                "drover",
                "job",
                "run",
                "-var",
                "a=1",
                "-var-file=f.hcl",
                "x.hcl"
            ])),
            os(&[
                "drover",
                "job",
                "run",
                "--var",
                "a=1",
                "--var-file=f.hcl",
                "x.hcl"
            ])
        );
        assert_eq!(
            nomad_style_args(os(&["drover", "job", "stop", "-purge", "-detach", "web"])),
            os(&["drover", "job", "stop", "--purge", "--detach", "web"])
        );
        // Short flags and unknown single-dash words are clap's to judge.
        assert_eq!(
            nomad_style_args(os(&["drover", "job", "status", "-h", "-verbose"])),
            os(&["drover", "job", "status", "-h", "-verbose"])
        );
        assert_eq!(
            nomad_style_args(os(&["drover", "task", "run", "--", "prog", "-var"])),
            os(&["drover", "task", "run", "--", "prog", "-var"])
        );
        assert_eq!(
            nomad_style_args(os(&["drover", "task", "run", "job", "-var"])),
            os(&["drover", "task", "run", "job", "-var"])
        );
        assert_eq!(
            nomad_style_args(os(&[
                "drover",
                "--address",
                "job",
                "job",
                "plan",
                "-var",
                "a=1"
            ])),
            os(&["drover", "--address", "job", "job", "plan", "--var", "a=1"])
        );
        assert_eq!(
            nomad_style_args(os(&["drover", "job", "run", "x.hcl", "--", "-var"])),
            os(&["drover", "job", "run", "x.hcl", "--", "-var"])
        );
    }
}
