//! `/v1/authorize`: forward auth for nginx `auth_request` (any method; nginx passes the original
//! request only through headers).
//!
//! Each request becomes ONE [`CheckRequest`] in the configured domain, with one descriptor per
//! `--authorize-descriptor` whose sources are all present in the forwarded headers. Answers:
//!
//! | outcome | status | `X-Tollgate-Reason` |
//! |---|---|---|
//! | allowed (or no descriptor applies) | `200` + rate-limit headers | — |
//! | denied by a limit | `403` + rate-limit headers + `Retry-After` | `over_limit` |
//! | denied because the store is unavailable (`closed` posture) | `403` + `Retry-After` | `unavailable` |
//! | the request cannot be checked | `403` | `invalid` |
//! | endpoint not configured (no `--authorize-domain`) | `404` | — |
//!
//! nginx treats only 2xx, 401 and 403 from an auth subrequest as answers (anything else becomes
//! a 500), so every denial is a 403 and the reason header tells nginx which status to return.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tollgate::limiter::{
    CheckRequest, CheckResponse, InvalidRequest, Limiter, MAX_FIELD_LEN, RequestDescriptor,
    normalized_path,
};

use super::respond::add_rate_limit_headers;
use crate::headers::header_text;

/// Response header saying why a request was denied: `over_limit`, `unavailable` or `invalid`.
pub const REASON: &str = "x-tollgate-reason";

/// Where one descriptor entry's value comes from in the forwarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A request header, e.g. `header:x-api-key`.
    Header(HeaderName),
    /// The first address of `X-Forwarded-For`, else `X-Real-IP`.
    ClientIp,
    /// `X-Original-Method`.
    Method,
    /// The path of `X-Original-URI` (without the query string).
    Path,
}

impl Source {
    /// The value for this source in `headers`, if present and not empty (see
    /// [`header_text`]).
    fn value(&self, headers: &HeaderMap) -> Option<String> {
        let get = |name: &str| header_text(headers, name);
        let value = match self {
            Source::Header(name) => header_text(headers, name),
            // The first address in the list: an empty item before it (`, 1.2.3.4`) would
            // otherwise leave the request without a client address, and unlimited.
            Source::ClientIp => get("x-forwarded-for")
                .and_then(|list| {
                    list.split(',')
                        .map(str::trim)
                        .find(|ip| !ip.is_empty())
                        .map(str::to_owned)
                })
                .or_else(|| get("x-real-ip").map(|ip| ip.trim().to_owned())),
            Source::Method => get("x-original-method"),
            Source::Path => get("x-original-uri").map(|uri| normalized_path(&uri)),
        };
        value.filter(|v| !v.is_empty())
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Header(name) => write!(f, "header:{name}"),
            Source::ClientIp => f.write_str("client_ip"),
            Source::Method => f.write_str("method"),
            Source::Path => f.write_str("path"),
        }
    }
}

/// A problem in an `--authorize-descriptor` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{item}`: {problem}")]
pub struct MappingError {
    item: String,
    problem: String,
}

/// One descriptor: ordered `(descriptor_key, source)` entries, parsed from
/// `key=SOURCE[,key=SOURCE...]` where SOURCE is `header:NAME`, `client_ip`, `method` or `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorMapping {
    entries: Vec<(String, Source)>,
}

impl FromStr for DescriptorMapping {
    type Err = MappingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |item: &str, problem: &str| MappingError {
            item: item.to_owned(),
            problem: problem.to_owned(),
        };
        let entries = s
            .split(',')
            .map(|item| {
                let item = item.trim();
                let (key, source) = item
                    .split_once('=')
                    .ok_or_else(|| fail(item, "expected descriptor_key=SOURCE"))?;
                let key = key.trim();
                if key.is_empty() {
                    return Err(fail(item, "the descriptor key is empty"));
                }
                // Every request carrying the source would be refused as invalid.
                if key.len() > MAX_FIELD_LEN {
                    return Err(fail(
                        item,
                        &format!("the descriptor key is longer than {MAX_FIELD_LEN} bytes, more than a request may carry"),
                    ));
                }
                let source = match source.trim() {
                    "client_ip" => Source::ClientIp,
                    "method" => Source::Method,
                    "path" => Source::Path,
                    other => {
                        let name = other.strip_prefix("header:").ok_or_else(|| {
                            fail(
                                item,
                                "SOURCE must be header:NAME, client_ip, method or path",
                            )
                        })?;
                        Source::Header(
                            HeaderName::from_bytes(name.trim().as_bytes())
                                .map_err(|_| fail(item, "not a valid header name"))?,
                        )
                    }
                };
                Ok((key.to_owned(), source))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DescriptorMapping { entries })
    }
}

impl fmt::Display for DescriptorMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, source)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{key}={source}")?;
        }
        Ok(())
    }
}

