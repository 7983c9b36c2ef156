//! Turns parsed policy files into lookup tables and rules, collecting every problem with its
//! location instead of stopping at the first one.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use serde_saphyr::{MessageFormatter, Spanned, UserMessageFormatter};

use super::document::{DescriptorDoc, DomainDoc, RateLimitDoc, ReplacesDoc};
use super::identity::{self, PathStep};
use super::rule::PolicyDefaults;
use super::snapshot::DomainTable;
use super::tree::{Level, MAX_WILDCARDS_PER_LEVEL, Node, ValueMatch};
use super::{Location, MAX_FIELD_LEN, Policy, PolicyError, PolicyErrors, Rule};

mod rule_fields;

/// Why a domain, key or value with control or bidirectional characters is refused (their text
/// is shown before it).
const GARBLES: &str =
    "holds control or bidirectional characters, which would garble logs, metrics and terminals";

/// Accumulates sources (one domain each) into one policy.
#[derive(Debug, Default)]
pub(super) struct Compiler {
    /// What a rule that leaves a setting out gets.
    pub defaults: PolicyDefaults,
    rules: Vec<Arc<Rule>>,
    domains: Vec<DomainTable>,
    /// Where each registered domain was defined, to name both files on a duplicate.
    domain_origins: HashMap<String, Option<Location>>,
    errors: Vec<PolicyError>,
}

impl Compiler {
    /// Parses and validates one file's text. A YAML or structural error stops this file only.
    pub fn add_source(&mut self, file: &str, text: &str) {
        let doc: Spanned<DomainDoc> = match serde_saphyr::from_str(text) {
            Ok(doc) => doc,
            Err(error) => {
                self.errors.push(yaml_error(file, &error));
                return;
            }
        };
        let mut source = SourceCompiler {
            file,
            domain: "",
            defaults: self.defaults,
            errors: Vec::new(),
            named: Vec::new(),
        };
        let root_location = source.location(&doc.referenced);
        let domain = match &doc.value.domain {
            None => {
                source.error(root_location, "missing `domain`");
                None
            }
            Some(domain) if domain.value.is_empty() => {
                source.error(source.location(&domain.referenced), "empty `domain`");
                None
            }
            Some(domain) if domain.value.len() > MAX_FIELD_LEN => {
                source.error(
                    source.location(&domain.referenced),
                    format!(
                        "`domain` is longer than {MAX_FIELD_LEN} bytes: no request could name it"
                    ),
                );
                None
            }
            Some(domain) if super::garbles(&domain.value) => {
                source.error(
                    source.location(&domain.referenced),
                    format!("`domain` {:?} {GARBLES}", domain.value),
                );
                None
            }
            Some(domain) => Some((domain.value.as_str(), source.location(&domain.referenced))),
        };
        source.domain = domain.as_ref().map_or("", |(name, _)| name);

        let mut root = Level::default();
        let mut path = Vec::new();
        let descriptors = doc.value.descriptors.as_deref().unwrap_or_default();
        source.descriptors(&mut self.rules, &mut root, &mut path, descriptors);
        source.check_names();

        if let Some((name, location)) = domain {
            match self.domain_origins.entry(name.to_owned()) {
                Entry::Occupied(first) => {
                    let first = first
                        .get()
                        .as_ref()
                        .map_or_else(|| "another file".to_owned(), ToString::to_string);
                    source.error(
                        location,
                        format!("domain `{name}` is already defined at {first}"),
                    );
                }
                Entry::Vacant(slot) => {
                    slot.insert(location);
                    self.domains.push(DomainTable {
                        name: name.to_owned(),
                        root,
                    });
                }
            }
        }

        let mut errors = source.errors;
        errors.sort_by_key(|e| e.location.as_ref().map(|l| (l.line, l.column)));
        self.errors.extend(errors);
    }

