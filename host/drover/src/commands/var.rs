//! `drover var get|put|list|purge` (Nomad's `nomad var ...`): variables, encrypted at
//! rest by the servers' keyring, read and written through `/v1/var/:path` and
//! `/v1/vars`. And `drover operator root keyring list|rotate`.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Subcommand;
use drover_server_api::client::Client;
use drover_server_api::client_vars::VarWriteOutcome;
use drover_server_api::variables::Variable;

use super::cluster_error;
use crate::render::print_json;

#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// Show a variable (or one of its items, `-item KEY`: the value alone).
    Get {
        /// The variable's path.
        path: String,
        /// Print only this item's value.
        #[arg(long, value_name = "KEY")]
        item: Option<String>,
        /// `table` (default) or `json` (Nomad's `Variable`).
        #[arg(long, value_parser = ["table", "json"], default_value = "table")]
        out: String,
    },
    /// Write a variable: `drover var put PATH key=value ...` (`key=@file` reads the
    /// value from a file, `key=-` from stdin). Replaces every item.
    Put {
        /// The variable's path.
        path: String,
        /// Items, `key=value`.
        #[arg(value_name = "KEY=VALUE")]
        items: Vec<String>,
        /// Write only if the variable's modify index is this (0: only if it does not
        /// exist yet).
        #[arg(long, value_name = "N")]
        check_index: Option<u64>,
        /// `none` (default: a line saying it was written), `table` or `json`.
        #[arg(long, value_parser = ["none", "table", "json"], default_value = "none")]
        out: String,
    },
    /// List the variables under a prefix (their paths, not their items).
    List {
        /// Only paths starting with this.
        #[arg(default_value = "")]
        prefix: String,
        /// `table` (default) or `json` (Nomad's `VariableMetadata` list).
        #[arg(long, value_parser = ["table", "json"], default_value = "table")]
        out: String,
    },
    /// Delete a variable.
    Purge {
        /// The variable's path.
        path: String,
        /// Delete only if the variable's modify index is this.
        #[arg(long, value_name = "N")]
        check_index: Option<u64>,
    },
}

/// `drover operator ...`.
#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// The cluster's root: the keyring.
    #[command(subcommand)]
    Root(RootCommand),
}

/// `drover operator root ...`.
#[derive(Debug, Subcommand)]
pub enum RootCommand {
    /// The root keys that encrypt variables and sign workload identities.
    #[command(subcommand)]
    Keyring(KeyringCommand),
}

/// `drover operator root keyring ...`.
#[derive(Debug, Subcommand)]
pub enum KeyringCommand {
    /// List the root keys (ids, states, creation times; never their material).
    List {
        /// Print JSON (Nomad's `RootKeyMeta` list).
        #[arg(long)]
        json: bool,
    },
    /// Make a new active root key; the old ones stay to decrypt what they encrypted.
    Rotate {
        /// Also encrypt every variable again with the new key.
        #[arg(long)]
        full: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn time_of(nanos: i64) -> String {
    u64::try_from(nanos).map_or_else(
        |_| "-".to_owned(),
        |n| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(n)).to_string(),
    )
}

/// Nomad's table of a variable (`renderSVAsUiTable`).
fn variable_table(v: &Variable) -> String {
    let mut meta = vec![
        ("Namespace", v.namespace.clone()),
        ("Path", v.path.clone()),
        ("Create Time", time_of(v.create_time)),
    ];
    if v.create_time != v.modify_time {
        meta.push(("Modify Time", time_of(v.modify_time)));
    }
    meta.push(("Check Index", v.modify_index.to_string()));
    let width = meta.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, val) in &meta {
        out.push_str(&format!("{k:<width$} = {val}\n"));
    }
    out.push_str("\nItems\n");
    let width = v.items.keys().map(String::len).max().unwrap_or(0);
    for (k, val) in &v.items {
        out.push_str(&format!("{k:<width$} = {val}\n"));
    }
    out
}

/// `key=value` items; `key=@file` reads a file, `key=-` stdin (once).
pub fn parse_items(args: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut items = BTreeMap::new();
    let mut stdin_used = false;
    for (i, a) in args.iter().enumerate() {
        let Some((k, v)) = a.split_once('=') else {
            bail!("item {} ({a:?}): expected KEY=VALUE", i + 1);
        };
        if k.is_empty() {
            bail!("item {} ({a:?}): the key is empty", i + 1);
        }
        let value = if v == "-" {
            if stdin_used {
                bail!("item {} ({a:?}): only one item may read stdin", i + 1);
            }
            stdin_used = true;
            let mut s = String::new();
            std::io::stdin()
                .take(drover_server_api::variables::MAX_VARIABLE_BYTES as u64 + 1)
                .read_to_string(&mut s)
                .with_context(|| format!("item {k}: cannot read stdin"))?;
            s
        } else if let Some(file) = v.strip_prefix('@') {
            let f = std::fs::File::open(file)
                .with_context(|| format!("item {k}: cannot open {file}"))?;
            let mut s = String::new();
            f.take(drover_server_api::variables::MAX_VARIABLE_BYTES as u64 + 1)
                .read_to_string(&mut s)
                .with_context(|| format!("item {k}: cannot read {file}"))?;
            s
        } else {
            v.to_owned()
        };
        if items.insert(k.to_owned(), value).is_some() {
            bail!("item {} ({a:?}): key {k:?} given twice", i + 1);
        }
    }
    drover_server_api::variables::validate_items(&items).map_err(anyhow::Error::msg)?;
    Ok(items)
}

