//! `drover acl bootstrap|policy|token`: Nomad's ACL commands, over `/v1/acl/*`.
//!
//! The token is `--token`, else `DROVER_TOKEN`, else `NOMAD_TOKEN`, as for every
//! cluster command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use drover_server_api::client::Client;
use drover_server_api::nomad::{AclPolicy, AclToken};

use super::{client, cluster_address, cluster_error, cluster_setting};
use crate::render::print_json;

/// `drover acl` and its token.
#[derive(Debug, Args)]
pub struct AclArgs {
    /// The ACL token (default: DROVER_TOKEN, else NOMAD_TOKEN).
    #[arg(long, global = true, value_name = "SECRET")]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: AclCommand,
}

/// `drover acl` subcommands.
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Make the first management token (once per cluster); prints its secret.
    Bootstrap {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Create, list, show and delete policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Create, list, show and delete tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `drover acl policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create or replace policy NAME with the rules in FILE (HCL or JSON; `-` reads
    /// standard input).
    Apply {
        /// The policy's name.
        name: String,
        /// The rules file.
        file: PathBuf,
        /// Free text.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the policies.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a policy and its rules.
    Info {
        /// The policy's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a policy.
    Delete {
        /// The policy's name.
        name: String,
    },
}

/// `drover acl token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; prints its secret (shown this once).
    Create {
        /// Free text.
        #[arg(long, default_value = "")]
        name: String,
        /// `client` (the permissions of its policies) or `management` (all).
        #[arg(long = "type", value_parser = ["client", "management"], default_value = "client")]
        token_type: String,
        /// A policy of the token (repeatable).
        #[arg(long = "policy", value_name = "NAME")]
        policies: Vec<String>,
        /// Time to live, e.g. "1h" (default: no expiry).
        #[arg(long, value_parser = parse_ttl)]
        ttl: Option<Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the tokens (no secrets).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a token by accessor id.
    Info {
        /// The accessor id.
        accessor: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the token in use.
    #[command(name = "self")]
    Self_ {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a token by accessor id.
    Delete {
        /// The accessor id.
        accessor: String,
    },
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration: {e}"))
}

/// Run `drover acl ...` against `--address`/`DROVER_ADDR` (else `NOMAD_ADDR`).
pub fn run(address: Option<String>, args: AclArgs) -> ExitCode {
    let result = (|| {
        let given = args.token.clone();
        let env = move |k: &str| match (k, &given) {
            ("DROVER_TOKEN", Some(t)) => Some(t.clone()),
            _ => std::env::var(k).ok(),
        };
        let address = address.or_else(|| cluster_setting(&env, "ADDR"));
        let address = cluster_address(address.as_deref())?;
        let c = client(&address, env)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(acl_command(&c, args.command))
    })();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_token(t: &AclToken) {
    println!("Accessor ID  = {}", t.accessor_id);
    if !t.secret_id.is_empty() {
        println!("Secret ID    = {}", t.secret_id);
    }
    println!("Name         = {}", t.name);
    println!("Type         = {}", t.token_type);
    println!("Global       = {}", t.global);
    println!("Policies     = [{}]", t.policies.join(", "));
    println!(
        "Create Time  = {}",
        t.create_time.as_deref().unwrap_or("<none>")
    );
    println!(
        "Expiry Time  = {}",
        t.expiration_time.as_deref().unwrap_or("<none>")
    );
    println!("Create Index = {}", t.create_index);
    println!("Modify Index = {}", t.modify_index);
}

async fn acl_command(c: &Client, cmd: AclCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AclCommand::Bootstrap { json } => {
            let t = c.acl_bootstrap().await.map_err(cluster_error)?;
            if json {
                print_json(&t)?;
            } else {
                print_token(&t);
            }
        }
        AclCommand::Policy(cmd) => policy_command(c, cmd).await?,
        AclCommand::Token(cmd) => token_command(c, cmd).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn policy_command(c: &Client, cmd: PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Apply {
            name,
            file,
            description,
        } => {
            let rules = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading the rules from stdin")?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading the rules file {}", file.display()))?
            };
            c.put_acl_policy(&AclPolicy {
                name: name.clone(),
                description,
                rules,
                ..AclPolicy::default()
            })
            .await
            .map_err(cluster_error)?;
            println!("Successfully wrote {name:?} ACL policy!");
        }
        PolicyCommand::List { json } => {
            let list = c.acl_policies().await.map_err(cluster_error)?.value;
            if json {
                return print_json(&list);
            }
            if list.is_empty() {
                println!("No policies found");
                return Ok(());
            }
            println!("{:<32} DESCRIPTION", "NAME");
            for p in &list {
                println!("{:<32} {}", p.name, p.description);
            }
        }
        PolicyCommand::Info { name, json } => {
            let p = c.acl_policy(&name).await.map_err(cluster_error)?.value;
            if json {
                return print_json(&p);
            }
            println!("Name        = {}", p.name);
            println!("Description = {}", p.description);
            println!("CreateIndex = {}", p.create_index);
            println!("ModifyIndex = {}", p.modify_index);
            println!("\nRules\n\n{}", p.rules);
        }
        PolicyCommand::Delete { name } => {
            c.delete_acl_policy(&name).await.map_err(cluster_error)?;
            println!("Successfully deleted {name:?} ACL policy!");
        }
    }
    Ok(())
}

async fn token_command(c: &Client, cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create {
            name,
            token_type,
            policies,
            ttl,
            json,
        } => {
            let t = c
                .create_acl_token(&AclToken {
                    name,
                    token_type,
                    policies,
                    expiration_ttl: ttl.unwrap_or_default(),
                    ..AclToken::default()
                })
                .await
                .map_err(cluster_error)?;
            if json {
                return print_json(&t);
            }
            print_token(&t);
        }
        TokenCommand::List { json } => {
            let list = c.acl_tokens().await.map_err(cluster_error)?.value;
            if json {
                return print_json(&list);
            }
            println!(
                "{:<24} {:<11} {:<37} POLICIES",
                "NAME", "TYPE", "ACCESSOR ID"
            );
            for t in &list {
                println!(
                    "{:<24} {:<11} {:<37} {}",
                    t.name,
                    t.token_type,
                    t.accessor_id,
                    t.policies.join(",")
                );
            }
        }
        TokenCommand::Info { accessor, json } => {
            let t = c.acl_token(&accessor).await.map_err(cluster_error)?.value;
            if json {
                return print_json(&t);
            }
            print_token(&t);
        }
        TokenCommand::Self_ { json } => {
            let t = c.acl_token_self().await.map_err(cluster_error)?.value;
            if json {
                return print_json(&t);
            }
            print_token(&t);
        }
        TokenCommand::Delete { accessor } => {
            c.delete_acl_token(&accessor).await.map_err(cluster_error)?;
            println!("Token {accessor} successfully deleted");
        }
    }
    Ok(())
}