    /// The policy, or every problem found in every source.
    pub fn finish(self) -> Result<Policy, PolicyErrors> {
        if !self.errors.is_empty() {
            return Err(PolicyErrors(self.errors));
        }
        Ok(Policy::new(self.rules, self.domains))
    }
}

/// The message of a serde-saphyr error without its snippet or location suffix.
fn yaml_error(file: &str, error: &serde_saphyr::Error) -> PolicyError {
    let mut inner = error;
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = inner
    {
        inner = error;
    }
    let message = UserMessageFormatter.format_message(inner);
    let location = error.location().and_then(|l| Location::from_yaml(file, &l));
    PolicyError::new(location, message)
}

/// A rule's name and `replaces`, checked once the whole domain is known.
struct NamedRule {
    name: String,
    /// Given with `name`, rather than derived from the descriptor path.
    explicit: bool,
    /// The explicit `name`, or the `rate_limit` block for a derived name.
    name_location: Option<Location>,
    replaces: Vec<(String, Option<Location>)>,
}

/// State while compiling one source (one domain).
struct SourceCompiler<'f> {
    file: &'f str,
    domain: &'f str,
    defaults: PolicyDefaults,
    errors: Vec<PolicyError>,
    named: Vec<NamedRule>,
}

impl<'f> SourceCompiler<'f> {
    fn location(&self, location: &serde_saphyr::Location) -> Option<Location> {
        Location::from_yaml(self.file, location)
    }

    fn error(&mut self, location: Option<Location>, message: impl AsRef<str>) {
        self.errors.push(PolicyError::new(location, message));
    }

