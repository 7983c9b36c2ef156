//! Where the upstream variables are read from: the process environment, or a test's map.

/// Reads one environment variable; `None` when unset or empty (upstream's loader treats an
/// empty value as not given).
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String>> Env for F {
    fn get(&self, name: &str) -> Option<String> {
        self(name).filter(|v| !v.is_empty())
    }
}
