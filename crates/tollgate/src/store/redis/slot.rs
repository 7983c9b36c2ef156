//! Redis keys for counters, hash-tagged by the service.
//!
//! A counter key is `tg:{HHHHHHHHHHHHHHHH}:` followed by the limiter's injective counter key,
//! where the tag is 16 hex digits of a hash of that counter key. Redis Cluster hashes only the
//! first `{...}` of a key, which is always ours: a client value that contains braces can never
//! choose the slot or collide with another key.

use std::io::Write;

use crate::fnv::fnv1a64;

/// Number of hash slots in Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// Appends the Redis key for `counter_key` to `buf` and returns its cluster slot.
pub fn redis_key(buf: &mut Vec<u8>, counter_key: &[u8]) -> u16 {
    // A stable hash, so every replica derives the same tag for the same counter.
    let start = buf.len();
    let _ = write!(buf, "tg:{{{:016x}}}:", fnv1a64(counter_key));
    // The tag is the 16 hex digits between the braces.
    let slot = crc16(&buf[start + 4..start + 20]) % SLOTS;
    buf.extend_from_slice(counter_key);
    slot
}

/// The Redis Cluster slot of the counter a limiter names `counter_key` (see [`redis_key`]).
pub fn counter_slot(counter_key: &[u8]) -> u16 {
    redis_key(&mut Vec::new(), counter_key)
}

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster uses for key slots.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_redis_cluster_specification() {
        // The check value given in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn the_service_tag_comes_first_whatever_the_value() {
        let mut a = Vec::new();
        let slot_a = redis_key(&mut a, b"r|9:{evil}x");
        let text = String::from_utf8(a.clone()).unwrap();
        assert!(text.starts_with("tg:{"));
        let tag = &text[text.find('{').unwrap() + 1..text.find('}').unwrap()];
        assert_eq!(tag.len(), 16);
        assert_eq!(slot_a, crc16(tag.as_bytes()) % SLOTS);
        let mut b = Vec::new();
        redis_key(&mut b, b"r|9:{evil}x");
        assert_eq!(a, b, "stable");
    }
}
