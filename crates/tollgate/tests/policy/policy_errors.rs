//! Every bad policy is rejected with its file, line and column, and every problem of a file is
//! reported at once. Line and column numbers below can be checked against the YAML next to them
//! (the first YAML line is line 1; columns count characters from 1).

// Helpers outside `#[test]` functions are test code too; the workspace lints aim at library code.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use tollgate::policy::{Location, Policy};

/// The displayed errors of one file named `t.yaml`, one per line.
fn errors(yaml: &str) -> Vec<String> {
    match Policy::from_yaml("t.yaml", yaml) {
        Ok(policy) => panic!("expected errors, got {policy:?}"),
        Err(errors) => {
            let text = errors.to_string();
            assert_eq!(
                text.lines().count(),
                errors.0.len(),
                "one line per error:\n{text}"
            );
            text.lines().map(str::to_owned).collect()
        }
    }
}

/// The single error of `yaml`.
fn error(yaml: &str) -> String {
    let mut all = errors(yaml);
    assert_eq!(all.len(), 1, "{all:#?}");
    all.remove(0)
}

const BURST_WINDOW: &str = "only token_bucket, leaky_bucket and gcra have a bucket";

#[test]
fn yaml_syntax_errors_have_a_position() {
    assert_eq!(
        error("domain: 'unterminated\n"),
        "t.yaml:1:9: unclosed quote"
    );
    assert_eq!(
        error("domain: a\n  bad: indentation\n"),
        "t.yaml:2:6: mapping values are not allowed in this context"
    );
    assert_eq!(
        error("domain: a\n---\ndomain: b\n"),
        "t.yaml:3:1: only single YAML document expected but multiple found"
    );
}

#[test]
fn unknown_fields_are_errors_at_the_field() {
    assert_eq!(
        error("domian: a\n"),
        "t.yaml:1:1: unknown field `domian`, expected one of domain, descriptors"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
    shadowmode: true
"
        ),
        "t.yaml:5:5: unknown field `shadowmode`, expected one of key, value, rate_limit, descriptors, \
         shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, replaces"
    );
    // `shadow_mode` belongs to the descriptor, not to `rate_limit`.
    let misplaced = error(
        "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 1
      shadow_mode: true
",
    );
    assert!(
        misplaced.starts_with("t.yaml:7:7: unknown field `shadow_mode`, expected one of unit,"),
        "{misplaced}"
    );
}

#[test]
fn duplicate_mapping_keys_are_errors() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    key: j
"
        ),
        "t.yaml:4:5: duplicate mapping key `key` is not allowed here"
    );
}

#[test]
fn wrong_types_are_errors() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    shadow_mode: maybe
"
        ),
        "t.yaml:4:18: invalid boolean"
    );
    assert_eq!(
        error("domain: a\ndescriptors: {key: k}\n"),
        "t.yaml:2:14: expected sequence start"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: lots
"
        ),
        "t.yaml:6:7: invalid type: string \"lots\", expected a whole number"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 2.5
"
        ),
        "t.yaml:6:7: invalid type: floating point `2.5`, expected a whole number"
    );
}

#[test]
fn missing_or_empty_domain() {
    assert_eq!(error("descriptors: []\n"), "t.yaml:1:1: missing `domain`");
    assert_eq!(
        error("domain: \"\"\ndescriptors: []\n"),
        "t.yaml:1:9: empty `domain`"
    );
}

#[test]
fn missing_or_empty_descriptor_key() {
    assert_eq!(
        errors(
            "domain: a
descriptors:
  - value: v
  - key: ''
    value: w
"
        ),
        [
            "t.yaml:3:5: descriptor has no `key`",
            "t.yaml:4:10: empty descriptor `key`"
        ]
    );
}

