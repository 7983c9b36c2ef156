//! `--store` URLs: `memory`, `redis://[user:pass@]host:port[/db]`, `rediss://...` (TLS), and
//! `redis+cluster://host:port[,host:port...]` (or `rediss+cluster://`) for Redis Cluster. A
//! build without the `redis` feature refuses the Redis forms with
//! [`InvalidStoreUrl::RedisNotBuilt`].

use std::fmt;
use std::str::FromStr;

/// Where counters live, as given on the command line. The Redis forms come with the `redis`
/// feature (hence `non_exhaustive`: a match elsewhere holds in every build).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// The embedded in-memory store.
    Memory,
    /// One Redis server (`redis://` or `rediss://`).
    #[cfg(feature = "redis")]
    Redis(String),
    /// A Redis Cluster, given by one or more seed nodes as `redis://` / `rediss://` URLs.
    #[cfg(feature = "redis")]
    Cluster(Vec<String>),
}

impl StoreUrl {
    /// Whether the store is reached over TLS (`rediss://`).
    pub fn uses_tls(&self) -> bool {
        match self {
            StoreUrl::Memory => false,
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => url.starts_with("rediss://"),
            #[cfg(feature = "redis")]
            StoreUrl::Cluster(seeds) => seeds.iter().any(|url| url.starts_with("rediss://")),
        }
    }
}

/// A `--store` value that cannot be used: not one of the accepted forms, or a Redis URL given
/// to a build without Redis. Each holds the URL with its password redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidStoreUrl {
    /// Not one of the accepted forms (`reason` says what is wrong).
    #[error("invalid store URL `{url}`: {reason}")]
    Malformed { url: String, reason: &'static str },
    /// A Redis or Redis Cluster URL, and tollgate was built without the `redis` feature (an
    /// embedded build on the memory store alone).
    #[error(
        "store URL `{url}` names Redis, but this tollgate was built without Redis support \
         (cargo feature `redis` of the tollgate crate)"
    )]
    RedisNotBuilt { url: String },
}

/// The schemes of the Redis forms: with or without the `redis` feature, a URL starting with
/// one is a Redis URL (read, or refused as such).
const REDIS_SCHEMES: [&str; 4] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
];

impl FromStr for StoreUrl {
    type Err = InvalidStoreUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "memory" {
            return Ok(StoreUrl::Memory);
        }
        if !REDIS_SCHEMES.iter().any(|scheme| s.starts_with(scheme)) {
            return Err(InvalidStoreUrl::Malformed {
                url: redact(s),
                reason: "expected memory, redis://, rediss:// or redis+cluster://",
            });
        }
        redis_url(s)
    }
}

/// A URL with one of [`REDIS_SCHEMES`], read.
#[cfg(feature = "redis")]
fn redis_url(s: &str) -> Result<StoreUrl, InvalidStoreUrl> {
    let invalid = |reason| InvalidStoreUrl::Malformed {
        url: redact(s),
        reason,
    };
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

/// A URL with one of [`REDIS_SCHEMES`], which this build cannot open.
#[cfg(not(feature = "redis"))]
fn redis_url(s: &str) -> Result<StoreUrl, InvalidStoreUrl> {
    Err(InvalidStoreUrl::RedisNotBuilt { url: redact(s) })
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
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => f.write_str(&redact(url)),
            #[cfg(feature = "redis")]
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
    fn memory_needs_no_feature() {
        assert_eq!("memory".parse(), Ok(StoreUrl::Memory));
        assert!(!StoreUrl::Memory.uses_tls());
        assert_eq!(StoreUrl::Memory.to_string(), "memory");
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
        // Not a Redis URL: malformed in every build, never "no Redis support".
        for bad in ["", "redis", "http://x:1", "redis//h:1", "memory://"] {
            assert!(
                matches!(
                    bad.parse::<StoreUrl>(),
                    Err(InvalidStoreUrl::Malformed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn without_redis_a_redis_url_says_so() {
        for url in [
            "redis://127.0.0.1:6379/2",
            "rediss://h:1",
            "redis+cluster://a:1,b:2",
            "rediss+cluster://a:1",
        ] {
            let err = url.parse::<StoreUrl>().unwrap_err();
            assert_eq!(err, InvalidStoreUrl::RedisNotBuilt { url: url.into() });
            assert!(err.to_string().contains("without Redis support"), "{err}");
        }
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        // Refused, whether for its two hosts or for a build without Redis.
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

    /// The Redis forms, read (the `redis` feature).
    #[cfg(feature = "redis")]
    mod redis {
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
        fn malformed_redis_urls_are_malformed_not_missing() {
            for bad in ["redis+cluster://", "redis+cluster://a", "redis://a:1,b:2"] {
                assert!(
                    matches!(
                        bad.parse::<StoreUrl>(),
                        Err(InvalidStoreUrl::Malformed { .. })
                    ),
                    "{bad}"
                );
            }
        }

        #[test]
        fn passwords_never_reach_logs() {
            let url: StoreUrl = "redis+cluster://u:secret@a:1".parse().unwrap();
            assert!(!url.to_string().contains("secret"));
            let url: StoreUrl = "redis://u:secret@a:1".parse().unwrap();
            assert!(!url.to_string().contains("secret"));
        }
    }
}
