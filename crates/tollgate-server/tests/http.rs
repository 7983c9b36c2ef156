//! The HTTP API's handlers answered in process, without a listener (axum's
//! `Router::oneshot`): the statuses, bodies and headers the e2e tests also see through the
//! binary, here at the cost of a function call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tollgate::clock::SystemClock;
use tollgate::lifecycle::Lifecycle;
use tollgate::limiter::Limiter;
use tollgate::policy::Policy;
use tollgate::store::{MemoryStore, StoreBackend};
use tower::ServiceExt;

const POLICY: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 3}
";

#[path = "http/admin_writes.rs"]
mod admin_writes;

/// A limiter over a memory store and `POLICY`, version 1.
fn lifecycle() -> Arc<Lifecycle> {
    let policy = Policy::from_yaml("policy.yaml", POLICY).unwrap();
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::Memory(MemoryStore::new(clock));
    let limiter = Arc::new(Limiter::new(policy, store));
    let sources = vec![("policy.yaml".to_owned(), POLICY.to_owned())];
    Arc::new(Lifecycle::new(limiter, None, sources))
}

/// The decision routes over [`lifecycle`].
fn app() -> Router {
    tollgate_server::http::router(lifecycle())
}

fn check_body(user: &str) -> Vec<u8> {
    json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": user}]}]})
        .to_string()
        .into_bytes()
}

async fn post(app: &Router, path: &str, body: Vec<u8>) -> Response<Body> {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

fn header<'a>(r: &'a Response<Body>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn json_body(r: Response<Body>) -> Value {
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn a_check_is_allowed_with_its_headers() {
    let app = app();
    let r = post(&app, "/v1/check", check_body("alice")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"per_user\";q=3;w=86400")
    );
    assert_eq!(header(&r, "retry-after"), None);
    let body = json_body(r).await;
    assert_eq!(body["allowed"], true);
    assert_eq!(body["overall_code"], "OK");
    assert_eq!(body["statuses"][0]["limit_name"], "per_user");
}

#[tokio::test]
async fn past_the_limit_a_check_is_a_429_with_retry_after() {
    let app = app();
    for _ in 0..3 {
        let r = post(&app, "/v1/check", check_body("bob")).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = post(&app, "/v1/check", check_body("bob")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    let reset: u64 = header(&r, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "retry-after {retry}");
    assert_eq!(retry, reset, "a fixed window clears when it resets");
    assert_eq!(
        header(&r, "ratelimit"),
        Some(format!("\"per_user\";r=0;t={reset}").as_str())
    );
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    let body = json_body(r).await;
    assert_eq!(body["allowed"], false);
    assert_eq!(body["overall_code"], "OVER_LIMIT");
    // Another user has a counter of their own.
    let r = post(&app, "/v1/check", check_body("carol")).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn bad_input_is_a_400_whose_body_is_only_the_error() {
    let app = app();
    let body = br#"{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}"#;
    let r = post(&app, "/v1/check", body.to_vec()).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    let body = json_body(r).await;
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("domain must not be empty"), "{error}");
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    // Nothing was counted: the user still has all three.
    let r = post(&app, "/v1/check", check_body("a")).await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
}

#[tokio::test]
async fn unknown_paths_methods_and_encodings_are_json_errors() {
    let app = app();
    let r = post(&app, "/v1/nothing", Vec::new()).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_body(r).await, json!({"error": "no such endpoint"}));

    let get = Request::get("/v1/check").body(Body::empty()).unwrap();
    let r = app.clone().oneshot(get).await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        json_body(r).await,
        json!({"error": "this endpoint does not take that method"})
    );

    let gzipped = Request::post("/v1/check")
        .header("content-encoding", "gzip")
        .body(Body::from(check_body("a")))
        .unwrap();
    let r = app.clone().oneshot(gzipped).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let error = json_body(r).await["error"].as_str().unwrap().to_owned();
    assert!(error.contains("Content-Encoding `gzip`"), "{error}");
}

/// A lone surrogate escape is a `400` naming it and where it is, not serde_json's "unexpected
/// end of hex escape"; nothing is counted.
#[tokio::test]
async fn a_lone_surrogate_is_a_400_that_names_it() {
    let app = app();
    let body =
        br#"{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "\ud800"}]}]}"#;
    let r = post(&app, "/v1/check", body.to_vec()).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = json_body(r).await["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains(r"lone UTF-16 surrogate \ud800 at line 1 column 74"),
        "{error}"
    );
    assert!(!error.contains("hex escape"), "{error}");
    // Nothing was counted: a first check has two left after it.
    let r = post(&app, "/v1/check", check_body("x")).await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("2"));
}
