//! The policy parser: any text either loads or is refused, and does the same the second time
//! and through `from_sources` (same rules, same errors, same domains).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = Policy::from_yaml("fuzz.yaml", text);
    let second = Policy::from_yaml("fuzz.yaml", text);
    let sources = Policy::from_sources(&[("fuzz.yaml".to_string(), text.to_string())]);
    for other in [&second, &sources] {
        match (&first, other) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.rules(), b.rules(), "the same text gave other rules");
                assert!(
                    a.domains().eq(b.domains()),
                    "the same text gave other domains"
                );
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "the same text gave other errors"),
            (a, b) => panic!("loaded once and refused once: {a:?} / {b:?}"),
        }
    }
    if let Err(errors) = &first {
        assert!(!errors.0.is_empty(), "refused without an error");
        for error in &errors.0 {
            assert!(!error.to_string().is_empty(), "an empty error message");
        }
    }
});
