//! The one reading of a `Content-Length` value, for requests and responses.
//!
//! RFC 9110 section 8.6 makes the value `1*DIGIT`, and RFC 9112 section 6.3
//! (rule 5) makes a message whose `Content-Length` is invalid one whose
//! framing cannot be trusted: a server refuses the request, a client the
//! response. The same section asks a recipient to "anticipate potentially
//! large decimal numerals and prevent parsing errors due to integer
//! conversion overflows". Here the cap is decided once: at most 15 digits,
//! a body under 10^15 bytes (about 900 TB). That is far past any body
//! keygate relays and far inside `u64`, so the sum below can never overflow
//! and no value is cut to a smaller one. A longer numeral (even with
//! leading zeros) is refused, not read. Of the two caps the lean path
//! (15 digits) and the upstream reader (19) had, the stricter is kept.

/// The most digits a `Content-Length` may have.
pub const MAX_DIGITS: usize = 15;

/// One plain decimal number (`1*DIGIT`, at most [`MAX_DIGITS`] of them),
/// as the field value httparse leaves trimmed of the optional whitespace
/// around it; `None` for anything else (a sign, a list, inner spaces).
#[inline]
pub fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > MAX_DIGITS {
        return None;
    }
    let mut n = 0u64;
    for &digit in value {
        if !digit.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(digit - b'0');
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_content_length_is_one_plain_decimal_number_of_at_most_15_digits() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b"00012"), Some(12));
        assert_eq!(
            content_length(b"999999999999999"),
            Some(999_999_999_999_999)
        );
        for refused in [
            &b""[..],
            b"1 2",
            b"+3",
            b"-5",
            b"0x3",
            b"5, 5",
            b"5,5",
            b"1000000000000000",
            b"0000000000000001",
            b"99999999999999999999",
            b"18446744073709551616",
        ] {
            assert_eq!(content_length(refused), None, "{refused:?}");
        }
    }
}
