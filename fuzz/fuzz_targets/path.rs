//! The forward-auth path normalizer: a normalized path normalizes to itself, and has no query,
//! fragment, empty, `.` or `..` segment left.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::limiter::normalized_path;

fuzz_target!(|data: &[u8]| {
    let Ok(target) = std::str::from_utf8(data) else {
        return;
    };
    let path = normalized_path(target);
    assert_eq!(
        normalized_path(&path),
        path,
        "not idempotent for {target:?}"
    );
    if path.is_empty() {
        return;
    }
    assert!(path.starts_with('/'), "{path:?}");
    assert!(!path.contains(['?', '#']), "{path:?}");
    assert!(!path.contains("//"), "{path:?}");
    let inner = path.trim_start_matches('/').trim_end_matches('/');
    if !inner.is_empty() {
        for segment in inner.split('/') {
            assert!(segment != "." && segment != "..", "{path:?}");
        }
    }
});
