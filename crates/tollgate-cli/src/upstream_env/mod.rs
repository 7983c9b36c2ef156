//! envoyproxy/ratelimit's environment variables, translated into `serve`'s own `TOLLGATE_*`
//! settings before clap parses, so that a Deployment written for upstream starts tollgate
//! unchanged ("swap the image, keep the Deployment").
//!
//! Only the variables that are set are translated: an unset one keeps tollgate's default
//! (upstream's own defaults, a unix socket to a Redis proxy and statsd on, would break a plain
//! start). Precedence: a flag, then its `TOLLGATE_*` variable, then the upstream variable; a
//! `TOLLGATE_*` variable and an upstream one that disagree stop the start naming both, and so do
//! two upstream variables that contradict each other. Upstream variables tollgate does not know
//! are ignored; the known ones it cannot honour stop the start saying why. The table is in
//! `docs/migrating.md`.

mod apply;
mod env;
mod error;
mod redis;
mod rows;
mod values;

#[cfg(test)]
pub use apply::translate;
pub use apply::{Defaults, Translated, translate_with};
pub use env::Env;
pub use error::UpstreamEnvError;

/// `command` with each translated setting as the default of the `serve` flag that reads its
/// `TOLLGATE_*` variable: a flag given and its variable still come first, as clap reads them
/// before a default. (The process environment is not changed: that needs `unsafe`.)
pub fn onto(
    mut command: clap::Command,
    translated: &Translated,
) -> Result<clap::Command, UpstreamEnvError> {
    for setting in &translated.settings {
        let id = command
            .find_subcommand("serve")
            .and_then(|serve| {
                serve
                    .get_arguments()
                    .find(|arg| arg.get_env() == Some(std::ffi::OsStr::new(setting.target)))
            })
            .map(|arg| arg.get_id().clone());
        let Some(id) = id else {
            return Err(UpstreamEnvError::NoSuchSetting {
                from: setting.from.clone(),
                target: setting.target,
            });
        };
        // Once per start: the default must live as long as the command.
        let value: &'static str = Box::leak(setting.value.clone().into_boxed_str());
        // `--help` shows defaults; a store URL's may hold a password.
        let secret = setting.target == "TOLLGATE_STORE";
        command = command.mut_subcommand("serve", |serve| {
            serve.mut_arg(id, |arg| {
                arg.default_value(value)
                    .required(false)
                    .hide_default_value(secret)
            })
        });
    }
    Ok(command)
}

#[cfg(test)]
mod tests;
