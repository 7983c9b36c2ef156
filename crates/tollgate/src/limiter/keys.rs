//! Counter keys. A key is built from the rule's identity and the request's entries, each part
//! length-prefixed, so no two different (rule, descriptor) pairs can produce the same bytes, and
//! a value sent by a client can never reach into another rule's or tenant's key space.

use smallvec::SmallVec;
use tollgate_core::Params;

use super::decimal;
use super::request::{MAX_FIELD_LEN, RequestDescriptor};

/// Every counter key of one request, back to back. Inline up to 256 bytes (four descriptors
/// of typical size), so building keys allocates nothing on the hot path. Each key is built on
/// the stack, then copied in whole ([`rule_key`]); a request's only key is used where it was
/// built ([`OneKey`]).
pub type KeyBuf = SmallVec<[u8; 256]>;

/// Where a key's bytes are written.
trait Sink {
    fn byte(&mut self, byte: u8);
    fn bytes(&mut self, bytes: &[u8]);
}

impl Sink for KeyBuf {
    fn byte(&mut self, byte: u8) {
        self.push(byte);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A key built on the stack, in `N` bytes. Written straight into a [`KeyBuf`], each of a
/// key's dozen parts was a call: a byte pushed, or a slice copied as an insert at the end,
/// which first moves the (empty) tail. Here a byte is a store and a part one copy: about 120
/// instructions fewer a key of one entry.
struct OnStack<const N: usize> {
    bytes: [u8; N],
    len: usize,
    /// A write did not fit: the key is built in a buffer instead.
    overflowed: bool,
}

impl<const N: usize> OnStack<N> {
    fn new() -> Self {
        OnStack {
            bytes: [0; N],
            len: 0,
            overflowed: false,
        }
    }

    /// The key written, unless it did not fit.
    fn written(&self) -> Option<&[u8]> {
        (!self.overflowed).then(|| &self.bytes[..self.len])
    }
}

impl<const N: usize> Sink for OnStack<N> {
    fn byte(&mut self, byte: u8) {
        match self.bytes.get_mut(self.len) {
            Some(slot) => {
                *slot = byte;
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let end = self.len.saturating_add(bytes.len());
        match self.bytes.get_mut(self.len..end) {
            Some(slots) => {
                slots.copy_from_slice(bytes);
                self.len = end;
            }
            None => self.overflowed = true,
        }
    }
}

/// Room for the one key of a request with one descriptor ([`OneKey`]): most keys are well
/// under it (55 bytes for a 30-byte value); a longer one is built in a [`KeyBuf`].
const ONE_KEY_BYTES: usize = 128;

/// The counter key of one descriptor, where the request has no other: built and used on the
/// stack, where the general path copies each key into the request's [`KeyBuf`].
pub(super) struct OneKey {
    stack: OnStack<ONE_KEY_BYTES>,
    /// Where a key longer than the stack's room is built (inline up to 256 bytes).
    long: KeyBuf,
}

impl OneKey {
    pub(super) fn new() -> Self {
        OneKey {
            stack: OnStack::new(),
            long: KeyBuf::new(),
        }
    }

    /// Builds the key of a configured rule's counter for `descriptor` (see [`rule_key`]) and
    /// returns it: written where it stays, as a key returned by value was copied whole.
    pub(super) fn rule(
        &mut self,
        rule_identity: &str,
        shared: u64,
        descriptor: &RequestDescriptor,
    ) -> &[u8] {
        write_rule_key(&mut self.stack, rule_identity, shared, descriptor);
        match self.stack.written() {
            Some(key) => key,
            None => {
                write_rule_key(&mut self.long, rule_identity, shared, descriptor);
                &self.long
            }
        }
    }
}

/// Appends `n` in decimal: a key takes several, and `write!` costs more than the rest of the key.
/// Inlined: most are one or two bytes, for which the call cost more than the writes.
#[inline]
fn push_decimal(buf: &mut impl Sink, n: u64) {
    // Most are lengths below 100: a byte or two, pushed without the digit buffer's copy.
    if n < 10 {
        buf.byte(b'0' + n as u8);
        return;
    }
    if n < 100 {
        buf.byte(b'0' + (n / 10) as u8);
        buf.byte(b'0' + (n % 10) as u8);
        return;
    }
    buf.bytes(decimal::digits(n, &mut [0; 20]));
}

fn push_part(buf: &mut impl Sink, part: &[u8]) {
    // Decimal length, then ':' — readable in `redis-cli`, and injective.
    push_decimal(buf, part.len() as u64);
    buf.byte(b':');
    buf.bytes(part);
}

/// Appends the entries; the value of entry `i` is a bare `*` when bit `i` of `shared` is set,
/// and a value longer than [`MAX_FIELD_LEN`] is its digest ([`push_digest`]: `#` and hex digits). A
/// part always starts with its length, so neither can be mistaken for a value.
fn push_entries(buf: &mut impl Sink, descriptor: &RequestDescriptor, shared: u64) {
    push_decimal(buf, descriptor.entries().len() as u64);
    buf.byte(b'|');
    for (i, (key, value)) in descriptor.entries().iter().enumerate() {
        push_part(buf, key.as_bytes());
        if i < 64 && shared & (1 << i) != 0 {
            buf.byte(b'*');
        } else if value.len() > MAX_FIELD_LEN {
            push_digest(buf, value);
        } else {
            push_part(buf, value.as_bytes());
        }
    }
}

/// Appends what stands for a value longer than [`MAX_FIELD_LEN`] bytes: `#` and the first 32
/// hex digits (128 bits) of its SHA-1, the same on every replica, so each long value keeps a
/// counter of its own and nobody can choose a long value that lands on another's.
fn push_digest(buf: &mut impl Sink, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf.byte(b'#');
    for byte in &sha1_smol::Sha1::from(value).digest().bytes()[..16] {
        buf.bytes(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
}

/// Appends the key of a configured rule's counter for `descriptor`; `shared` is the rule's
/// `shared_levels`.
pub fn rule_key(
    buf: &mut KeyBuf,
    rule_identity: &str,
    shared: u64,
    descriptor: &RequestDescriptor,
) {
    let mut key = OnStack::<256>::new();
    write_rule_key(&mut key, rule_identity, shared, descriptor);
    match key.written() {
        Some(key) => buf.extend_from_slice(key),
        None => write_rule_key(buf, rule_identity, shared, descriptor),
    }
}

fn write_rule_key(
    buf: &mut impl Sink,
    rule_identity: &str,
    shared: u64,
    descriptor: &RequestDescriptor,
) {
    buf.bytes(b"r|");
    push_part(buf, rule_identity.as_bytes());
    push_entries(buf, descriptor, shared);
}

/// Appends the key of a shadow candidate rule's counter for `descriptor`: the rule key behind
/// `c|` and the candidate's hash, so a candidate never touches a live counter, and candidates
/// with different texts never share one.
pub fn candidate_rule_key(
    buf: &mut KeyBuf,
    candidate_hash: &str,
    rule_identity: &str,
    shared: u64,
    descriptor: &RequestDescriptor,
) {
    buf.extend_from_slice(b"c|");
    push_part(buf, candidate_hash.as_bytes());
    write_rule_key(buf, rule_identity, shared, descriptor);
}

/// Appends the key of a caller-supplied limit override's counter: the domain, the period and
/// the entries, not the limit, so a caller that raises or lowers it (a tenant moved to another
/// tier) keeps the count, as envoyproxy/ratelimit does.
pub fn override_key(
    buf: &mut KeyBuf,
    domain: &str,
    descriptor: &RequestDescriptor,
    params: &Params,
) {
    buf.extend_from_slice(b"o|");
    push_part(buf, domain.as_bytes());
    buf.push(b'/');
    push_decimal(buf, params.period_micros());
    buf.push(b'|');
    push_entries(buf, descriptor, 0);
}

/// The counter key of a configured rule (`rule_identity`, its `shared_levels` as `shared`) for
/// `descriptor`, as the stores see it. For the fuzz targets (`fuzz/`), which check that two
/// different descriptors never share a key; the limiter builds keys in place.
#[doc(hidden)]
pub fn rule_key_bytes(rule_identity: &str, shared: u64, descriptor: &RequestDescriptor) -> Vec<u8> {
    let mut buf = KeyBuf::new();
    rule_key(&mut buf, rule_identity, shared, descriptor);
    buf.to_vec()
}

/// The counter key of a caller's limit override in `domain` for `descriptor` (see
/// [`rule_key_bytes`]; for the fuzz targets).
#[doc(hidden)]
pub fn override_key_bytes(
    domain: &str,
    descriptor: &RequestDescriptor,
    params: &tollgate_core::Params,
) -> Vec<u8> {
    let mut buf = KeyBuf::new();
    override_key(&mut buf, domain, descriptor, params);
    buf.to_vec()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::Algorithm;

    use super::*;

    fn key(identity: &str, entries: &[(&str, &str)]) -> KeyBuf {
        let d = RequestDescriptor::new(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            1,
            None,
        )
        .unwrap();
        let mut buf = KeyBuf::new();
        rule_key(&mut buf, identity, 0, &d);
        buf
    }

    /// A long value is keyed by its digest: bounded, its own, and not the key of a short value
    /// spelt like the digest.
    #[test]
    fn long_values_are_keyed_by_their_digest() {
        let long = "v".repeat(MAX_FIELD_LEN + 1);
        let keyed = key("r", &[("path", &long)]);
        assert!(keyed.len() < 100, "{}", keyed.len());
        assert_eq!(keyed, key("r", &[("path", &long)]));
        assert_ne!(keyed, key("r", &[("path", &format!("{long}v"))]));
        let mut digest = KeyBuf::new();
        push_digest(&mut digest, &long);
        let digest = std::str::from_utf8(&digest).unwrap();
        assert!(digest.len() == 33 && digest[1..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(
            keyed.ends_with(digest.as_bytes()),
            "the key holds the digest"
        );
        assert_ne!(keyed, key("r", &[("path", digest)]));
    }

    #[test]
    fn separators_inside_values_cannot_collide() {
        assert_ne!(key("r", &[("a_b", "c")]), key("r", &[("a", "b_c")]));
        assert_ne!(
            key("r", &[("a", "1:b")]),
            key("r", &[("a", "1"), ("b", "")])
        );
        assert_ne!(key("r1", &[("a", "b")]), key("r", &[("1a", "b")]));
        assert_ne!(
            key("x", &[("k", "v|1:k")]),
            key("x", &[("k", "v"), ("k", "")])
        );
    }

    #[test]
    fn candidate_keys_never_meet_live_or_other_candidates_keys() {
        let d = RequestDescriptor::new(vec![("user".into(), "alice".into())], 1, None).unwrap();
        let mut live = KeyBuf::new();
        rule_key(&mut live, "r", 0, &d);
        let mut one = KeyBuf::new();
        candidate_rule_key(&mut one, "0123456789abcdef", "r", 0, &d);
        let mut other = KeyBuf::new();
        candidate_rule_key(&mut other, "fedcba9876543210", "r", 0, &d);
        assert!(one.starts_with(b"c|16:0123456789abcdef"));
        assert_ne!(one, live);
        assert_ne!(one, other);
        assert!(one.ends_with(&live), "the live key follows the namespace");
    }

    /// A key is built on the stack when it fits there, in a buffer when it does not: the same
    /// bytes either way, at every length around each stack's size and well past it, whether
    /// appended to the request's keys or built alone.
    #[test]
    fn keys_too_long_for_the_stack_are_the_same_keys() {
        let mut lengths = Vec::new();
        for len in (105..125).chain(230..250).chain([1_000]) {
            let entries = vec![("k".to_owned(), "v".repeat(len))];
            let d = RequestDescriptor::new(entries, 1, None).unwrap();
            let identity = "r";
            let mut built = KeyBuf::from_slice(b"before");
            rule_key(&mut built, identity, 0, &d);
            let mut straight = KeyBuf::from_slice(b"before");
            write_rule_key(&mut straight, identity, 0, &d);
            assert_eq!(built, straight, "{len}");
            let mut alone = OneKey::new();
            let alone = alone.rule(identity, 0, &d);
            assert_eq!(alone, &straight[b"before".len()..], "{len}");
            lengths.push(alone.len());
        }
        // The keys tried do cross each stack's size, one byte at a time.
        for room in [ONE_KEY_BYTES, 256] {
            let around = room - 6..=room + 6;
            assert!(around.clone().all(|n| lengths.contains(&n)), "{lengths:?}");
        }
        assert!(lengths.iter().any(|&n| n > 1_000), "{lengths:?}");
    }

    #[test]
    fn same_rule_and_values_share_a_key() {
        assert_eq!(
            key("r", &[("user", "alice")]),
            key("r", &[("user", "alice")])
        );
    }

    #[test]
    fn decimals_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            let mut buf = KeyBuf::new();
            push_decimal(&mut buf, n);
            assert_eq!(buf.as_slice(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn the_key_layout_is_stable() {
        // Counters in Redis outlive a deploy: the same rule and values must keep their key.
        assert_eq!(
            key("per_user", &[("user", "alice"), ("path", "")]).as_slice(),
            b"r|8:per_user2|4:user5:alice4:path0:"
        );
        let d = RequestDescriptor::new(vec![("ip".into(), "10.0.0.1".into())], 1, None).unwrap();
        let params = Params::new(Algorithm::FixedWindow, 100, Duration::from_secs(60), None);
        let mut buf = KeyBuf::new();
        override_key(&mut buf, "api", &d, &params.unwrap());
        assert_eq!(buf.as_slice(), b"o|3:api/60000000|1|2:ip8:10.0.0.1");
    }
}
