//! `tollgate top`: the keys a rule denied most often, from a running server.

use std::process::ExitCode;

use clap::Args;

use crate::admin_client::{AdminArgs, AdminClient, expect_ok};
use crate::stdout::outln;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The rule's domain.
    #[arg(long)]
    domain: String,
    /// The rule's name (as in `tollgate validate`).
    #[arg(long)]
    rule: String,
    /// How many keys.
    #[arg(short = 'n', long, default_value_t = 10, value_parser = crate::arg_values::positive::<usize>)]
    count: usize,
    #[command(flatten)]
    admin: AdminArgs,
}

pub fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    let client = AdminClient::new(&args.admin)?;
    let query = format!(
        "/v1/admin/top?domain={}&rule={}&n={}",
        encode(&args.domain),
        encode(&args.rule),
        args.count
    );
    let body = expect_ok(client.send("GET", &query, None)?)?;
    let keys = body["keys"].as_array().cloned().unwrap_or_default();
    if keys.is_empty() {
        outln!(
            "rule `{}` has denied nothing since it was loaded",
            args.rule
        );
    }
    for k in keys {
        outln!(
            "{:>10}  {}{}",
            k["count"].as_u64().unwrap_or(0),
            k["key"].as_str().unwrap_or("?"),
            match k["error"].as_u64() {
                Some(e) if e > 0 => format!("  (±{e})"),
                _ => String::new(),
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
