//! `--store` URLs: `memory`, `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS), and
//! `redis+cluster://host:port[,host:port...]` (or `rediss+cluster://`) for Redis Cluster.

use std::fmt;
use std::str::FromStr;

/// Where counters live, as given on the command line.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// The embedded in-memory store.
    Memory,
    /// One Redis server (`redis://` or `rediss://`).
    Redis(String),
    /// A Redis Cluster, given by one or more seed nodes as `redis://` / `rediss://` URLs.
    Cluster(Vec<String>),
}

impl StoreUrl {
    /// Whether the store is reached over TLS (`rediss://`).
    pub fn uses_tls(&self) -> bool {
        let tls = |url: &String| url.starts_with("rediss://");
        match self {
            StoreUrl::Memory => false,
            StoreUrl::Redis(url) => tls(url),
            StoreUrl::Cluster(seeds) => seeds.iter().any(tls),
        }
    }
}

/// A `--store` value that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid store URL `{url}`: {reason}")]
pub struct InvalidStoreUrl {
    url: String,
    reason: &'static str,
}

impl FromStr for StoreUrl {
    type Err = InvalidStoreUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason| InvalidStoreUrl {
            url: redact(s),
            reason,
        };
        if s == "memory" {
            return Ok(StoreUrl::Memory);
        }
        for (prefix, scheme) in [
            ("redis+cluster://", "redis"),
            ("rediss+cluster://", "rediss"),
        ] {
            if let Some(rest) = s.strip_prefix(prefix) {
                // Credentials, if any, apply to every seed node.
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((auth, hosts)) => (format!("{auth}@"), hosts),
                    None => (String::new(), rest),
                };
                let hosts = hosts.trim_end_matches('/');
                let seeds: Vec<String> = hosts
                    .split(',')
                    .map(|h| h.trim())
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{scheme}://{auth}{h}"))
                    .collect();
                if seeds.is_empty() {
                    return Err(invalid("a cluster URL needs at least one host:port"));
                }
                if hosts
                    .split(',')
                    .any(|h| !h.contains(':') || h.contains('/'))
                {
                    return Err(invalid(
                        "cluster seed nodes must be written host:port, comma-separated",
                    ));
                }
                return Ok(StoreUrl::Cluster(seeds));
            }
        }
        if s.starts_with("redis://") || s.starts_with("rediss://") {
            if s.contains(',') {
                return Err(invalid("several hosts need redis+cluster://"));
            }
            return Ok(StoreUrl::Redis(s.to_owned()));
        }
        Err(invalid(
            "expected memory, redis://, rediss:// or redis+cluster://",
        ))
    }
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        // Not a URL (a typo such as `redis//user:pass@host`): whatever comes before an `@`
        // may be credentials.
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let rest = &head[scheme_end + 3..];
    let mut out = match (rest.rfind('@'), rest.find(':')) {
        (Some(at), Some(colon)) if colon < at => {
            format!(
                "{}{}:***{}",
                &head[..scheme_end + 3],
                &rest[..colon],
                &rest[at..]
            )
        }
        _ => head.to_owned(),
    };
    // A password can come as a query parameter too (`?password=`).
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _))
                    if name.eq_ignore_ascii_case("password")
                        || name.eq_ignore_ascii_case("pass") =>
                {
                    format!("{name}=***")
                }
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory"),
            StoreUrl::Redis(url) => f.write_str(&redact(url)),
            StoreUrl::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| redact(s)).collect();
                write!(f, "cluster [{}]", seeds.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_is_told_by_the_scheme() {
        let tls = |url: &str| url.parse::<StoreUrl>().unwrap().uses_tls();
        assert!(tls("rediss://127.0.0.1:6379"));
        assert!(tls("rediss+cluster://a:1,b:2"));
        assert!(!tls("redis://127.0.0.1:6379"));
        assert!(!tls("redis+cluster://a:1,b:2"));
        assert!(!tls("memory"));
    }

    #[test]
    fn parses_every_form() {
        assert_eq!("memory".parse(), Ok(StoreUrl::Memory));
        assert_eq!(
            "redis://127.0.0.1:6379/2".parse(),
            Ok(StoreUrl::Redis("redis://127.0.0.1:6379/2".into()))
        );
        assert_eq!(
            "redis+cluster://u:p@a:1,b:2".parse(),
            Ok(StoreUrl::Cluster(vec![
                "redis://u:p@a:1".into(),
                "redis://u:p@b:2".into()
            ]))
        );
        assert_eq!(
            "rediss+cluster://a:1".parse(),
            Ok(StoreUrl::Cluster(vec!["rediss://a:1".into()]))
        );
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        for bad in [
            "",
            "redis",
            "http://x:1",
            "redis+cluster://",
            "redis+cluster://a",
            "redis://a:1,b:2",
        ] {
            assert!(bad.parse::<StoreUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        let url: StoreUrl = "redis+cluster://u:secret@a:1".parse().unwrap();
        assert!(!url.to_string().contains("secret"));
        let err = "redis://u:secret@a:1,b:2".parse::<StoreUrl>().unwrap_err();
        assert!(!err.to_string().contains("secret"));
        // In the query too, and an `@` there is no end of a password.
        assert_eq!(
            redact("redis://u:p@h:1/0?password=secret&protocol=resp3&tag=a@b"),
            "redis://u:***@h:1/0?password=***&protocol=resp3&tag=a@b"
        );
        assert_eq!(redact("redis://h:1?x=a@b"), "redis://h:1?x=a@b");
        // A mistyped scheme is no URL, but may still hold a password.
        let err = "redis//:secret@h:1".parse::<StoreUrl>().unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(redact("memory"), "memory");
    }
}
