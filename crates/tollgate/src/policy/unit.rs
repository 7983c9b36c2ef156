use std::fmt;
use std::time::Duration;

/// An envoyproxy/ratelimit time unit: a fixed-length period aligned to the Unix epoch.
///
/// `month` is 30 days and `year` 365 days, exactly as in envoyproxy/ratelimit (not calendar
/// months). Policy files may spell units in any case (`second`, `SECOND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The lower-case policy-file name.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's fixed length.
    pub fn period(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// Parses a unit name, ignoring ASCII case as envoyproxy/ratelimit does.
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_any_case() {
        assert_eq!(Unit::from_name("second"), Some(Unit::Second));
        assert_eq!(Unit::from_name("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::from_name("Month"), Some(Unit::Month));
        assert_eq!(Unit::from_name("seconds"), None);
        assert_eq!(Unit::from_name("unknown"), None);
        for unit in Unit::ALL {
            assert_eq!(Unit::from_name(unit.name()), Some(unit));
        }
    }

    #[test]
    fn periods_are_fixed_lengths() {
        assert_eq!(Unit::Week.period(), Duration::from_secs(604_800));
        assert_eq!(Unit::Month.period(), Duration::from_secs(2_592_000));
        assert_eq!(Unit::Year.period(), Duration::from_secs(31_536_000));
    }
}
