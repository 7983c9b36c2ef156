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

/// Parses a `period` (`30s`, `5m`, `1h30m`, `500ms`, `2d`, `1w`). Months and years are refused:
/// humantime's are 30.44 and 365.25 days, not the 30 and 365 of `unit: month` and `unit: year`,
/// and `1M` (a month) is one letter's case away from `1m` (a minute).
pub fn parse_period(text: &str) -> Result<Duration, PeriodError> {
    let text = text.trim();
    let calendar = text
        .split(|c: char| c.is_ascii_digit() || c.is_whitespace())
        .filter(|suffix| !suffix.is_empty())
        .find(|suffix| {
            suffix.starts_with('M')
                || suffix.starts_with('y')
                || suffix.to_ascii_lowercase().starts_with("mo")
        });
    if let Some(suffix) = calendar {
        return Err(PeriodError::Calendar {
            suffix: suffix.to_owned(),
            text: text.to_owned(),
        });
    }
    humantime::parse_duration(text).map_err(|why| PeriodError::Invalid {
        text: text.to_owned(),
        why,
    })
}

/// Why a `period` is not one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PeriodError {
    /// A month or a year, whose lengths humantime and the envoy units disagree on.
    #[error(
        "`{suffix}` in period `{text}`: months and years are not periods here (humantime's are 30.44 and 365.25 days; `M` is a month, `m` a minute); write days (`30d`, `365d`) or use `unit: month` / `unit: year`"
    )]
    Calendar { suffix: String, text: String },
    /// Not a duration humantime reads.
    #[error("invalid period `{text}`: {why}")]
    Invalid {
        text: String,
        why: humantime::DurationError,
    },
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

    #[test]
    fn periods_refuse_months_and_years() {
        assert_eq!(parse_period(" 1h30m "), Ok(Duration::from_secs(5400)));
        assert_eq!(
            parse_period("2d 500ms"),
            Ok(Duration::from_millis(172_800_500))
        );
        assert_eq!(parse_period("1min"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_period("1m"), Ok(Duration::from_secs(60)));
        for text in ["1M", "1y", "2years", "1month", "3mon", "1d 1y"] {
            let error = parse_period(text).unwrap_err().to_string();
            assert!(
                error.contains("months and years are not periods"),
                "{text}: {error}"
            );
        }
        assert!(
            parse_period("5 parsecs")
                .unwrap_err()
                .to_string()
                .starts_with("invalid period `5 parsecs`")
        );
    }
}