/// A domain or key over 1 KiB could never be sent (every API refuses one): a dead rule is an
/// error, not a silent no-op. Exactly 1 KiB is fine.
#[test]
fn domains_and_keys_longer_than_a_request_may_send_are_errors() {
    let long = "k".repeat(1025);
    assert_eq!(
        error(&format!("domain: {long}\ndescriptors: []\n")),
        "t.yaml:1:9: `domain` is longer than 1024 bytes: no request could name it"
    );
    assert_eq!(
        error(&format!(
            "domain: a\ndescriptors:\n  - key: {long}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )),
        "t.yaml:3:10: descriptor `key` is longer than 1024 bytes: no request could send it"
    );
    let longest = "k".repeat(1024);
    assert!(
        Policy::from_yaml(
            "t.yaml",
            &format!("domain: {longest}\ndescriptors:\n  - key: {longest}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
        )
        .is_ok()
    );
}

#[test]
fn requests_per_unit_is_validated_by_params() {
    let yaml = |n: &str, algorithm: &str| {
        format!(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      algorithm: {algorithm}
      requests_per_unit: {n}
"
        )
    };
    // 0 blocks, as in envoyproxy/ratelimit.
    let blocked = Policy::from_yaml("t.yaml", &yaml("0", "fixed_window")).unwrap();
    assert!(blocked.rules()[0].blocked);
    assert_eq!(
        blocked.rules()[0].limit.map(|p| p.period()),
        Some(std::time::Duration::from_secs(1))
    );
    assert_eq!(
        error(&yaml("-5", "fixed_window")),
        "t.yaml:7:26: invalid `requests_per_unit`: limit must be at least 1, or 0 to block \
         every request"
    );
    assert_eq!(
        error(&yaml("10000000000000", "gcra")),
        "t.yaml:7:26: invalid `requests_per_unit`: limit 10000000000000 is above the maximum of 1000000000000"
    );
    assert_eq!(
        error(&yaml("200000", "sliding_window_log")),
        "t.yaml:7:26: invalid `requests_per_unit`: limit 200000 is above the maximum of 100000"
    );
    // Beyond 64 bits the parser only approximates the number, so the message does not repeat it.
    assert_eq!(
        error(&yaml("100000000000000000000000", "fixed_window")),
        "t.yaml:7:26: invalid `requests_per_unit`: limit is above the maximum of 1000000000000"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit: {unit: second}
"
        ),
        "t.yaml:4:17: missing `requests_per_unit`"
    );
}

#[test]
fn unit_and_period_are_exclusive_and_one_is_required() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      period: 10s
      requests_per_unit: 5
"
        ),
        "t.yaml:6:15: give either `unit` or `period`, not both"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      requests_per_unit: 5
"
        ),
        "t.yaml:5:7: `rate_limit` needs `unit` or `period` (or `unlimited: true`)"
    );
}

#[test]
fn unlimited_takes_no_limit() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      unlimited: true
      requests_per_unit: 5
"
        ),
        "t.yaml:6:18: `unlimited: true` cannot be combined with `unit`"
    );
    // `unlimited: false` is just a limited rule.
    let policy = Policy::from_yaml(
        "t.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: false, unit: day, requests_per_unit: 5}\n",
    )
    .unwrap();
    assert_eq!(policy.rules()[0].limit.map(|p| p.limit()), Some(5));
    // envoyproxy/ratelimit accepts a `requests_per_unit` beside `unlimited: true` and ignores
    // it; such a file loads here too, and the rule stays unlimited.
    let policy = Policy::from_yaml(
        "t.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n",
    )
    .unwrap();
    assert!(policy.rules()[0].is_unlimited());
    assert_eq!(policy.rules()[0].limit, None);
}

#[test]
fn a_block_takes_no_burst_budget_or_soft_mode() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra, burst: 2, mode: soft}
"
        ),
        "t.yaml:4:51: `requests_per_unit: 0` blocks every request; `burst`, `mode: soft` has \
         no meaning beside it"
    );
    let shadow = Policy::from_yaml(
        "t.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 0}\n",
    )
    .unwrap();
    assert!(shadow.rules()[0].blocked && shadow.rules()[0].is_shadow());
}

#[test]
fn share_threshold_needs_a_wildcard() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: path
    value: /exact
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
"
        ),
        "t.yaml:5:22: `share_threshold` makes the values a wildcard matches share one counter; \
         it needs a `value` with a `*`"
    );
    // A `*` in the middle is a wildcard too, as in envoyproxy/ratelimit.
    let policy = Policy::from_yaml(
        "t.yaml",
        "domain: a
descriptors:
  - key: path
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
",
    )
    .unwrap();
    assert_eq!(policy.rules()[0].shared_levels, 1);
}

