//! Envoy's `RateLimitUnit` enum and our periods. The enum is not monotonic:
//! UNKNOWN=0, SECOND=1, MINUTE=2, HOUR=3, DAY=4, MONTH=5, YEAR=6, WEEK=7.

use std::time::Duration;

const DAY: u64 = 86_400;

/// Envoy unit number → period. Month and year are fixed 30- and 365-day periods, as in
/// envoyproxy/ratelimit.
pub fn period_of_unit(unit: i32) -> Option<Duration> {
    let secs = match unit {
        1 => 1,
        2 => 60,
        3 => 3_600,
        4 => DAY,
        5 => 30 * DAY,
        6 => 365 * DAY,
        7 => 7 * DAY,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// Period → the Envoy unit that describes it exactly, if any.
pub fn unit_of_period(period: Duration) -> Option<i32> {
    (1..=7).find(|u| period_of_unit(*u) == Some(period))
}

/// Envoy unit name (as in proto3 JSON) → unit number.
pub fn unit_from_name(name: &str) -> Option<i32> {
    UNIT_NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| i as i32)
}

/// Unit number → Envoy unit name.
pub fn unit_name(unit: i32) -> &'static str {
    usize::try_from(unit)
        .ok()
        .and_then(|i| UNIT_NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

const UNIT_NAMES: [&str; 8] = [
    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_unit_numbers_are_not_in_length_order() {
        assert_eq!(period_of_unit(7), Some(Duration::from_secs(7 * DAY)));
        assert_eq!(period_of_unit(5), Some(Duration::from_secs(30 * DAY)));
        assert_eq!(period_of_unit(0), None);
        assert_eq!(unit_of_period(Duration::from_secs(60)), Some(2));
        assert_eq!(unit_of_period(Duration::from_secs(30)), None);
        assert_eq!(unit_from_name("week"), Some(7));
        assert_eq!(unit_name(6), "YEAR");
    }
}
