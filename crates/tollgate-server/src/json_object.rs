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

/// Reads a JSON body into `T`, which must be an object (see the module documentation); the
/// error says what was wrong, as the `400` answers it.
pub fn from_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice::<Object<T>>(body)
        .map(|Object(t)| t)
        .map_err(|e| format!("invalid JSON body: {e}"))
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
            let error = from_body::<Pair>(array).unwrap_err();
            assert!(error.contains("expected a JSON object"), "{error}");
        }
        let unknown = from_body::<Pair>(br#"{"a": 1, "b": [], "z": 0}"#).unwrap_err();
        assert!(unknown.contains("unknown field `z`"), "{unknown}");
    }
}