#[test]
fn one_level_holds_at_most_so_many_wildcards() {
    use tollgate::policy::MAX_WILDCARDS_PER_LEVEL;
    let level = |n: usize| {
        let mut yaml = String::from("domain: a\ndescriptors:\n");
        for i in 0..n {
            yaml.push_str(&format!(
                "  - key: k\n    value: 'v{i}*'\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n"
            ));
        }
        // Exact values and other levels do not count.
        yaml.push_str(
            "  - key: k\n    value: exact\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        );
        yaml
    };
    let policy = Policy::from_yaml("t.yaml", &level(MAX_WILDCARDS_PER_LEVEL)).unwrap();
    assert_eq!(policy.rules().len(), MAX_WILDCARDS_PER_LEVEL + 1);
    // The first one past the cap is named, by its line (three lines per descriptor after two).
    let line = 3 + 3 * MAX_WILDCARDS_PER_LEVEL + 1;
    assert_eq!(
        error(&level(MAX_WILDCARDS_PER_LEVEL + 2)),
        format!(
            "t.yaml:{line}:12: more than {MAX_WILDCARDS_PER_LEVEL} wildcard values (with `*`) in \
             one `descriptors` list: a request entry is tried against each in turn; nest them \
             under a more specific key or use exact values"
        )
    );
}

#[test]
fn burst_only_for_bucket_algorithms() {
    let yaml = |algorithm: &str, burst: &str| {
        format!(
            "domain: a
descriptors:
  - key: k
    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: {algorithm}, burst: {burst}}}
"
        )
    };
    let window = error(&yaml("sliding_window_counter", "10"));
    assert_eq!(
        window,
        format!("t.yaml:4:96: burst is not supported by sliding_window_counter; {BURST_WINDOW}")
    );
    assert_eq!(
        error(&yaml("gcra", "0")),
        "t.yaml:4:78: burst 0 must be between 1 and 1000000000000"
    );
    assert_eq!(
        error(&yaml("gcra", "-2")),
        "t.yaml:4:78: burst -2 must be between 1 and 1000000000000"
    );
    assert!(Policy::from_yaml("t.yaml", &yaml("leaky_bucket", "10")).is_ok());
    // Without `algorithm` the rule is a fixed window, which has no bucket.
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n"
        ),
        format!("t.yaml:4:61: burst is not supported by fixed_window; {BURST_WINDOW}")
    );
}

#[test]
fn unknown_algorithm_unit_and_bad_period() {
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: GCRA}\n"
        ),
        "t.yaml:4:65: unknown algorithm `GCRA`, expected one of: fixed_window, sliding_window_log, \
         sliding_window_counter, token_bucket, leaky_bucket, gcra"
    );
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"
        ),
        "t.yaml:4:24: unknown unit `fortnight`, expected one of: second, minute, hour, day, week, month, year"
    );
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 30, requests_per_unit: 5}\n"
        ),
        "t.yaml:4:26: invalid period `30`: time unit needed, for example 30sec or 30ms"
    );
    // Humantime's month and year are not `unit: month` and `unit: year`; `1M` is not `1m`.
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 1M, requests_per_unit: 5}\n"
        ),
        "t.yaml:4:26: `M` in period `1M`: months and years are not periods here (humantime's are 30.44 and 365.25 days; `M` is a month, `m` a minute); write days (`30d`, `365d`) or use `unit: month` / `unit: year`"
    );
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 0s, requests_per_unit: 5}\n"
        ),
        "t.yaml:4:26: period 0ns is outside the supported range 1ms..=400 days"
    );
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 500days, requests_per_unit: 5}\n"
        ),
        "t.yaml:4:26: period 43200000s is outside the supported range 1ms..=400 days"
    );
}

#[test]
fn the_same_key_and_value_twice_at_one_level() {
    assert_eq!(
        errors(
            "domain: a
descriptors:
  - key: ip
    value: \"10.*\"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: ip
    value: \"10.*\"
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: ip
  - key: ip
    value: \"\"
"
        ),
        [
            "t.yaml:6:5: duplicate descriptor `ip` with value `10.*` at this level, first defined at t.yaml:3:5",
            "t.yaml:10:5: duplicate descriptor `ip` without a value at this level, first defined at t.yaml:9:5",
        ]
    );
    // The same pair under different parents, or the same key with different values, is fine.
    let policy = Policy::from_yaml(
        "t.yaml",
        "domain: a
descriptors:
  - key: x
    descriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 1}}]
  - key: y
    descriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 1}}]
  - {key: ip, value: '10.*', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: ip, value: '10.', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: ip, rate_limit: {unit: second, requests_per_unit: 1}}
