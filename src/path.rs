//! One normalised path decides the route and the auth policy, and the upstream
//! receives that same path.
//!
//! Dot-segments are resolved (RFC 3986 section 5.2.4) and empty segments
//! (`//`) dropped, as servlet containers and nginx merge them. Refused rather than
//! repaired, so no later decoding can change the meaning:
//! - a percent-encoded `/`, `\`, `.` or NUL, a raw `\`, a broken escape, or a
//!   `..` above the root;
//! - a `;` anywhere in the path, raw or encoded (`%3B`): servlet containers
//!   (the platform's among them) strip `;` parameters from segments, so
//!   `/api/noauth/..;/x` would be `..` to them and a plain name to us, and a
//!   container that decodes before it strips reads `..%3B` the same way;
//! - a raw byte outside ASCII: RFC 3986 has none in a URI (clients
//!   percent-encode them), and a raw `．．` (U+FF0E) would otherwise reach a
//!   server that folds it to `..` without any of the checks below;
//! - an encoded `%` (`%25`), the mark of a double encoding: `%252e` is `%2e`
//!   after one decoding and `.` after two (`%25%32%65` likewise);
//! - escapes of unreserved characters (letters, digits, `-`, `_`, `~`) are
//!   decoded: RFC 3986 section 6.2.2.2 makes `/%61pi/` the same path as
//!   `/api/`, and the platform's servlet container reads it so; left encoded,
//!   it would decide no route of keygate's (or the public `/` route) while
//!   the platform answered its own `/api/` endpoint;
//! - percent-escapes that do not decode to UTF-8 (overlong forms such as
//!   `%c0%ae` for `.`), and segments made only of dots where some are Unicode
//!   look-alikes (`%ef%bc%8e`, U+FF0E) that some servers fold to `.`, and
//!   characters such servers fold to `/` or `\` (`%ef%bc%8f`, U+FF0F).

use std::borrow::Cow;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path must start with '/'")]
    NotAbsolute,
    #[error("path contains an encoded separator, dot or NUL")]
    EncodedSeparator,
    #[error("path contains a broken percent-escape")]
    BadEscape,
    #[error("path climbs above the root")]
    AboveRoot,
    #[error("path contains a backslash")]
    Backslash,
    #[error("path contains ';' (path parameters are not accepted)")]
    Semicolon,
    #[error("path contains an encoded '%' (double encoding)")]
    DoubleEncoded,
    #[error("path does not decode to UTF-8")]
    BadEncoding,
    #[error("path contains a raw non-ASCII byte (percent-encode it)")]
    RawNonAscii,
}

/// Characters some servers fold to dots (Unicode compatibility
/// normalisation, NFKC): fullwidth full stop, one dot leader, small full stop
/// (each `.`), two dot leader (`..`) and the ellipsis (`...`).
const DOT_LOOKALIKES: &[char] = &['\u{FF0E}', '\u{2024}', '\u{FE52}', '\u{2025}', '\u{2026}'];

/// Characters the same folding turns into (or into text holding) a `/` or a
/// `\`: fullwidth solidus and reverse solidus, small reverse solidus, and the
/// `a/c`, `a/s`, `c/o`, `c/u` symbols.
const SEPARATOR_LOOKALIKES: &[char] = &[
    '\u{FF0F}', '\u{FF3C}', '\u{FE68}', '\u{2100}', '\u{2101}', '\u{2105}', '\u{2106}',
];

/// Checks what the escapes of a path decode to (only called when some decode
/// to a non-ASCII byte): valid UTF-8, no separator look-alike, and no segment
/// of dots and dot look-alikes.
fn check_decoded(path: &str) -> Result<(), PathError> {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            // Escapes were validated by the caller.
            let hex =
                std::str::from_utf8(&bytes[i + 1..i + 3]).map_err(|_| PathError::BadEscape)?;
            decoded.push(u8::from_str_radix(hex, 16).map_err(|_| PathError::BadEscape)?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    let text = std::str::from_utf8(&decoded).map_err(|_| PathError::BadEncoding)?;
    if text.contains(SEPARATOR_LOOKALIKES) {
        return Err(PathError::EncodedSeparator);
    }
    let dotlike = |c: char| c == '.' || DOT_LOOKALIKES.contains(&c);
    if text
        .split('/')
        .any(|seg| !seg.is_empty() && seg.chars().all(dotlike) && !seg.is_ascii())
    {
        return Err(PathError::EncodedSeparator);
    }
    Ok(())
}

/// The byte two hex digits stand for.
fn hex_byte(hex: Option<&[u8]>) -> Option<u8> {
    let hex = std::str::from_utf8(hex?).ok()?;
    u8::from_str_radix(hex, 16).ok()
}

/// RFC 3986's unreserved characters but `.` (an encoded dot is refused).
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~')
}

