//! JSON objects only. A struct `#[derive(Deserialize)]` also reads a JSON array, its elements
//! taken as the fields in order (and `deny_unknown_fields` unchecked), so without this
//! `["api", [[[["user", "alice"]]]]]` would be a valid `/v1/check` request and charge alice.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A `T` read from a JSON object, never from an array.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(Object)
    }
}

/// A body that is not the JSON object asked for: what was wrong, where, as the `400` says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON body: {why}")]
pub struct InvalidJson {
    /// serde_json's message, or a clearer one (see [`explained`]).
    why: String,
}

/// Reads a JSON body into `T`, which must be an object (see the module documentation); the
/// error says what was wrong, as the `400` answers it.
pub fn from_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, InvalidJson> {
    serde_json::from_slice::<Object<T>>(body)
        .map(|Object(t)| t)
        .map_err(|e| InvalidJson {
            why: explained(&e, body),
        })
}

/// serde_json's message for `error`, but for a lone UTF-16 surrogate escape (`"\ud800"`, which a
/// string cannot hold): serde_json calls that an "unexpected end of hex escape" or a "lone
/// leading surrogate" (a trailing one too), which does not say what to fix.
fn explained(error: &serde_json::Error, body: &[u8]) -> String {
    let message = error.to_string();
    let about_a_surrogate = ["unexpected end of hex escape", "lone leading surrogate"]
        .iter()
        .any(|m| message.starts_with(m));
    if !about_a_surrogate {
        return message;
    }
    match lone_surrogate(body, error_offset(body, error.line(), error.column())) {
        Some(escape) => {
            let line_start = body[..escape]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |n| n + 1);
            let line = 1 + body[..line_start].iter().filter(|b| **b == b'\n').count();
            let column = escape - line_start + 1;
            let text = String::from_utf8_lossy(&body[escape..escape + 6]);
            format!(
                "lone UTF-16 surrogate {text} at line {line} column {column}: a surrogate \
                 escape must be a pair, \\ud800-\\udbff then \\udc00-\\udfff"
            )
        }
        None => message,
    }
}

/// The byte offset serde_json's `line` and `column` point at (the byte after the last read).
fn error_offset(body: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match body[start..].iter().position(|b| *b == b'\n') {
            Some(n) => start += n + 1,
            None => break,
        }
    }
    (start + column).min(body.len())
}

/// The start of the lone surrogate escape that ends just before `at`, if there is one: the
/// last `\uXXXX` in D800..=DFFF among the few bytes before, or when that is a leading one
/// right after another leading one, that other (`\ud800\udbff`: the first is the lone one).
fn lone_surrogate(body: &[u8], at: usize) -> Option<usize> {
    // A surrogate error is raised at most one escape and a byte past the lone escape.
    let from = at.saturating_sub(16);
    let escapes: Vec<(usize, u16)> = (from..at)
        .filter_map(|p| surrogate_escape(body, p).map(|n| (p, n)))
        .collect();
    let leading = |n: u16| (0xD800..=0xDBFF).contains(&n);
    match escapes.as_slice() {
        [.., (before, b), (last, n)] if leading(*n) && leading(*b) && before + 6 == *last => {
            Some(*before)
        }
        [.., (last, _)] => Some(*last),
        [] => None,
    }
}

/// The code unit of the `\uXXXX` escape at `p`, if it is one (its backslash not itself
/// escaped) and a surrogate.
fn surrogate_escape(body: &[u8], p: usize) -> Option<u16> {
    let escape = body.get(p..p + 6)?;
    let backslashes = body[..p].iter().rev().take_while(|b| **b == b'\\').count();
    if escape[..2] != *b"\\u" || backslashes % 2 == 1 {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    let n = u16::from_str_radix(hex, 16).ok()?;
    (0xD800..=0xDFFF).contains(&n).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Pair {
        a: u32,
        b: Vec<Object<Inner>>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        c: u32,
    }

    impl<T: PartialEq> PartialEq for Object<T> {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    #[test]
    fn objects_are_read_arrays_refused() {
        let read: Pair = from_body(br#"{"a": 1, "b": [{"c": 2}]}"#).unwrap();
        assert_eq!(read.b[0].0.c, 2);
        for array in [&br#"[1, [{"c": 2}]]"#[..], br#"{"a": 1, "b": [[2]]}"#] {
            let error = from_body::<Pair>(array).unwrap_err().to_string();
            assert!(error.contains("expected a JSON object"), "{error}");
        }
        let unknown = from_body::<Pair>(br#"{"a": 1, "b": [], "z": 0}"#)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field `z`"), "{unknown}");
    }

    #[derive(Debug, Deserialize)]
    struct Text {
        #[allow(dead_code)]
        t: String,
    }

    /// A lone surrogate escape is named, with where it is; serde_json called it an "unexpected
    /// end of hex escape", or a trailing one a "lone leading surrogate".
    #[test]
    fn a_lone_surrogate_is_named_where_it_is() {
        let error = |body: &str| from_body::<Text>(body.as_bytes()).unwrap_err().to_string();
        for (body, escape, at) in [
            (r#"{"t": "\ud800"}"#, r"\ud800", "line 1 column 8"),
            (r#"{"t": "ab\uDBFF!"}"#, r"\uDBFF", "line 1 column 10"),
            (r#"{"t": "\udc00"}"#, r"\udc00", "line 1 column 8"),
            (r#"{"t": "\ud800\u0041"}"#, r"\ud800", "line 1 column 8"),
            (r#"{"t": "\ud800\udbff"}"#, r"\ud800", "line 1 column 8"),
            (r#"{"t": "\ud800\n"}"#, r"\ud800", "line 1 column 8"),
            (
                "{\n  \"t\":\n    \"\\ud83d\\ude00 \\udfff\"}",
                r"\udfff",
                "line 3 column 19",
            ),
        ] {
            let error = error(body);
            assert!(
                error.contains(&format!("lone UTF-16 surrogate {escape} at {at}")),
                "{body}: {error}"
            );
            assert!(!error.contains("hex escape"), "{error}");
        }
        // A pair is one character; an escaped backslash is no escape.
        assert!(from_body::<Text>(br#"{"t": "\ud83d\ude00"}"#).is_ok());
        assert!(from_body::<Text>(br#"{"t": "\\ud800"}"#).is_ok());
        // Other escape errors keep serde_json's words.
        let error = error(r#"{"t": "\u12"}"#);
        assert!(error.contains("invalid escape"), "{error}");
    }
}
