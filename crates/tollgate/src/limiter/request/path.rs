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
    let decoded = decoded_escapes(path);

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

/// `path` with its unreserved characters percent-decoded and other escapes in upper case. A
/// `%` that starts no escape stays, unless the decoding put two hex digits after it (`%%36c`
/// gives `%6c`): that one is written `%25`, or the result would decode again into something
/// else (`/l`), and a normalized path would not be its own normal form.
fn decoded_escapes(path: &str) -> String {
    let mut decoded = String::with_capacity(path.len());
    let mut bare = Vec::new();
    let mut rest = path;
    while let Some(at) = rest.find('%') {
        decoded.push_str(&rest[..at]);
        // Two hex digits, checked as such: `from_str_radix` also takes a sign (`%+f`).
        let escape = rest
            .get(at + 1..at + 3)
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) => {
                decoded.push(char::from(byte));
            }
            Some(byte) => decoded.push_str(&format!("%{byte:02X}")),
            None => {
                bare.push(decoded.len());
                decoded.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        }
        rest = &rest[at + 3..];
    }
    decoded.push_str(rest);
    let starts_escape = |at: usize| {
        decoded
            .as_bytes()
            .get(at + 1..at + 3)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    };
    if !bare.iter().any(|&at| starts_escape(at)) {
        return decoded;
    }
    let mut escaped = String::with_capacity(decoded.len() + 2 * bare.len());
    let mut from = 0;
    for at in bare.into_iter().filter(|&at| starts_escape(at)) {
        escaped.push_str(&decoded[from..=at]);
        escaped.push_str("25");
        from = at + 1;
    }
    escaped.push_str(&decoded[from..]);
    escaped
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
            // A bare `%` before what decodes to hex digits is written `%25` (found by the
            // fuzz target `path`: `%%36c` gave `%6c`, which normalizes to `l`).
            ("/%%36cogin", "/%256cogin"),
            ("/%3%36", "/%2536"),
            ("/%%zz", "/%%zz"),
            // A sign is no hex digit (found by the fuzz target: `%+f` was read as `%0F`).
            ("/%+f", "/%+f"),
            ("/%7%%664%4%+%666", "/%7%25f4%4%+f6"),
        ] {
            assert_eq!(normalized_path(target), path, "{target}");
            assert_eq!(normalized_path(path), path, "{path} is its own normal form");
        }
    }
}