/// `path` with the escapes of [`is_unreserved`] characters decoded, every
/// other escape kept as it was (escapes were validated by the caller).
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(value) = hex_byte(bytes.get(i + 1..i + 3)).filter(|v| is_unreserved(*v))
        {
            out.push(value as char);
            i += 3;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// What one pass over a path found that normalising must act on.
#[derive(Clone, Copy)]
struct Scan {
    /// A `.` segment or an empty segment (`//`) to resolve.
    needs_dot_work: bool,
    /// An escape of a non-ASCII byte: what the escapes decode to is checked.
    non_ascii_escape: bool,
    /// An escape of an unreserved character, to decode.
    unreserved_escape: bool,
}

/// Refuses what a path may not hold (see the module's list) and notes what
/// normalising it must do, in one pass over its bytes.
fn scan(path: &str) -> Result<Scan, PathError> {
    let bytes = path.as_bytes();
    let mut found = Scan {
        needs_dot_work: false,
        non_ascii_escape: false,
        unreserved_escape: false,
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let value = hex_byte(bytes.get(i + 1..i + 3)).ok_or(PathError::BadEscape)?;
                if matches!(value, b'/' | b'\\' | b'.' | 0) {
                    return Err(PathError::EncodedSeparator);
                }
                if value == b'%' {
                    return Err(PathError::DoubleEncoded);
                }
                if value == b';' {
                    return Err(PathError::Semicolon);
                }
                found.non_ascii_escape |= !value.is_ascii();
                found.unreserved_escape |= is_unreserved(value);
                i += 3;
                continue;
            }
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::Semicolon),
            byte if !byte.is_ascii() => return Err(PathError::RawNonAscii),
            b'.' if bytes[i - 1] == b'/' => found.needs_dot_work = true,
            b'/' if i > 0 && bytes[i - 1] == b'/' => found.needs_dot_work = true,
            _ => {}
        }
        i += 1;
    }
    Ok(found)
}

/// Normalises a request path. Borrows when nothing needs changing.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let found = scan(path)?;
    if found.non_ascii_escape {
        check_decoded(path)?;
    }
    if found.unreserved_escape {
        // Decoding them makes no separator, dot, `%` or `;`: the decoded
        // path is checked again, and has no such escape left.
        let decoded = decode_unreserved(path);
        return Ok(Cow::Owned(normalize(&decoded)?.into_owned()));
    }
    if !found.needs_dot_work {
        return Ok(Cow::Borrowed(path));
    }
    resolve_segments(path).map(Cow::Owned)
}

/// `path` with its dot-segments resolved and its empty segments dropped.
fn resolve_segments(path: &str) -> Result<String, PathError> {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, segment) in segments.iter().enumerate() {
        match *segment {
            "." => {
                if n == last {
                    out.push("");
                }
            }
            ".." => {
                if out.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                if n == last {
                    out.push("");
                }
            }
            // An empty segment (`//`) is dropped, as the platform's servlet
            // container and nginx (`merge_slashes`) drop it: left in,
            // `/api//user/x/token` would be no path keygate classes while
            // the upstream answered `/api/user/x/token`.
            "" if n != last => {}
            other => out.push(other),
        }
    }
    let mut normalized = String::with_capacity(path.len());
    for segment in &out {
        normalized.push('/');
        normalized.push_str(segment);
    }
    if normalized.is_empty() {
        normalized.push('/');
    }
    Ok(normalized)
}

