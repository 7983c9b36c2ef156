//! The validity period of an X.509 certificate (RFC 5280 §4.1.2.5), read from its DER: enough
//! to warn that the certificate a port serves has expired, or is not valid yet, without an
//! X.509 library. rustls checks nothing of the kind on the serving side: the clients refuse
//! the handshake, and the server's log said nothing of why.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When a certificate is valid: from `not_before` to `not_after`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Seconds since the Unix epoch (negative before 1970).
    pub not_before: i64,
    pub not_after: i64,
}

impl Validity {
    /// The validity of the DER certificate `der`, or `None` if it is not one this can read.
    pub fn of(der: &[u8]) -> Option<Validity> {
        let (certificate, _) = element(der, SEQUENCE)?;
        let (mut tbs, _) = element(certificate, SEQUENCE)?;
        // version [0] EXPLICIT (absent for version 1), then serialNumber, signature, issuer.
        if tbs.first() == Some(&VERSION) {
            tbs = element(tbs, VERSION)?.1;
        }
        for tag in [INTEGER, SEQUENCE, SEQUENCE] {
            tbs = element(tbs, tag)?.1;
        }
        let (validity, _) = element(tbs, SEQUENCE)?;
        let (not_before, rest) = time(validity)?;
        let (not_after, _) = time(rest)?;
        Some(Validity {
            not_before,
            not_after,
        })
    }

    /// What is wrong with serving the certificate at `now` (seconds since the epoch), if
    /// anything.
    pub fn problem(&self, now: i64) -> Option<String> {
        if now > self.not_after {
            Some(format!("expired at {}", rfc3339(self.not_after)))
        } else if now < self.not_before {
            Some(format!("not valid before {}", rfc3339(self.not_before)))
        } else {
            None
        }
    }
}

const INTEGER: u8 = 0x02;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;

/// The contents of the DER element at the start of `input`, which must have tag `tag`, and
/// what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: the next `first & 0x7f` bytes, big-endian (a certificate fits in 4).
        let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
        if bytes.is_empty() || bytes.len() > 4 {
            return None;
        }
        let length = bytes
            .iter()
            .fold(0usize, |length, &b| (length << 8) | usize::from(b));
        (length, rest)
    };
    rest.split_at_checked(length)
}

/// A `Time` (UTCTime `YYMMDDHHMMSSZ`, years 1950–2049, or GeneralizedTime `YYYYMMDDHHMMSSZ`,
/// as RFC 5280 requires them) at the start of `input`: seconds since the epoch, and what follows.
fn time(input: &[u8]) -> Option<(i64, &[u8])> {
    let (text, rest, year) = match *input.first()? {
        UTC_TIME => {
            let (text, rest) = element(input, UTC_TIME)?;
            let yy = digits(text.get(..2)?)?;
            (
                text.get(2..)?,
                rest,
                if yy >= 50 { 1900 + yy } else { 2000 + yy },
            )
        }
        GENERALIZED_TIME => {
            let (text, rest) = element(input, GENERALIZED_TIME)?;
            (text.get(4..)?, rest, digits(text.get(..4)?)?)
        }
        _ => return None,
    };
    let [m1, m2, d1, d2, h1, h2, i1, i2, s1, s2, b'Z'] = *text else {
        return None;
    };
    let (month, day) = (digits(&[m1, m2])?, digits(&[d1, d2])?);
    let (hour, minute, second) = (digits(&[h1, h2])?, digits(&[i1, i2])?, digits(&[s1, s2])?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // A leap second (60) is allowed by the format; it counts as the next second.
    if second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3_600 + minute * 60 + second, rest))
}

