//! Loading a directory of policy files: one domain per file, sorted, duplicates rejected.

// Helpers outside `#[test]` functions are test code too; the workspace lints aim at library code.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tollgate::policy::{Policy, PolicyErrors};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load_err(path: &Path) -> PolicyErrors {
    match Policy::load(path) {
        Ok(policy) => panic!("expected errors, got {policy:?}"),
        Err(errors) => errors,
    }
}

#[test]
fn a_directory_loads_its_yaml_and_yml_files_in_name_order() {
    let policy = Policy::load(&fixture("two_domains")).unwrap_or_else(|e| panic!("{e}"));
    // Not `.a-api.yaml` (dot file), `notes.txt` (not YAML) or `nested/c.yaml` (not recursive).
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["api", "edge"]);

    let rules: Vec<(usize, &str, &str)> = policy
        .rules()
        .iter()
        .map(|r| (r.index, r.domain.as_str(), r.name.as_str()))
        .collect();
    assert_eq!(
        rules,
        [
            (0, "api", "tenant"),
            (1, "api", "user"),
            (2, "edge", "remote_address")
        ]
    );

    let edge = &policy.rules()[2];
    assert!(
        edge.location.file.ends_with("two_domains/b-edge.yml"),
        "{}",
        edge.location
    );
    assert_eq!((edge.location.line, edge.location.column), (4, 17));

    assert_eq!(
        policy.find("api", &[("user", "u1")]).map(|r| r.index),
        Some(1)
    );
    assert_eq!(
        policy
            .find("edge", &[("remote_address", "192.0.2.7")])
            .map(|r| r.index),
        Some(2)
    );
    // Domains are separate trees.
    assert!(policy.find("edge", &[("user", "u1")]).is_none());
    assert_eq!(policy.rules()[1].limit.map(|p| p.burst()), Some(8));
}

#[test]
fn a_single_file_loads_by_path() {
    let policy = Policy::load(&fixture("two_domains/a-api.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["api"]);
    assert_eq!(policy.rules().len(), 2);
}

#[test]
fn the_same_domain_in_two_files_names_both_files() {
    let dir = fixture("duplicate_domain");
    let errors = load_err(&dir);
    let a = dir.join("a.yaml").display().to_string();
    let b = dir.join("b.yaml").display().to_string();
    assert_eq!(
        errors.to_string(),
        format!("{b}:1:9: domain `shared` is already defined at {a}:1:9")
    );
}

#[test]
fn the_same_domain_in_two_sources() {
    let source =
        |name: &str, domain: &str| (name.to_owned(), format!("# {name}\ndomain: {domain}\n"));
    let errors =
        Policy::from_sources(&[source("one", "x"), source("two", "y"), source("three", "x")])
            .unwrap_err();
    assert_eq!(
        errors.to_string(),
        "three:2:9: domain `x` is already defined at one:2:9"
    );
    let policy = Policy::from_sources(&[source("one", "x"), source("two", "y")]).unwrap();
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["x", "y"]);
    assert!(policy.rules().is_empty());
}

#[test]
fn missing_paths_and_empty_directories_are_errors() {
    let missing = fixture("does-not-exist.yaml");
    let errors = load_err(&missing);
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].location, None);
    assert!(
        errors
            .to_string()
            .starts_with(&format!("cannot read {}: ", missing.display())),
        "{errors}"
    );

    let empty = fixture("no_policies");
    assert_eq!(
        load_err(&empty).to_string(),
        format!("no *.yaml or *.yml policy files in {}", empty.display())
    );
}

/// Extensions match in any case: `a.YAML` is a policy file like `b.yml`.
#[test]
fn extensions_match_in_any_case() {
    let dir = tempfile::tempdir().unwrap();
    for (file, domain) in [("a.YAML", "upper"), ("b.yml", "lower")] {
        std::fs::write(
            dir.path().join(file),
            format!("domain: {domain}\ndescriptors: []\n"),
        )
        .unwrap();
    }
    let policy = Policy::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["upper", "lower"]);
}

/// A path that is no policy file (`/dev/zero`, a huge log) fails after 16 MiB instead of
/// filling memory.
#[test]
fn a_file_larger_than_any_policy_is_refused() {
    let errors = load_err(Path::new("/dev/zero"));
    assert_eq!(
        errors.to_string(),
        "cannot read /dev/zero: larger than 16 MiB, which no policy file needs"
    );
}

/// A policy file name in a directory that cannot be read (here a link to a file that is gone)
/// fails the load, naming it: skipped, its domain would silently lose its limits on a reload.
/// A name that is not UTF-8 is read like any other.
#[test]
fn odd_entries_in_a_directory_are_read_or_refused_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: a\ndescriptors: []\n").unwrap();
    let link = dir.path().join("b.yaml");
    std::os::unix::fs::symlink(dir.path().join("gone/b.yaml"), &link).unwrap();
    let errors = load_err(dir.path());
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert!(
        errors
            .to_string()
            .starts_with(&format!("cannot read {}: ", link.display())),
        "{errors}"
    );
    // A file name that is not UTF-8 is a policy file by its extension all the same.
    std::fs::remove_file(&link).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"b\xff.yaml");
    std::fs::write(dir.path().join(odd), "domain: b\ndescriptors: []\n").unwrap();
    let policy = Policy::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["a", "b"]);
    std::fs::remove_file(dir.path().join(odd)).unwrap();
    // A directory named like a policy file is no file to read.
    std::fs::create_dir(dir.path().join("c.yaml")).unwrap();
    let policy = Policy::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.domains().collect::<Vec<_>>(), ["a"]);
}
