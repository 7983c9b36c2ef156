//! Decimal digits without `fmt`: a counter key and a decision's header values each take
//! several numbers, and `write!` cost more than the rest of them.

/// The decimal digits of `n`, written at the end of `buffer`.
#[inline]
pub(super) fn digits(mut n: u64, buffer: &mut [u8; 20]) -> &[u8] {
    // u64::MAX has 20 digits: `start` never goes below 0.
    let mut start = buffer.len();
    loop {
        start -= 1;
        // A digit: `n % 10` is below 10.
        buffer[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buffer[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_what_display_writes() {
        for n in [
            0,
            7,
            10,
            99,
            100,
            1_000_000,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(digits(n, &mut [0; 20]), n.to_string().as_bytes());
        }
    }
}
