//! Redis errors as store errors, classified by the server's error code (`WRONGTYPE`,
//! `NOAUTH`...) or the client's [`redis::ErrorKind`], not by searching their text.

use redis::ErrorKind;

use crate::store::{Failure, Invalid, RedisFailure, StoreError};

/// A Redis client error as a store error.
pub(super) fn store_error(e: redis::RedisError) -> StoreError {
    if matches!(e.kind(), ErrorKind::UnexpectedReturnType | ErrorKind::Parse) {
        return StoreError::InvalidData(Invalid::Unreadable(e));
    }
    let class = class(own_code(e.code(), e.detail().unwrap_or_default()));
    classify(class, RedisFailure::Client(e))
}

/// The code of a server error whose code is `code` and text after it `detail`. Redis closes an
/// unauthenticated connection that sends a large command (a script call) with a protocol error
/// ("ERR Protocol error: unauthenticated multibulk length") that does not say `NOAUTH`: the one
/// error whose kind only its text tells, taken as the `NOAUTH` it means.
fn own_code<'a>(code: Option<&'a str>, detail: &str) -> Option<&'a str> {
    match code {
        Some("ERR") if detail.contains("unauthenticated") => Some("NOAUTH"),
        code => code,
    }
}

/// The error a batched script call answered for one request (`{-1, message}`): the server's
/// error as its script saw it, code first ("WRONGTYPE Operation against a key...").
pub(super) fn script_error(message: String) -> StoreError {
    let code = message
        .split_whitespace()
        .next()
        .filter(|word| !word.is_empty() && word.bytes().all(|b| b.is_ascii_uppercase()));
    let detail = message.split_once(' ').map_or("", |(_, rest)| rest);
    let class = class(own_code(code, detail));
    classify(class, RedisFailure::Script(message))
}

/// What a Redis error means for the store, by its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A foreign value at one of our keys (`WRONGTYPE`).
    ForeignValue,
    /// A password missing or wrong (`NOAUTH`).
    AuthRequired,
    /// Anything else: a failure of the store.
    Failure,
}

fn class(code: Option<&str>) -> Class {
    match code {
        Some("WRONGTYPE") => Class::ForeignValue,
        Some("NOAUTH") => Class::AuthRequired,
        _ => Class::Failure,
    }
}

fn classify(class: Class, failure: RedisFailure) -> StoreError {
    match class {
        // A foreign value at one of our keys fails that call only; retrying will not help and
        // the store itself is healthy.
        Class::ForeignValue => StoreError::InvalidData(Invalid::ForeignValue(failure)),
        Class::AuthRequired => StoreError::Unavailable(Failure::AuthRequired(failure)),
        // Unreachable, out of memory, cluster reconfiguring, script cache lost twice...
        Class::Failure => StoreError::Unavailable(Failure::Redis(failure)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind of store error.
    fn kind(e: &StoreError) -> &'static str {
        match e {
            StoreError::InvalidData(_) => "invalid data",
            StoreError::Unavailable(Failure::AuthRequired(_)) => "auth",
            StoreError::Unavailable(_) => "unavailable",
            _ => "other",
        }
    }

    /// A server error as Redis writes it on the wire, as the client reads it.
    fn from_wire(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        match value.extract_error() {
            Err(e) => e,
            Ok(v) => panic!("not an error: {v:?}"),
        }
    }

    /// Every error the text matching classified, mapped to the same kind by its code.
    #[test]
    fn each_error_is_classified_as_before() {
        let server = [
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                "invalid data",
            ),
            ("NOAUTH Authentication required.", "auth"),
            (
                "ERR Protocol error: unauthenticated multibulk length",
                "auth",
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                "unavailable",
            ),
            ("CLUSTERDOWN The cluster is down", "unavailable"),
            (
                "LOADING Redis is loading the dataset in memory",
                "unavailable",
            ),
            (
                "ERR tollgate: late: the call reached Redis after its deadline",
                "unavailable",
            ),
        ];
        for (line, expected) in server {
            assert_eq!(kind(&store_error(from_wire(line))), expected, "{line}");
            assert_eq!(
                kind(&script_error(line.to_owned())),
                expected,
                "script: {line}"
            );
        }
        let client = [
            (ErrorKind::Parse, "invalid data"),
            (ErrorKind::UnexpectedReturnType, "invalid data"),
            (ErrorKind::Io, "unavailable"),
        ];
        for (error_kind, expected) in client {
            let e = redis::RedisError::from((error_kind, "from the client"));
            assert_eq!(kind(&store_error(e)), expected, "{error_kind:?}");
        }
        // A Lua error that is not the server's: a store failure, as before.
        let lua = script_error("user_script:12: attempt to compare nil with number".into());
        assert_eq!(kind(&lua), "unavailable");
    }
}
