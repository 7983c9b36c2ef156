//! Reading Prometheus text (format 0.0.4), for tests that check a server's `/metrics`: one
//! sample's value ([`sample`]), or the whole text parsed and checked ([`parse`]).

use std::collections::BTreeSet;

/// The value of the unlabelled sample `name` in Prometheus `text`.
///
/// # Panics
///
/// When there is no such sample, or its value is not a whole number.
pub fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// A sample's labels: `(name, value)` pairs.
type Labels = Vec<(String, String)>;

/// A whole exposition: its families in the order written.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposition {
    pub families: Vec<Family>,
}

/// One family: its `# HELP` text (unescaped), its `# TYPE`, and its samples in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: String,
    pub samples: Vec<Sample>,
}

/// One sample line: its name (a histogram's with `_bucket`, `_sum` or `_count`), its labels as
/// written (values unescaped) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Exposition {
    /// The family `name`, if the text has it.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Samples in all, every histogram line counted (as Prometheus counts them when it scrapes).
    pub fn sample_count(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }
}

/// Parses `text` as the text format says it and checks what a scraper relies on:
///
/// - every line is a `# HELP`, a `# TYPE`, another comment, or a sample; no blank line;
/// - each family has exactly one `# HELP` and one `# TYPE` (a known type), before its samples,
///   and appears once: no family begun again after another;
/// - each sample is of the family above it (a histogram's `_bucket`, `_sum` and `_count`
///   included), with valid metric and label names, label values escaped (`\\`, `\"`, `\n`
///   only), no label twice, and a number as its value;
/// - no series (name and label set) twice;
/// - a counter's and a gauge's samples carry no suffix; a histogram's series have a `+Inf`
///   bucket, cumulative buckets, and a `_count` equal to the `+Inf` bucket;
/// - the text ends with a line break.
///
/// # Panics
///
/// On the first problem, naming the line.
pub fn parse(text: &str) -> Exposition {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the text does not end with a line break"
    );
    let mut families: Vec<Family> = Vec::new();
    // A family's HELP or TYPE seen before its other header line: (name, help, kind).
    let mut pending: Option<(String, Option<String>, Option<String>)> = None;
    let mut series = BTreeSet::new();
    for (number, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", number + 1);
        assert!(!line.is_empty(), "{}: a blank line", at());
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = unescape(help, false).unwrap_or_else(|e| panic!("{}: {e}", at()));
            header(&mut pending, &mut families, name, Some(help), None, &at);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .unwrap_or_else(|| panic!("{}: a TYPE line without a type", at()));
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{}: unknown type {kind}",
                at()
            );
            header(
                &mut pending,
                &mut families,
                name,
                None,
                Some(kind.to_owned()),
                &at,
            );
        } else if line.starts_with('#') {
            continue;
        } else {
            if let Some(begun) = pending.take() {
                families.push(complete(begun, &at()));
            }
            let sample = sample_line(line).unwrap_or_else(|e| panic!("{}: {e}", at()));
            let family = families
                .last_mut()
                .unwrap_or_else(|| panic!("{}: a sample before any family", at()));
            let suffix = sample.name.strip_prefix(family.name.as_str());
            let of_family = match (family.kind.as_str(), suffix) {
                ("histogram", Some(s)) => ["_bucket", "_sum", "_count"].contains(&s),
                ("summary", Some(s)) => ["", "_sum", "_count"].contains(&s),
                (_, Some(s)) => s.is_empty(),
                (_, None) => false,
            };
            assert!(
                of_family,
                "{}: not a sample of family {} ({})",
                at(),
                family.name,
                family.kind
            );
            let mut key = sample.labels.clone();
            key.sort();
            assert!(
                series.insert((sample.name.clone(), key)),
                "{}: the series is there twice",
                at()
            );
            family.samples.push(sample);
        }
    }
    if let Some(begun) = pending {
        families.push(complete(begun, "at the end"));
    }
    for family in families.iter().filter(|f| f.kind == "histogram") {
        check_histogram(family);
    }
    Exposition { families }
}

