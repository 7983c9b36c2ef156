//! The translation: upstream's environment in, the `TOLLGATE_*` settings it gives out.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use super::rows::{ALWAYS, Refused, Row, UNHONOURABLE, XDS, XDS_TLS};
use super::values::{address, boolean};
use super::{Env, UpstreamEnvError, redis};

/// A `TOLLGATE_*` setting the upstream environment gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The `TOLLGATE_*` variable.
    pub target: &'static str,
    /// Its value, as `serve` reads it.
    pub value: String,
    /// The upstream variables it comes from, for messages (`PORT=8080`; no secret shown).
    pub from: String,
}

/// The settings to apply: those whose `TOLLGATE_*` variable is unset (the others agree).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Translated {
    pub settings: Vec<Setting>,
}

/// Upstream's defaults for what tollgate has no default of its own.
const RUNTIME_ROOT_DEFAULT: &str = "/srv/runtime_data/current";
const RUNTIME_APPDIRECTORY_DEFAULT: &str = "config";
const XDS_SERVER_URL_DEFAULT: &str = "localhost:18000";

/// The binary name under which upstream's defaults apply.
const UPSTREAM: &str = "ratelimit";

/// Whose defaults fill in a listener address upstream's variables leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defaults {
    /// `tollgate serve`: loopback, and only the listeners a variable names.
    Tollgate,
    /// Run as `ratelimit` (upstream's binary name, as Envoy Gateway's Deployment does): every
    /// interface, and upstream's three listeners (HTTP 8080, gRPC 8081, debug 6070) whether a
    /// variable names them or not.
    Upstream,
}

/// Translates upstream's environment. Fails on a known variable tollgate cannot honour, on a
/// malformed value, and on two variables (upstream's, or upstream's and a `TOLLGATE_*` one)
/// that disagree. (`serve` calls [`translate_with`], saying whose listener defaults apply.)
#[cfg(test)]
pub fn translate(env: &dyn Env) -> Result<Translated, UpstreamEnvError> {
    translate_with(env, Defaults::Tollgate)
}

/// [`translate`], with `defaults` for the listener addresses.
pub fn translate_with(env: &dyn Env, defaults: Defaults) -> Result<Translated, UpstreamEnvError> {
    refuse_unhonourable(env)?;
    let mut out = Vec::new();
    // Upstream's defaults as `ratelimit`: they give way to a `TOLLGATE_*` variable, no conflict.
    let mut fallbacks = Vec::new();
    for row in ALWAYS {
        one(env, row, &mut out)?;
    }
    listeners(env, defaults, &mut out, &mut fallbacks)?;
    if let Some(url) = redis::store(env)? {
        let from = [
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS",
        ]
        .into_iter()
        .filter(|var| env.get(var).is_some())
        .collect::<Vec<_>>()
        .join(", ");
        out.push(Setting {
            target: "TOLLGATE_STORE",
            value: url,
            from,
        });
    }
    grpc_tls(env, &mut out)?;
    prometheus(env, defaults, &mut out)?;
    config_source(env, &mut out)?;
    for setting in &out {
        if let Some(own) = env.get(setting.target)
            && !agree(&own, &setting.value)
        {
            let own = if setting.target == "TOLLGATE_STORE" {
                tollgate::store::redact(&own)
            } else {
                own
            };
            return Err(UpstreamEnvError::Conflict {
                first: format!("{}={own}", setting.target),
                second: setting.from.clone(),
                why: format!(
                    "the upstream variable means {}; unset one of them",
                    shown(setting)
                ),
            });
        }
    }
    out.extend(fallbacks);
    out.retain(|setting| env.get(setting.target).is_none());
    Ok(Translated { settings: out })
}

fn shown(setting: &Setting) -> String {
    let value = if setting.target == "TOLLGATE_STORE" {
        tollgate::store::redact(&setting.value)
    } else {
        setting.value.clone()
    };
    format!("{}={value}", setting.target)
}

/// Whether a `TOLLGATE_*` value says what the translated one says.
fn agree(own: &str, translated: &str) -> bool {
    if own == translated {
        return true;
    }
    if let (Ok(a), Ok(b)) = (own.parse::<SocketAddr>(), translated.parse::<SocketAddr>()) {
        return a == b;
    }
    if matches!(translated, "true" | "false") {
        // clap's reading of a switch's variable: these are false, anything else true.
        let falsey =
            ["n", "no", "f", "false", "off", "0"].contains(&own.to_ascii_lowercase().as_str());
        return (translated == "true") != falsey;
    }
    own.eq_ignore_ascii_case(translated)
}

