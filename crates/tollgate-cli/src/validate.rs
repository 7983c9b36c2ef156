//! `tollgate validate PATH`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::stdout::out;
use clap::Args;
use tollgate::policy::{ChargeMode, Policy, PolicyDefaults, Rule};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Policy file, or a directory of `*.yaml` / `*.yml` files.
    path: PathBuf,
    /// `charge` of rules that do not set one, as `serve --default-charge` gives it: whole or
    /// up_to_limit.
    #[arg(
        long,
        default_value = "whole",
        value_name = "CHARGE",
        env = "TOLLGATE_DEFAULT_CHARGE"
    )]
    default_charge: ChargeMode,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let defaults = PolicyDefaults {
        charge: args.default_charge,
    };
    match Policy::load_with(&args.path, defaults) {
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
    if rule.quota_mode {
        flags.push_str(" [quota mode]");
    }
    if !rule.replaces.is_empty() {
        flags.push_str(&format!(" [replaces {}]", rule.replaces.join(", ")));
    }
    format!(
        "{} / {}: {limit}{flags}  ({})",
        rule.domain, rule.name, rule.location
    )
}
