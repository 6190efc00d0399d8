//! Nomad's HCL job files on a Drover dev agent, through the `drover` CLI (issue 24):
//! the example of `drover job init` and job files written as Nomad's documentation
//! writes them run unchanged (acceptance 2); a typo'd attribute, an unknown block, a
//! block Drover does not support yet, a bad type and a syntax error each get one clear
//! error with file, line and column (acceptance 3).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Agent;
use common::cluster::{allocs_with, pids_running, tail, wait_dev_node_ready, wait_job};

fn dev_agent(root: &Path, extra: &[&str], drivers: &[&str]) -> Agent {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let port = common::cluster::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["--dev", "--dev-http-addr", &addr];
    args.extend_from_slice(extra);
    let mut agent = Agent::start(root, &plugins, &args);
    agent.end_tasks = true;
    wait_dev_node_ready(&agent, drivers, Duration::from_secs(30));
    agent
}

fn hcl(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn cli_ok(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?} failed: {}\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        tail(&agent.log_text())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The output of `alloc logs ALLOC TASK`, once it contains `want`.
fn logs_containing(agent: &Agent, alloc: &str, task: &str, want: &str) -> String {
    let mut logs = String::new();
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(100),
        &format!("{want:?} in the logs of {task} in {alloc}"),
        || {
            logs = String::from_utf8_lossy(&agent.cli(&["alloc", "logs", alloc, task]).stdout)
                .into_owned();
            logs.contains(want)
        },
    );
    logs
}

fn no_process_left(marker: &str) {
    drover_test_support::until_blocking(
        Duration::from_secs(20),
        Duration::from_millis(50),
        &format!("no `sleep {marker}` left"),
        || pids_running(&["sleep", marker]).is_empty(),
    );
}

