//! The remote client over the service's HTTP API (`POST /v1/check`).

use std::time::Duration;

use tollgate::limiter::{CheckRequest, MAX_BODY};

use crate::backend::{Backend, BackendError, Outcome, Verdict};
use crate::remote::{
    FORWARDED, Posture, binding_name, fallback, refuse_limit_overrides, service_url,
};

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

    /// A service URL that [`service_url`] refuses is refused at construction too: accepted,
    /// every decision fell to the posture, looking like an outage.
    #[test]
    fn a_client_of_a_bad_service_url_is_refused() {
        for bad in [
            "127.0.0.1:8080",
            "http://[::1",
            "ftp://h:1",
            "not a url",
            "http://",
        ] {
            assert!(
                Remote::http(bad, Duration::from_secs(1), Posture::Open).is_err(),
                "{bad}"
            );
        }
    }
}