/// Takes one HELP or TYPE line of family `name` into `pending`: the family's first header line
/// begins it (ending the family before), its second completes it.
fn header(
    pending: &mut Option<(String, Option<String>, Option<String>)>,
    families: &mut Vec<Family>,
    name: &str,
    help: Option<String>,
    kind: Option<String>,
    at: &dyn Fn() -> String,
) {
    assert!(
        valid_name(name, true),
        "{}: invalid metric name {name:?}",
        at()
    );
    assert!(
        families.iter().all(|f| f.name != name),
        "{}: family {name} is there twice",
        at()
    );
    if let Some((pending_name, pending_help, pending_kind)) = pending
        && pending_name == name
    {
        assert!(
            !(help.is_some() && pending_help.is_some()),
            "{}: a second HELP for {name}",
            at()
        );
        assert!(
            !(kind.is_some() && pending_kind.is_some()),
            "{}: a second TYPE for {name}",
            at()
        );
        if help.is_some() {
            *pending_help = help;
        }
        if kind.is_some() {
            *pending_kind = kind;
        }
        return;
    }
    // The family before had no sample: one all the same, with both header lines.
    if let Some(before) = pending.take() {
        families.push(complete(before, &at()));
    }
    *pending = Some((name.to_owned(), help, kind));
}

/// The family whose header lines `begun` holds, once its samples begin (or the next family
/// does): both lines must be there.
fn complete((name, help, kind): (String, Option<String>, Option<String>), at: &str) -> Family {
    let Some(help) = help else {
        panic!("{at}: family {name} has no HELP");
    };
    let Some(kind) = kind else {
        panic!("{at}: family {name} has no TYPE");
    };
    Family {
        name,
        help,
        kind,
        samples: Vec::new(),
    }
}

/// Checks every series of histogram `family`: buckets cumulative up to `+Inf`, `_count` equal
/// to it, and a `_sum`.
fn check_histogram(family: &Family) {
    let name = &family.name;
    // Per label set but `le`: its buckets, `(bound, cumulative count)`.
    let mut by_series: Vec<(Labels, Vec<(f64, f64)>)> = Vec::new();
    for sample in &family.samples {
        let mut labels: Labels = sample
            .labels
            .iter()
            .filter(|(n, _)| n != "le")
            .cloned()
            .collect();
        labels.sort();
        if sample.name.ends_with("_bucket") {
            let le = sample
                .label("le")
                .unwrap_or_else(|| panic!("{name}: a bucket without le: {sample:?}"));
            let bound: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse()
                    .unwrap_or_else(|_| panic!("{name}: le={le:?} is not a number"))
            };
            match by_series.iter_mut().find(|(l, _)| *l == labels) {
                Some((_, buckets)) => buckets.push((bound, sample.value)),
                None => by_series.push((labels, vec![(bound, sample.value)])),
            }
        }
    }
    for (labels, buckets) in &by_series {
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{name}{labels:?}: buckets not increasing and cumulative: {buckets:?}"
        );
        let inf = buckets
            .last()
            .filter(|(bound, _)| bound.is_infinite())
            .unwrap_or_else(|| panic!("{name}{labels:?}: no +Inf bucket"))
            .1;
        let of = |suffix: &str| {
            family.samples.iter().find(|s| {
                let mut l = s.labels.clone();
                l.sort();
                s.name.strip_prefix(name.as_str()) == Some(suffix) && l == *labels
            })
        };
        let count = of("_count").unwrap_or_else(|| panic!("{name}{labels:?}: no _count"));
        assert_eq!(
            count.value, inf,
            "{name}{labels:?}: _count is not the +Inf bucket"
        );
        assert!(of("_sum").is_some(), "{name}{labels:?}: no _sum");
    }
}

/// Whether `name` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) or, with `colons`
/// false, label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
fn valid_name(name: &str, colons: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic()
            || c == '_'
            || (colons && c == ':')
            || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// `text` with its escapes read: `\\` and `\n`, and `\"` with `quotes` (a label value).
fn unescape(text: &str, quotes: bool) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('"') if quotes => out.push('"'),
                other => return Err(format!("unknown escape \\{other:?}")),
            },
            '"' if quotes => return Err("an unescaped quote in a label value".into()),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// One sample line: `name{label="value",...} value`, with no timestamp.
