//! `tollgate`: the rate-limit decision service and its tools.

mod admin_client;
mod arg_values;
mod bench;
mod bench_server;
mod check;
mod grpc_limits;
mod grpc_tls;
mod policy;
mod serve;
mod serve_args;
mod stdout;
mod top;
mod upstream_env;
mod validate;
mod xds_args;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A standalone rate-limit decision service"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Every command with a number takes negative ones as values (`--hits -5`), so that the
// option's own parser says what is wrong with them, not clap's "unexpected argument" (the
// setting is per command: `policy`'s subcommands have it too).
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: Envoy RLS v3 gRPC and the HTTP/JSON API.
    #[command(allow_negative_numbers = true)]
    Serve(Box<serve_args::ServeArgs>),
    /// Ask a running server for a decision and print it.
    #[command(allow_negative_numbers = true)]
    Check(check::CheckArgs),
    /// Check a policy file or directory; print every problem, or a summary of its rules.
    #[command(allow_negative_numbers = true)]
    Validate(validate::ValidateArgs),
    /// Manage a running server's policy: push (or shadow), list, show, diff, rollback,
    /// reload, promote, candidate.
    #[command(allow_negative_numbers = true)]
    Policy(policy::PolicyArgs),
    /// Show the keys a rule denied most often on a running server.
    #[command(allow_negative_numbers = true)]
    Top(top::TopArgs),
    /// Load a rate-limit server (tollgate or any Envoy RLS v3 server) and report throughput,
    /// latency and outcomes; bounded in time, loopback targets only by default.
    #[command(allow_negative_numbers = true)]
    Bench(Box<bench::BenchArgs>),
    /// A no-op Envoy RLS v3 / HTTP server that allows every valid request and counts nothing:
    /// the ceiling `tollgate bench` measures `serve` against. A benchmarking aid, never for
    /// production.
    #[command(allow_negative_numbers = true)]
    BenchServer(bench_server::BenchServerArgs),
}

/// The file name envoyproxy/ratelimit's image runs (`/bin/ratelimit`, Envoy Gateway's
/// Deployment's command): the binary under that name is `tollgate serve` with upstream's
/// listener defaults.
const UPSTREAM_NAME: &str = "ratelimit";

/// The arguments clap reads, and whose listener defaults apply: run as `ratelimit`, the
/// binary is `tollgate serve` and every argument after the name is serve's.
fn arguments() -> (Vec<std::ffi::OsString>, Option<upstream_env::Defaults>) {
    let mut args: Vec<_> = std::env::args_os().collect();
    let as_upstream = args
        .first()
        .and_then(|name| std::path::Path::new(name).file_name())
        .is_some_and(|name| name == UPSTREAM_NAME);
    if as_upstream {
        args.splice(0..1, ["tollgate".into(), "serve".into()]);
        return (args, Some(upstream_env::Defaults::Upstream));
    }
    let serve = args.get(1).is_some_and(|arg| arg == "serve");
    (args, serve.then_some(upstream_env::Defaults::Tollgate))
}

fn main() -> ExitCode {
    let mut command = Cli::command();
    let (args, defaults) = arguments();
    // `serve` also reads envoyproxy/ratelimit's environment variables (see `upstream_env`).
    if let Some(defaults) = defaults {
        let env = |name: &str| std::env::var(name).ok();
        match upstream_env::translate_with(&env, defaults)
            .and_then(|t| upstream_env::onto(command, &t))
        {
            Ok(with_upstream) => command = with_upstream,
            Err(e) => {
                crate::stdout::errln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let cli = match Cli::from_arg_matches_mut(&mut command.get_matches_from(args)) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut Cli::command()).exit(),
    };
    let json_logs = matches!(&cli.command, Command::Serve(args) if args.logs_json());
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Check(args) => check::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Policy(args) => policy::run(args),
        Command::Top(args) => top::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::BenchServer(args) => bench_server::run(args),
    };
    match result {
        Ok(code) => code,
        // Under `--log-format json` every line on stderr is a JSON object, the last one too.
        Err(e) if json_logs => {
            tracing::error!(error = %format_args!("{e:#}"), "Stopped");
            ExitCode::from(2)
        }
        Err(e) => {
            crate::stdout::errln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