/// The number `bytes` spell in ASCII digits.
fn digits(bytes: &[u8]) -> Option<i64> {
    bytes.iter().try_fold(0i64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
    })
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year-month-day` (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `seconds` since the epoch as RFC 3339 UTC, e.g. `2026-11-30T19:55:00Z`.
fn rfc3339(seconds: i64) -> String {
    let at = match u64::try_from(seconds) {
        Ok(after) => UNIX_EPOCH.checked_add(Duration::from_secs(after)),
        Err(_) => UNIX_EPOCH.checked_sub(Duration::from_secs(seconds.unsigned_abs())),
    };
    at.map_or_else(
        || format!("{seconds} s from the epoch"),
        |at: SystemTime| humantime::format_rfc3339_seconds(at).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_count_from_1970_across_leap_years_and_centuries() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        // 2000 is a leap year (divisible by 400), 1900 and 2100 are not.
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28),
            2
        );
        assert_eq!(
            days_from_civil(1900, 3, 1) - days_from_civil(1900, 2, 28),
            1
        );
        assert_eq!(
            days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 28),
            1
        );
        // 2026-11-30 is 20 787 days after the epoch (`date -d 2026-11-30 +%s` / 86 400).
        assert_eq!(days_from_civil(2026, 11, 30), 20_787);
    }

    /// A DER element of `tag` holding `contents`.
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    /// A certificate's outline: what `Validity::of` walks, with `validity` in place.
    fn certificate(version: bool, validity: &[u8]) -> Vec<u8> {
        let mut tbs = Vec::new();
        if version {
            tbs.extend(der(VERSION, &der(INTEGER, &[2])));
        }
        tbs.extend(der(INTEGER, &[0x01, 0x23]));
        tbs.extend(der(SEQUENCE, &der(0x06, &[0x2a, 0x86, 0x48])));
        // A long issuer, so that the TBS length takes the long form.
        tbs.extend(der(SEQUENCE, &[0x31; 200]));
        tbs.extend(der(SEQUENCE, validity));
        tbs.extend(der(SEQUENCE, b"subject and the rest"));
        der(
            SEQUENCE,
            &[der(SEQUENCE, &tbs), der(SEQUENCE, b"signature")].concat(),
        )
    }

    fn times(before: (u8, &[u8]), after: (u8, &[u8])) -> Vec<u8> {
        [der(before.0, before.1), der(after.0, after.1)].concat()
    }

    #[test]
    fn reads_utc_and_generalized_times_with_or_without_a_version() {
        let validity = times(
            (UTC_TIME, b"491231235959Z"),
            (GENERALIZED_TIME, b"20501231235959Z"),
        );
        let expected = Validity {
            not_before: days_from_civil(2049, 12, 31) * 86_400 + 86_399,
            not_after: days_from_civil(2050, 12, 31) * 86_400 + 86_399,
        };
        assert_eq!(Validity::of(&certificate(true, &validity)), Some(expected));
        assert_eq!(Validity::of(&certificate(false, &validity)), Some(expected));
        // UTCTime's two-digit years from 50 are the 1900s.
        let validity = times((UTC_TIME, b"500101000000Z"), (UTC_TIME, b"700101000000Z"));
        let read = Validity::of(&certificate(true, &validity)).unwrap();
        assert_eq!(read.not_before, days_from_civil(1950, 1, 1) * 86_400);
        assert_eq!(read.not_after, 0);
    }

    #[test]
    fn anything_else_is_not_read() {
        let good = times((UTC_TIME, b"200101000000Z"), (UTC_TIME, b"200102000000Z"));
        assert!(Validity::of(&certificate(true, &good)).is_some());
        for validity in [
            times((UTC_TIME, b"200101000000"), (UTC_TIME, b"200102000000Z")), // no Z
            times((UTC_TIME, b"201301000000Z"), (UTC_TIME, b"200102000000Z")), // month 13
            times((UTC_TIME, b"20010100000aZ"), (UTC_TIME, b"200102000000Z")), // a letter
            times((INTEGER, b"200101000000Z"), (UTC_TIME, b"200102000000Z")), // not a time
            der(UTC_TIME, b"200101000000Z"),                                  // one time only
        ] {
            assert_eq!(Validity::of(&certificate(true, &validity)), None);
        }
        let whole = certificate(true, &good);
        for cut in [0, 1, 5, whole.len() / 2, whole.len() - 1] {
            // Truncated: the outer length runs past the end.
            assert_eq!(Validity::of(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Validity::of(b"-----BEGIN CERTIFICATE-----"), None);
    }

    #[test]
    fn a_problem_is_reported_outside_the_period_only() {
        let validity = Validity {
            not_before: days_from_civil(2026, 1, 1) * 86_400,
            not_after: days_from_civil(2026, 12, 31) * 86_400,
        };
        assert_eq!(validity.problem(validity.not_before), None);
        assert_eq!(validity.problem(validity.not_after), None);
        assert_eq!(
            validity.problem(validity.not_after + 1).as_deref(),
            Some("expired at 2026-12-31T00:00:00Z")
        );
        assert_eq!(
            validity.problem(validity.not_before - 1).as_deref(),
            Some("not valid before 2026-01-01T00:00:00Z")
        );
    }
}