fn sample_line(line: &str) -> Result<Sample, String> {
    let end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample without a value".to_owned())?;
    let name = &line[..end];
    if !valid_name(name, true) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[end..];
    let mut labels: Vec<(String, String)> = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = rest
                .split_once("=\"")
                .ok_or_else(|| "a label is not name=\"value\"".to_owned())?;
            if !valid_name(label, false) {
                return Err(format!("invalid label name {label:?}"));
            }
            if labels.iter().any(|(n, _)| n == label) {
                return Err(format!("label {label} twice"));
            }
            // The value ends at the first quote that no backslash escapes.
            let mut close = None;
            let mut escaped = false;
            for (i, c) in after.char_indices() {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        close = Some(i);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            let close =
                close.ok_or_else(|| "a label value without its closing quote".to_owned())?;
            labels.push((label.to_owned(), unescape(&after[..close], true)?));
            rest = &after[close + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err("labels are not separated by commas".into());
            }
        }
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_owned())?;
    if value.contains(' ') {
        return Err("more than a value after the series (a timestamp?)".into());
    }
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse()
            .map_err(|_| format!("the value {v:?} is not a number"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unlabelled_sample_and_not_a_longer_name() {
        let text = "# TYPE a_total counter\na_total_x 9\na_total{k=\"v\"} 8\na_total 7\n";
        assert_eq!(sample(text, "a_total"), 7);
    }

    const GOOD: &str = "# HELP h_seconds Time \\\\ taken.\n# TYPE h_seconds histogram\n\
        h_seconds_bucket{op=\"a\",le=\"0.5\"} 1\nh_seconds_bucket{op=\"a\",le=\"+Inf\"} 3\n\
        h_seconds_sum{op=\"a\"} 0.25\nh_seconds_count{op=\"a\"} 3\n\
        # TYPE c_total counter\n# HELP c_total Counted.\n\
        c_total{z=\"a\\\"b\",a=\"x\\\\y\\nz\"} 7\nc_total 1\n";

    #[test]
    fn reads_families_samples_and_escapes() {
        let parsed = parse(GOOD);
        let names: Vec<&str> = parsed.families.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["h_seconds", "c_total"]);
        assert_eq!(parsed.families[0].help, "Time \\ taken.");
        assert_eq!(parsed.families[0].kind, "histogram");
        let counter = parsed.family("c_total").unwrap();
        assert_eq!(counter.samples[0].label("z"), Some("a\"b"));
        assert_eq!(counter.samples[0].label("a"), Some("x\\y\nz"));
        assert_eq!(counter.samples[0].value, 7.0);
        assert_eq!(parsed.sample_count(), 6);
    }

    /// Each text breaks one rule; the panic names it.
    #[test]
    fn refuses_what_a_scraper_would_not_take() {
        let cases = [
            ("a 1\n", "before any family"),
            ("# TYPE a gauge\na 1\n", "has no HELP"),
            ("# HELP a A.\na 1\n", "has no TYPE"),
            ("# HELP a A.\n# TYPE a gauge\na 1\n# HELP a A.\n", "twice"),
            (
                "# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n",
                "second TYPE",
            ),
            ("# HELP a A.\n# TYPE a gauge\na 1\na 2\n", "twice"),
            (
                "# HELP a A.\n# TYPE a gauge\na{x=\"1\",y=\"2\"} 1\na{y=\"2\",x=\"1\"} 1\n",
                "twice",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\nb 1\n",
                "not a sample of family a",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\na_sum 1\n",
                "not a sample of family a",
            ),
            ("# HELP a A.\n# TYPE a gauge\na{x=\"q\"q\"} 1\n", "comma"),
            (
                "# HELP a A.\n# TYPE a gauge\na{x=\"\\t\"} 1\n",
                "unknown escape",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\na{1x=\"1\"} 1\n",
                "invalid label name",
            ),
            ("# HELP a A.\n# TYPE a gauge\na one\n", "not a number"),
            ("# HELP a A.\n# TYPE a gauge\na 1", "line break"),
            ("# HELP a A.\n# TYPE a gauge\n\na 1\n", "blank line"),
            ("# HELP a A.\n# TYPE a wibble\na 1\n", "unknown type"),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
                "cumulative",
            ),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
                "_count is not",
            ),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 1\nh_count 2\n",
                "no +Inf",
            ),
        ];
        for (text, why) in cases {
            let panic = std::panic::catch_unwind(|| parse(text))
                .expect_err(&format!("{text:?} was accepted"));
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            assert!(message.contains(why), "{text:?}: {message}");
        }
    }
}