",
    )
    .unwrap();
    assert_eq!(policy.rules().len(), 5);
}

#[test]
fn replaces_must_name_an_existing_other_rule() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 5
      replaces: [{name: nowhere}]
"
        ),
        "t.yaml:7:25: `replaces` names `nowhere`, but no rule in this domain has that name"
    );
    assert_eq!(
        errors(
            "domain: a
descriptors:
  - key: k
    rate_limit: {name: me, unit: second, requests_per_unit: 5, replaces: [{name: me}]}
  - key: j
    replaces: [{name: me}]
  - key: i
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{}]}
  - key: h
    replaces: [{name: me}]
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: me}]}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: me}, {name: me}]}
"
        ),
        [
            "t.yaml:4:82: rule `me` cannot replace itself",
            "t.yaml:6:15: `replaces` needs a `rate_limit` on the same descriptor",
            "t.yaml:8:65: `replaces` entry has no `name`",
            "t.yaml:11:64: `replaces` is given both on the descriptor and in its `rate_limit`; keep one",
            "t.yaml:13:84: `replaces` names `me` twice",
        ]
    );
}

#[test]
fn replaces_may_name_a_rule_defined_later_or_by_its_default_name() {
    let policy = Policy::from_yaml(
        "t.yaml",
        "domain: a
descriptors:
  - key: user
    replaces: [{name: late}, {name: tenant}]
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: other
    rate_limit: {name: late, unit: second, requests_per_unit: 5}
",
    )
    .unwrap();
    assert_eq!(policy.rules()[0].replaces, ["late", "tenant"]);
}

#[test]
fn names_are_unique_in_a_domain() {
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit: {name: shared, unit: second, requests_per_unit: 5}
  - key: j
    rate_limit:
      name: shared
      unit: second
      requests_per_unit: 5
"
        ),
        "t.yaml:7:13: two rules are named `shared` in this domain; the other is at t.yaml:4:24"
    );
    assert_eq!(
        error(
            "domain: a
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: j
    rate_limit: {name: k, unit: second, requests_per_unit: 5}
"
        ),
        "t.yaml:6:24: name `k` is already the default name (descriptor path) of the rule at t.yaml:4:17"
    );
}

#[test]
fn all_errors_of_a_file_are_reported_in_order() {
    let text = include_str!("../fixtures/many_errors.yaml");
    let errors = Policy::from_yaml("many_errors.yaml", text).unwrap_err();
    let lines: Vec<String> = errors.to_string().lines().map(str::to_owned).collect();
    let period_error = humantime::parse_duration("soon").unwrap_err();
    let expected = [
        "many_errors.yaml:3:10: empty descriptor `key`".to_owned(),
        "many_errors.yaml:6:24: unknown unit `fortnight`, expected one of: second, minute, hour, day, week, month, year".to_owned(),
        "many_errors.yaml:6:54: invalid `requests_per_unit`: limit must be at least 1, or 0 to block every request".to_owned(),
        "many_errors.yaml:7:5: duplicate descriptor `user` without a value at this level, first defined at many_errors.yaml:5:5".to_owned(),
        "many_errors.yaml:8:40: give either `unit` or `period`, not both".to_owned(),
        "many_errors.yaml:11:29: `unlimited: true` cannot be combined with `unit`".to_owned(),
        format!("many_errors.yaml:14:30: invalid period `soon`: {period_error}"),
        "many_errors.yaml:14:55: invalid `requests_per_unit`: limit must be at least 1, or 0 to block every request".to_owned(),
        format!("many_errors.yaml:14:66: burst is not supported by fixed_window; {BURST_WINDOW}"),
        "many_errors.yaml:15:9: duplicate descriptor `path` without a value at this level, first defined at many_errors.yaml:13:9".to_owned(),
        "many_errors.yaml:16:21: `rate_limit` needs `unit` or `period` (or `unlimited: true`)".to_owned(),
        format!("many_errors.yaml:23:14: burst is not supported by sliding_window_counter; {BURST_WINDOW}"),
        "many_errors.yaml:26:13: two rules are named `plan_limit` in this domain; the other is at many_errors.yaml:19:13".to_owned(),
        "many_errors.yaml:29:18: unknown algorithm `bucket`, expected one of: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra".to_owned(),
        "many_errors.yaml:31:17: `replaces` names `missing_limit`, but no rule in this domain has that name".to_owned(),
    ];
    assert_eq!(lines, expected);
    // The structured form carries the same positions.
    assert_eq!(
        errors.0[0].location,
        Some(Location {
            file: "many_errors.yaml".into(),
            line: 3,
            column: 10
        })
    );
    assert_eq!(errors.0[0].message, "empty descriptor `key`");
}

