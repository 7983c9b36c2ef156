//! `REDIS_URL` and its companions as one `--store` URL.

use super::values::boolean;
use super::{Env, UpstreamEnvError};

const URL: &str = "REDIS_URL";
const SOCKET: &str = "REDIS_SOCKET_TYPE";
const TYPE: &str = "REDIS_TYPE";
const AUTH: &str = "REDIS_AUTH";
const TLS: &str = "REDIS_TLS";

/// What `REDIS_TLS=true` may come with that tollgate's Redis client cannot do: it verifies the
/// server against the public web roots, by name, and presents no certificate of its own.
pub const TLS_UNSUPPORTED: [&str; 4] = [
    "REDIS_TLS_CACERT",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
];

fn conflict(first: String, second: String, why: &str) -> UpstreamEnvError {
    UpstreamEnvError::Conflict {
        first,
        second,
        why: why.to_owned(),
    }
}

fn shown(var: &str, value: &str) -> String {
    format!("{var}={}", tollgate::store::redact(value))
}

/// The store URL the Redis variables describe; `None` without `REDIS_URL` (tollgate's default
/// store stays).
pub fn store(env: &dyn Env) -> Result<Option<String>, UpstreamEnvError> {
    let Some(url) = env.get(URL) else {
        return Ok(None);
    };
    let url = url.trim().to_owned();
    let socket = env.get(SOCKET);
    match socket.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("tcp") => {
            if url.starts_with('/') {
                return Err(conflict(
                    shown(SOCKET, socket.as_deref().unwrap_or("tcp (unset)")),
                    shown(URL, &url),
                    "a TCP socket type with a unix socket path",
                ));
            }
        }
        Some("unix") if url.starts_with('/') || !url.contains(':') => {
            return Err(UpstreamEnvError::Unhonourable {
                var: SOCKET,
                value: "unix".to_owned(),
                why: "tollgate reaches Redis over TCP only; give REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port",
            });
        }
        Some("unix") => {
            return Err(conflict(
                shown(SOCKET, "unix"),
                shown(URL, &url),
                "a unix socket type with a TCP address",
            ));
        }
        Some(_) => {
            return Err(UpstreamEnvError::Invalid {
                var: SOCKET,
                value: socket.unwrap_or_default(),
                why: "not a socket type (tcp or unix)".to_owned(),
            });
        }
    }
    let cluster = match env.get(TYPE).map(|t| t.to_ascii_lowercase()).as_deref() {
        None | Some("single") => false,
        Some("cluster") => true,
        Some("sentinel") => {
            return Err(UpstreamEnvError::Unhonourable {
                var: TYPE,
                value: env.get(TYPE).unwrap_or_default(),
                why: "Redis Sentinel is not supported; give the master's host:port (REDIS_TYPE=single) or a Redis Cluster (REDIS_TYPE=cluster)",
            });
        }
        Some(_) => {
            return Err(UpstreamEnvError::Invalid {
                var: TYPE,
                value: env.get(TYPE).unwrap_or_default(),
                why: "not a Redis type (single, cluster or sentinel)".to_owned(),
            });
        }
    };
    let tls = env.get(TLS).map(|v| boolean(TLS, &v)).transpose()?;
    if tls == Some(true) {
        for var in TLS_UNSUPPORTED {
            let Some(value) = env.get(var) else { continue };
            let skipped = var != "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" || boolean(var, &value)?;
            if skipped {
                return Err(UpstreamEnvError::Unhonourable {
                    var,
                    value,
                    why: "tollgate's Redis TLS verifies the server by name against the public web roots and presents no client certificate",
                });
            }
        }
    }
    let auth = env.get(AUTH);
    // A full URL keeps its own scheme and credentials; the separate variables must agree.
    let (scheme_tls, rest) = if let Some(rest) = url.strip_prefix("rediss://") {
        (Some(true), rest)
    } else if let Some(rest) = url.strip_prefix("redis://") {
        (Some(false), rest)
    } else if url.contains("://") {
        return Err(UpstreamEnvError::Invalid {
            var: URL,
            value: tollgate::store::redact(&url),
            why: "expected host:port, redis://... or rediss://...".to_owned(),
        });
    } else {
        (None, url.as_str())
    };
    if let (Some(scheme), Some(tls)) = (scheme_tls, tls)
        && scheme != tls
    {
        return Err(conflict(
            format!("{TLS}={tls}"),
            shown(URL, &url),
            "the URL's scheme says otherwise about TLS",
        ));
    }
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo.to_owned()), hosts),
        None => (None, rest),
    };
    let userinfo = match (userinfo, auth) {
        (Some(_), Some(_)) => {
            return Err(conflict(
                shown(URL, &url),
                format!("{AUTH}=***"),
                "both give credentials; keep one",
            ));
        }
        (Some(given), None) => Some(given),
        (None, Some(auth)) => Some(credentials(&auth)),
        (None, None) => None,
    };
    let tls = scheme_tls.or(tls).unwrap_or(false);
    let scheme = match (cluster, tls) {
        (false, false) => "redis",
        (false, true) => "rediss",
        (true, false) => "redis+cluster",
        (true, true) => "rediss+cluster",
    };
    if !cluster && hosts.contains(',') {
        return Err(UpstreamEnvError::Invalid {
            var: URL,
            value: tollgate::store::redact(&url),
            why: "several hosts need REDIS_TYPE=cluster".to_owned(),
        });
    }
    let hosts = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    Ok(Some(match userinfo {
        Some(userinfo) => format!("{scheme}://{userinfo}@{hosts}"),
        None => format!("{scheme}://{hosts}"),
    }))
}

/// `REDIS_AUTH` (`password` or `username:password`) as a URL's userinfo, percent-encoded.
fn credentials(auth: &str) -> String {
    match auth.split_once(':') {
        Some((user, password)) => format!("{}:{}", encode(user), encode(password)),
        None => format!(":{}", encode(auth)),
    }
}

fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
