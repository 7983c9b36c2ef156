//! Every write of the admin listener (the admin API's and the dashboard's) needs
//! `Content-Type: application/json`, a loopback `Host` when no token is configured, and an
//! `Origin`, when sent, that agrees with the `Host`: a cross-site form or `text/plain` post, or
//! a page on a rebound name, is refused and changes nothing. Reads are not affected.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tollgate::lifecycle::Lifecycle;
use tollgate::observe::history::History;
use tollgate_server::admin::{self, dashboard};
use tower::ServiceExt;

use super::{POLICY, lifecycle};

const LOOPBACK: &str = "127.0.0.1:9090";

/// The admin listener's routes, as `serve` builds them, with `token` if any.
fn listener(token: Option<&str>) -> (Router, Arc<Lifecycle>) {
    let lifecycle = lifecycle();
    let token = token.map(str::to_owned);
    let router = dashboard::around(
        admin::router(lifecycle.clone(), token.clone()),
        lifecycle.clone(),
        Arc::new(History::new(8)),
        dashboard::Tokens::new(token, None),
    );
    (router, lifecycle)
}

/// One request: `method path` with `headers`, and `body`.
async fn send(
    app: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body.to_owned())).unwrap();
    let answer = app.clone().oneshot(request).await.unwrap();
    let status = answer.status();
    let bytes = http_body_util::BodyExt::collect(answer.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (status, body)
}

const JSON: (&str, &str) = ("content-type", "application/json");
const HOST: (&str, &str) = ("host", LOOPBACK);

fn push_body() -> String {
    let text = POLICY.replace("requests_per_unit: 3", "requests_per_unit: 4");
    json!({"sources": [{"name": "policy.yaml", "text": text}]}).to_string()
}

fn override_body() -> String {
    json!({"domain": "api", "rule": "per_user", "entries": [{"key": "user", "value": "a"}],
           "requests_per_unit": 10})
    .to_string()
}

async fn versions(app: &Router) -> (u64, usize) {
    let (status, list) = send(app, "GET", "/v1/admin/policy", &[HOST], "").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let count = list["versions"].as_array().unwrap().len();
    (list["current"].as_u64().unwrap(), count)
}

async fn overrides(app: &Router) -> Vec<Value> {
    let (status, list) = send(app, "GET", "/v1/admin/overrides", &[HOST], "").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["overrides"].as_array().unwrap().clone()
}

/// Every write route of the admin listener, with a body it would take.
fn writes() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("POST", "/v1/admin/policy", push_body()),
        ("POST", "/v1/admin/policy/rollback", String::new()),
        ("POST", "/v1/admin/policy/candidate", push_body()),
        ("DELETE", "/v1/admin/policy/candidate", String::new()),
        ("POST", "/v1/admin/policy/promote", String::new()),
        ("POST", "/v1/admin/reload", String::new()),
        ("PUT", "/v1/admin/overrides", override_body()),
        ("DELETE", "/v1/admin/overrides/1", String::new()),
        (
            "POST",
            "/v1/admin/dashboard/rollback",
            r#"{"to": 1}"#.to_owned(),
        ),
        ("POST", "/v1/admin/dashboard/promote", String::new()),
        ("POST", "/v1/admin/dashboard/drop", String::new()),
    ]
}

#[tokio::test]
async fn a_write_not_marked_as_json_is_a_415_on_every_write_route() {
    let (app, _) = listener(None);
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("multipart/form-data; boundary=x"),
    ] {
        for (method, path, body) in writes() {
            let mut headers = vec![HOST];
            if let Some(c) = content_type {
                headers.push(("content-type", c));
            }
            let (status, answer) = send(&app, method, path, &headers, &body).await;
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{method} {path} as {content_type:?}: {answer}"
            );
            let error = answer["error"].as_str().unwrap();
            assert!(error.contains("Content-Type: application/json"), "{error}");
        }
    }
    assert_eq!(versions(&app).await, (1, 1), "nothing was activated");
    assert!(overrides(&app).await.is_empty(), "nothing was set");
}

