//! Time-based one-time passwords (RFC 6238) as authenticator apps compute
//! them: HMAC-SHA1, 6 digits, 30-second steps; and the `otpauth://` URL that
//! carries a secret to such an app.

use aws_lc_rs::hmac;

/// Seconds per step.
pub const STEP_SECS: i64 = 30;
/// Digits of a code.
pub const DIGITS: usize = 6;
/// Steps either side of now a code is still accepted in (clock drift).
pub const SKEW_STEPS: i64 = 1;
/// Bytes of a generated secret (160 bits, as RFC 4226 recommends).
pub const SECRET_BYTES: usize = 20;

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The step a moment (epoch seconds) falls in.
pub fn step_of(now_secs: i64) -> i64 {
    now_secs.div_euclid(STEP_SECS)
}

/// The code of `step` (RFC 4226 dynamic truncation of HMAC-SHA1).
pub fn code_at(secret: &[u8], step: i64) -> u32 {
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret);
    let tag = hmac::sign(&key, &step.to_be_bytes());
    let mac = tag.as_ref();
    let offset = usize::from(mac[mac.len() - 1] & 0x0f);
    let word = u32::from_be_bytes([
        mac[offset] & 0x7f,
        mac[offset + 1],
        mac[offset + 2],
        mac[offset + 3],
    ]);
    word % 10u32.pow(DIGITS as u32)
}

/// The step within [`SKEW_STEPS`] of `now_secs` whose code `code` is, or
/// `None`. Only six ASCII digits can match. Every candidate step is computed
/// and compared, so the time taken does not tell which one matched.
pub fn matching_step(secret: &[u8], code: &str, now_secs: i64) -> Option<i64> {
    if code.len() != DIGITS || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let given: u32 = code.parse().ok()?;
    let now = step_of(now_secs);
    let mut found = None;
    for step in now - SKEW_STEPS..=now + SKEW_STEPS {
        let same = aws_lc_rs::constant_time::verify_slices_are_equal(
            &code_at(secret, step).to_be_bytes(),
            &given.to_be_bytes(),
        )
        .is_ok();
        if same && found.is_none() {
            found = Some(step);
        }
    }
    found
}

/// RFC 4648 Base32 without padding, as `otpauth://` URLs carry secrets.
pub fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for &byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(BASE32[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(BASE32[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// Decodes Base32 (either case, padding and spaces ignored); `None` for any
/// other character.
pub fn base32_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for c in text.bytes().filter(|c| *c != b'=' && *c != b' ') {
        let value = BASE32.iter().position(|b| *b == c.to_ascii_uppercase())? as u32;
        buffer = (buffer << 5) | value;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    Some(out)
}

/// `otpauth://totp/<issuer>:<account>?issuer=<issuer>&secret=<secret>`, the
/// URL authenticator apps read from a QR code.
pub fn auth_url(issuer: &str, account: &str, secret_base32: &str) -> String {
    format!(
        "otpauth://totp/{}:{}?issuer={}&secret={}",
        escape(issuer, b"@"),
        escape(account, b"@"),
        escape(issuer, b""),
        secret_base32
    )
}

/// The `secret` query parameter of an `otpauth://totp/` URL.
pub fn secret_of_url(url: &str) -> Option<&str> {
    let query = url.strip_prefix("otpauth://totp/")?.split_once('?')?.1;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("secret="))
        .filter(|s| !s.is_empty())
}

/// Percent-escapes all but unreserved characters and `keep`.
fn escape(text: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B, SHA-1 rows (8 digits there; the last 6 here).
    #[test]
    fn codes_match_the_rfc_6238_test_vectors() {
        let secret = b"12345678901234567890";
        for (time, expected) in [
            (59, 94_287_082u32),
            (1_111_111_109, 7_081_804),
            (1_111_111_111, 14_050_471),
            (1_234_567_890, 89_005_924),
            (2_000_000_000, 69_279_037),
            (20_000_000_000, 65_353_130),
        ] {
            assert_eq!(
                code_at(secret, step_of(time)),
                expected % 1_000_000,
                "{time}"
            );
        }
    }

    #[test]
    fn a_code_matches_within_one_step_either_side_only() {
        let secret = b"12345678901234567890";
        let now = 1_111_111_111;
        let code = format!("{:06}", code_at(secret, step_of(now)));
        assert_eq!(matching_step(secret, &code, now), Some(step_of(now)));
        assert_eq!(matching_step(secret, &code, now + 30), Some(step_of(now)));
        assert_eq!(matching_step(secret, &code, now - 30), Some(step_of(now)));
        assert_eq!(matching_step(secret, &code, now + 90), None);
        assert_eq!(matching_step(secret, " 12345", now), None);
        assert_eq!(matching_step(secret, "1234567", now), None);
        assert_eq!(matching_step(secret, "+12345", now), None);
    }

    #[test]
    fn base32_round_trips_and_matches_rfc_4648() {
        assert_eq!(base32_encode(b"foobar"), "MZXW6YTBOI");
        assert_eq!(base32_decode("MZXW6YTBOI").unwrap(), b"foobar");
        assert_eq!(base32_decode("mzxw6ytboi======").unwrap(), b"foobar");
        assert!(base32_decode("MZXW1").is_none());
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(base32_decode(&base32_encode(&bytes)).unwrap(), bytes);
    }

    #[test]
    fn auth_url_escapes_names_and_carries_the_secret() {
        let url = auth_url("TB 2FA", "tenant@example.com", "ABCDEF");
        assert_eq!(
            url,
            "otpauth://totp/TB%202FA:tenant@example.com?issuer=TB%202FA&secret=ABCDEF"
        );
        assert_eq!(secret_of_url(&url), Some("ABCDEF"));
        assert_eq!(secret_of_url("https://x/?secret=A"), None);
        assert_eq!(secret_of_url("otpauth://totp/a?secret="), None);
    }
}