    /// Compiles one `descriptors` list into `level`, recursing into nested lists.
    fn descriptors<'d>(
        &mut self,
        rules: &mut Vec<Arc<Rule>>,
        level: &mut Level,
        path: &mut Vec<PathStep<'d>>,
        docs: &'d [Spanned<DescriptorDoc>],
    ) {
        let mut seen: HashMap<(&'d str, Option<&'d str>), Option<Location>> = HashMap::new();
        let mut wildcards = 0usize;
        for doc in docs {
            let descriptor = &doc.value;
            let here = self.location(&doc.referenced);
            let key = match &descriptor.key {
                None => {
                    self.error(here.clone(), "descriptor has no `key`");
                    None
                }
                Some(key) if key.value.is_empty() => {
                    self.error(self.location(&key.referenced), "empty descriptor `key`");
                    None
                }
                Some(key) if key.value.len() > MAX_FIELD_LEN => {
                    self.error(
                        self.location(&key.referenced),
                        format!(
                            "descriptor `key` is longer than {MAX_FIELD_LEN} bytes: no request could send it"
                        ),
                    );
                    None
                }
                Some(key) if super::garbles(&key.value) => {
                    self.error(
                        self.location(&key.referenced),
                        format!("descriptor `key` {:?} {GARBLES}", key.value),
                    );
                    None
                }
                Some(key) => Some(key.value.as_str()),
            };
            if let Some(value) = descriptor
                .value
                .as_ref()
                .filter(|v| super::garbles(&v.value))
            {
                self.error(
                    self.location(&value.referenced),
                    format!("descriptor `value` {:?} {GARBLES}", value.value),
                );
            }
            let value = descriptor
                .value
                .as_ref()
                .map(|v| v.value.as_str())
                .filter(|v| !v.is_empty());
            if value.is_some_and(|v| v.contains('*')) {
                wildcards += 1;
                if wildcards == MAX_WILDCARDS_PER_LEVEL + 1 {
                    let at = descriptor
                        .value
                        .as_ref()
                        .and_then(|v| self.location(&v.referenced));
                    self.error(
                        at,
                        format!(
                            "more than {MAX_WILDCARDS_PER_LEVEL} wildcard values (with `*`) in one \
                             `descriptors` list: a request entry is tried against each in turn; \
                             nest them under a more specific key or use exact values"
                        ),
                    );
                }
            }

            // A descriptor that cannot be placed is still checked, in a scratch node, so that
            // its own problems are reported too.
            let mut scratch = Node::default();
            let mut node = &mut scratch;
            if let Some(key) = key {
                match seen.entry((key, value)) {
                    Entry::Occupied(first) => {
                        let first = first
                            .get()
                            .as_ref()
                            .map_or_else(String::new, |l| format!(", first defined at {l}"));
                        let what = match value {
                            Some(value) => format!("`{key}` with value `{value}`"),
                            None => format!("`{key}` without a value"),
                        };
                        self.error(
                            here.clone(),
                            format!("duplicate descriptor {what} at this level{first}"),
                        );
                    }
                    Entry::Vacant(slot) => {
                        slot.insert(here.clone());
                        node = level.insert(key, ValueMatch::from_written(value));
                    }
                }
            }

            let shared = match &descriptor.share_threshold {
                Some(share) if share.value => {
                    if !value.is_some_and(|v| v.contains('*')) {
                        self.error(
                            self.location(&share.referenced),
                            "`share_threshold` makes the values a wildcard matches share one \
                             counter; it needs a `value` with a `*`",
                        );
                    }
                    true
                }
                _ => false,
            };
            path.push(PathStep {
                key: key.unwrap_or_default(),
                value,
                shared,
            });
            match &descriptor.rate_limit {
                Some(rate_limit) => {
                    node.rule = Some(self.rule(rules, path, descriptor, rate_limit))
                }
                None => {
                    if let Some(replaces) = &descriptor.replaces {
                        self.error(
                            self.location(&replaces.referenced),
                            "`replaces` needs a `rate_limit` on the same descriptor",
                        );
                    }
                }
            }
            if let Some(children) = &descriptor.descriptors {
                self.descriptors(rules, &mut node.children, path, children);
            }
            path.pop();
        }
    }

    /// Builds the rule of one `rate_limit` block; returns its index in `rules`.
    fn rule(
        &mut self,
        rules: &mut Vec<Arc<Rule>>,
        path: &[PathStep<'_>],
        descriptor: &DescriptorDoc,
        rate_limit: &Spanned<RateLimitDoc>,
    ) -> usize {
        let block = self.location(&rate_limit.referenced);
        let doc = &rate_limit.value;
        let (limit, unit) = self.limit(doc, &block);
        let (on_store_error, local_share) = self.failure_posture(doc);
        let mode = self.mode(doc, descriptor.shadow_mode.unwrap_or(false));
        let local_budget = self.local_budget(doc, limit.as_ref(), mode);
        let up_to_limit = self.charges_up_to_limit(doc);
        let limit = limit.map(|params| params.charging_up_to_limit(up_to_limit));
        let blocked = limit.is_some() && self.blocks(doc, mode);
        let quota_mode = self.quota_mode(descriptor, doc);

        let (name, name_location, explicit) =
            match doc.name.as_ref().filter(|n| !n.value.is_empty()) {
                Some(name) => (name.value.clone(), self.location(&name.referenced), true),
                // An empty name means no name, as in envoyproxy/ratelimit.
                None => (self.derived_name(path), block.clone(), false),
            };
        if explicit && (name.trim().is_empty() || super::garbles(&name)) {
            self.error(
                name_location.clone(),
                format!("rule name {name:?} is blank or {GARBLES}"),
            );
        }

        let replaces_doc = match (&descriptor.replaces, &doc.replaces) {
            (Some(_), Some(inner)) => {
                self.error(
                    self.location(&inner.referenced),
                    "`replaces` is given both on the descriptor and in its `rate_limit`; keep one",
                );
                None
            }
            (outer, inner) => outer.as_ref().or(inner.as_ref()),
        };
        let replaces = replaces_doc
            .map(|r| self.replaces(&r.value))
            .unwrap_or_default();

        let metadata = self.metadata(descriptor);
        let index = rules.len();
        rules.push(Arc::new(Rule {
            index,
            domain: self.domain.to_owned(),
            name: name.clone(),
            name_given: explicit,
            identity: identity::encode(self.domain, path),
            shared_levels: path
                .iter()
                .enumerate()
                .filter(|(level, step)| step.shared && *level < 64)
                .fold(0, |bits, (level, _)| bits | 1 << level),
            limit,
            blocked,
            unit,
            mode,
            quota_mode,
            detailed_metric: descriptor.detailed_metric.unwrap_or(false),
            replaces: replaces.iter().map(|(name, _)| name.clone()).collect(),
            metadata,
            on_store_error,
            local_share,
            local_budget,
            location: block.clone().unwrap_or_else(|| Location {
                file: self.file.to_owned(),
                line: 0,
                column: 0,
            }),
        }));
        self.named.push(NamedRule {
            name,
            explicit,
            name_location,
            replaces,
        });
        index
    }

    /// The envoy-style name of the rule at `path`, made unique in the domain: two paths can
    /// read the same (`a_b` = `c` and `a` = `b_c` are both `a_b_c`), and the second gets `#2`
    /// (then `#3`...), so every rule has metrics and top keys of its own.
    fn derived_name(&self, path: &[PathStep<'_>]) -> String {
        let base = identity::display_name(path);
        let taken = |name: &str| self.named.iter().any(|r| !r.explicit && r.name == name);
        let mut name = base.clone();
        let mut n = 2;
        while taken(&name) {
            name = format!("{base}#{n}");
            n += 1;
        }
        name
    }

    fn replaces(&mut self, entries: &[Spanned<ReplacesDoc>]) -> Vec<(String, Option<Location>)> {
        let mut names = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry.value.name.as_ref().filter(|n| !n.value.is_empty()) {
                Some(name) if names.iter().any(|(seen, _)| *seen == name.value) => self.error(
                    self.location(&name.referenced),
                    format!("`replaces` names `{}` twice", name.value),
                ),
                Some(name) => names.push((name.value.clone(), self.location(&name.referenced))),
                None => self.error(
                    self.location(&entry.referenced),
                    "`replaces` entry has no `name`",
                ),
            }
        }
        names
    }

    /// Every name is unique in its domain (derived ones already are: see `derived_name`);
    /// every `replaces` names some rule of the domain other than itself.
    fn check_names(&mut self) {
        let named = std::mem::take(&mut self.named);
        let mut first_by_name: HashMap<&str, &NamedRule> = HashMap::new();
        for rule in &named {
            match first_by_name.entry(rule.name.as_str()) {
                Entry::Occupied(first) => {
                    let first = *first.get();
                    let at = first
                        .name_location
                        .as_ref()
                        .map_or_else(String::new, |l| format!(" at {l}"));
                    let name = &rule.name;
                    let message = match (first.explicit, rule.explicit) {
                        (true, true) => {
                            format!("two rules are named `{name}` in this domain; the other is{at}")
                        }
                        (false, _) => format!(
                            "name `{name}` is already the default name (descriptor path) of the rule{at}"
                        ),
                        (true, false) => format!(
                            "this rule's default name `{name}` (its descriptor path) is the `name` of the rule{at}; give one of them another `name`"
                        ),
                    };
                    self.error(rule.name_location.clone(), message);
                }
                Entry::Vacant(slot) => {
                    slot.insert(rule);
                }
            }
        }
        for rule in &named {
            for (replaced, at) in &rule.replaces {
                if *replaced == rule.name {
                    self.error(
                        at.clone(),
                        format!("rule `{replaced}` cannot replace itself"),
                    );
                } else if !first_by_name.contains_key(replaced.as_str()) {
                    self.error(at.clone(), format!("`replaces` names `{replaced}`, but no rule in this domain has that name"));
                }
            }
        }
    }
}