/// A query component with its `%XX` escapes decoded (RFC 3986 section 2.1;
/// `+` is kept: a JWT has none); `None` for a bad escape or bytes that are not
/// UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_are_borrowed_unchanged() {
        for p in ["/", "/api/tenant/devices", "/api/a.b/c..d", "/api/%20x"] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn empty_segments_are_dropped_so_a_doubled_slash_cannot_hide_an_endpoint() {
        for (doubled, single) in [
            ("/api//x", "/api/x"),
            ("//api/auth/login", "/api/auth/login"),
            (
                "/api/user//u1///activationLink",
                "/api/user/u1/activationLink",
            ),
            ("/api//", "/api/"),
            ("//", "/"),
            ("/api//a/../b", "/api/b"),
        ] {
            assert_eq!(normalize(doubled).as_deref(), Ok(single), "{doubled}");
        }
    }

    #[test]
    fn escaped_letters_and_digits_are_decoded_so_routing_reads_what_the_platform_reads() {
        for (escaped, plain) in [
            ("/%61pi/auth/login", "/api/auth/login"),
            ("/%41pi/x", "/Api/x"),
            ("/api/noauth/%61ctivate", "/api/noauth/activate"),
            ("/api/user/u1/t%6f%6Ben", "/api/user/u1/token"),
            ("/api/%7Ex%2D%5f%31", "/api/~x-_1"),
            ("/api/%61/../b", "/api/b"),
            ("/api/%61%20b", "/api/a%20b"),
        ] {
            assert_eq!(normalize(escaped).as_deref(), Ok(plain), "{escaped}");
        }
        // Other escapes keep their meaning and their checks.
        assert_eq!(
            normalize("/%61pi/%2e%2e/x"),
            Err(PathError::EncodedSeparator)
        );
        assert_eq!(normalize("/%61pi/%3b"), Err(PathError::Semicolon));
        assert_eq!(normalize("/%61pi/%25"), Err(PathError::DoubleEncoded));
    }

    #[test]
    fn dot_segments_are_resolved() {
        assert_eq!(
            normalize("/api/noauth/../tenant/devices").unwrap(),
            "/api/tenant/devices"
        );
        assert_eq!(normalize("/api/./x").unwrap(), "/api/x");
        assert_eq!(normalize("/api/x/.").unwrap(), "/api/x/");
        assert_eq!(normalize("/api/x/..").unwrap(), "/api/");
        assert_eq!(normalize("/a/..").unwrap(), "/");
        assert_eq!(normalize("/.").unwrap(), "/");
    }

    #[test]
    fn climbing_above_root_is_refused() {
        assert_eq!(normalize("/.."), Err(PathError::AboveRoot));
        assert_eq!(
            normalize("/api/../../etc/passwd"),
            Err(PathError::AboveRoot)
        );
    }

    #[test]
    fn encoded_traversal_and_separators_are_refused() {
        for p in [
            "/api/noauth/..%2ftenant",
            "/api/%2e%2e/x",
            "/api/%2E/x",
            "/api/a%00b",
            "/api/a%5cb",
            "/api/a%2Fb",
        ] {
            assert_eq!(normalize(p), Err(PathError::EncodedSeparator), "{p}");
        }
        assert_eq!(normalize("/api/a\\..\\b"), Err(PathError::Backslash));
        assert_eq!(normalize("/api/%zz"), Err(PathError::BadEscape));
        assert_eq!(normalize("/api/%2"), Err(PathError::BadEscape));
        assert_eq!(normalize("api"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn semicolon_path_parameters_are_refused() {
        for p in [
            "/api/noauth/..;/device/x",
            "/api/noauth/.;/x",
            "/api/device;jsessionid=1",
            "/api/;/x",
        ] {
            assert_eq!(normalize(p), Err(PathError::Semicolon), "{p}");
        }
        // Encoded, it is refused the same: a container may decode first.
        for p in [
            "/api/noauth/..%3B/device/x",
            "/api/noauth/..%3bjsessionid=1/device/x",
            "/api/a%3Bb",
        ] {
            assert_eq!(normalize(p), Err(PathError::Semicolon), "{p}");
        }
    }

    #[test]
    fn raw_non_ascii_bytes_are_refused() {
        for p in [
            "/api/noauth/\u{FF0E}\u{FF0E}/tenant/devices",
            "/api/noauth/\u{2024}\u{2024}/x",
            "/api/noauth/\u{FE52}\u{FE52}/x",
            "/api/caf\u{e9}",
        ] {
            assert_eq!(normalize(p), Err(PathError::RawNonAscii), "{p}");
        }
    }

    #[test]
    fn encoded_separator_and_dot_lookalikes_are_refused() {
        for p in [
            "/api/noauth/%ef%bc%8e%ef%bc%8e%ef%bc%8ftenant/devices",
            "/api/noauth/..%ef%bc%bcx",
            "/api/noauth/%e2%80%a5/x",
            "/api/noauth/%ef%b9%92/x",
            "/api/%e2%84%80",
        ] {
            assert_eq!(normalize(p), Err(PathError::EncodedSeparator), "{p}");
        }
    }

    #[test]
    fn double_encoded_and_overlong_dots_are_refused() {
        for p in ["/api/noauth/%252e%252e/x", "/api/%252f", "/api/%25%32%65"] {
            assert!(normalize(p).is_err(), "{p}");
        }
        assert_eq!(normalize("/api/%252e"), Err(PathError::DoubleEncoded));
        for p in [
            "/api/%c0%ae%c0%ae/x",
            "/api/%e0%80%ae/x",
            "/api/%c0%af",
            "/api/%ff",
        ] {
            assert_eq!(normalize(p), Err(PathError::BadEncoding), "{p}");
        }
        for p in ["/api/noauth/%ef%bc%8e%ef%bc%8e/x", "/api/.%e2%80%a4/x"] {
            assert_eq!(normalize(p), Err(PathError::EncodedSeparator), "{p}");
        }
        assert_eq!(normalize("/api/100%25"), Err(PathError::DoubleEncoded));
        // Non-ASCII names that are plain UTF-8 data still pass.
        assert!(normalize("/api/caf%c3%a9").is_ok());
    }

    /// Hostile paths, for the property tests and `fuzz/run`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Pieces that have broken path handling somewhere: separators,
        /// dots, escapes of both, broken and double escapes, look-alikes.
        fn piece() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("/".to_string()),
                Just(".".to_string()),
                Just("..".to_string()),
                Just("%2e".to_string()),
                Just("%2F".to_string()),
                Just("%5c".to_string()),
                Just("%25".to_string()),
                Just("%".to_string()),
                Just("%zz".to_string()),
                Just("%00".to_string()),
                Just("%3b".to_string()),
                Just(";".to_string()),
                Just("\\".to_string()),
                Just("%ef%bc%8e".to_string()),
                Just("%c0%ae".to_string()),
                Just("\u{FF0E}".to_string()),
                Just("%c3%a9".to_string()),
                Just("api".to_string()),
                Just("noauth".to_string()),
                "[a-z0-9._~-]{1,6}",
                any::<String>(),
            ]
        }

        fn path() -> impl Strategy<Value = String> {
            proptest::collection::vec(piece(), 0..16).prop_map(|p| format!("/{}", p.concat()))
        }

        /// Percent-decodes what decodes (as a lenient upstream would).
        fn decode(path: &str) -> Vec<u8> {
            let bytes = path.as_bytes();
            let mut out = Vec::with_capacity(bytes.len());
            let mut i = 0;
            while i < bytes.len() {
                match (bytes[i], hex_byte(bytes.get(i + 1..i + 3))) {
                    (b'%', Some(b)) => {
                        out.push(b);
                        i += 3;
                    }
                    (b, _) => {
                        out.push(b);
                        i += 1;
                    }
                }
            }
            out
        }

        proptest! {
            #[test]
            fn a_normalised_path_is_a_fixed_point(path in path()) {
                if let Ok(normalized) = normalize(&path) {
                    prop_assert!(normalized.starts_with('/'));
                    let again = normalize(&normalized);
                    prop_assert_eq!(again.as_deref(), Ok(&*normalized));
                }
            }

            #[test]
            fn an_upstream_decoding_the_path_sees_the_segments_routing_saw(path in path()) {
                if let Ok(normalized) = normalize(&path) {
                    let decoded = decode(&normalized);
                    let text = String::from_utf8_lossy(&decoded);
                    prop_assert_eq!(
                        decoded.iter().filter(|b| **b == b'/').count(),
                        normalized.matches('/').count(),
                        "an encoded separator passed"
                    );
                    prop_assert!(!decoded.contains(&b'\\') && !decoded.contains(&0));
                    for segment in text.split('/') {
                        prop_assert!(segment != "." && segment != "..", "{segment:?} in {normalized}");
                        prop_assert!(
                            segment.is_empty() || !segment.chars().all(|c| c == '.' || DOT_LOOKALIKES.contains(&c)) || segment.len() > 2,
                            "dot look-alike segment {segment:?}"
                        );
                    }
                }
            }

            #[test]
            fn plain_paths_pass_unchanged(path in "(/[a-z0-9_~-]{1,8}){0,8}/?") {
                let path = if path.is_empty() { "/".to_string() } else { path };
                let normalized = normalize(&path);
                prop_assert_eq!(normalized.as_deref(), Ok(path.as_str()));
            }
        }
    }
}