/// How `/v1/authorize` turns forwarded headers into a check: the domain and the descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizeMapping {
    domain: String,
    descriptors: Vec<DescriptorMapping>,
}

impl AuthorizeMapping {
    /// A mapping checking `descriptors` in `domain`.
    pub fn new(domain: String, descriptors: Vec<DescriptorMapping>) -> Self {
        AuthorizeMapping {
            domain,
            descriptors,
        }
    }

    /// The request for `headers`, or `None` when no descriptor has all its sources (nothing to
    /// limit). A descriptor with a missing source is skipped, not sent with an empty value.
    pub fn request(&self, headers: &HeaderMap) -> Option<Result<CheckRequest, InvalidRequest>> {
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for mapping in &self.descriptors {
            let entries: Option<Vec<(String, String)>> = mapping
                .entries
                .iter()
                .map(|(key, source)| Some((key.clone(), source.value(headers)?)))
                .collect();
            let Some(entries) = entries else { continue };
            match RequestDescriptor::new(entries, 1, None) {
                Ok(d) => descriptors.push(d),
                Err(e) => return Some(Err(e)),
            }
        }
        if descriptors.is_empty() {
            return None;
        }
        Some(CheckRequest::new(self.domain.clone(), descriptors))
    }
}

/// The handler's state: the limiter and, when enabled, the mapping.
#[derive(Debug, Clone)]
pub struct AuthorizeState {
    pub limiter: Arc<Limiter>,
    pub mapping: Option<Arc<AuthorizeMapping>>,
}

pub async fn authorize(State(state): State<AuthorizeState>, headers: HeaderMap) -> Response {
    let Some(mapping) = state.mapping.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            "forward auth is disabled: start `tollgate serve` with --authorize-domain DOMAIN and \
             --authorize-descriptor KEY=SOURCE to enable /v1/authorize\n",
        )
            .into_response();
    };
    let request = match mapping.request(&headers) {
        None => return StatusCode::OK.into_response(),
        Some(Ok(r)) => r,
        // Only a mapping nothing could carry (a key over 1 KiB, too many descriptors) gets
        // here. A 400 would become a 500 in nginx; deny instead of letting the request through.
        Some(Err(why)) => return denied("invalid", why.to_string()),
    };
    match state.limiter.check(&request).await {
        Ok(decided) => encode(&decided),
        Err(e) => denied("invalid", e.to_string()),
    }
}

fn encode(decided: &CheckResponse) -> Response {
    let (status, reason) = if decided.allowed() {
        (StatusCode::OK, None)
    } else if decided.unavailable() {
        (StatusCode::FORBIDDEN, Some("unavailable"))
    } else {
        (StatusCode::FORBIDDEN, Some("over_limit"))
    };
    let mut response = status.into_response();
    add_rate_limit_headers(response.headers_mut(), decided);
    if let Some(reason) = reason {
        response
            .headers_mut()
            .insert(REASON, HeaderValue::from_static(reason));
    }
    response
}