/// Acceptance 2: `job init`'s example, a raw_exec service with env and meta, a batch
/// job with a prestart task, and a job with variables run with `-var`, all unchanged.
#[test]
fn nomad_job_files_run_unchanged_on_a_dev_agent() {
    let root = tempfile::tempdir().unwrap();
    let agent = dev_agent(root.path(), &[], &["raw_exec"]);
    let dir = root.path();
    let sleep = format!("{}", 300_000 + std::process::id() % 100_000);

    // `job init` writes an example that runs as it is, and refuses to overwrite it.
    let init = agent
        .cli_in(dir, &["job", "init"])
        .unwrap_or_else(|e| panic!("job init: {e}"));
    let example = dir.join("example.nomad.hcl");
    assert!(
        example.is_file(),
        "job init wrote no example.nomad.hcl: {init}"
    );
    assert!(
        agent.cli_in(dir, &["job", "init"]).is_err(),
        "a second job init overwrote the example"
    );
    let text = std::fs::read_to_string(&example).unwrap();
    let name = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("job \""))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no job \"NAME\" in the example:\n{text}"))
        .to_owned();
    cli_ok(&agent, &["job", "validate", example.to_str().unwrap()]);
    cli_ok(&agent, &["job", "run", example.to_str().unwrap()]);
    let status = wait_job(
        &agent,
        &name,
        "the example's allocations running or complete",
        |v| !allocs_with(v, "running").is_empty() || !allocs_with(v, "complete").is_empty(),
    );
    assert!(allocs_with(&status, "failed").is_empty(), "{status:#}");
    cli_ok(&agent, &["job", "stop", "--purge", &name]);

    // A raw_exec service as Nomad's documentation writes one: env and meta, with
    // `${NOMAD_ALLOC_INDEX}` interpolated by the client, per allocation.
    let web = hcl(
        dir,
        "web.nomad.hcl",
        &r#"
job "docs-web" {
  datacenters = ["dc1"]
  type        = "service"

  meta {
    team = "web"
  }

  group "web" {
    count = 2

    task "server" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo index=$NOMAD_ALLOC_INDEX greeting=$GREETING owner=$NOMAD_META_owner team=$NOMAD_META_team arg=${NOMAD_ALLOC_INDEX}; exec sleep SLEEP"]
      }

      env {
        GREETING = "hello-${NOMAD_ALLOC_INDEX}"
      }

      meta {
        owner = "docs"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
"#
        .replace("SLEEP", &sleep),
    );
    cli_ok(&agent, &["job", "run", web.to_str().unwrap()]);
    let status = wait_job(&agent, "docs-web", "2 running allocations", |v| {
        allocs_with(v, "running").len() == 2
    });
    for a in allocs_with(&status, "running") {
        let id = a["id"].as_str().unwrap();
        let index = a["index"].as_u64().unwrap();
        logs_containing(
            &agent,
            id,
            "server",
            &format!("index={index} greeting=hello-{index} owner=docs team=web arg={index}"),
        );
    }
    cli_ok(&agent, &["job", "stop", "--purge", "docs-web"]);
    no_process_left(&sleep);

    // A batch job with a prestart task: it runs first, to its end, and the main task
    // sees what it left in the shared alloc dir.
    let batch = hcl(
        dir,
        "batch.nomad",
        r#"
job "docs-batch" {
  datacenters = ["dc1"]
  type        = "batch"

  group "work" {
    task "setup" {
      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo prepared > ${NOMAD_ALLOC_DIR}/ready"]
      }
    }

    task "main" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo main saw $(cat ${NOMAD_ALLOC_DIR}/ready)"]
      }
    }
  }
}
"#,
    );
    cli_ok(&agent, &["job", "run", batch.to_str().unwrap()]);
    let status = wait_job(&agent, "docs-batch", "the batch allocation complete", |v| {
        allocs_with(v, "complete").len() == 1
    });
    let alloc = allocs_with(&status, "complete")[0];
    assert_eq!(alloc["task_states"]["setup"]["exit_code"], 0, "{alloc:#}");
    assert_eq!(alloc["task_states"]["main"]["exit_code"], 0, "{alloc:#}");
    logs_containing(
        &agent,
        alloc["id"].as_str().unwrap(),
        "main",
        "main saw prepared",
    );

    // Variables: declared with defaults and types, set with -var, used through
    // functions.
    let vars = hcl(
        dir,
        "vars.nomad.hcl",
        &r#"
variable "greeting" {
  type    = string
  default = "hello"
}

variable "copies" {
  type = number
}

locals {
  shout = upper(var.greeting)
}

job "docs-vars" {
  datacenters = ["dc1"]

  group "g" {
    count = var.copies

    task "t" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo ${var.greeting} ${local.shout} ${format("%03d", var.copies)}; exec sleep SLEEP"]
      }
    }
  }
}
"#
        .replace("SLEEP", &sleep),
    );
    // Without the variable that has no default: refused, naming it.
    let out = agent.cli(&["job", "run", vars.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("copies"), "{err}");
    cli_ok(
        &agent,
        &[
            "job",
            "run",
            "-var",
            "copies=2",
            "-var",
            "greeting=bonjour",
            vars.to_str().unwrap(),
        ],
    );
    let status = wait_job(&agent, "docs-vars", "2 running allocations", |v| {
        allocs_with(v, "running").len() == 2
    });
    let id = allocs_with(&status, "running")[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    logs_containing(&agent, &id, "t", "bonjour BONJOUR 002");
    cli_ok(&agent, &["job", "stop", "--purge", "docs-vars"]);
    no_process_left(&sleep);
}

/// Acceptance 2, docker: a docker job as Nomad's documentation writes it, on the test
/// image of the private dockerd.
#[test]
fn a_nomad_docker_job_file_runs_unchanged() {
    let Some(docker) = common::docker::docker_env() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = common::docker::agent_config(root.path(), &docker.host, "");
    let agent = dev_agent(
        root.path(),
        &["--config", config.to_str().unwrap()],
        &["raw_exec", "docker"],
    );
    let job = hcl(
        root.path(),
        "docker.nomad.hcl",
        &r#"
job "docs-docker" {
  datacenters = ["dc1"]
  type        = "batch"

  group "hello" {
    task "hello" {
      driver = "docker"

      config {
        image   = "IMAGE"
        command = "/bin/sh"
        args    = ["-c", "echo hello from docker alloc $NOMAD_ALLOC_INDEX"]
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
"#
        .replace("IMAGE", &docker.image),
    );
    cli_ok(&agent, &["job", "run", job.to_str().unwrap()]);
    let status = wait_job(
        &agent,
        "docs-docker",
        "the docker allocation complete",
        |v| allocs_with(v, "complete").len() == 1,
    );
    let alloc = allocs_with(&status, "complete")[0];
    assert_eq!(alloc["task_states"]["hello"]["exit_code"], 0, "{alloc:#}");
    logs_containing(
        &agent,
        alloc["id"].as_str().unwrap(),
        "hello",
        "hello from docker alloc 0",
    );
    cli_ok(&agent, &["job", "stop", "--purge", "docs-docker"]);
}

/// Acceptance 3: each kind of mistake gets one error with file, line and column, from
/// `job validate` (no server needed) and from `job run` (nothing submitted).
#[test]
fn mistakes_in_hcl_job_files_name_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let base = |group_body: &str| {
        format!(
            "job \"oops\" {{\n  datacenters = [\"dc1\"]\n\n  group \"g\" {{\n{group_body}\n    task \"t\" {{\n      driver = \"raw_exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    // (file name, text, line, column, words the message must hold)
    let cases: Vec<(&str, String, u32, u32, Vec<&str>)> = vec![
        (
            "typo.nomad.hcl",
            base("    cunt = 2"),
            5,
            5,
            vec!["cunt", "count"],
        ),
        (
            "unknown.nomad.hcl",
            base("    gruop \"x\" {\n    }"),
            5,
            5,
            vec!["gruop"],
        ),
        (
            "unsupported.nomad.hcl",
            base("    vault {\n      policies = [\"web\"]\n    }"),
            5,
            5,
            vec!["vault", "not supported"],
        ),
        (
            "badtype.nomad.hcl",
            base("    count = \"two\""),
            5,
            13,
            vec!["count", "number"],
        ),
        ("syntax.nomad.hcl", base("    count = = 2"), 5, 13, vec![]),
    ];
    for (name, text, line, col, words) in cases {
        let path = hcl(dir.path(), name, &text);
        for verb in ["validate", "run"] {
            let out = std::process::Command::new(common::drover())
                .args(["job", verb, path.to_str().unwrap()])
                // Nowhere to submit to: `run` must fail on the file before it tries.
                .env("DROVER_ADDR", "http://127.0.0.1:1")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "job {verb} {name} succeeded:\n{text}"
            );
            let at = format!("{}:{line}:", path.display());
            assert!(
                err.contains(&at),
                "job {verb} {name}: the error does not say {at}COL:\n{err}\nfile:\n{text}"
            );
            let at_col = format!("{}:{line}:{col}", path.display());
            assert!(
                err.contains(&at_col),
                "job {verb} {name}: not at {at_col}:\n{err}"
            );
            for w in &words {
                assert!(err.contains(w), "job {verb} {name}: no {w:?} in:\n{err}");
            }
            assert!(
                !err.contains("cannot reach"),
                "job {verb} {name} tried the server:\n{err}"
            );
            let error_lines = err.lines().filter(|l| l.contains(name)).count();
            assert_eq!(error_lines, 1, "job {verb} {name}: not one error:\n{err}");
        }
    }
}
