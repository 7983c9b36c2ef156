//! The remote client: decisions from a tollgate service over its HTTP API (`POST /v1/check`).

use std::time::Duration;

use tollgate::limiter::{CheckRequest, MAX_BODY, headers};

use crate::backend::{Backend, BackendError, Outcome, Verdict};

/// What the caller answers when the service cannot be asked (unreachable, slower than the
/// timeout, answering a status other than `200`, `429`, `503` or `400`, or a body that is not
/// JSON). This is the caller's posture
/// about the *service*; the service's own `on_store_error` postures still apply to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Posture {
    /// Allow, marked `X-Tollgate-Degraded: open`.
    #[default]
    Open,
    /// Deny as unavailable (`503`, `Retry-After: 1`, `X-Tollgate-Degraded: closed`).
    Closed,
}

/// Headers copied from the service's answer onto the verdict.
pub(crate) const FORWARDED: [&str; 8] = [
    headers::DEGRADED,
    headers::SOFT_EXCEEDED,
    headers::LIMIT,
    headers::REMAINING,
    headers::RESET,
    headers::POLICY,
    headers::RATELIMIT,
    headers::RETRY_AFTER,
];

/// A client of a tollgate service's HTTP API. Cheap to clone; clones share one pool of
/// keep-alive connections (as many as there are decisions in flight).
#[derive(Debug, Clone)]
pub struct Remote {
    client: reqwest::Client,
    check_url: String,
    timeout: Duration,
    posture: Posture,
}

impl Remote {
    /// A client of the service at `base_url` (e.g. `http://127.0.0.1:8080`, or an `https://`
    /// proxy in front of it, verified against the system's roots or the PEM file
    /// `SSL_CERT_FILE` names). Each decision waits at most `timeout` (connecting included);
    /// past it, or when the service cannot be reached, `posture` answers.
    ///
    /// A URL that is not an absolute `http://` or `https://` one with a host is refused: it
    /// would leave every decision to `posture`, looking like an outage.
    pub fn http(base_url: &str, timeout: Duration, posture: Posture) -> Result<Self, BackendError> {
        let (base_url, _) = service_url(base_url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(timeout)
            // Under the service's `--http-read-timeout` (60s by default), which closes idle
            // connections: a pooled one is dropped here before the service closes it.
            .pool_idle_timeout(Duration::from_secs(50))
            .build()
            .map_err(|e| BackendError::Invalid(format!("cannot build the HTTP client: {e}")))?;
        Ok(Remote {
            client,
            check_url: format!("{}/v1/check", base_url.trim_end_matches('/')),
            timeout,
            posture,
        })
    }
}

/// `url` with its scheme in lower case, and whether that is `https`; refused unless `url` is
/// an absolute `http://` or `https://` URL with a host (`127.0.0.1:8080` without a scheme, a
/// typo) rather than a client whose every decision falls to its posture.
pub(crate) fn service_url(url: &str) -> Result<(String, bool), BackendError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| BackendError::Invalid(format!("`{url}` is not a service URL: {e}")))?;
    let https = match parsed.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(BackendError::Invalid(format!(
                "`{url}`: a service URL starts with http:// or https://, not {other}:"
            )));
        }
    };
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(BackendError::Invalid(format!("`{url}` names no host")));
    }
    // The scheme parsed, so `url` holds "://" after it.
    let rest = url.find("://").map_or("", |at| &url[at..]);
    Ok((format!("{}{rest}", parsed.scheme()), https))
}

/// The binding limit's name, as the service put it in `RateLimit-Policy` (`"name";q=..;w=..`,
/// an RFC 8941 string): the same limit the other forwarded headers describe, the denial that
/// lasts longest or the least remaining quota, which the statuses alone do not say.
pub(crate) fn binding_name(forwarded: &[(&'static str, String)]) -> Option<String> {
    let (_, policy) = forwarded
        .iter()
        .find(|(name, _)| *name == headers::POLICY)?;
    let mut chars = policy.strip_prefix('"')?.chars();
    let mut name = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(name),
            '\\' => name.push(chars.next()?),
            c => name.push(c),
        }
    }
}

/// The verdict a caller-side `posture` gives when the service cannot be asked.
pub(crate) fn fallback(posture: Posture) -> Verdict {
    match posture {
        Posture::Open => Verdict {
            outcome: Outcome::Allowed,
            headers: vec![(headers::DEGRADED, "open".to_owned())],
            limit_name: None,
        },
        Posture::Closed => Verdict {
            outcome: Outcome::Unavailable,
            headers: vec![
                (headers::DEGRADED, "closed".to_owned()),
                (headers::RETRY_AFTER, "1".to_owned()),
            ],
            limit_name: None,
        },
    }
}

/// Refuses a request a remote client cannot send: limit overrides stay in-process.
pub(crate) fn refuse_limit_overrides(request: &CheckRequest) -> Result<(), BackendError> {
    if request
        .descriptors()
        .iter()
        .any(|d| d.limit_override().is_some())
    {
        return Err(BackendError::Invalid(
            "limit overrides are not sent by the remote client".to_owned(),
        ));
    }
    Ok(())
}

