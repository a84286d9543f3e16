//! An implementation of RFC 6238 of the tests' own (6 digits, 30 s,
//! HMAC-SHA1), independent of keygate's: the codes authenticator apps show.

pub fn base32_decode(text: &str) -> Vec<u8> {
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut bits = String::new();
    for c in text.trim_end_matches('=').chars() {
        let value = alphabet.find(c.to_ascii_uppercase()).expect("base32");
        bits.push_str(&format!("{value:05b}"));
    }
    bits.as_bytes()
        .chunks(8)
        .filter(|chunk| chunk.len() == 8)
        .map(|chunk| u8::from_str_radix(std::str::from_utf8(chunk).unwrap(), 2).unwrap())
        .collect()
}

/// The 6-digit code of `step` (RFC 4226 truncation of HMAC-SHA1).
pub fn totp_at(secret_base32: &str, step: i64) -> String {
    use aws_lc_rs::hmac;
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        &base32_decode(secret_base32),
    );
    let mac = hmac::sign(&key, &(step as u64).to_be_bytes());
    let mac = mac.as_ref();
    let offset = (mac[19] & 0xf) as usize;
    let binary = ((u32::from(mac[offset]) & 0x7f) << 24)
        | (u32::from(mac[offset + 1]) << 16)
        | (u32::from(mac[offset + 2]) << 8)
        | u32::from(mac[offset + 3]);
    format!("{:06}", binary % 1_000_000)
}

pub fn step_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        / 30
}
