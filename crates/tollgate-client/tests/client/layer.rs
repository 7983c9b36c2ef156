//! The layer over an axum router, through `oneshot` (no socket).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::limiter::{CheckRequest, RequestDescriptor};
use tollgate::policy::Policy;
use tollgate::store::StoreUrl;
use tollgate_client::{
    Backend, BackendError, Cost, Descriptors, Embedded, Options, RateLimitLayer, Verdict,
};
use tower::ServiceExt;

const POLICY: &str = "
domain: api
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 3}
  - key: soft_key
    rate_limit: {name: soft, unit: hour, requests_per_unit: 1, mode: soft}
";

async fn embedded() -> Embedded {
    let policy = Policy::from_yaml("inline.yaml", POLICY).unwrap();
    Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap()
}

/// A router whose handler counts its calls.
fn app(limiter: Embedded, calls: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "hello"
                }
            }),
        )
        .layer(RateLimitLayer::new(
            limiter,
            Descriptors::new("api")
                .header("x-api-key", "api_key")
                .header("x-soft", "soft_key"),
        ))
}

fn get_with(header: &str, value: &str) -> Request<Body> {
    Request::get("/")
        .header(header, value)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn allows_up_to_the_limit_then_answers_429_without_calling_the_service() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(embedded().await, calls.clone());
    for expected_remaining in ["2", "1", "0"] {
        let response = app
            .clone()
            .oneshot(get_with("x-api-key", "k1"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let h = response.headers();
        assert_eq!(h["x-ratelimit-limit"], "3");
        assert_eq!(h["x-ratelimit-remaining"], expected_remaining);
        assert!(h.contains_key("x-ratelimit-reset"));
        assert_eq!(h["ratelimit-policy"], "\"per_key\";q=3;w=3600");
        assert!(
            h["ratelimit"]
                .to_str()
                .unwrap()
                .starts_with(&format!("\"per_key\";r={expected_remaining};t="))
        );
        assert!(!h.contains_key("retry-after"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    for _ in 0..2 {
        let response = app
            .clone()
            .oneshot(get_with("x-api-key", "k1"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = response.headers();
        assert_eq!(h["content-type"], "application/problem+json");
        let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=3600).contains(&retry), "retry-after {retry}");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            problem,
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": "rate limit `per_key` exceeded",
            })
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "denied requests never reach the service"
    );

    // Another key has its own quota.
    let other = app.oneshot(get_with("x-api-key", "k2")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn requests_without_descriptors_pass_unchecked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(embedded().await, calls.clone());
    for _ in 0..5 {
        let response = app
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("x-ratelimit-limit"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn soft_limited_requests_pass_with_the_soft_header() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(embedded().await, calls.clone());
    let first = app.clone().oneshot(get_with("x-soft", "s")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(!first.headers().contains_key("x-tollgate-soft-exceeded"));
    let second = app.oneshot(get_with("x-soft", "s")).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let delay: u64 = second.headers()["x-tollgate-soft-exceeded"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(delay > 0);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_closure_describes_requests() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = Router::new()
        .route(
            "/{tenant}",
            get(move || {
                let calls = counted.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                }
            }),
        )
        .layer(RateLimitLayer::new(
            embedded().await,
            |request: &Request<Body>| {
                let tenant = request.uri().path().trim_start_matches('/').to_owned();
                let d = RequestDescriptor::new(vec![("api_key".into(), tenant)], 2, None).ok()?;
                CheckRequest::new("api".into(), vec![d]).ok()
            },
        ));
    // Cost 2 against a limit of 3: the first fits, the second does not.
    let first = app
        .clone()
        .oneshot(Request::get("/acme").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
    let second = app
        .oneshot(Request::get("/acme").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn client_ip_and_path_become_descriptors() {
    let policy = Policy::from_yaml(
        "inline.yaml",
        "
domain: api
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 1}
  - key: path
    value: /admin
    rate_limit: {name: admin, unit: hour, requests_per_unit: 5}
",
    )
    .unwrap();
    let limiter = Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap();
    let app = Router::new()
        .route("/admin", get(|| async {}))
        .layer(RateLimitLayer::new(
            limiter,
            Descriptors::new("api")
                .client_ip("remote_address")
                .path("path"),
        ));
    let from = |ip: [u8; 4]| {
        let mut request = Request::get("/admin").body(Body::empty()).unwrap();
        let addr = std::net::SocketAddr::from((ip, 40000));
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        request
    };
    let first = app.clone().oneshot(from([10, 0, 0, 1])).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The per-IP limit binds (least remaining), and the path limit counted too.
    assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
    let again = app.clone().oneshot(from([10, 0, 0, 1])).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = again.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["detail"], "rate limit `per_ip` exceeded");
    let other = app.clone().oneshot(from([10, 0, 0, 2])).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(other.headers()["ratelimit-policy"], "\"per_ip\";q=1;w=3600");
    // The path is a descriptor too: two admitted so far, three more addresses reach its 5.
    for last in 3..=5 {
        let ok = app.clone().oneshot(from([10, 0, 0, last])).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK, "10.0.0.{last}");
    }
    let sixth = app.oneshot(from([10, 0, 0, 6])).await.unwrap();
    assert_eq!(sixth.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = sixth.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["detail"], "rate limit `admin` exceeded");
}

/// Post-paid costs (the tokens an LLM call used): with `charge_after_response`, a request is
/// checked without counting and charged the `Cost` its response reports; on a
/// `charge: up_to_limit` rule, a cost above what is left uses it up, and the next request is
/// refused without reaching the service.
#[tokio::test]
async fn costs_reported_by_the_response_are_charged_after_it() {
    let policy = Policy::from_yaml(
        "inline.yaml",
        "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {name: tokens, unit: hour, requests_per_unit: 10, charge: up_to_limit}\n",
    )
    .unwrap();
    let limiter = Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let served = calls.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |headers: http::HeaderMap| {
                served.fetch_add(1, Ordering::SeqCst);
                let used = headers
                    .get("x-used")
                    .map(|v| v.to_str().unwrap().parse().unwrap());
                async move {
                    let mut response = axum::response::Response::new(Body::from("answer"));
                    if let Some(used) = used {
                        response.extensions_mut().insert(Cost(used));
                    }
                    response
                }
            }),
        )
        .layer(
            RateLimitLayer::new(
                limiter,
                Descriptors::new("api").header("x-api-key", "api_key"),
            )
            .charge_after_response(),
        );
    let call = async |used: Option<&str>| {
        let mut request = Request::get("/").header("x-api-key", "k");
        if let Some(used) = used {
            request = request.header("x-used", used);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await;
        let response = response.unwrap();
        let remaining = response.headers().get("x-ratelimit-remaining").cloned();
        (
            response.status(),
            remaining.map(|v| v.to_str().unwrap().to_owned()),
        )
    };
    let ok = |left: &str| (StatusCode::OK, Some(left.to_owned()));
    assert_eq!(
        call(None).await,
        ok("10"),
        "no cost reported: nothing charged"
    );
    assert_eq!(
        call(Some("0")).await,
        ok("10"),
        "a cost of 0 charges nothing"
    );
    assert_eq!(
        call(Some("4")).await,
        ok("6"),
        "the quota left after the charge"
    );
    assert_eq!(call(Some("8")).await, ok("0"), "the 6 left are used up");
    let (status, _) = call(Some("1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "a refused request is not served"
    );
}

/// A backend that holds every charge (a request of a cost above 0) until `go` is notified,
/// after telling `charging` it has one.
struct HeldCharges {
    inner: Embedded,
    charging: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
}

impl Backend for HeldCharges {
    async fn check(&self, request: &CheckRequest) -> Result<Verdict, BackendError> {
        if request.descriptors().iter().any(|d| d.cost() > 0) {
            self.charging.notify_one();
            self.go.notified().await;
        }
        self.inner.check(request).await
    }
}

/// The cost a response reports is charged even when the caller goes away (a client reset, an
/// outer timeout) while the charge is on its way: the response was made, so it was served.
#[tokio::test]
async fn a_cost_is_charged_even_when_the_caller_leaves_during_the_charge() {
    let limiter = embedded().await;
    let charging = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let backend = HeldCharges {
        inner: limiter.clone(),
        charging: charging.clone(),
        go: go.clone(),
    };
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                let mut response = axum::response::Response::new(Body::from("answer"));
                response.extensions_mut().insert(Cost(2));
                response
            }),
        )
        .layer(
            RateLimitLayer::new(
                backend,
                Descriptors::new("api").header("x-api-key", "api_key"),
            )
            .charge_after_response(),
        );
    let caller = tokio::spawn(app.oneshot(get_with("x-api-key", "leaving")));
    charging.notified().await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    go.notify_one();

    let key = vec![("api_key".to_string(), "leaving".to_string())];
    let check = CheckRequest::new(
        "api".into(),
        vec![RequestDescriptor::new(key, 0, None).unwrap()],
    )
    .unwrap();
    let mut remaining = None;
    for _ in 0..200 {
        let verdict = limiter.check(&check).await.unwrap();
        remaining = verdict.header("x-ratelimit-remaining").map(str::to_owned);
        if remaining.as_deref() == Some("1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(remaining.as_deref(), Some("1"), "2 of the 3 charged");
}

/// A cost one descriptor can never hold (400 against 30 an hour, a rule without
/// `charge: up_to_limit`) still charges the `up_to_limit` token budget beside it, and is
/// counted as refused. The whole charge used to be refused, so the budget was charged nothing
/// and never ran out (every answer 200).
#[tokio::test]
async fn a_cost_one_descriptor_refuses_still_charges_the_others() {
    let policy = Policy::from_yaml(
        "inline.yaml",
        "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {name: tokens, unit: hour, requests_per_unit: 1000, charge: up_to_limit}\n  - key: user\n    rate_limit: {name: per_user, unit: hour, requests_per_unit: 30}\n",
    )
    .unwrap();
    let limiter = Embedded::with_policy(policy, &StoreUrl::Memory, Options::default())
        .await
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                let mut response = axum::response::Response::new(Body::from("answer"));
                response.extensions_mut().insert(Cost(400));
                response
            }),
        )
        .layer(
            RateLimitLayer::new(
                limiter,
                Descriptors::new("api")
                    .header("x-api-key", "api_key")
                    .header("x-user", "user"),
            )
            .charge_after_response(),
        );
    let call = async || {
        let request = Request::get("/")
            .header("x-api-key", "k")
            .header("x-user", "u")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request).await.unwrap().status()
    };
    let refused_before = tollgate_client::refused_charges();
    // 400, 800, then the last 200 of the 1,000 tokens: the budget is used up.
    for _ in 0..3 {
        assert_eq!(call().await, StatusCode::OK);
    }
    assert_eq!(
        call().await,
        StatusCode::TOO_MANY_REQUESTS,
        "the token budget was charged"
    );
    assert!(
        tollgate_client::refused_charges() >= refused_before + 3,
        "each charge per_user could not hold is counted"
    );
}
