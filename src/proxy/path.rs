//! One normalised path decides the route and the auth policy, and the upstream
//! receives that same path.
//!
//! Dot-segments are resolved (RFC 3986 section 5.2.4); a percent-encoded `/`,
//! `\`, `.` or NUL, a raw `\`, a broken escape, or a `..` above the root is
//! refused rather than repaired, so no later decoding can change the meaning.

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
}

/// Normalises a request path. Borrows when nothing needs changing.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let bytes = path.as_bytes();
    let mut needs_dot_work = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEscape)?;
                let value = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(PathError::BadEscape)?;
                if matches!(value, b'/' | b'\\' | b'.' | 0) {
                    return Err(PathError::EncodedSeparator);
                }
                i += 3;
                continue;
            }
            b'\\' => return Err(PathError::Backslash),
            b'.' if bytes[i - 1] == b'/' => needs_dot_work = true,
            _ => {}
        }
        i += 1;
    }
    if !needs_dot_work {
        return Ok(Cow::Borrowed(path));
    }
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
    Ok(Cow::Owned(normalized))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_are_borrowed_unchanged() {
        for p in [
            "/",
            "/api/tenant/devices",
            "/api/a.b/c..d",
            "/api/%20x",
            "/api//x",
        ] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
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
}
