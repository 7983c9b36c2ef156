use std::fmt;

/// A position in a policy source: the file (or source name), a 1-based line and a 1-based column
/// counted in characters. Displays as `file:line:column`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The file path or source name the policy was loaded from.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

impl Location {
    /// Converts a serde-saphyr location; `None` when the parser did not know where it was.
    pub(super) fn from_yaml(file: &str, location: &serde_saphyr::Location) -> Option<Location> {
        if location.line() == 0 {
            return None;
        }
        Some(Location {
            file: file.to_owned(),
            line: usize::try_from(location.line()).unwrap_or(usize::MAX),
            column: usize::try_from(location.column()).unwrap_or(usize::MAX),
        })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One problem found while loading a policy. Displays as `file:line:column: message`, or just
/// the message when no position is known (an unreadable file, for instance).
///
/// The message never contains control characters (they are escaped), so a list of errors prints
/// one error per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", LocationPrefix(.location.as_ref()))]
pub struct PolicyError {
    /// Where the problem is.
    pub location: Option<Location>,
    /// What is wrong, lowercase, without a trailing period.
    pub message: String,
}

impl PolicyError {
    /// An error at `location`; control characters in `message` are escaped.
    pub fn new(location: Option<Location>, message: impl AsRef<str>) -> PolicyError {
        PolicyError {
            location,
            message: escape_controls(message.as_ref()),
        }
    }
}

struct LocationPrefix<'a>(Option<&'a Location>);

impl fmt::Display for LocationPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(location) => write!(f, "{location}: "),
            None => Ok(()),
        }
    }
}

/// Every problem found in a policy, in source order. Displays one error per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl PolicyErrors {
    /// The errors, in source order.
    pub fn iter(&self) -> std::slice::Iter<'_, PolicyError> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a PolicyErrors {
    type Item = &'a PolicyError;
    type IntoIter = std::slice::Iter<'a, PolicyError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// Escapes control characters (a value may contain a newline) so one error stays on one line.
fn escape_controls(message: &str) -> String {
    if !message.chars().any(char::is_control) {
        return message.to_owned();
    }
    let mut out = String::with_capacity(message.len() + 8);
    for c in message.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: usize, column: usize) -> Option<Location> {
        Some(Location {
            file: "p.yaml".into(),
            line,
            column,
        })
    }

    #[test]
    fn displays_one_error_per_line_with_location() {
        let errors = PolicyErrors(vec![
            PolicyError::new(at(3, 7), "empty domain"),
            PolicyError::new(None, "cannot read /nope: not found"),
        ]);
        assert_eq!(
            errors.to_string(),
            "p.yaml:3:7: empty domain\ncannot read /nope: not found"
        );
    }

    #[test]
    fn control_characters_cannot_break_the_one_error_per_line_format() {
        let error = PolicyError::new(at(1, 1), "duplicate descriptor `a\nb`");
        assert_eq!(
            error.to_string(),
            "p.yaml:1:1: duplicate descriptor `a\\nb`"
        );
        assert_eq!(error.to_string().lines().count(), 1);
    }
}
