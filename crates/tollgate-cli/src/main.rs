//! `tollgate`: the rate-limit decision service and its tools.

mod check;
mod serve;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: Envoy RLS v3 gRPC and the HTTP/JSON API.
    Serve(serve::ServeArgs),
    /// Ask a running server for a decision and print it.
    Check(check::CheckArgs),
    /// Check a policy file or directory; print every problem, or a summary of its rules.
    Validate(validate::ValidateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Check(args) => check::run(args),
        Command::Validate(args) => validate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
