//! Reading a sample out of Prometheus text, for tests that check a server's `/metrics`.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unlabelled_sample_and_not_a_longer_name() {
        let text = "# TYPE a_total counter\na_total_x 9\na_total{k=\"v\"} 8\na_total 7\n";
        assert_eq!(sample(text, "a_total"), 7);
    }
}