fn denied(reason: &'static str, message: String) -> Response {
    let mut response = (StatusCode::FORBIDDEN, message).into_response();
    response
        .headers_mut()
        .insert(REASON, HeaderValue::from_static(reason));
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn mapping(descriptors: &[&str]) -> AuthorizeMapping {
        AuthorizeMapping::new(
            "api".into(),
            descriptors.iter().map(|d| d.parse().unwrap()).collect(),
        )
    }

    fn entries(request: &CheckRequest) -> Vec<Vec<(String, String)>> {
        request
            .descriptors()
            .iter()
            .map(|d| d.entries().to_vec())
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_prints_every_source() {
        let d: DescriptorMapping = "api_key=header:X-Api-Key, ip=client_ip,m=method,p=path"
            .parse()
            .unwrap();
        assert_eq!(
            d.to_string(),
            "api_key=header:x-api-key,ip=client_ip,m=method,p=path"
        );
    }

    #[test]
    fn rejects_malformed_items() {
        let long = format!("{}=client_ip", "k".repeat(MAX_FIELD_LEN + 1));
        let error = long.parse::<DescriptorMapping>().unwrap_err().to_string();
        assert!(error.contains("longer than 1024 bytes"), "{error}");
        for bad in [
            "api_key",
            "=client_ip",
            "k=cookie:x",
            "k=header:bad name",
            "",
        ] {
            assert!(bad.parse::<DescriptorMapping>().is_err(), "{bad}");
        }
    }

    #[test]
    fn builds_one_request_from_all_descriptors() {
        let m = mapping(&[
            "api_key=header:x-api-key",
            "remote_address=client_ip",
            "api_key=header:x-api-key,path=path,method=method",
        ]);
        let h = headers(&[
            ("x-api-key", "k1"),
            ("x-forwarded-for", " 203.0.113.7 , 10.0.0.1"),
            ("x-original-uri", "/items/3?page=2"),
            ("x-original-method", "DELETE"),
        ]);
        let request = m.request(&h).unwrap().unwrap();
        assert_eq!(request.domain(), "api");
        assert_eq!(
            entries(&request),
            vec![
                pairs(&[("api_key", "k1")]),
                pairs(&[("remote_address", "203.0.113.7")]),
                pairs(&[
                    ("api_key", "k1"),
                    ("path", "/items/3"),
                    ("method", "DELETE")
                ]),
            ]
        );
    }

    #[test]
    fn skips_descriptors_with_a_missing_source() {
        let m = mapping(&[
            "api_key=header:x-api-key",
            "api_key=header:x-api-key,path=path",
        ]);
        let request = m
            .request(&headers(&[("x-api-key", "k1")]))
            .unwrap()
            .unwrap();
        assert_eq!(entries(&request), vec![pairs(&[("api_key", "k1")])]);
    }

    #[test]
    fn nothing_to_limit_when_no_descriptor_applies() {
        let m = mapping(&["api_key=header:x-api-key"]);
        assert!(m.request(&headers(&[("x-other", "v")])).is_none());
        // An empty value counts as missing rather than as a shared empty key.
        assert!(m.request(&headers(&[("x-api-key", "")])).is_none());
    }

    #[test]
    fn a_value_nobody_can_read_is_still_limited() {
        let m = mapping(&["api_key=header:x-api-key"]);
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_bytes(b"k\x80").unwrap());
        let request = m.request(&h).unwrap().unwrap();
        assert_eq!(entries(&request), vec![pairs(&[("api_key", "k\u{fffd}")])]);
    }

    #[test]
    fn client_ip_falls_back_to_x_real_ip() {
        let m = mapping(&["ip=client_ip"]);
        let request = m
            .request(&headers(&[("x-real-ip", "198.51.100.2")]))
            .unwrap()
            .unwrap();
        assert_eq!(entries(&request), vec![pairs(&[("ip", "198.51.100.2")])]);
        // An empty first item does not hide the address after it.
        let request = m
            .request(&headers(&[("x-forwarded-for", " , 203.0.113.9, 10.0.0.1")]))
            .unwrap()
            .unwrap();
        assert_eq!(entries(&request), vec![pairs(&[("ip", "203.0.113.9")])]);
    }

    /// A long value (a JWT in `Authorization`, a long path) is checked as it is: neither an
    /// error, which nginx would turn into a 400 for every such client, nor a skip.
    #[test]
    fn an_oversized_value_is_checked() {
        let m = mapping(&["api_key=header:x-api-key"]);
        let long = "k".repeat(100_000);
        let request = m
            .request(&headers(&[("x-api-key", &long)]))
            .unwrap()
            .unwrap();
        assert_eq!(request.descriptors()[0].entries()[0].1, long);
    }

    fn router(mapping: Option<AuthorizeMapping>) -> axum::Router {
        let policy = tollgate::policy::Policy::from_yaml(
            "policy.yaml",
            "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {name: per_key, unit: minute, requests_per_unit: 1}\n",
        )
        .unwrap();
        let clock = Arc::new(tollgate::clock::SystemClock::new());
        let store = tollgate::store::StoreBackend::Memory(tollgate::store::MemoryStore::new(clock));
        axum::Router::new()
            .route("/v1/authorize", axum::routing::any(authorize))
            .with_state(AuthorizeState {
                limiter: Arc::new(Limiter::new(policy, store)),
                mapping: mapping.map(Arc::new),
            })
    }

    async fn call(router: &axum::Router, method: &str, key: &str) -> Response {
        use tower::ServiceExt;
        let request = axum::http::Request::builder()
            .method(method)
            .uri("/v1/authorize")
            .header("x-api-key", key)
            .body(axum::body::Body::empty())
            .unwrap();
        router.clone().oneshot(request).await.unwrap()
    }

    #[tokio::test]
    async fn answers_200_then_403_over_limit_with_headers() {
        let router = router(Some(mapping(&["api_key=header:x-api-key"])));
        let allowed = call(&router, "GET", "k1").await;
        assert_eq!(allowed.status(), StatusCode::OK);
        assert_eq!(allowed.headers()["x-ratelimit-remaining"], "0");
        assert!(allowed.headers().get(REASON).is_none());
        // nginx forwards the original method only in a header; the subrequest may be any method.
        let denied = call(&router, "POST", "k1").await;
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        assert_eq!(denied.headers()[REASON], "over_limit");
        assert_eq!(denied.headers()["x-ratelimit-limit"], "1");
        assert!(denied.headers().contains_key("retry-after"));
        assert_eq!(call(&router, "GET", "k2").await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn disabled_without_a_mapping() {
        let response = call(&router(None), "GET", "k1").await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
}