#[tokio::test]
async fn refused_pushes_change_nothing_and_a_well_formed_one_works() {
    let (app, _) = listener(None);
    let push = push_body();
    let refused = [
        (
            vec![HOST, ("content-type", "application/x-www-form-urlencoded")],
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            vec![HOST, ("content-type", "text/plain")],
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            vec![("host", "rebound.example:9090"), JSON],
            StatusCode::FORBIDDEN,
            "loopback Host",
        ),
        (
            vec![HOST, JSON, ("origin", "http://evil.example")],
            StatusCode::FORBIDDEN,
            "Origin",
        ),
        (
            vec![HOST, JSON, ("origin", "null")],
            StatusCode::FORBIDDEN,
            "Origin",
        ),
        (vec![JSON], StatusCode::FORBIDDEN, "without Host"),
    ];
    for (headers, expected, says) in refused {
        let (status, answer) = send(&app, "POST", "/v1/admin/policy", &headers, &push).await;
        assert_eq!(status, expected, "{headers:?}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(says), "{headers:?}: {error}");
        assert_eq!(versions(&app).await, (1, 1), "{headers:?} changed nothing");
    }
    // A rebound name's page also may not roll back, set or delete an override.
    let rebound = [("host", "rebound.example:9090"), JSON];
    let (status, _) = send(
        &app,
        "PUT",
        "/v1/admin/overrides",
        &rebound,
        &override_body(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(overrides(&app).await.is_empty());

    let own = ("origin", "http://127.0.0.1:9090");
    let (status, answer) = send(&app, "POST", "/v1/admin/policy", &[HOST, JSON, own], &push).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(versions(&app).await, (2, 2));
    let localhost = [("host", "localhost:9090"), JSON];
    let (status, answer) = send(&app, "POST", "/v1/admin/policy/rollback", &localhost, "").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(versions(&app).await, (3, 3));
}

#[tokio::test]
async fn a_refused_override_write_changes_nothing() {
    let (app, _) = listener(None);
    let form = [HOST, ("content-type", "application/x-www-form-urlencoded")];
    let (status, _) = send(&app, "PUT", "/v1/admin/overrides", &form, &override_body()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(overrides(&app).await.is_empty());

    let (status, set) = send(
        &app,
        "PUT",
        "/v1/admin/overrides",
        &[HOST, JSON],
        &override_body(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    let path = format!("/v1/admin/overrides/{}", set["id"]);
    for headers in [
        vec![HOST],
        vec![HOST, ("content-type", "text/plain")],
        vec![HOST, JSON, ("origin", "https://evil.example")],
    ] {
        let (status, answer) = send(&app, "DELETE", &path, &headers, "").await;
        assert!(
            [StatusCode::UNSUPPORTED_MEDIA_TYPE, StatusCode::FORBIDDEN].contains(&status),
            "{headers:?}: {status} {answer}"
        );
        assert_eq!(overrides(&app).await.len(), 1, "{headers:?} deleted it");
    }
    let (status, _) = send(&app, "DELETE", &path, &[HOST, JSON], "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(overrides(&app).await.is_empty());
}

/// With a token, any `Host` is answered (the token authenticates); the token is still asked
/// first, and the JSON and `Origin` rules still hold.
#[tokio::test]
async fn with_a_token_any_host_but_still_json_and_a_matching_origin() {
    let (app, _) = listener(Some("s3cret"));
    let auth = ("authorization", "Bearer s3cret");
    let host = ("host", "tollgate.internal:9090");
    let form = ("content-type", "application/x-www-form-urlencoded");
    let (status, _) = send(
        &app,
        "POST",
        "/v1/admin/policy",
        &[host, form],
        &push_body(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the token first");
    let (status, _) = send(
        &app,
        "POST",
        "/v1/admin/policy",
        &[auth, host, form],
        &push_body(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let evil = ("origin", "http://evil.example");
    let (status, _) = send(
        &app,
        "POST",
        "/v1/admin/policy",
        &[auth, host, JSON, evil],
        &push_body(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, list) = send(&app, "GET", "/v1/admin/policy", &[auth, host], "").await;
    assert_eq!(
        (status, list["current"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    let (status, answer) = send(
        &app,
        "POST",
        "/v1/admin/policy",
        &[auth, host, JSON],
        &push_body(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// Reads take no content type, and the admin API's reads any `Host`, as before.
#[tokio::test]
async fn reads_are_not_affected() {
    let (app, _) = listener(None);
    for path in [
        "/v1/admin/policy",
        "/v1/admin/overrides",
        "/v1/admin/policy/1",
    ] {
        for headers in [
            vec![HOST],
            vec![
                ("host", "rebound.example"),
                ("origin", "http://evil.example"),
            ],
        ] {
            let (status, answer) = send(&app, "GET", path, &headers, "").await;
            assert_eq!(status, StatusCode::OK, "{path} {headers:?}: {answer}");
        }
    }
    let (status, _) = send(&app, "GET", "/v1/admin/dashboard/snapshot", &[HOST], "").await;
    assert_eq!(status, StatusCode::OK);
}