fn refuse_unhonourable(env: &dyn Env) -> Result<(), UpstreamEnvError> {
    for known in UNHONOURABLE {
        let Some(value) = env.get(known.var) else {
            continue;
        };
        let refused = match known.refused {
            Refused::True => boolean(known.var, &value)?,
            Refused::Set => true,
            Refused::Not(accepted) => !value.eq_ignore_ascii_case(accepted),
        };
        if refused {
            return Err(UpstreamEnvError::Unhonourable {
                var: known.var,
                value,
                why: known.why,
            });
        }
    }
    Ok(())
}

fn one(env: &dyn Env, row: &Row, out: &mut Vec<Setting>) -> Result<(), UpstreamEnvError> {
    if let Some(value) = env.get(row.upstream) {
        out.push(Setting {
            target: row.target,
            value: (row.convert)(row.upstream, &value)?,
            from: format!("{}={value}", row.upstream),
        });
    }
    Ok(())
}

/// The unspecified address a listener binds to when no variable names its host.
fn default_ip(defaults: Defaults) -> Ipv4Addr {
    match defaults {
        Defaults::Tollgate => Ipv4Addr::LOCALHOST,
        Defaults::Upstream => Ipv4Addr::UNSPECIFIED,
    }
}

fn listeners(
    env: &dyn Env,
    defaults: Defaults,
    out: &mut Vec<Setting>,
    fallbacks: &mut Vec<Setting>,
) -> Result<(), UpstreamEnvError> {
    // Upstream's ports; the host is loopback for `tollgate serve`, every interface as `ratelimit`.
    for (host, port, target, default_port) in [
        ("HOST", "PORT", "TOLLGATE_HTTP_ADDR", 8080),
        ("GRPC_HOST", "GRPC_PORT", "TOLLGATE_GRPC_ADDR", 8081),
        ("DEBUG_HOST", "DEBUG_PORT", "TOLLGATE_DEBUG_ADDR", 6070),
    ] {
        let default = SocketAddr::from((default_ip(defaults), default_port));
        let given = address((host, env.get(host)), (port, env.get(port)), default)?;
        let from = [host, port]
            .into_iter()
            .filter_map(|var| env.get(var).map(|v| format!("{var}={v}")))
            .collect::<Vec<_>>()
            .join(", ");
        match (given, defaults) {
            (Some(value), _) => out.push(Setting {
                target,
                value,
                from,
            }),
            (None, Defaults::Upstream) => fallbacks.push(Setting {
                target,
                value: default.to_string(),
                from: format!("{host} and {port} unset: upstream's default as {UPSTREAM}"),
            }),
            (None, Defaults::Tollgate) => {}
        }
    }
    Ok(())
}

/// `USE_PROMETHEUS=true` with `PROMETHEUS_ADDR` (`[HOST]:PORT`, Go's form: an empty host is
/// the default one): a listener of its own serving `/metrics`, as upstream's. Without the
/// address, `/metrics` stays on the HTTP port only.
fn prometheus(
    env: &dyn Env,
    defaults: Defaults,
    out: &mut Vec<Setting>,
) -> Result<(), UpstreamEnvError> {
    let Some(on) = env.get("USE_PROMETHEUS") else {
        return Ok(());
    };
    if !boolean("USE_PROMETHEUS", &on)? {
        return Ok(());
    }
    let Some(addr) = env.get("PROMETHEUS_ADDR") else {
        return Ok(());
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(UpstreamEnvError::Invalid {
            var: "PROMETHEUS_ADDR",
            value: addr,
            why: "not [HOST]:PORT".to_owned(),
        });
    };
    let host = (!host.is_empty()).then(|| host.to_owned());
    let default = SocketAddr::from((default_ip(defaults), 9090));
    let value = address(
        ("PROMETHEUS_ADDR", host),
        ("PROMETHEUS_ADDR", Some(port.to_owned())),
        default,
    )?
    .unwrap_or_else(|| default.to_string());
    out.push(Setting {
        target: "TOLLGATE_METRICS_ADDR",
        value,
        from: format!("USE_PROMETHEUS={on}, PROMETHEUS_ADDR={addr}"),
    });
    Ok(())
}