/// The `/v1/check` body for `request`; `None` when it has nothing to ask. A descriptor without
/// entries matches no rule (as over gRPC), but `/v1/check` refuses one as a mistake: it is
/// left out.
fn wire_body(request: &CheckRequest) -> Result<Option<serde_json::Value>, BackendError> {
    refuse_limit_overrides(request)?;
    let descriptors = request
        .descriptors()
        .iter()
        .filter(|d| !d.entries().is_empty())
        .map(|d| {
            let entries: Vec<serde_json::Value> = d
                .entries()
                .iter()
                .map(|(key, value)| serde_json::json!({"key": key, "value": value}))
                .collect();
            serde_json::json!({"entries": entries, "hits_addend": d.cost()})
        })
        .collect::<Vec<_>>();
    Ok((!descriptors.is_empty())
        .then(|| serde_json::json!({"domain": request.domain(), "descriptors": descriptors})))
}

impl Backend for Remote {
    async fn check(&self, request: &CheckRequest) -> Result<Verdict, BackendError> {
        // Refused here rather than by the service, which would cut the upload short: a broken
        // connection looks like an outage, and the posture would answer a request the
        // service can never take.
        let Some(body) = wire_body(request)? else {
            return Ok(Verdict {
                outcome: Outcome::Allowed,
                headers: Vec::new(),
                limit_name: None,
            });
        };
        let body = serde_json::to_vec(&body).map_err(|e| BackendError::Invalid(e.to_string()))?;
        if body.len() > MAX_BODY {
            return Err(BackendError::Invalid(format!(
                "the request is {} bytes of JSON, larger than the service accepts ({MAX_BODY})",
                body.len()
            )));
        }
        // reqwest's per-request timeout runs from connecting until the body is read, so a
        // service that accepts and then stalls cannot hold the caller past it.
        let answer = async {
            let response = self
                .client
                .post(&self.check_url)
                .timeout(self.timeout)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await?;
            let status = response.status();
            let headers: Vec<(&'static str, String)> = FORWARDED
                .iter()
                .filter_map(|name| {
                    let value = response.headers().get(*name)?.to_str().ok()?;
                    Some((*name, value.to_owned()))
                })
                .collect();
            // Only a 400's `error` is read; the rest of the answer is in the status and headers.
            let body: ErrorBody = response.json().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        }
        .await;
        let Ok((status, headers, body)) = answer else {
            return Ok(fallback(self.posture));
        };
        let outcome = match status.as_u16() {
            200 => Outcome::Allowed,
            429 => Outcome::Limited,
            503 => Outcome::Unavailable,
            400 => {
                let why = body
                    .error
                    .unwrap_or_else(|| "rejected by the service".into());
                return Err(BackendError::Invalid(why));
            }

            _ => return Ok(fallback(self.posture)),
        };
        let limit_name = binding_name(&headers);
        Ok(Verdict {
            outcome,
            headers,
            limit_name,
        })
    }
}

/// The one field of the service's answer this client reads (a `400`'s reason); other fields
/// are skipped without being built.
#[derive(serde::Deserialize)]
struct ErrorBody {
    error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_name_is_read_from_rate_limit_policy() {
        let forwarded = |policy: &str| {
            vec![
                (headers::LIMIT, "10".to_owned()),
                (headers::POLICY, policy.to_owned()),
            ]
        };
        let name = |policy: &str| binding_name(&forwarded(policy));
        assert_eq!(
            name(r#""per_tenant_day";q=10;w=86400"#).as_deref(),
            Some("per_tenant_day")
        );
        assert_eq!(
            name(r#""a \"quoted\" \\ name";q=1;w=1"#).as_deref(),
            Some(r#"a "quoted" \ name"#)
        );
        assert_eq!(name("unquoted;q=1;w=1"), None);
        assert_eq!(name(r#""cut"#), None);
        assert_eq!(binding_name(&[(headers::LIMIT, "10".to_owned())]), None);
    }

    /// A descriptor without entries is left out of the body (`/v1/check` refuses one); with
    /// nothing left there is nothing to ask.
    #[test]
    fn descriptors_without_entries_are_not_sent() {
        use tollgate::limiter::RequestDescriptor;
        let descriptor = |entries: &[(&str, &str)]| {
            let entries = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            RequestDescriptor::new(entries, 1, None).unwrap_or_else(|e| panic!("{e}"))
        };
        let request = |descriptors| {
            CheckRequest::new("api".into(), descriptors).unwrap_or_else(|e| panic!("{e}"))
        };
        let body = wire_body(&request(vec![
            descriptor(&[]),
            descriptor(&[("user", "a")]),
        ]));
        let body = body.ok().flatten().unwrap_or_default();
        assert_eq!(
            body["descriptors"],
            serde_json::json!([{"entries": [{"key": "user", "value": "a"}], "hits_addend": 1}])
        );
        assert!(matches!(
            wire_body(&request(vec![descriptor(&[])])),
            Ok(None)
        ));
    }

    /// A service URL without an http(s) scheme or a host is refused at construction: accepted,
    /// every decision fell to the posture, looking like an outage. The scheme is read in any case.
    #[test]
    fn service_urls_are_checked_and_their_scheme_read_in_any_case() {
        for bad in [
            "127.0.0.1:8080",
            "http://[::1",
            "ftp://h:1",
            "not a url",
            "http://",
        ] {
            assert!(service_url(bad).is_err(), "{bad}");
            assert!(
                Remote::http(bad, Duration::from_secs(1), Posture::Open).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            service_url("HTTPS://h:1/x").unwrap(),
            ("https://h:1/x".to_owned(), true)
        );
        assert_eq!(
            service_url("http://h:1").unwrap(),
            ("http://h:1".to_owned(), false)
        );
    }
}
