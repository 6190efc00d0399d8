//! The HCL parser against the real `nomad` 1.0.18 binary: for every golden job file,
//! `nomad job run -output` (run now, no agent needed) and `drover_server_api::hcl`
//! print the same job, less Nomad's nulls. Skips loudly without the binary (a failure
//! under CI=true).

use std::path::{Path, PathBuf};
use std::process::Command;

use drover_server_api::hcl::{self, VarInputs};
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hcl")
}

fn without_nulls(v: &Json) -> Json {
    match v {
        Json::Object(m) => Json::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// (job file, -var arguments, -var-file files): as the golden fixtures were printed.
const CASES: &[(&str, &[&str], &[&str])] = &[
    ("web.nomad", &[], &[]),
    (
        "vars.nomad.hcl",
        &["image_tag=v2", "region=us-east"],
        &["vars.vars.hcl"],
    ),
    ("batch.hcl", &[], &[]),
    ("docs.nomad.hcl", &["message=hello"], &[]),
    ("config.hcl", &[], &[]),
    ("services.nomad.hcl", &[], &[]),
    ("artifacts.nomad.hcl", &[], &[]),
];

#[test]
fn parser_prints_what_nomad_job_run_output_prints() {
    let Some(peers) = drover_test_support::nomad::peers() else {
        return;
    };
    for (job, vars, var_files) in CASES {
        let mut cmd = Command::new(peers.nomad());
        cmd.current_dir(fixtures()).args(["job", "run", "-output"]);
        for v in *vars {
            cmd.args(["-var", v]);
        }
        for f in *var_files {
            cmd.args(["-var-file", f]);
        }
        // Only what the command line gives: no NOMAD_VAR_* of this environment.
        for (k, _) in std::env::vars() {
            if k.starts_with(hcl::ENV_VAR_PREFIX) {
                cmd.env_remove(k);
            }
        }
        let out = cmd.arg(job).output().expect("run nomad");
        assert!(
            out.status.success(),
            "nomad job run -output {job}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let nomad: Json = serde_json::from_slice(&out.stdout).expect("nomad prints JSON");
        let inputs = VarInputs {
            vars: vars.iter().map(|v| (*v).to_owned()).collect(),
            var_files: var_files.iter().map(|f| fixtures().join(f)).collect(),
            env: vec![],
        };
        let ours =
            hcl::parse_file(&fixtures().join(job), &inputs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ours,
            without_nulls(&nomad),
            "{job}: ours (left) differs from nomad's (right)"
        );

        // The fixture in the repository is still what this binary prints.
        let stored = job
            .replace(".nomad.hcl", ".json")
            .replace(".nomad", ".json")
            .replace(".hcl", ".json");
        let stored: Json = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join(&stored)).expect("fixture"),
        )
        .expect("fixture JSON");
        assert_eq!(stored, nomad, "{job}: the stored fixture is stale");
    }
}