fn grpc_tls(env: &dyn Env, out: &mut Vec<Setting>) -> Result<(), UpstreamEnvError> {
    let Some(on) = env.get("GRPC_SERVER_USE_TLS") else {
        return Ok(());
    };
    if !boolean("GRPC_SERVER_USE_TLS", &on)? {
        return Ok(());
    }
    for (var, target) in [
        ("GRPC_SERVER_TLS_CERT", "TOLLGATE_GRPC_TLS_CERT"),
        ("GRPC_SERVER_TLS_KEY", "TOLLGATE_GRPC_TLS_KEY"),
    ] {
        let Some(path) = env.get(var) else {
            return Err(UpstreamEnvError::Invalid {
                var: "GRPC_SERVER_USE_TLS",
                value: on,
                why: format!("needs {var}"),
            });
        };
        out.push(Setting {
            target,
            value: path.clone(),
            from: format!("{var}={path}"),
        });
    }
    // Upstream reads GRPC_CLIENT_TLS_CACERT; Envoy Gateway's Deployment sets
    // GRPC_SERVER_TLS_CA_CERT. Either asks for client certificates.
    let upstream = env.get("GRPC_CLIENT_TLS_CACERT");
    let gateway = env.get("GRPC_SERVER_TLS_CA_CERT");
    let ca = match (upstream, gateway) {
        (Some(a), Some(b)) if a != b => {
            return Err(UpstreamEnvError::Conflict {
                first: format!("GRPC_CLIENT_TLS_CACERT={a}"),
                second: format!("GRPC_SERVER_TLS_CA_CERT={b}"),
                why: "two client CA files; give one".to_owned(),
            });
        }
        (Some(a), _) => Some(("GRPC_CLIENT_TLS_CACERT", a)),
        (None, Some(b)) => Some(("GRPC_SERVER_TLS_CA_CERT", b)),
        (None, None) => None,
    };
    if let Some((var, path)) = ca {
        if let Some(san) = env.get("GRPC_CLIENT_TLS_SAN") {
            return Err(UpstreamEnvError::Unhonourable {
                var: "GRPC_CLIENT_TLS_SAN",
                value: san,
                why: "tollgate checks that a client certificate is signed by the CA, not its SAN",
            });
        }
        out.push(Setting {
            target: "TOLLGATE_GRPC_TLS_CLIENT_CA",
            value: path.clone(),
            from: format!("{var}={path}"),
        });
    }
    Ok(())
}

fn config_source(env: &dyn Env, out: &mut Vec<Setting>) -> Result<(), UpstreamEnvError> {
    let kind = env.get("CONFIG_TYPE");
    match kind.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("FILE") => runtime(env, out),
        Some("GRPC_XDS_SOTW") => {
            let server = env
                .get("CONFIG_GRPC_XDS_SERVER_URL")
                .unwrap_or_else(|| XDS_SERVER_URL_DEFAULT.to_owned());
            out.push(Setting {
                target: "TOLLGATE_CONFIG_SOURCE",
                value: format!("xds://{server}"),
                from: format!("CONFIG_TYPE=GRPC_XDS_SOTW, CONFIG_GRPC_XDS_SERVER_URL={server}"),
            });
            for row in XDS {
                one(env, row, out)?;
            }
            let tls = env.get("CONFIG_GRPC_XDS_SERVER_USE_TLS");
            if let Some(tls) = tls
                && boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", &tls)?
            {
                out.push(Setting {
                    target: "TOLLGATE_XDS_TLS",
                    value: "true".to_owned(),
                    from: format!("CONFIG_GRPC_XDS_SERVER_USE_TLS={tls}"),
                });
                for row in XDS_TLS {
                    one(env, row, out)?;
                }
            }
            Ok(())
        }
        Some(_) => Err(UpstreamEnvError::Invalid {
            var: "CONFIG_TYPE",
            value: kind.unwrap_or_default(),
            why: "not a config type (FILE or GRPC_XDS_SOTW)".to_owned(),
        }),
    }
}

/// `RUNTIME_*`: the policy directory `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
/// tollgate's watcher reads it through `RUNTIME_ROOT` every `--watch-interval`, so both of
/// upstream's reload triggers work whatever `RUNTIME_WATCH_ROOT` says: a swap of the
/// `RUNTIME_ROOT` symlink and a change of the files themselves.
fn runtime(env: &dyn Env, out: &mut Vec<Setting>) -> Result<(), UpstreamEnvError> {
    for var in ["RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"] {
        if let Some(value) = env.get(var) {
            boolean(var, &value)?;
        }
    }
    let vars = [
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
    ];
    if vars.iter().all(|var| env.get(var).is_none()) {
        return Ok(());
    }
    let mut path = PathBuf::from(
        env.get("RUNTIME_ROOT")
            .unwrap_or_else(|| RUNTIME_ROOT_DEFAULT.to_owned()),
    );
    if let Some(sub) = env.get("RUNTIME_SUBDIRECTORY") {
        path.push(sub);
    }
    path.push(
        env.get("RUNTIME_APPDIRECTORY")
            .unwrap_or_else(|| RUNTIME_APPDIRECTORY_DEFAULT.to_owned()),
    );
    let from = vars
        .into_iter()
        .filter_map(|var| env.get(var).map(|v| format!("{var}={v}")))
        .collect::<Vec<_>>()
        .join(", ");
    out.push(Setting {
        target: "TOLLGATE_CONFIG",
        value: path.display().to_string(),
        from,
    });
    Ok(())
}