fn cas_conflict(check: Option<u64>, current: &Variable) -> ExitCode {
    eprintln!("\nCheck-and-Set conflict\n");
    let last = if current.modify_index > 0 {
        format!(" It was last updated at {}.", time_of(current.modify_time))
    } else {
        " The variable does not exist.".to_owned()
    };
    eprintln!(
        "    Your provided check-index ({}) does not match the server-side index ({}).{last}\n    \
         Read the variable again and retry with its check index.",
        check.unwrap_or(0),
        current.modify_index
    );
    ExitCode::FAILURE
}

/// Run a `var` subcommand.
pub async fn var_command(c: &Client, cmd: VarCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        VarCommand::Get { path, item, out } => {
            let Some(v) = c.variable(&path, None).await.map_err(cluster_error)? else {
                eprintln!("Variable not found");
                return Ok(ExitCode::FAILURE);
            };
            if let Some(item) = item {
                return match v.items.get(&item) {
                    Some(val) => {
                        println!("{val}");
                        Ok(ExitCode::SUCCESS)
                    }
                    None => {
                        eprintln!("Variable does not contain {item:?} item");
                        Ok(ExitCode::FAILURE)
                    }
                };
            }
            if out == "json" {
                print_json(&v)?;
            } else {
                print!("{}", variable_table(&v));
            }
        }
        VarCommand::Put {
            path,
            items,
            check_index,
            out,
        } => {
            let items = parse_items(&items)?;
            match c
                .put_variable(&path, None, items, check_index)
                .await
                .map_err(cluster_error)?
            {
                VarWriteOutcome::Conflict(current) => {
                    return Ok(cas_conflict(check_index, &current));
                }
                VarWriteOutcome::Done(v, index) => match (out.as_str(), v) {
                    ("json", Some(v)) => print_json(&v)?,
                    ("table", Some(v)) => print!("{}", variable_table(&v)),
                    _ => println!("Created variable {path:?} with modify index {index}"),
                },
            }
        }
        VarCommand::List { prefix, out } => {
            let list = c.variables(&prefix, None).await.map_err(cluster_error)?;
            if out == "json" {
                return print_json(&list).map(|()| ExitCode::SUCCESS);
            }
            if list.is_empty() {
                println!("No matching variables found");
                return Ok(ExitCode::SUCCESS);
            }
            let w_ns = list
                .iter()
                .map(|v| v.namespace.len())
                .max()
                .unwrap_or(0)
                .max(9);
            let w_path = list.iter().map(|v| v.path.len()).max().unwrap_or(0).max(4);
            println!("{:<w_ns$}  {:<w_path$}  Last Updated", "Namespace", "Path");
            for v in &list {
                println!(
                    "{:<w_ns$}  {:<w_path$}  {}",
                    v.namespace,
                    v.path,
                    time_of(v.modify_time)
                );
            }
        }
        VarCommand::Purge { path, check_index } => {
            match c
                .delete_variable(&path, None, check_index)
                .await
                .map_err(cluster_error)?
            {
                VarWriteOutcome::Conflict(current) => {
                    return Ok(cas_conflict(check_index, &current));
                }
                VarWriteOutcome::Done(..) => println!("Successfully purged variable {path:?}!"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Run an `operator` subcommand.
pub async fn operator_command(c: &Client, cmd: OperatorCommand) -> anyhow::Result<ExitCode> {
    let OperatorCommand::Root(RootCommand::Keyring(cmd)) = cmd;
    match cmd {
        KeyringCommand::List { json } => {
            let keys = c.keyring_keys().await.map_err(cluster_error)?;
            if json {
                return print_json(&keys).map(|()| ExitCode::SUCCESS);
            }
            if keys.is_empty() {
                println!("No root keys yet (the first is made with the first variable or job)");
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<36}  {:<8}  Create Time", "Key", "State");
            for k in &keys {
                println!(
                    "{:<36}  {:<8}  {}",
                    k.key_id,
                    k.state,
                    time_of(k.create_time)
                );
            }
        }
        KeyringCommand::Rotate { full, json } => {
            let r = c.rotate_keyring(full).await.map_err(cluster_error)?;
            if json {
                return print_json(&r).map(|()| ExitCode::SUCCESS);
            }
            println!("{:<36}  {:<8}  Create Time", "Key", "State");
            println!(
                "{:<36}  {:<8}  {}",
                r.key.key_id,
                r.key.state,
                time_of(r.key.create_time)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_parse_as_nomads_kv_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("v");
        std::fs::write(&f, "from file").unwrap();
        let items =
            parse_items(&["a=1".into(), "b=x=y".into(), format!("c=@{}", f.display())]).unwrap();
        assert_eq!(items["a"], "1");
        assert_eq!(items["b"], "x=y");
        assert_eq!(items["c"], "from file");
        assert!(
            parse_items(&["novalue".into()])
                .unwrap_err()
                .to_string()
                .contains("KEY=VALUE")
        );
        assert!(
            parse_items(&["=v".into()])
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(
            parse_items(&["a=1".into(), "a=2".into()])
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        assert!(parse_items(&[]).unwrap_err().to_string().contains("Items"));
    }
}
