//! `tollgate check`: ask a running server through `POST /v1/check`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Domain of the request.
    #[arg(long)]
    domain: String,
    /// A descriptor as `key=value[,key=value...]`; repeat for several descriptors.
    #[arg(long = "descriptor", required = true, value_name = "KEY=VALUE[,...]")]
    descriptors: Vec<String>,
    /// Cost of the request (hits_addend); 0 checks every descriptor without counting.
    #[arg(long, default_value_t = 1)]
    hits: u64,
    /// Base URL of the server's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    addr: String,
    /// Print the server's JSON answer instead of the readable summary.
    #[arg(long)]
    json: bool,
}

/// The `(key, value)` entries of a `--descriptor key=value[,key=value...]` argument (also
/// `tollgate bench`'s, whose values are templates).
pub(crate) fn descriptor_entries(text: &str) -> anyhow::Result<Vec<(&str, &str)>> {
    text.split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .with_context(|| format!("descriptor entry `{pair}` is not key=value"))?;
            if key.is_empty() {
                bail!("descriptor entry `{pair}` has an empty key");
            }
            Ok((key, value))
        })
        .collect()
}

fn parse_descriptor(text: &str, hits: u64) -> anyhow::Result<Value> {
    let entries: Vec<Value> = descriptor_entries(text)?
        .into_iter()
        .map(|(key, value)| json!({ "key": key, "value": value }))
        .collect();
    Ok(json!({ "entries": entries, "hits_addend": hits }))
}

/// Exit status: 0 allowed, 1 denied, 2 error, 3 the server could not decide (a `503`: the
/// store is unavailable and a limit's posture is `closed`).
pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let descriptors = args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d, args.hits))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let body = json!({ "domain": args.domain, "descriptors": descriptors });
    let url = format!("{}/v1/check", args.addr.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, answer) = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let response = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("could not reach {url}"))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .context("the server's answer is not JSON")?;
        anyhow::Ok((status, answer))
    })?;
    if let Some(error) = answer.get("error").and_then(Value::as_str) {
        bail!("server answered {status}: {error}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", render(&args.descriptors, status.as_u16(), &answer));
    }
    let allowed = answer
        .get("allowed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(if allowed {
        ExitCode::SUCCESS
    } else if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        ExitCode::from(3)
    } else {
        ExitCode::FAILURE
    })
}

fn ms(v: &Value, field: &str) -> Option<String> {
    v.get(field)
        .and_then(Value::as_u64)
        .map(|ms| format!("{:?}", Duration::from_millis(ms)))
}

fn render(descriptors: &[String], status: u16, answer: &Value) -> String {
    let verdict = answer
        .get("overall_code")
        .and_then(Value::as_str)
        .unwrap_or("UNKNOWN");
    let mut out = format!("{verdict} (HTTP {status})");
    if let Some(retry) = ms(answer, "retry_after_ms") {
        out.push_str(&format!(", retry after {retry}"));
    }
    if let Some(posture) = answer.get("degraded").and_then(Value::as_str) {
        out.push_str(&format!(
            ", the store could not decide: answered by the `{posture}` posture"
        ));
    }
    out.push('\n');
    let statuses = answer
        .get("statuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (descriptor, s) in descriptors.iter().zip(statuses) {
        let code = s.get("code").and_then(Value::as_str).unwrap_or("?");
        out.push_str(&format!("  {descriptor}: {code}"));
        match s.get("limit_name").and_then(Value::as_str) {
            None => out.push_str(", no limit applies"),
            Some(name) => {
                let num = |f: &str| s.get(f).and_then(Value::as_u64).unwrap_or(0);
                out.push_str(&format!(
                    ", limit `{name}` {} {} per {}, {} remaining",
                    s.get("algorithm").and_then(Value::as_str).unwrap_or("?"),
                    num("limit"),
                    ms(&s, "period_ms").unwrap_or_default(),
                    num("remaining"),
                ));
                if let Some(reset) = ms(&s, "reset_after_ms") {
                    out.push_str(&format!(", full again in {reset}"));
                }
                if let Some(delay) = ms(&s, "delay_ms").filter(|d| d != "0ns") {
                    out.push_str(&format!(", hold for {delay}"));
                }
                if let Some(reason) = s.get("reason").and_then(Value::as_str) {
                    out.push_str(&format!(" ({reason})"));
                }
                if s.get("shadow_would_deny").and_then(Value::as_bool) == Some(true) {
                    out.push_str(" (shadow: would deny)");
                }
            }
        }
        out.push('\n');
    }
    out
}
