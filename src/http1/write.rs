//! Writing message heads: each line appended to one buffer, in one pass.
//!
//! A response head is framed as RFC 9112 section 6.3 asks of a sender: by
//! its `Content-Length` when it has one (kept, written once), else by the
//! body's exact size when it is known, else chunked; 1xx, 204 and 304
//! responses have no body and no `Content-Length`. Any `Transfer-Encoding`
//! given is dropped: it is hop-by-hop, and the framing is the writer's.

use http::{HeaderName, HeaderValue, Method, header, response};

use super::response::bodiless;

/// Appends a request line (`METHOD target HTTP/1.1`).
#[inline]
pub fn request_line(method: &Method, path_and_query: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Appends one header line.
#[inline]
pub fn header_line(name: &HeaderName, value: &HeaderValue, out: &mut Vec<u8>) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a `content-length` line.
#[inline]
pub fn content_length_line(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa(n, &mut [0u8; 20]));
    out.extend_from_slice(b"\r\n");
}

/// Appends the empty line that ends a head.
#[inline]
pub fn end_head(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n");
}

/// How the body after a written response head is to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body at all (1xx, 204, 304).
    None,
    /// As it is: its length was stated.
    Plain,
    /// In chunks ([`super::write_chunk`], [`super::write_last_chunk`]).
    Chunked,
}

/// Appends an HTTP/1.1 response head for `parts`, with a `date` when it has
/// none; `exact_len()` is asked for the body's exact size only when the
/// head states no length. Says how the body is to be written.
pub fn response_head(
    parts: &response::Parts,
    exact_len: impl FnOnce() -> Option<u64>,
    out: &mut Vec<u8>,
) -> BodyFraming {
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let bodiless = bodiless(status);
    let mut has_length = false;
    for (name, value) in &parts.headers {
        if name == header::TRANSFER_ENCODING {
            // Hop-by-hop; the framing is this writer's.
            continue;
        }
        if name == header::CONTENT_LENGTH {
            // Repeated with one value (the only repetition an upstream
            // response gets through with), it is written once.
            if bodiless || has_length {
                continue;
            }
            has_length = true;
        }
        header_line(name, value, out);
    }
    if !parts.headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        date(out);
        out.extend_from_slice(b"\r\n");
    }
    let framing = if bodiless {
        BodyFraming::None
    } else if has_length {
        BodyFraming::Plain
    } else if let Some(n) = exact_len() {
        content_length_line(n, out);
        BodyFraming::Plain
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        BodyFraming::Chunked
    };
    end_head(out);
    framing
}

/// `n` in decimal, in `buf`.
pub fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Appends the HTTP date of now, formatted once a second per thread.
pub fn date(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Response, StatusCode};

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0u64, 7, 10, 1234567890, u64::MAX] {
            assert_eq!(itoa(n, &mut [0; 20]), n.to_string().as_bytes());
        }
    }

    fn head(response: Response<()>, exact: Option<u64>) -> (String, BodyFraming) {
        let (parts, ()) = response.into_parts();
        let mut out = Vec::new();
        let framing = response_head(&parts, || exact, &mut out);
        (String::from_utf8(out).unwrap(), framing)
    }

    #[test]
    fn a_response_head_is_framed_by_its_length_else_the_body_size_else_chunked() {
        let dated = |status: u16| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            response
                .headers_mut()
                .insert(header::DATE, HeaderValue::from_static("d"));
            response
        };
        let mut stated = dated(200);
        stated
            .headers_mut()
            .append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        stated
            .headers_mut()
            .append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        stated
            .headers_mut()
            .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(
            head(stated, Some(9)),
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: 5\r\n\r\n".into(),
                BodyFraming::Plain
            )
        );
        assert_eq!(
            head(dated(404), Some(9)),
            (
                "HTTP/1.1 404 Not Found\r\ndate: d\r\ncontent-length: 9\r\n\r\n".into(),
                BodyFraming::Plain
            )
        );
        assert_eq!(
            head(dated(200), None),
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ntransfer-encoding: chunked\r\n\r\n".into(),
                BodyFraming::Chunked
            )
        );
        let mut no_content = dated(204);
        no_content
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        assert_eq!(
            head(no_content, Some(0)),
            (
                "HTTP/1.1 204 No Content\r\ndate: d\r\n\r\n".into(),
                BodyFraming::None
            )
        );
    }

    #[test]
    fn a_response_without_a_date_is_given_one() {
        let (text, _) = head(Response::new(()), Some(0));
        assert!(text.starts_with("HTTP/1.1 200 OK\r\ndate: "), "{text:?}");
        assert!(
            text.ends_with(" GMT\r\ncontent-length: 0\r\n\r\n"),
            "{text:?}"
        );
    }
}
