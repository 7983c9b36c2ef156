//! Shadow policy candidates: `policy push --shadow`, the candidate report, `promote` and
//! `candidate --drop` — against the built binary over real sockets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use serde_json::{Value, json};
use support::Server;

const LIVE: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 5}
";

/// Stricter on users, and a rule the live policy does not have.
const CANDIDATE: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 2}
  - key: tenant
    rate_limit: {name: per_tenant, unit: day, requests_per_unit: 1}
";

async fn report(server: &Server) -> (u16, Value) {
    let r = reqwest::get(server.admin_url("/v1/admin/policy/candidate"))
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn rule<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_candidate_reports_what_it_would_deny_and_promote_makes_it_live() {
    let server = Server::start_with_args(LIVE, &["--watch-interval", "0s"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("candidate.yaml");
    std::fs::write(&path, CANDIDATE).unwrap();

    assert_eq!(report(&server).await.0, 404, "no candidate yet");
    let (code, out, err) = server.policy_cli(&["push", path.to_str().unwrap(), "--shadow"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("shadowing: candidate ") && out.contains("(2 limited rules)"),
        "{out}"
    );
    let (_, list, _) = server.policy_cli(&["list"]);
    assert_eq!(
        list.lines().count(),
        1,
        "a shadow push is no version: {list}"
    );

    // The live policy decides every request: 5 a day for each user, no tenant rule.
    for expected_remaining in [4, 3, 2, 1] {
        let r = server.check("user", "a").await;
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["statuses"][0]["remaining"], expected_remaining,
            "{body}"
        );
        assert_eq!(body["statuses"][0]["limit_name"], "per_user");
    }
    assert_eq!(server.check("user", "b").await.status(), 200);
    for _ in 0..2 {
        assert_eq!(server.check("tenant", "t").await.status(), 200);
    }
    // Explain charges nothing and is no traffic for the candidate either.
    let explained = reqwest::Client::new()
        .post(server.url("/v1/explain"))
        .json(&json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(explained.status(), 200);

    let (status, shadow) = report(&server).await;
    assert_eq!(status, 200, "{shadow}");
    assert!(
        out.contains(shadow["hash"].as_str().unwrap()),
        "{out} / {shadow}"
    );
    let per_user = rule(&shadow, "per_user");
    assert_eq!(per_user["allowed"], 3, "a twice, b once: {shadow}");
    assert_eq!(per_user["would_deny"], 2, "a's third and fourth: {shadow}");
    assert_eq!(per_user["mode"], "enforce");
    assert_eq!(
        per_user["top_keys"],
        json!([{"key": "user=a", "count": 2, "error": 0}])
    );
    let per_tenant = rule(&shadow, "per_tenant");
    assert_eq!(
        (&per_tenant["allowed"], &per_tenant["would_deny"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(per_tenant["top_keys"][0]["key"], "tenant=t");

    // The CLI prints one line per rule.
    let (code, table, err) = server.policy_cli(&["candidate"]);
    assert_eq!(code, 0, "{err}");
    let row = |name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        row("per_user"),
        ["api", "per_user", "enforce", "3", "2", "user=a", "(2)"],
        "{table}"
    );
    assert_eq!(
        row("per_tenant"),
        ["api", "per_tenant", "enforce", "1", "1", "tenant=t", "(1)"],
        "{table}"
    );

    let text = server.metrics().await;
    for expected in [
        r#"tollgate_candidate_decisions_total{domain="api",rule="per_user",outcome="allowed"} 3"#,
        r#"tollgate_candidate_decisions_total{domain="api",rule="per_user",outcome="denied"} 2"#,
        r#"tollgate_candidate_decisions_total{domain="api",rule="per_tenant",outcome="denied"} 1"#,
        r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="allowed"} 5"#,
        r#"tollgate_decisions_total{domain="api",rule="per_user",outcome="denied"} 0"#,
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }

    // An invalid candidate is refused, with its location, by the CLI and by the server; the
    // candidate shadowing keeps running with its counts.
    let broken = dir.path().join("broken.yaml");
    let broken_text =
        "domain: api\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: -1}}]\n";
    std::fs::write(&broken, broken_text).unwrap();
    let (code, _, err) = server.policy_cli(&["push", broken.to_str().unwrap(), "--shadow"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("broken.yaml:2:") && err.contains("nothing pushed"),
        "{err}"
    );
    let r = reqwest::Client::new()
        .post(server.admin_url("/v1/admin/policy/candidate"))
        .json(&json!({"sources": [{"name": "broken.yaml", "text": broken_text}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let refused: Value = r.json().await.unwrap();
    assert!(
        refused["problems"][0]
            .as_str()
            .unwrap()
            .starts_with("broken.yaml:2:"),
        "{refused}"
    );
    let (_, after) = report(&server).await;
    assert_eq!(after["hash"], shadow["hash"], "the old candidate stays");
    assert_eq!(rule(&after, "per_user")["would_deny"], 2);

    // Promote: the candidate's texts become version 2, on the live counters.
    let (code, out, err) = server.policy_cli(&["promote"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("activated: version 2-"), "{out}");
    assert_eq!(report(&server).await.0, 404, "promote clears the candidate");
    let (code, _, err) = server.policy_cli(&["candidate"]);
    assert_ne!(code, 0);
    assert!(err.contains("no candidate"), "{err}");
    let (code, _, err) = server.policy_cli(&["promote"]);
    assert_ne!(code, 0, "nothing left to promote");
    assert!(err.contains("no candidate"), "{err}");
    assert!(
        !server
            .metrics()
            .await
            .contains("tollgate_candidate_decisions_total")
    );

    // a used 4 of the live counter, so at 2 a day a is denied; b (1 used) gets one more.
    assert_eq!(server.check("user", "a").await.status(), 429);
    assert_eq!(server.check("user", "b").await.status(), 200);
    assert_eq!(server.check("user", "b").await.status(), 429);
    // The shadow's tenant counter was its own: the live per_tenant starts at zero.
    assert_eq!(server.check("tenant", "t").await.status(), 200);
    assert_eq!(server.check("tenant", "t").await.status(), 429);
    let (_, list, _) = server.policy_cli(&["list"]);
    let running = list.lines().find(|l| l.starts_with('*')).unwrap();
    assert!(
        running.starts_with("*    2") && running.contains("push") && running.contains("2 rules"),
        "{list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_stops_shadowing_and_the_token_guards_the_candidate_routes() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let token = token_file.to_str().unwrap();
    let server = Server::start_with_args(LIVE, &["--admin-token-file", token]);
    let path = dir.path().join("candidate.yaml");
    std::fs::write(&path, CANDIDATE).unwrap();

    let admin = reqwest::Client::new();
    let url = server.admin_url("/v1/admin/policy/candidate");
    let push = json!({"sources": [{"name": "c.yaml", "text": CANDIDATE}]});
    for r in [
        admin.post(&url).json(&push),
        admin.get(&url),
        admin.delete(&url),
        admin.post(server.admin_url("/v1/admin/policy/promote")),
    ] {
        assert_eq!(r.send().await.unwrap().status(), 401);
    }
    assert_eq!(
        admin
            .get(&url)
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        404,
        "the refused push set nothing"
    );

    let (code, out, err) = server.policy_cli(&[
        "push",
        path.to_str().unwrap(),
        "--shadow",
        "--token-file",
        token,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    server.check("user", "a").await;
    let (code, table, _) = server.policy_cli(&["candidate", "--token-file", token]);
    assert_eq!(code, 0);
    assert!(table.lines().any(|l| l.contains("per_user")), "{table}");

    let (code, out, err) = server.policy_cli(&["candidate", "--drop", "--token-file", token]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("dropped: candidate "), "{out}");
    assert_eq!(
        admin
            .get(&url)
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let (code, _, err) = server.policy_cli(&["candidate", "--drop", "--token-file", token]);
    assert_ne!(code, 0, "nothing left to drop");
    assert!(err.contains("no candidate"), "{err}");
    assert!(
        !server
            .metrics()
            .await
            .contains("tollgate_candidate_decisions_total")
    );

    // The running policy never changed: a keeps the live 5 a day (1 used).
    let body: Value = server.check("user", "a").await.json().await.unwrap();
    assert_eq!(body["statuses"][0]["remaining"], 3);
}
