//! `tollgate check`: ask a running server through `POST /v1/check`.

use std::process::ExitCode;
use std::time::Duration;

use crate::stdout::{out, outln};
use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Domain of the request.
    #[arg(long)]
    domain: String,
    /// A descriptor as `key=value[,key=value...]`; repeat for several descriptors. Write a `,`,
    /// `=` or `\` inside a key or value as `\,`, `\=` or `\\`.
    #[arg(long = "descriptor", required = true, value_name = "KEY=VALUE[,...]")]
    descriptors: Vec<String>,
    /// Cost of the request (hits_addend); 0 checks every descriptor without counting.
    #[arg(long, default_value_t = 1)]
    hits: u64,
    /// Base URL of the server's HTTP API; `https://` is verified against the system's roots
    /// (or the PEM file `SSL_CERT_FILE` names).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    addr: String,
    /// Print the server's JSON answer instead of the readable summary.
    #[arg(long)]
    json: bool,
}

/// The `(key, value)` entries of a `--descriptor key=value[,key=value...]` argument (also
/// `tollgate bench`'s, whose values are templates). A `,`, `=` or `\` inside a key or value is
/// written `\,`, `\=` or `\\`, and any character may be written `\u{HEX}`, as `tollgate top`
/// prints control characters: a key `top` lists can be pasted back.
pub(crate) fn descriptor_entries(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut entries = Vec::new();
    let (mut key, mut field, mut in_value) = (String::new(), String::new(), false);
    let mut chars = text.chars();
    let mut finish = |key: &mut String, field: &mut String, in_value: &mut bool| {
        if !std::mem::take(in_value) {
            bail!("descriptor entry `{field}` is not key=value");
        }
        if key.is_empty() {
            bail!("descriptor entry `={field}` has an empty key");
        }
        entries.push((std::mem::take(key), std::mem::take(field)));
        Ok(())
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('\\' | ',' | '=')) => field.push(escaped),
                Some('u') => field.push(unicode_escape(&mut chars, text)?),
                _ => bail!("`\\` in `{text}` must come before `,`, `=`, `\\` or `u{{HEX}}`"),
            },
            '=' if !in_value => {
                key = std::mem::take(&mut field);
                in_value = true;
            }
            ',' => finish(&mut key, &mut field, &mut in_value)?,
            c => field.push(c),
        }
    }
    finish(&mut key, &mut field, &mut in_value)?;
    Ok(entries)
}

/// The character of a `\u{HEX}` escape, its `u` already read from `chars`.
fn unicode_escape(chars: &mut std::str::Chars<'_>, text: &str) -> anyhow::Result<char> {
    let rest = chars.as_str();
    let digits = rest
        .strip_prefix('{')
        .and_then(|r| r.split_once('}'))
        .map(|(digits, _)| digits)
        .filter(|d| (1..=6).contains(&d.len()));
    let Some(c) = digits
        .and_then(|d| u32::from_str_radix(d, 16).ok())
        .and_then(char::from_u32)
    else {
        bail!(
            "`\\u` in `{text}` must be followed by `{{HEX}}`, a character's code (1 to 6 hex digits)"
        );
    };
    let taken = digits.map_or(0, str::len) + 2;
    *chars = rest[taken..].chars();
    Ok(c)
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
        outln!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        out!("{}", render(&args.descriptors, status.as_u16(), &answer));
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
        // The `open` and `closed` postures decided nothing about the quota: no numbers to show.
        let quota_unknown = matches!(
            s.get("degraded").and_then(Value::as_str),
            Some("open" | "closed")
        );
        match s.get("limit_name").and_then(Value::as_str) {
            None => out.push_str(", no limit applies"),
            Some(name) if quota_unknown => {
                out.push_str(&format!(", limit `{name}`, quota unknown"));
            }
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
                if s.get("soft_exceeded").and_then(Value::as_bool) == Some(true) {
                    out.push_str(" (soft: over the limit, allowed)");
                }
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{descriptor_entries, render};

    fn entries(text: &str) -> Vec<(String, String)> {
        descriptor_entries(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn entries_split_on_unescaped_commas_and_the_first_equals() {
        assert_eq!(
            entries("user=alice,path=/a=b"),
            pairs(&[("user", "alice"), ("path", "/a=b")])
        );
        assert_eq!(entries("user="), pairs(&[("user", "")]));
        // As `tollgate top` prints them.
        assert_eq!(
            entries(r"user=a\,b,k\=ey=c\\d"),
            pairs(&[("user", "a,b"), ("k=ey", r"c\d")])
        );
        assert_eq!(
            entries(r"user=a\u{a}b\u{202e},k=\u{1F600}"),
            pairs(&[("user", "a\nb\u{202e}"), ("k", "\u{1F600}")])
        );
    }

    #[test]
    fn malformed_entries_say_what_is_wrong() {
        let error = |text: &str| descriptor_entries(text).unwrap_err().to_string();
        assert!(error("novalue").contains("`novalue` is not key=value"));
        assert!(error("user=a,").contains("is not key=value"));
        assert!(error("=alice").contains("empty key"));
        assert!(error(r"user=a\b").contains("must come before"));
        for bad in [
            r"user=\u",
            r"user=\u{}",
            r"user=\u{d800}",
            r"user=\u{1234567}",
            r"u=\u{zz}",
        ] {
            assert!(error(bad).contains("followed by `{HEX}`"), "{bad}");
        }
    }

    /// A rule in `shadow` or `soft` mode over its limit says so: the code alone (`OK`) hides it.
    #[test]
    fn over_limit_shadow_and_soft_rules_say_so() {
        let status = |flag: &str| {
            serde_json::json!({
                "code": "OK", "limit_name": "r", "algorithm": "fixed_window", "limit": 5,
                "period_ms": 60000, "remaining": 0, flag: true,
            })
        };
        let answer = serde_json::json!({
            "overall_code": "OK",
            "statuses": [status("shadow_would_deny"), status("soft_exceeded")],
        });
        let text = render(&["a=1".into(), "b=2".into()], 200, &answer);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("(shadow: would deny)"), "{text}");
        assert!(
            lines[2].ends_with("(soft: over the limit, allowed)"),
            "{text}"
        );
    }
}
