//! The overrides' expiry, cap and adoption of changes.

use super::*;

/// An override that expires is logged once, whichever notices it first (the sweep, a
/// listing, an adoption of the shared list that still holds it), and an adoption does not
/// bring it back.
#[test]
fn an_expired_override_is_dropped_and_logged_once() {
    let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
    let o = |value: &str, expires: Option<u64>| Override {
        id: 0,
        domain: "api".into(),
        rule: "per_tenant".into(),
        entries: vec![("tenant".into(), value.into())],
        requests_per_unit: 30,
        period: None,
        expires_at: expires.map(at),
        set_at: at(0),
        reason: String::new(),
    };
    let overrides = Overrides::default();
    let short = overrides.set(o("acme", Some(10))).unwrap();
    overrides.set(o("globex", None)).unwrap();
    let shared = overrides.all();
    let logs = tollgate_testkit::CapturedLogs::default();
    let subscriber = logs.subscriber();
    tracing::subscriber::with_default(subscriber, || {
        overrides.drop_expired(at(9));
        assert_eq!(overrides.list(at(9)).len(), 2, "not expired yet");
        overrides.adopt(shared.clone(), at(11));
        overrides.drop_expired(at(12));
        assert_eq!(overrides.list(at(12)).len(), 1);
        overrides.adopt(shared.clone(), at(13));
        assert_eq!(
            overrides.all().len(),
            1,
            "an adoption does not bring it back"
        );
    });
    let text = logs.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Override expired"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains(&format!("id={short}")), "{text}");

    let sweeping = Overrides::default();
    sweeping.set(o("acme", Some(10))).unwrap();
    sweeping.drop_expired(at(10));
    assert!(sweeping.all().is_empty(), "gone at its expiry");
}

fn tenant(value: &str) -> Override {
    Override {
        id: 0,
        domain: "api".into(),
        rule: "per_tenant".into(),
        entries: vec![("tenant".into(), value.into())],
        requests_per_unit: 30,
        period: None,
        expires_at: None,
        set_at: Timestamp::from_micros(1),
        reason: String::new(),
    }
}

/// Sets stop at the cap, naming it: a set that would pass it, alone or in a batch, sets
/// nothing (no override, no change to share); replacing a target at the cap is no addition;
/// an expired override no longer counts.
#[test]
fn sets_past_the_cap_are_refused_whole() {
    let overrides = Overrides::with_max(3);
    overrides.set_all(vec![tenant("a"), tenant("b")]).unwrap();
    let pending = overrides.take_pending().len();
    assert_eq!(pending, 2);
    let refused = overrides
        .set_all(vec![tenant("a"), tenant("c"), tenant("d")])
        .unwrap_err();
    assert_eq!(
        refused,
        OverrideError::TooMany {
            max: 3,
            held: 2,
            adding: 2
        }
    );
    assert!(
        refused.to_string().contains("at most 3 runtime overrides"),
        "{refused}"
    );
    assert_eq!(overrides.len(), 2, "nothing set");
    assert!(!overrides.has_pending(), "nothing to share");
    assert!(
        overrides
            .find_target("a")
            .is_some_and(|o| o.requests_per_unit == 30)
    );

    // The same target twice in one batch adds one.
    overrides.set_all(vec![tenant("c"), tenant("c")]).unwrap();
    assert_eq!(overrides.len(), 3);
    assert!(matches!(
        overrides.set(tenant("d")),
        Err(OverrideError::TooMany { max: 3, .. })
    ));
    let mut again = tenant("a");
    again.requests_per_unit = 99;
    overrides.set(again).unwrap();
    assert_eq!(
        overrides.find_target("a").map(|o| o.requests_per_unit),
        Some(99)
    );

    let mut short = tenant("e");
    short.expires_at = Some(Timestamp::from_micros(5));
    let held = Overrides::with_max(1);
    held.set(short).unwrap();
    let mut later = tenant("f");
    later.set_at = Timestamp::from_micros(5);
    held.set(later).unwrap();
    assert_eq!(held.len(), 1, "the expired one made room");
}

/// With 20,000 overrides in force a lookup compares with at most the one it finds, and the
/// changes adopted from another replica replace, add and remove by target.
#[test]
fn many_overrides_are_found_by_target_and_changed_by_target() {
    let overrides = Overrides::default();
    let ids = overrides
        .set_all((0..20_000).map(|i| tenant(&format!("t{i}"))).collect())
        .unwrap();
    assert_eq!(ids.len(), 20_000);
    let entries = |v: &str| vec![("tenant".to_owned(), v.to_owned())];
    assert!(overrides.probes("api", "per_tenant", &entries("unrelated")) <= 1);
    assert!(overrides.probes("api", "per_tenant", &entries("t19999")) <= 2);
    assert!(overrides.find_target("t19999").is_some());
    overrides.take_pending();

    let target = |v: &str| ("api".to_owned(), "per_tenant".to_owned(), entries(v));
    let mut changed = tenant("t5");
    changed.id = 42;
    changed.requests_per_unit = 7;
    let before = overrides.generation();
    let n = overrides.adopt_changes(
        vec![
            (target("t5"), Some(changed.clone())),
            (target("t6"), None),
            (
                target("new"),
                Some(Override {
                    id: 43,
                    ..tenant("new")
                }),
            ),
            (target("never-held"), None),
        ],
        Timestamp::from_micros(2),
    );
    assert_eq!(n, 3);
    assert_ne!(overrides.generation(), before);
    assert_eq!(overrides.len(), 20_000);
    assert_eq!(overrides.find_target("t5"), Some(changed.clone()));
    assert!(overrides.find_target("t6").is_none());
    assert_eq!(overrides.find_target("new").map(|o| o.id), Some(43));
    let before = overrides.generation();
    let n = overrides.adopt_changes(
        vec![(target("t5"), Some(changed))],
        Timestamp::from_micros(2),
    );
    assert_eq!(n, 0, "what is held already is no change");
    assert_eq!(overrides.generation(), before);
}

impl Overrides {
    fn find_target(&self, tenant: &str) -> Option<Override> {
        let entries = vec![("tenant".to_owned(), tenant.to_owned())];
        let index = self.index.load();
        index
            .find("api", "per_tenant", &entries)
            .0
            .map(|o| Override::clone(o))
    }
}
