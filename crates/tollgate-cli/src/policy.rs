//! `tollgate policy ...`: versions of a running server's policy and its shadow candidate,
//! through its admin API.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tollgate::policy::Policy;

use crate::admin_client::{AdminClient, expect_ok};
use crate::stdout::{out, outln};

#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
    #[command(flatten)]
    admin: crate::admin_client::AdminArgs,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate a policy file or directory locally, then make it the server's running policy
    /// (or, with `--shadow`, run it beside the running one without enforcing it).
    Push {
        /// Policy file, or a directory of `*.yaml` / `*.yml` files.
        path: PathBuf,
        /// Shadow it: decide every request with it too, enforce nothing, and report per rule
        /// what it would have denied (`policy candidate`) until `promote` or `candidate --drop`.
        #[arg(long)]
        shadow: bool,
    },
    /// Show what the shadow candidate would have denied: per rule, and for which top keys.
    Candidate {
        /// Stop shadowing instead.
        #[arg(long)]
        drop: bool,
    },
    /// Make the shadow candidate the running policy.
    Promote,
    /// List the kept versions; `*` marks the running one.
    List,
    /// Print one version's source texts.
    #[command(allow_negative_numbers = true)]
    Show {
        /// Version sequence number (see `list`).
        version: u64,
    },
    /// Line diff between two versions (the second defaults to the running one).
    #[command(allow_negative_numbers = true)]
    Diff {
        /// Older version.
        from: u64,
        /// Newer version; defaults to the running one.
        to: Option<u64>,
    },
    /// Return to an earlier version (the previous one by default).
    #[command(allow_negative_numbers = true)]
    Rollback {
        /// The version to return to.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Make the server re-read its config path now.
    Reload,
}

pub fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    let client = AdminClient::new(&args.admin)?;
    match args.command {
        PolicyCommand::Push { path, shadow } => {
            let sources = Policy::read_sources(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
            if let Err(errors) = Policy::from_sources(&sources) {
                crate::stdout::errln!("{errors}");
                bail!(
                    "{}: {} problem(s); nothing pushed",
                    path.display(),
                    errors.0.len()
                );
            }
            let body = json!({
                "sources": sources.iter().map(|(n, t)| json!({"name": n, "text": t})).collect::<Vec<_>>()
            });
            if shadow {
                let answer = client.send("POST", "/v1/admin/policy/candidate", Some(body))?;
                let report = expect_ok(answer)
                    .context("the shadow candidate and the running policy are unchanged")?;
                outln!(
                    "shadowing: candidate {} ({} limited rules); `tollgate policy candidate` reports, `tollgate policy promote` enforces",
                    report["hash"].as_str().unwrap_or("?"),
                    report["rules"].as_array().map_or(0, Vec::len),
                );
                return Ok(ExitCode::SUCCESS);
            }
            activation(client.send("POST", "/v1/admin/policy", Some(body))?)
        }
        PolicyCommand::Candidate { drop: true } => {
            let body = expect_ok(client.send("DELETE", "/v1/admin/policy/candidate", None)?)?;
            outln!(
                "dropped: candidate {}",
                body["hash"].as_str().unwrap_or("?")
            );
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Candidate { drop: false } => {
            let report = expect_ok(client.send("GET", "/v1/admin/policy/candidate", None)?)?;
            out!("{}", render_report(&report));
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Promote => {
            activation(client.send("POST", "/v1/admin/policy/promote", None)?)
        }
        PolicyCommand::List => {
            let list = expect_ok(client.send("GET", "/v1/admin/policy", None)?)?;
            for v in list["versions"].as_array().cloned().unwrap_or_default() {
                outln!(
                    "{} {:>4}  {}  {:<8}  {} rules  {}",
                    if v["current"] == true { "*" } else { " " },
                    v["seq"].as_u64().unwrap_or(0),
                    v["hash"].as_str().unwrap_or("?"),
                    v["origin"].as_str().unwrap_or("?"),
                    v["rules"].as_u64().unwrap_or(0),
                    files(&v["files"]),
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Show { version } => {
            let v = expect_ok(client.send("GET", &format!("/v1/admin/policy/{version}"), None)?)?;
            for source in v["sources"].as_array().cloned().unwrap_or_default() {
                outln!("# {}", source["name"].as_str().unwrap_or("?"));
                out!("{}", source["text"].as_str().unwrap_or(""));
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Diff { from, to } => {
            let path = match to {
                Some(to) => format!("/v1/admin/policy/diff?from={from}&to={to}"),
                None => format!("/v1/admin/policy/diff?from={from}"),
            };
            let (status, body) = client.send_text("GET", &path)?;
            if status != 200 {
                // An error is JSON (`{"error": ...}`); shown as the other commands show it.
                let error = serde_json::from_str::<serde_json::Value>(&body).map_or_else(
                    |_| body.clone(),
                    |v| v["error"].as_str().unwrap_or(&body).to_owned(),
                );
                bail!("server answered {status}: {error}");
            }
            out!("{body}");
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Rollback { to } => {
            let body = to.map_or_else(|| json!({}), |to| json!({ "to": to }));
            activation(client.send("POST", "/v1/admin/policy/rollback", Some(body))?)
        }
        PolicyCommand::Reload => activation(client.send("POST", "/v1/admin/reload", None)?),
    }
}

/// The candidate report as a table: one line per rule.
fn render_report(report: &Value) -> String {
    let rules = report["rules"].as_array().cloned().unwrap_or_default();
    let text = |v: &Value, field: &str| v[field].as_str().unwrap_or("?").to_owned();
    let width = |field: &str, title: &str| {
        rules
            .iter()
            .map(|r| text(r, field).len())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (dw, nw) = (width("domain", "DOMAIN"), width("name", "RULE"));
    let shadowing_for = Duration::from_millis(report["shadowing_for_ms"].as_u64().unwrap_or(0));
    let mut out = format!(
        "candidate {} shadowing for {} ({})\n",
        text(report, "hash"),
        humantime::format_duration(Duration::from_secs(shadowing_for.as_secs())),
        files(&report["files"]),
    );
    let _ = writeln!(
        out,
        "{:<dw$}  {:<nw$}  {:<7}  {:>10}  {:>10}  TOP KEYS",
        "DOMAIN", "RULE", "MODE", "ALLOWED", "WOULD DENY"
    );
    for r in &rules {
        let top: Vec<String> = r["top_keys"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|k| match k["error"].as_u64() {
                Some(e) if e > 0 => format!("{} ({}±{e})", text(k, "key"), k["count"]),
                _ => format!("{} ({})", text(k, "key"), k["count"]),
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<dw$}  {:<nw$}  {:<7}  {:>10}  {:>10}  {}",
            text(r, "domain"),
            text(r, "name"),
            text(r, "mode"),
            r["allowed"].as_u64().unwrap_or(0),
            r["would_deny"].as_u64().unwrap_or(0),
            if top.is_empty() {
                "-".to_owned()
            } else {
                top.join(", ")
            },
        );
    }
    out
}

fn activation(answer: (u16, Value)) -> anyhow::Result<ExitCode> {
    let body = expect_ok(answer).context("the running policy is unchanged")?;
    let v = &body["version"];
    outln!(
        "{}: version {} ({} rules)",
        body["result"].as_str().unwrap_or("?"),
        v["version"].as_str().unwrap_or("?"),
        v["rules"]
    );
    Ok(ExitCode::SUCCESS)
}

/// A JSON array of file names, as one comma-separated line.
fn files(names: &Value) -> String {
    names
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}
