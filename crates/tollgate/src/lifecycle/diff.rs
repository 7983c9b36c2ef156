//! A line diff of two policy versions, file by file, for `tollgate policy diff`.

use std::fmt::Write;
use std::time::Duration;

use similar::algorithms::{DiffHook, myers};

use super::version::PolicyVersion;
use crate::policy::sources::relative_names;

/// A line diff of two versions' sources, file by file (`-` removed, `+` added, ` ` kept).
/// Files are paired by their names relative to each version's shared directory; two versions
/// of one file each are compared whatever their names (a push of `new.yaml` over a server
/// started on `policy.yaml`).
pub fn diff(from: &PolicyVersion, to: &PolicyVersion) -> String {
    let mut out = format!("--- version {}\n+++ version {}\n", from.label(), to.label());
    let (old, new) = (named_texts(from), named_texts(to));
    let pairs: Vec<(String, &str, &str)> = match (old.as_slice(), new.as_slice()) {
        ([(a_name, a)], [(b_name, b)]) if a_name != b_name => {
            vec![(format!("{a_name} -> {b_name}"), *a, *b)]
        }
        _ => {
            let mut names: Vec<&str> = old.iter().chain(&new).map(|(n, _)| *n).collect();
            names.sort_unstable();
            names.dedup();
            fn text<'a>(files: &[(&str, &'a str)], name: &str) -> &'a str {
                files
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or("", |(_, t)| *t)
            }
            names
                .into_iter()
                .map(|name| (name.to_owned(), text(&old, name), text(&new, name)))
                .collect()
        }
    };
    for (label, a, b) in pairs {
        if a == b {
            continue;
        }
        let _ = writeln!(out, "@@ {label}");
        let lines = line_diff(a, b);
        if lines.iter().all(|l| l.starts_with(' ')) {
            out.push_str("  (the texts differ only in line endings or the final newline)\n");
            continue;
        }
        for line in around_changes(&lines) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A version's texts by their [`relative_names`].
fn named_texts(version: &PolicyVersion) -> Vec<(&str, &str)> {
    relative_names(&version.sources)
        .into_iter()
        .zip(&version.sources)
        .map(|(name, (_, text))| (name, text.as_str()))
        .collect()
}

/// Unchanged lines kept around each change in [`diff`]; longer runs show as ` ...`.
const DIFF_CONTEXT: usize = 2;

/// The lines of a line diff within [`DIFF_CONTEXT`] of a change, a run of others as one ` ...`.
fn around_changes(lines: &[String]) -> Vec<&str> {
    let mut near = vec![false; lines.len()];
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') {
            let around = i.saturating_sub(DIFF_CONTEXT)..(i + DIFF_CONTEXT + 1).min(lines.len());
            near[around].fill(true);
        }
    }
    let mut out = Vec::new();
    for (line, near) in lines.iter().zip(near) {
        if near {
            out.push(line.as_str());
        } else if out.last() != Some(&" ...") {
            out.push(" ...");
        }
    }
    out
}

/// Changed lines past which [`line_diff`] stops looking for the shortest diff and shows the
/// rest as all removed, then all added.
const MAX_DIFF_EDITS: usize = 1000;

/// How long [`line_diff`] looks for the shortest diff at most: the search takes time that grows
/// with the lines times the changes, and a diff of two very different long policies must not
/// hold an admin request for long. Past it, the diff found so far is shown (still one from one
/// text to the other, no longer the shortest).
const DIFF_DEADLINE: Duration = Duration::from_secs(2);

/// A line diff (` ` kept, `-` removed, `+` added): the common first and last lines, then the
/// shortest edit of the lines between (Myers' algorithm, by the `similar` crate, in time that
/// grows with the lines times the changes and memory with the lines: a policy of a hundred
/// thousand lines with a few changes diffs at once). In each run of changes the removed lines
/// come first.
fn line_diff(a: &str, b: &str) -> Vec<String> {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (middle_a, middle_b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut out: Vec<String> = a[..head].iter().map(|l| format!(" {l}")).collect();
    match shortest_edit(middle_a, middle_b) {
        Some(edit) => out.extend(edit),
        None => {
            out.extend(middle_a.iter().map(|l| format!("-{l}")));
            out.extend(middle_b.iter().map(|l| format!("+{l}")));
        }
    }
    out.extend(a[a.len() - tail..].iter().map(|l| format!(" {l}")));
    out
}

/// The shortest edit turning `a` into `b`, or `None` past [`MAX_DIFF_EDITS`] changed lines.
fn shortest_edit(a: &[&str], b: &[&str]) -> Option<Vec<String>> {
    let mut edit = Edit {
        a,
        b,
        lines: Vec::new(),
        removed: Vec::new(),
        added: Vec::new(),
        changed: 0,
    };
    // The raw search: the default one may settle for a longer edit on hard inputs.
    myers::diff_deadline_raw(&mut edit, a, 0..a.len(), b, 0..b.len(), deadline()).ok()?;
    edit.flush();
    Some(edit.lines)
}

/// [`DIFF_DEADLINE`] from now.
#[allow(clippy::disallowed_methods)] // bounds the work of an admin request; decides nothing
fn deadline() -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(DIFF_DEADLINE)
}