#[test]
fn errors_of_every_source_are_reported_together() {
    let sources = [
        (
            "bad_syntax.yaml".to_owned(),
            "domain: [unclosed\n".to_owned(),
        ),
        (
            "good.yaml".to_owned(),
            "domain: fine\ndescriptors: []\n".to_owned(),
        ),
        (
            "bad_rule.yaml".to_owned(),
            "domain: b\ndescriptors:\n  - key: ''\n".to_owned(),
        ),
    ];
    let errors = Policy::from_sources(&sources).unwrap_err();
    let files: Vec<&str> = errors
        .iter()
        .map(|e| e.location.as_ref().unwrap().file.as_str())
        .collect();
    assert_eq!(files, ["bad_syntax.yaml", "bad_rule.yaml"]);
    assert!(
        errors
            .to_string()
            .ends_with("bad_rule.yaml:3:10: empty descriptor `key`"),
        "{errors}"
    );
}

#[test]
fn a_value_with_a_newline_cannot_split_an_error_line() {
    let lines = errors(
        "domain: a
descriptors:
  - {key: k, value: \"x\\ny\"}
  - {key: k, value: \"x\\ny\"}
",
    );
    let garbles =
        "holds control or bidirectional characters, which would garble logs, metrics and terminals";
    assert_eq!(
        lines,
        [
            format!(r#"t.yaml:3:21: descriptor `value` "x\ny" {garbles}"#),
            "t.yaml:4:5: duplicate descriptor `k` with value `x\\ny` at this level, first defined at t.yaml:3:5".to_owned(),
            format!(r#"t.yaml:4:21: descriptor `value` "x\ny" {garbles}"#),
        ]
    );
}

#[test]
fn local_budgets_are_checked_against_their_limit() {
    let rule = |fields: &str| {
        format!(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 100, {fields}}}\n"
        )
    };
    let ok =
        Policy::from_yaml("t.yaml", &rule("local_budget: 10, local_budget_ttl: 250ms")).unwrap();
    let budget = ok.rules()[0].local_budget.unwrap();
    assert_eq!((budget.size, budget.ttl.as_millis()), (10, 250));
    let default_ttl = Policy::from_yaml("t.yaml", &rule("local_budget: 100")).unwrap();
    assert_eq!(
        default_ttl.rules()[0].local_budget.unwrap().ttl.as_millis(),
        100
    );

    // The column is the value's: `local_budget: ` ends at 69, `local_budget_ttl: ` at 73 or 90.
    assert_eq!(
        error(&rule("local_budget: 101")),
        "t.yaml:4:70: `local_budget` 101 must be between 1 and the limit's capacity, 100"
    );
    assert_eq!(
        error(&rule("local_budget: 0")),
        "t.yaml:4:70: `local_budget` 0 must be between 1 and the limit's capacity, 100"
    );
    assert_eq!(
        error(&rule("local_budget: -3")),
        "t.yaml:4:70: `local_budget` -3 must be between 1 and the limit's capacity, 100"
    );
    assert_eq!(
        error(&rule("local_budget: 5, mode: shadow")),
        "t.yaml:4:70: `local_budget` applies to enforced limits only, not `mode: shadow`"
    );
    assert_eq!(
        error(&rule("local_budget: 5, algorithm: leaky_bucket")),
        "t.yaml:4:70: `local_budget` cannot be used with leaky_bucket: each request must get \
         its own delay from the store"
    );
    assert_eq!(
        error(&rule("local_budget_ttl: 1s")),
        "t.yaml:4:74: `local_budget_ttl` needs `local_budget`"
    );
    assert_eq!(
        error(&rule("local_budget: 5, local_budget_ttl: 2m")),
        "t.yaml:4:91: `local_budget_ttl` must be between 1ms and 60s"
    );
    assert!(
        error(&rule("local_budget: 5, local_budget_ttl: soon"))
            .starts_with("t.yaml:4:91: invalid `local_budget_ttl` `soon`:")
    );
}

#[test]
fn charging_up_to_the_limit_is_checked_against_the_other_fields() {
    let rule = |fields: &str| {
        format!(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 100, {fields}}}\n"
        )
    };
    let charges_up_to_limit = |fields: &str| {
        let policy = Policy::from_yaml("t.yaml", &rule(fields)).unwrap();
        policy.rules()[0].limit.unwrap().charges_up_to_limit()
    };
    assert!(charges_up_to_limit("charge: up_to_limit"));
    assert!(!charges_up_to_limit("charge: whole"));
    assert!(!charges_up_to_limit("name: n"));

    // `charge: ` ends at column 63, or at 80 after `local_budget: 5, `.
    assert_eq!(
        error(&rule("charge: all")),
        "t.yaml:4:64: unknown charge `all`, expected whole or up_to_limit"
    );
    assert_eq!(
        error(&rule("local_budget: 5, charge: up_to_limit")),
        "t.yaml:4:81: `charge: up_to_limit` cannot be used with `local_budget`: a replica \
         serves from its reservation only what fits whole"
    );
    assert_eq!(
        error(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, charge: whole}\n"
        ),
        "t.yaml:4:43: `charge` has no meaning with `unlimited: true`"
    );
}

