//! The validity period of an X.509 certificate (RFC 5280 §4.1.2.5), read from its DER by
//! `x509-parser`: enough to warn that the certificate a port serves has expired, or is not
//! valid yet. rustls checks nothing of the kind on the serving side: the clients refuse the
//! handshake, and the server's log said nothing of why.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// When a certificate is valid: from `not_before` to `not_after`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Seconds since the Unix epoch (negative before 1970).
    pub not_before: i64,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

impl Validity {
    /// The validity of the DER certificate `der`, or `None` if it is not one that parses.
    pub fn of(der: &[u8]) -> Option<Validity> {
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let validity = certificate.validity();
        Some(Validity {
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
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

/// `seconds` since the epoch (before it too) as RFC 3339 UTC, e.g. `2026-11-30T19:55:00Z`.
/// (A certificate's times are years 0000 to 9999, which RFC 3339 writes; anything else is
/// written as seconds.)
fn rfc3339(seconds: i64) -> String {
    OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{seconds} s from 1970-01-01T00:00:00Z"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use time::{Date, Month};

    use super::*;

    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;
    const SEQUENCE: u8 = 0x30;
    const VERSION: u8 = 0xa0;
    const EXTENSIONS: u8 = 0xa3;

    /// `year-month-day hour:minute:second` UTC.
    fn at(year: i32, month: u8, day: u8, hms: (u8, u8, u8)) -> OffsetDateTime {
        Date::from_calendar_date(year, Month::try_from(month).unwrap(), day)
            .unwrap()
            .with_hms(hms.0, hms.1, hms.2)
            .unwrap()
            .assume_utc()
    }

    /// A self-signed certificate valid from `not_before` to `not_after`, made by `rcgen`, which
    /// writes years 1950 to 2049 as UTCTime and others as GeneralizedTime (as RFC 5280 asks).
    fn certificate(not_before: OffsetDateTime, not_after: OffsetDateTime) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_before = not_before;
        params.not_after = not_after;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
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

    /// The DER elements `input` holds one after the other, as (tag, contents).
    fn elements(mut input: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while let [tag, first, rest @ ..] = input {
            let (length, rest) = if *first < 0x80 {
                (usize::from(*first), rest)
            } else {
                let (bytes, rest) = rest.split_at(usize::from(first & 0x7f));
                let length = bytes.iter().fold(0, |n, &b| (n << 8) | usize::from(b));
                (length, rest)
            };
            let (contents, rest) = rest.split_at(length);
            out.push((*tag, contents.to_vec()));
            input = rest;
        }
        out
    }

    /// `certificate` with its TBS part's elements changed by `change` (its signature no longer
    /// matches, which reading the validity does not check).
    fn with_tbs(
        certificate: &[u8],
        change: impl FnOnce(Vec<(u8, Vec<u8>)>) -> Vec<(u8, Vec<u8>)>,
    ) -> Vec<u8> {
        let outer = elements(certificate);
        let [(SEQUENCE, whole)] = outer.as_slice() else {
            panic!("not a certificate");
        };
        let mut parts = elements(whole);
        let tbs = change(elements(&parts[0].1));
        parts[0].1 = tbs.iter().flat_map(|(tag, c)| der(*tag, c)).collect();
        der(
            SEQUENCE,
            &parts
                .iter()
                .flat_map(|(tag, c)| der(*tag, c))
                .collect::<Vec<_>>(),
        )
    }

    /// Whether `der` holds the time `text` encoded with `tag`.
    fn holds(der: &[u8], tag: u8, text: &[u8]) -> bool {
        let wanted = [&[tag, text.len() as u8][..], text].concat();
        der.windows(wanted.len()).any(|w| w == wanted)
    }

    /// `der` with the bytes `from` replaced by `to`, of the same length.
    fn replaced(der: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let at = der.windows(from.len()).position(|w| w == from).unwrap();
        [&der[..at], to, &der[at + from.len()..]].concat()
    }

    #[test]
    fn reads_utc_and_generalized_times_with_or_without_a_version() {
        let (before, after) = (
            at(2049, 12, 31, (23, 59, 59)),
            at(2050, 12, 31, (23, 59, 59)),
        );
        let v3 = certificate(before, after);
        assert!(holds(&v3, UTC_TIME, b"491231235959Z"));
        assert!(holds(&v3, GENERALIZED_TIME, b"20501231235959Z"));
        let expected = Validity {
            not_before: before.unix_timestamp(),
            not_after: after.unix_timestamp(),
        };
        assert_eq!(Validity::of(&v3), Some(expected));
        // Version 1: no version field (and no extensions, which only version 3 has).
        let v1 = with_tbs(&v3, |tbs| {
            tbs.into_iter()
                .filter(|(tag, _)| ![VERSION, EXTENSIONS].contains(tag))
                .collect()
        });
        assert_ne!(v1, v3);
        assert_eq!(Validity::of(&v1), Some(expected));
        // UTCTime's two-digit years from 50 are the 1900s.
        let old = certificate(at(1950, 1, 1, (0, 0, 0)), at(1970, 1, 1, (0, 0, 0)));
        assert!(holds(&old, UTC_TIME, b"500101000000Z"));
        let read = Validity::of(&old).unwrap();
        assert_eq!(read.not_before, at(1950, 1, 1, (0, 0, 0)).unix_timestamp());
        assert_eq!(read.not_after, 0);
    }

    #[test]
    fn a_chain_is_valid_while_all_of_its_certificates_are() {
        let leaf = certificate(at(2020, 1, 1, (0, 0, 0)), at(2030, 1, 1, (0, 0, 0)));
        let intermediate = certificate(at(2010, 1, 1, (0, 0, 0)), at(2025, 1, 1, (0, 0, 0)));
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
        let good = certificate(at(2020, 1, 1, (0, 0, 0)), at(2020, 1, 2, (0, 0, 0)));
        assert!(Validity::of(&good).is_some());
        let start = b"200101000000Z";
        for (from, to) in [
            (&start[..], &b"2001010000000"[..]), // no Z
            (start, b"201301000000Z"),           // month 13
            (start, b"20010100000aZ"),           // a letter
            (
                &[&[UTC_TIME, 13][..], start].concat()[..],
                &[&[0x02, 13][..], start].concat()[..],
            ), // not a time
        ] {
            let bad = replaced(&good, from, to);
            assert_eq!(Validity::of(&bad), None, "{}", String::from_utf8_lossy(to));
        }
        // One time only.
        let one = with_tbs(&good, |mut tbs| {
            let validity = tbs
                .iter_mut()
                .find(|(tag, c)| *tag == SEQUENCE && c.first() == Some(&UTC_TIME))
                .unwrap();
            validity.1 = der(UTC_TIME, &elements(&validity.1)[0].1);
            tbs
        });
        assert_eq!(Validity::of(&one), None);
        for cut in [0, 1, 5, good.len() / 2, good.len() - 1] {
            // Truncated: the outer length runs past the end.
            assert_eq!(Validity::of(&good[..cut]), None, "cut at {cut}");
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
            let seconds = at(year, month, day, (0, 0, 0)).unix_timestamp();
            assert_eq!(
                rfc3339(seconds),
                format!("{year:04}-{month:02}-{day:02}T00:00:00Z")
            );
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        // 2026-11-30 is 20 787 days after the epoch (`date -d 2026-11-30 +%s` / 86 400).
        let at = 20_787 * 86_400 + 19 * 3_600 + 55 * 60 + 7;
        assert_eq!(rfc3339(at), "2026-11-30T19:55:07Z");
    }

    #[test]
    fn a_problem_is_reported_outside_the_period_only() {
        let validity = Validity {
            not_before: at(2026, 1, 1, (0, 0, 0)).unix_timestamp(),
            not_after: at(2026, 12, 31, (0, 0, 0)).unix_timestamp(),
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
            not_before: at(1960, 1, 1, (0, 0, 0)).unix_timestamp(),
            not_after: -1,
        };
        assert_eq!(
            old.problem(0).as_deref(),
            Some("expired at 1969-12-31T23:59:59Z")
        );
    }
}
