//! A policy's source texts as a set: read from the config path only once two reads agree,
//! named relative to the directories they share, and hashed by content.

use std::path::Path;

use super::{Policy, PolicyError, PolicyErrors};
use crate::fnv::fnv1a64;

/// The policy files' texts, read twice and only when both reads agree: a directory read while
/// it is being replaced (a Kubernetes ConfigMap swap between the listing and the reads) could
/// otherwise give texts that never existed together, a policy valid but never written.
pub fn read_settled(path: &Path) -> Result<Vec<(String, String)>, PolicyErrors> {
    settled(path, Policy::read_sources(path)?)
}

/// `first`, read from `path`, once a second read agrees with it (see [`read_settled`]).
pub fn settled(
    path: &Path,
    first: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, PolicyErrors> {
    if Policy::read_sources(path)? == first {
        Ok(first)
    } else {
        Err(PolicyErrors(vec![PolicyError::new(
            None,
            format!(
                "{} changed while being read; read again later",
                path.display()
            ),
        )]))
    }
}

/// The names of `sources` without the directories they all share: `/etc/tollgate/api.yaml`
/// and `./api.yaml` are both `api.yaml`, and the files of a directory are named from inside it.
/// Equal policies read from, or pushed as, differently spelt paths hash and diff as equal.
pub fn relative_names(sources: &[(String, String)]) -> Vec<&str> {
    // Bytes through the last '/' of `bytes`: a directory part, never a partial name.
    let dir_len = |bytes: &[u8]| bytes.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let shared = match sources {
        [] => 0,
        [(first, _), rest @ ..] => {
            rest.iter()
                .fold(dir_len(first.as_bytes()), |shared, (name, _)| {
                    let common = first
                        .bytes()
                        .zip(name.bytes())
                        .take(shared)
                        .take_while(|(a, b)| a == b)
                        .count();
                    dir_len(&first.as_bytes()[..common])
                })
        }
    };
    sources.iter().map(|(name, _)| &name[shared..]).collect()
}

/// The content hash of a set of sources: their texts and their names relative to the
/// directories they share (see [`relative_names`]).
pub fn sources_hash(sources: &[(String, String)]) -> String {
    let mut bytes = Vec::new();
    for (name, (_, text)) in relative_names(sources).into_iter().zip(sources) {
        // Length-prefixed, so moving text between files changes the hash.
        bytes.extend_from_slice(&(name.len() as u64).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(&(text.len() as u64).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
    }
    format!("{:016x}", fnv1a64(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn names_are_taken_from_inside_the_directories_all_files_share() {
        let names = |pairs: &[(&str, &str)]| {
            relative_names(&named(pairs))
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&[("/etc/tollgate/api.yaml", "")]), ["api.yaml"]);
        assert_eq!(names(&[("./api.yaml", "")]), ["api.yaml"]);
        assert_eq!(names(&[("api.yaml", "")]), ["api.yaml"]);
        assert_eq!(
            names(&[("conf/a.yaml", ""), ("conf/sub/b.yaml", "")]),
            ["a.yaml", "sub/b.yaml"]
        );
        // A shared prefix that is not a whole directory stays.
        assert_eq!(
            names(&[("ab/x.yaml", ""), ("ac/y.yaml", "")]),
            ["ab/x.yaml", "ac/y.yaml"]
        );
        // Not cut inside a multi-byte character the two names begin alike.
        assert_eq!(
            names(&[("d/é/x.yaml", ""), ("d/è/y.yaml", "")]),
            ["é/x.yaml", "è/y.yaml"]
        );
    }

    #[test]
    fn the_hash_depends_on_names_and_texts() {
        let one = vec![("a.yaml".to_owned(), "x".to_owned())];
        let other = vec![("b.yaml".to_owned(), "x".to_owned())];
        assert_eq!(sources_hash(&one), sources_hash(&one.clone()));
        assert_ne!(sources_hash(&one), sources_hash(&other));
    }
}