/// An unlimited rule never denies, so a `mode` other than enforce would promise what it cannot
/// do (a soft overage, a shadow would-deny); envoy's `shadow_mode: true` beside it is accepted,
/// as upstream does.
#[test]
fn a_mode_beside_unlimited_is_an_error() {
    let rule = |fields: &str| {
        format!(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{unlimited: true, {fields}}}\n"
        )
    };
    for mode in ["soft", "shadow"] {
        assert_eq!(
            error(&rule(&format!("mode: {mode}"))),
            format!(
                "t.yaml:4:41: `mode: {mode}` has no meaning with `unlimited: true`: the rule never denies"
            )
        );
    }
    assert!(Policy::from_yaml("t.yaml", &rule("mode: enforce")).is_ok());
    let envoy = "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unlimited: true}\n";
    assert!(Policy::from_yaml("t.yaml", envoy).is_ok());
}

/// A rule name must be printable where it shows: logs, metrics, `validate`, `tollgate top`.
#[test]
fn blank_or_unprintable_rule_names_are_errors() {
    for (name, shown) in [
        ("'   '", r#""   ""#),
        ("\"a\\nb\"", r#""a\nb""#),
        ("\"ab\\u202Ec\"", r#""ab\u{202e}c""#),
    ] {
        assert_eq!(
            error(&format!(
                "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{name: {name}, unit: second, requests_per_unit: 5}}\n"
            )),
            format!(
                "t.yaml:4:24: rule name {shown} is blank or holds control or bidirectional characters, which would garble logs, metrics and terminals"
            ),
            "{name}"
        );
    }
}

/// A domain, a key or a value with control or bidirectional characters would reach the same
/// places as a rule name (a derived name is made of keys and values): a value holding a newline
/// could forge a log line, an escape sequence could repaint a terminal.
#[test]
fn unprintable_domains_keys_and_values_are_errors() {
    let garbles =
        "holds control or bidirectional characters, which would garble logs, metrics and terminals";
    assert_eq!(
        errors(
            "domain: \"d\\ex\"
descriptors:
  - key: \"k\\u202E\"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    value: \"x\\n2026-12-01T00:00:00Z WARN forged\"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    value: \"tab\\tbed\"
    descriptors:
      - {key: \"a\\u0007\", rate_limit: {unit: second, requests_per_unit: 5}}
"
        ),
        [
            format!(r#"t.yaml:1:9: `domain` "d\u{{1b}}x" {garbles}"#),
            format!(r#"t.yaml:3:10: descriptor `key` "k\u{{202e}}" {garbles}"#),
            format!(
                r#"t.yaml:6:12: descriptor `value` "x\n2026-12-01T00:00:00Z WARN forged" {garbles}"#
            ),
            format!(r#"t.yaml:9:12: descriptor `value` "tab\tbed" {garbles}"#),
            format!(r#"t.yaml:11:15: descriptor `key` "a\u{{7}}" {garbles}"#),
        ]
    );
    // Printable text from anywhere is fine.
    assert!(
        Policy::from_yaml(
            "t.yaml",
            "domain: été\ndescriptors:\n  - {key: 鍵, value: 'a b/c?d=e', rate_limit: {unit: second, requests_per_unit: 5}}\n"
        )
        .is_ok()
    );
}