/// Past [`MAX_DIFF_EDITS`] changed lines.
#[derive(Debug)]
struct TooManyEdits;

/// Collects an edit from `a` to `b` as diff lines, each run of changes its removed lines first.
struct Edit<'a> {
    a: &'a [&'a str],
    b: &'a [&'a str],
    lines: Vec<String>,
    removed: Vec<String>,
    added: Vec<String>,
    changed: usize,
}

impl Edit<'_> {
    /// Ends a run of changes.
    fn flush(&mut self) {
        self.lines.append(&mut self.removed);
        self.lines.append(&mut self.added);
    }

    /// Counts `n` more changed lines.
    fn change(&mut self, n: usize) -> Result<(), TooManyEdits> {
        self.changed += n;
        if self.changed > MAX_DIFF_EDITS {
            return Err(TooManyEdits);
        }
        Ok(())
    }
}

impl DiffHook for Edit<'_> {
    type Error = TooManyEdits;

    fn equal(
        &mut self,
        old_index: usize,
        _new_index: usize,
        len: usize,
    ) -> Result<(), TooManyEdits> {
        self.flush();
        let kept = self.a.get(old_index..old_index + len).unwrap_or_default();
        self.lines.extend(kept.iter().map(|l| format!(" {l}")));
        Ok(())
    }

    fn delete(
        &mut self,
        old_index: usize,
        old_len: usize,
        _new_index: usize,
    ) -> Result<(), TooManyEdits> {
        self.change(old_len)?;
        let removed = self
            .a
            .get(old_index..old_index + old_len)
            .unwrap_or_default();
        self.removed.extend(removed.iter().map(|l| format!("-{l}")));
        Ok(())
    }

    fn insert(
        &mut self,
        _old_index: usize,
        new_index: usize,
        new_len: usize,
    ) -> Result<(), TooManyEdits> {
        self.change(new_len)?;
        let added = self
            .b
            .get(new_index..new_index + new_len)
            .unwrap_or_default();
        self.added.extend(added.iter().map(|l| format!("+{l}")));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Timestamp;

    use super::*;
    use crate::lifecycle::version::Origin;
    use crate::policy::sources::sources_hash;

    fn named(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn the_same_texts_under_differently_spelt_paths_are_the_same_policy() {
        let text = "domain: d\ndescriptors: []\n";
        let file = named(&[("/etc/tollgate/api.yaml", text)]);
        let pushed = named(&[("api.yaml", text)]);
        assert_eq!(sources_hash(&file), sources_hash(&pushed));

        let version = |seq, sources: &[(String, String)]| PolicyVersion {
            seq,
            hash: sources_hash(sources),
            origin: Origin::File,
            accepted_at: Timestamp::from_micros(0),
            sources: sources.to_vec(),
            rules: 0,
            restored: None,
        };
        let changed = named(&[("./api.yaml", "domain: d\ndescriptors: [x]\n")]);
        let d = diff(&version(1, &file), &version(2, &changed));
        assert!(
            d.contains("@@ api.yaml\n domain: d\n-descriptors: []\n+descriptors: [x]"),
            "{d}"
        );

        // One file on each side is compared line by line whatever the names.
        let renamed = named(&[("new.yaml", "domain: d\ndescriptors: [x]\n")]);
        let d = diff(&version(1, &file), &version(3, &renamed));
        assert!(
            d.contains("@@ api.yaml -> new.yaml\n domain: d\n-descriptors: []\n+descriptors: [x]"),
            "{d}"
        );

        // Texts that differ only where lines end say so, not a bare `...`.
        let crlf = named(&[("api.yaml", "domain: d\r\ndescriptors: []")]);
        let d = diff(&version(1, &file), &version(4, &crlf));
        assert!(
            d.ends_with(
                "@@ api.yaml\n  (the texts differ only in line endings or the final newline)\n"
            ),
            "{d}"
        );
    }

    #[test]
    fn a_diff_shows_a_few_lines_around_each_change() {
        let a: Vec<String> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .map(|l| format!(" {l}"))
            .collect();
        let mut lines = a.clone();
        lines[4] = "-e".to_owned();
        lines.insert(5, "+E".to_owned());
        assert_eq!(
            around_changes(&lines),
            [" ...", " c", " d", "-e", "+E", " f", " g", " ..."]
        );
        assert_eq!(around_changes(&a), [" ..."], "nothing changed");
    }

    #[test]
    fn a_line_diff_shows_what_changed() {
        let d = line_diff("a\nb\nc", "a\nB\nc\nd");
        assert_eq!(d, vec![" a", "-b", "+B", " c", "+d"]);
    }

    /// The reference: the length of a longest common subsequence, by the textbook table.
    fn lcs_len(a: &[&str], b: &[&str]) -> usize {
        let mut table = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                table[i][j] = if a[i] == b[j] {
                    table[i + 1][j + 1] + 1
                } else {
                    table[i + 1][j].max(table[i][j + 1])
                };
            }
        }
        table[0][0]
    }

    /// The texts a diff goes from and to.
    fn sides(diff: &[String]) -> (Vec<&str>, Vec<&str>) {
        let side = |drop: char| {
            diff.iter()
                .filter(|l| !l.starts_with(drop))
                .map(|l| &l[1..])
                .collect()
        };
        (side('+'), side('-'))
    }

    proptest::proptest! {
        /// Any two texts: the diff goes from one to the other, and changes as few lines as the
        /// longest common subsequence allows.
        #[test]
        fn a_line_diff_is_a_shortest_edit(
            a in proptest::collection::vec(0u8..4, 0..40),
            b in proptest::collection::vec(0u8..4, 0..40),
        ) {
            let text = |t: &[u8]| t.iter().map(|c| format!("{c}\n")).collect::<String>();
            let (a, b) = (text(&a), text(&b));
            let (a_lines, b_lines): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
            let diff = line_diff(&a, &b);
            proptest::prop_assert_eq!(sides(&diff), (a_lines.clone(), b_lines.clone()));
            let changed = diff.iter().filter(|l| !l.starts_with(' ')).count();
            let shortest = a_lines.len() + b_lines.len() - 2 * lcs_len(&a_lines, &b_lines);
            proptest::prop_assert_eq!(changed, shortest);
        }
    }

    /// A policy of 120 000 lines with two changes far apart diffs to those two changes (the
    /// table the diff once built would have held 14.4 billion cells).
    #[test]
    fn a_long_policy_diffs_to_its_changes() {
        let a: String = (0..120_000).map(|i| format!("line {i}\n")).collect();
        let b = a
            .replace("line 10\n", "line ten\n")
            .replace("line 110000\n", "");
        let diff = line_diff(&a, &b);
        let changed: Vec<&String> = diff.iter().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(changed, ["-line 10", "+line ten", "-line 110000"]);
        assert_eq!(sides(&diff), (a.lines().collect(), b.lines().collect()));
    }

    /// Past the edits the shortest diff is looked for within, the lines between the common
    /// first and last ones show as removed, then added: still a diff from one text to the other.
    #[test]
    fn a_diff_of_too_many_changes_shows_the_middle_replaced() {
        let a: String = (0..3000).map(|i| format!("{i}\n")).collect();
        let b: String = (0..3000)
            .map(|i| {
                if i % 2 == 1 && (1..2999).contains(&i) {
                    format!("{i}x\n")
                } else {
                    format!("{i}\n")
                }
            })
            .collect();
        let diff = line_diff(&a, &b);
        assert_eq!(sides(&diff), (a.lines().collect(), b.lines().collect()));
        // "0" is kept; then every line from "1" to "2998" removed, then those of `b` added.
        assert_eq!(diff[0], " 0");
        assert_eq!(diff[1], "-1");
        assert_eq!(diff[2998], "+1x");
        assert_eq!(diff.last().map(String::as_str), Some(" 2999"));
    }
}
