//! What the two remote clients share: the caller's [`Posture`] when the service cannot be
//! asked, the headers they copy from its answer, and the checks of a service URL and of a
//! request before it is sent.

use tollgate::limiter::{CheckRequest, headers};

use crate::backend::{BackendError, Outcome, Verdict};

/// What the caller answers when the service cannot be asked (unreachable, slower than the
/// timeout, answering a status other than `200`, `429`, `503` or `400`, or a body that is not
/// JSON). This is the caller's posture
/// about the *service*; the service's own `on_store_error` postures still apply to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Posture {
    /// Allow, marked `X-Tollgate-Degraded: open`.
    #[default]
    Open,
    /// Deny as unavailable (`503`, `Retry-After: 1`, `X-Tollgate-Degraded: closed`).
    Closed,
}

/// Headers copied from the service's answer onto the verdict.
pub(crate) const FORWARDED: [&str; 8] = [
    headers::DEGRADED,
    headers::SOFT_EXCEEDED,
    headers::LIMIT,
    headers::REMAINING,
    headers::RESET,
    headers::POLICY,
    headers::RATELIMIT,
    headers::RETRY_AFTER,
];

/// `url` with its scheme in lower case, and whether that is `https`; refused unless `url` is
/// an absolute `http://` or `https://` URL with a host (`127.0.0.1:8080` without a scheme, a
/// typo) rather than a client whose every decision falls to its posture.
pub(crate) fn service_url(url: &str) -> Result<(String, bool), BackendError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| BackendError::Invalid(format!("`{url}` is not a service URL: {e}")))?;
    let https = match parsed.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(BackendError::Invalid(format!(
                "`{url}`: a service URL starts with http:// or https://, not {other}:"
            )));
        }
    };
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(BackendError::Invalid(format!("`{url}` names no host")));
    }
    // The scheme parsed, so `url` holds "://" after it.
    let rest = url.find("://").map_or("", |at| &url[at..]);
    Ok((format!("{}{rest}", parsed.scheme()), https))
}

/// The binding limit's name, as the service put it in `RateLimit-Policy` (`"name";q=..;w=..`,
/// an RFC 8941 string): the same limit the other forwarded headers describe, the denial that
/// lasts longest or the least remaining quota, which the statuses alone do not say.
pub(crate) fn binding_name(forwarded: &[(&'static str, String)]) -> Option<String> {
    let (_, policy) = forwarded
        .iter()
        .find(|(name, _)| *name == headers::POLICY)?;
    let mut chars = policy.strip_prefix('"')?.chars();
    let mut name = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(name),
            '\\' => name.push(chars.next()?),
            c => name.push(c),
        }
    }
}

/// The verdict a caller-side `posture` gives when the service cannot be asked.
pub(crate) fn fallback(posture: Posture) -> Verdict {
    match posture {
        Posture::Open => Verdict {
            outcome: Outcome::Allowed,
            headers: vec![(headers::DEGRADED, "open".to_owned())],
            limit_name: None,
        },
        Posture::Closed => Verdict {
            outcome: Outcome::Unavailable,
            headers: vec![
                (headers::DEGRADED, "closed".to_owned()),
                (headers::RETRY_AFTER, "1".to_owned()),
            ],
            limit_name: None,
        },
    }
}

/// Refuses a request a remote client cannot send: limit overrides stay in-process.
pub(crate) fn refuse_limit_overrides(request: &CheckRequest) -> Result<(), BackendError> {
    if request
        .descriptors()
        .iter()
        .any(|d| d.limit_override().is_some())
    {
        return Err(BackendError::Invalid(
            "limit overrides are not sent by the remote client".to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_name_is_read_from_rate_limit_policy() {
        let forwarded = |policy: &str| {
            vec![
                (headers::LIMIT, "10".to_owned()),
                (headers::POLICY, policy.to_owned()),
            ]
        };
        let name = |policy: &str| binding_name(&forwarded(policy));
        assert_eq!(
            name(r#""per_tenant_day";q=10;w=86400"#).as_deref(),
            Some("per_tenant_day")
        );
        assert_eq!(
            name(r#""a \"quoted\" \\ name";q=1;w=1"#).as_deref(),
            Some(r#"a "quoted" \ name"#)
        );
        assert_eq!(name("unquoted;q=1;w=1"), None);
        assert_eq!(name(r#""cut"#), None);
        assert_eq!(binding_name(&[(headers::LIMIT, "10".to_owned())]), None);
    }

    /// A service URL without an http(s) scheme or a host is refused at construction: accepted,
    /// every decision fell to the posture, looking like an outage. The scheme is read in any case.
    #[test]
    fn service_urls_are_checked_and_their_scheme_read_in_any_case() {
        for bad in [
            "127.0.0.1:8080",
            "http://[::1",
            "ftp://h:1",
            "not a url",
            "http://",
        ] {
            assert!(service_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            service_url("HTTPS://h:1/x").unwrap(),
            ("https://h:1/x".to_owned(), true)
        );
        assert_eq!(
            service_url("http://h:1").unwrap(),
            ("http://h:1".to_owned(), false)
        );
    }
}
