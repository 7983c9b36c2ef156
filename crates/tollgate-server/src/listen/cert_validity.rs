//! The validity period of an X.509 certificate (RFC 5280 §4.1.2.5), read from its DER: enough
//! to warn that the certificate a port serves has expired, or is not valid yet, without an
//! X.509 library. rustls checks nothing of the kind on the serving side: the clients refuse
//! the handshake, and the server's log said nothing of why.

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

    /// When every certificate of `chain` is valid (the server's own, then intermediates): the
    /// latest start and the earliest end. `None` if one of them cannot be read.
    pub fn of_chain<'a>(chain: impl IntoIterator<Item = &'a [u8]>) -> Option<Validity> {
        chain
            .into_iter()
            .try_fold(None, |all: Option<Validity>, der| {
                let one = Validity::of(der)?;
                Some(Some(all.map_or(one, |all| Validity {
                    not_before: all.not_before.max(one.not_before),
                    not_after: all.not_after.min(one.not_after),
                })))
            })?
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

/// The date `days` after 1970-01-01: year, month, day (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `seconds` since the epoch (before it too) as RFC 3339 UTC, e.g. `2026-11-30T19:55:00Z`.
fn rfc3339(seconds: i64) -> String {
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day / 60 % 60,
        second_of_day % 60
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
    fn a_chain_is_valid_while_all_of_its_certificates_are() {
        let leaf = certificate(
            true,
            &times((UTC_TIME, b"200101000000Z"), (UTC_TIME, b"300101000000Z")),
        );
        let intermediate = certificate(
            true,
            &times((UTC_TIME, b"100101000000Z"), (UTC_TIME, b"250101000000Z")),
        );
        let chain = Validity::of_chain([leaf.as_slice(), intermediate.as_slice()]).unwrap();
        assert_eq!(chain.not_before, Validity::of(&leaf).unwrap().not_before);
        assert_eq!(
            chain.not_after,
            Validity::of(&intermediate).unwrap().not_after
        );
        assert_eq!(Validity::of_chain([leaf.as_slice(), b"garbage"]), None);
        assert_eq!(Validity::of_chain([]), None);
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
    fn dates_are_written_back_as_they_were_read_before_and_after_the_epoch() {
        for (year, month, day) in [
            (1970, 1, 1),
            (1969, 12, 31),
            (1945, 5, 8),
            (2, 1, 1),
            (2000, 2, 29),
            (2026, 11, 30),
            (9999, 12, 31),
        ] {
            assert_eq!(
                civil_from_days(days_from_civil(year, month, day)),
                (year, month, day)
            );
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        let at = days_from_civil(2026, 11, 30) * 86_400 + 19 * 3_600 + 55 * 60 + 7;
        assert_eq!(rfc3339(at), "2026-11-30T19:55:07Z");
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
        // Before the epoch, as a certificate may say.
        let old = Validity {
            not_before: days_from_civil(1960, 1, 1) * 86_400,
            not_after: -1,
        };
        assert_eq!(
            old.problem(0).as_deref(),
            Some("expired at 1969-12-31T23:59:59Z")
        );
    }
}
