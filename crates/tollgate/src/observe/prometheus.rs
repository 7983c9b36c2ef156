//! The one writer of the Prometheus text exposition format (version 0.0.4) that every
//! `/metrics` part renders through: a family's `# HELP` and `# TYPE` lines, then its samples,
//! with label values escaped as the format requires.
//!
//! It is for scrapes only: nothing here runs on the request path, where counting stays a
//! relaxed atomic add or a thread's own counter (see [`crate::metrics`],
//! [`crate::observe::Histogram::observe`]).
//!
//! ```
//! use tollgate::observe::prometheus::{Exposition, Kind};
//!
//! let mut out = String::new();
//! let mut text = Exposition::new(&mut out);
//! text.family("jobs_total", "Jobs run, by result.", Kind::Counter)
//!     .sample(&[("result", "ok")], 3u64)
//!     .sample(&[("result", "say \"no\"")], 1u64);
//! text.family("queue_depth", "Jobs waiting.", Kind::Gauge).sample(&[], 2u64);
//! let lines: Vec<&str> = out.lines().collect();
//! assert_eq!(lines, [
//!     "# HELP jobs_total Jobs run, by result.",
//!     "# TYPE jobs_total counter",
//!     r#"jobs_total{result="ok"} 3"#,
//!     r#"jobs_total{result="say \"no\""} 1"#,
//!     "# HELP queue_depth Jobs waiting.",
//!     "# TYPE queue_depth gauge",
//!     "queue_depth 2",
//! ]);
//! ```

use std::fmt::{Display, Write};

/// A family's type, as its `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up while the process runs.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets with `_sum` and `_count` (see [`Family::histogram`]).
    Histogram,
}

impl Kind {
    /// The name in the `# TYPE` line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value: written as Rust's `Display` writes it (`1`, `0.00035`, `+Inf` aside).
pub trait Value: Display + Copy {}

impl Value for u64 {}
impl Value for u32 {}
impl Value for u8 {}
impl Value for usize {}
impl Value for i64 {}
impl Value for f64 {}

/// What a histogram series is made of (see [`Family::histogram`]).
pub trait Distribution {
    /// Per bucket, in order: its upper bound (`None` for `+Inf`, last) and its own count (not
    /// cumulative).
    fn buckets(&self) -> impl Iterator<Item = (Option<f64>, u64)>;

    /// The sum of all observations, as `_sum` shows it.
    fn sum_seconds(&self) -> f64;
}

/// A sample's labels, written in the order given.
pub trait Labels {
    /// Appends `name="value"` pairs, comma-separated, escaped; returns whether it wrote any.
    fn write_to(&self, out: &mut String) -> bool;
}

impl Labels for [(&str, &str)] {
    fn write_to(&self, out: &mut String) -> bool {
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(name);
            out.push_str("=\"");
            escape_label_into(value, out);
            out.push('"');
        }
        !self.is_empty()
    }
}

impl<const N: usize> Labels for [(&str, &str); N] {
    fn write_to(&self, out: &mut String) -> bool {
        self.as_slice().write_to(out)
    }
}

/// Writes families into a `String` (a scrape's text, or one part of it).
#[derive(Debug)]
pub struct Exposition<'a> {
    out: &'a mut String,
}

impl<'a> Exposition<'a> {
    /// Appends to `out`.
    pub fn new(out: &'a mut String) -> Self {
        Exposition { out }
    }

    /// Writes the `# HELP` and `# TYPE` lines of family `name`; its samples follow through the
    /// returned [`Family`], before the next family is begun.
    pub fn family<'b>(&'b mut self, name: &'b str, help: &str, kind: Kind) -> Family<'b> {
        let out = &mut *self.out;
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        escape_help_into(help, out);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind.name());
        out.push('\n');
        Family { out, name }
    }
}

/// One family's samples (see [`Exposition::family`]).
#[derive(Debug)]
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl<'a> Family<'a> {
    /// Writes one sample of the family (a counter's or a gauge's series).
    pub fn sample<L: Labels + ?Sized>(&mut self, labels: &L, value: impl Value) -> &mut Self {
        write_sample(self.out, self.name, "", labels, None, value);
        self
    }

    /// Writes `histogram` as one series of the family: cumulative `_bucket` lines for each
    /// bound and `+Inf` (the `le` label after `labels`), then `_sum` in seconds and `_count`.
    pub fn histogram<L: Labels + ?Sized>(
        &mut self,
        labels: &L,
        histogram: &impl Distribution,
    ) -> &mut Self {
        let mut cumulative: u64 = 0;
        let mut bound_text = String::new();
        for (bound, count) in histogram.buckets() {
            cumulative = cumulative.wrapping_add(count);
            bound_text.clear();
            match bound {
                Some(bound) => {
                    let _ = write!(bound_text, "{bound}");
                }
                None => bound_text.push_str("+Inf"),
            }
            write_sample(
                self.out,
                self.name,
                "_bucket",
                labels,
                Some(("le", &bound_text)),
                cumulative,
            );
        }
        write_sample(
            self.out,
            self.name,
            "_sum",
            labels,
            None,
            histogram.sum_seconds(),
        );
        write_sample(self.out, self.name, "_count", labels, None, cumulative);
        self
    }
}

/// Writes `name` + `suffix`, the labels (with `extra` last) in braces if there are any, and
/// `value`, as one line.
fn write_sample<L: Labels + ?Sized>(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &L,
    extra: Option<(&str, &str)>,
    value: impl Value,
) {
    out.push_str(name);
    out.push_str(suffix);
    let start = out.len();
    out.push('{');
    let mut any = labels.write_to(out);
    if let Some((label, text)) = extra {
        if any {
            out.push(',');
        }
        [(label, text)].write_to(out);
        any = true;
    }
    if any {
        out.push('}');
    } else {
        out.truncate(start);
    }
    let _ = writeln!(out, " {value}");
}

/// Appends `value` escaped as a label value: backslash, double quote and line feed.
fn escape_label_into(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends `help` escaped as a `# HELP` text: backslash and line feed.
fn escape_help_into(help: &str, out: &mut String) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_help_are_escaped() {
        let mut out = String::new();
        Exposition::new(&mut out)
            .family("x_total", "A \\ help\nline.", Kind::Counter)
            .sample(&[("a", "back\\slash"), ("b", "line\nfeed \"q\"")], 1u64);
        assert_eq!(
            out,
            "# HELP x_total A \\\\ help\\nline.\n# TYPE x_total counter\nx_total{a=\"back\\\\slash\",b=\"line\\nfeed \\\"q\\\"\"} 1\n"
        );
    }
}
