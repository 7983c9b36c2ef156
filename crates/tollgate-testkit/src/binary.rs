//! Finding the executables tests start: `redis-server`, `redis-cli`, and any other a test
//! needs (Prometheus, promtool).

use std::env;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What to do when a Redis executable is missing; tests must fail, never skip.
const INSTALL_HINT: &str =
    "run scripts/test.sh (it installs redis-server) or apt-get install redis-server redis-tools";

/// The `redis-server` executable found on `PATH`.
///
/// # Panics
///
/// When `redis-server` is not on `PATH`, with a message saying how to install it: a test that needs
/// Redis fails loudly instead of silently skipping.
pub fn redis_binary() -> PathBuf {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| find_in_path("redis-server", env::var_os("PATH").as_deref()))
        .clone()
        .unwrap_or_else(|| panic!("redis-server not found: {INSTALL_HINT}"))
}

/// The `redis-cli` executable found on `PATH`.
///
/// # Panics
///
/// When `redis-cli` is not on `PATH`, with a message saying how to install it.
pub fn redis_cli_binary() -> PathBuf {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| find_in_path("redis-cli", env::var_os("PATH").as_deref()))
        .clone()
        .unwrap_or_else(|| panic!("redis-cli not found: {INSTALL_HINT}"))
}

/// The executable `name`: the path in the environment variable `override_var` when set, else
/// the first on `PATH`.
///
/// # Panics
///
/// When neither gives one, with `install` (how to install it) in the message: a test that
/// needs it fails loudly instead of silently skipping.
pub fn installed_binary(name: &str, override_var: &str, install: &str) -> PathBuf {
    if let Some(path) = env::var_os(override_var) {
        return PathBuf::from(path);
    }
    find_in_path(name, env::var_os("PATH").as_deref()).unwrap_or_else(|| {
        panic!("{name} is not installed: {install}; or set {override_var} to its binary")
    })
}

/// The first executable file called `name` in the directories of a `PATH`-style list.
fn find_in_path(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn finds_redis_server_on_the_real_path() {
        assert!(redis_binary().ends_with("redis-server"));
        assert!(redis_cli_binary().ends_with("redis-cli"));
    }

    #[test]
    fn a_path_without_redis_finds_nothing() {
        let empty = tempfile::tempdir().unwrap();
        let path = env::join_paths([empty.path()]).unwrap();
        assert_eq!(find_in_path("redis-server", Some(&path)), None);
        assert_eq!(find_in_path("redis-server", None), None);
    }

    #[test]
    fn a_non_executable_file_is_not_a_binary() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("redis-server");
        std::fs::write(&file, "not a program").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = OsString::from(dir.path());
        assert_eq!(find_in_path("redis-server", Some(&path)), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_in_path("redis-server", Some(&path)), Some(file));
    }
}
