//! The one spelling of a request path that rules limit, for transports that take a
//! descriptor value from a request's path (the forward-auth endpoint, the tower middleware).

/// The path of a request target, without its query, in the one spelling of its equivalents
/// that the same rules should limit: unreserved characters percent-decoded (`%6C` is `l`), other
/// escapes in upper case (`%2f` is `%2F`, and stays an escape, not a `/`), `.` and `..` segments
/// resolved and repeated slashes merged (RFC 3986 §6.2.2 and §5.2.4; nginx merges slashes too).
/// Without it `//login`, `/%6cogin` or `/./login` would match no `/login` rule and go unlimited.
/// Case and a trailing slash are kept: they may name other resources. Empty stays empty.
pub fn normalized_path(target: &str) -> String {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() {
        return String::new();
    }
    let mut decoded = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find('%') {
        decoded.push_str(&rest[..at]);
        let escape = rest
            .get(at + 1..at + 3)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) => {
                decoded.push(char::from(byte));
            }
            Some(byte) => decoded.push_str(&format!("%{byte:02X}")),
            None => {
                decoded.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        }
        rest = &rest[at + 3..];
    }
    decoded.push_str(rest);

    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    for segment in &segments {
        normal.push('/');
        normal.push_str(segment);
    }
    let ends_in_directory =
        decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    if ends_in_directory || normal.is_empty() {
        normal.push('/');
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings a client could use to slip past a rule for a path all come out the same.
    #[test]
    fn paths_are_normalized_before_they_are_limited() {
        for (target, path) in [
            ("/items/3?page=2", "/items/3"),
            ("/login", "/login"),
            ("//login", "/login"),
            ("/%6cogin", "/login"),
            ("/%6Cogin#top", "/login"),
            ("/./login", "/login"),
            ("/a/../login", "/login"),
            ("/../../login", "/login"),
            ("/%2e%2E/login", "/login"),
            ("/%7Euser//files/", "/~user/files/"),
            ("/login/", "/login/"),
            ("/login/.", "/login/"),
            ("/LOGIN", "/LOGIN"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%zz%4", "/a%zz%4"),
            ("/caf%C3%A9", "/caf%C3%A9"),
            ("/", "/"),
            ("/..", "/"),
            ("login", "/login"),
            ("?only=query", ""),
        ] {
            assert_eq!(normalized_path(target), path, "{target}");
        }
    }
}
