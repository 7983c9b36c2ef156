use std::fs;
use std::path::{Path, PathBuf};

use super::compiler::Compiler;
use super::{Policy, PolicyDefaults, PolicyError, PolicyErrors};

impl Policy {
    /// Loads a policy file, or every `*.yaml`/`*.yml` file of a directory (in any case; not
    /// recursive, files whose name starts with `.` skipped) in sorted name order, each file one domain.
    ///
    /// Every problem of every file is reported, each with its file, line and column. A directory
    /// without policy files is an error.
    pub fn load(path: &Path) -> Result<Policy, PolicyErrors> {
        Policy::load_with(path, PolicyDefaults::default())
    }

    /// [`Policy::load`], with `defaults` for the settings the rules leave out.
    pub fn load_with(path: &Path, defaults: PolicyDefaults) -> Result<Policy, PolicyErrors> {
        Policy::from_sources_with(&Policy::read_sources(path)?, defaults)
    }

    /// Reads the texts [`Policy::load`] would compile, as `(file name, text)` pairs in load
    /// order (for versioning: the same texts always give the same policy).
    pub fn read_sources(path: &Path) -> Result<Vec<(String, String)>, PolicyErrors> {
        let metadata = fs::metadata(path)
            .map_err(|e| one_error(format!("cannot read {}: {e}", path.display())))?;
        let files = if metadata.is_dir() {
            let files = policy_files(path)?;
            if files.is_empty() {
                return Err(one_error(format!(
                    "no *.yaml or *.yml policy files in {}",
                    path.display()
                )));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut sources = Vec::with_capacity(files.len());
        let mut errors = Vec::new();
        for file in files {
            let name = file.display().to_string();
            match read_capped(&file) {
                Ok(text) => sources.push((name, text)),
                Err(why) => {
                    errors.push(PolicyError::new(None, format!("cannot read {name}: {why}")))
                }
            }
        }
        if errors.is_empty() {
            Ok(sources)
        } else {
            Err(PolicyErrors(errors))
        }
    }

    /// Parses one file's text; `source_name` is the file name used in locations.
    pub fn from_yaml(source_name: &str, text: &str) -> Result<Policy, PolicyErrors> {
        let mut compiler = Compiler::default();
        compiler.add_source(source_name, text);
        compiler.finish()
    }

    /// Parses several files' texts, as `(name, text)` pairs in load order, like a directory:
    /// each is one domain and no domain may appear twice.
    pub fn from_sources(sources: &[(String, String)]) -> Result<Policy, PolicyErrors> {
        Policy::from_sources_with(sources, PolicyDefaults::default())
    }

    /// [`Policy::from_sources`], with `defaults` for the settings the rules leave out.
    pub fn from_sources_with(
        sources: &[(String, String)],
        defaults: PolicyDefaults,
    ) -> Result<Policy, PolicyErrors> {
        let mut compiler = Compiler::default();
        compiler.defaults = defaults;
        for (name, text) in sources {
            compiler.add_source(name, text);
        }
        compiler.finish()
    }
}

/// Largest policy file read, so that a wrong path (`/dev/zero`, a log file) fails at once
/// instead of filling memory.
pub const MAX_POLICY_FILE: u64 = 16 * 1024 * 1024;

/// Why a policy file's text could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// Opening or reading it failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// It is longer than [`MAX_POLICY_FILE`].
    #[error("larger than {} MiB, which no policy file needs", MAX_POLICY_FILE / (1024 * 1024))]
    TooLarge,
}

/// The text of `file`, refused past [`MAX_POLICY_FILE`] bytes.
fn read_capped(file: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let mut text = String::new();
    fs::File::open(file).and_then(|f| f.take(MAX_POLICY_FILE + 1).read_to_string(&mut text))?;
    if text.len() as u64 > MAX_POLICY_FILE {
        return Err(ReadError::TooLarge);
    }
    Ok(text)
}

fn one_error(message: String) -> PolicyErrors {
    PolicyErrors(vec![PolicyError::new(None, message)])
}

/// The directory's policy files, sorted by name.
fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, PolicyErrors> {
    let cannot_list = |e: std::io::Error| one_error(format!("cannot list {}: {e}", dir.display()));
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(cannot_list)? {
        let path = entry.map_err(cannot_list)?.path();
        // A name that is not UTF-8 is still a policy file by its extension (shown lossily).
        let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
            continue;
        };
        // Dot files are editor and tooling leftovers (`.#a.yaml`, `.a.yaml.swp`).
        let lower = name.to_ascii_lowercase();
        let is_policy =
            !name.starts_with('.') && (lower.ends_with(".yaml") || lower.ends_with(".yml"));
        // `metadata` follows symlinks, as Kubernetes ConfigMap mounts need. A policy name that
        // cannot be followed (a dangling link, a lost mount) is kept, and fails to read: skipped,
        // its domain's limits would silently go.
        let directory = fs::metadata(&path).is_ok_and(|m| m.is_dir());
        if is_policy && !directory {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
