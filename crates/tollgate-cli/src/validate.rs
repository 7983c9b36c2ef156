//! `tollgate validate PATH`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::stdout::out;
use clap::Args;
use tollgate::policy::{Policy, Rule};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Policy file, or a directory of `*.yaml` / `*.yml` files.
    path: PathBuf,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    match Policy::load(&args.path) {
        Ok(policy) => {
            out!("{}", summary(&policy));
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            crate::stdout::errln!("{errors}");
            crate::stdout::errln!(
                "{}: {} problem(s) found",
                args.path.display(),
                errors.0.len()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// One line per rule: domain, name, limit, flags, where it is defined.
pub fn summary(policy: &Policy) -> String {
    let mut out = format!(
        "{} domain(s), {} rule(s)\n",
        policy.domains().count(),
        policy.rules().len()
    );
    for rule in policy.rules() {
        out.push_str(&format!("  {}\n", describe(rule)));
    }
    out
}

fn describe(rule: &Rule) -> String {
    let limit = match &rule.limit {
        None => "unlimited".to_owned(),
        Some(p) if rule.blocked => format!("blocked (0 per {:?})", p.period()),
        Some(p) => {
            let burst = if p.algorithm().uses_burst() && p.burst() != p.limit() {
                format!(" burst {}", p.burst())
            } else {
                String::new()
            };
            format!(
                "{} {} per {:?}{burst}",
                p.algorithm(),
                p.limit(),
                p.period()
            )
        }
    };
    let mut flags = String::new();
    if rule.mode != tollgate::policy::RuleMode::Enforce {
        flags.push_str(&format!(" [{}]", rule.mode.name()));
    }
    if rule.limit.is_some_and(|p| p.charges_up_to_limit()) {
        flags.push_str(" [charges up to the limit]");
    }
    if !rule.replaces.is_empty() {
        flags.push_str(&format!(" [replaces {}]", rule.replaces.join(", ")));
    }
    format!(
        "{} / {}: {limit}{flags}  ({})",
        rule.domain, rule.name, rule.location
    )
}
