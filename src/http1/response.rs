//! Response heads: parsed once with `httparse`, with how the body that
//! follows is delimited, as hyper's client reads it (RFC 9112 section 6.3):
//!
//! - rule 1: a 1xx, a 204 and a 304 have no body ([`bodiless`]). A 101 ends
//!   the exchange and its connection is not reused.
//! - rule 3: a `Transfer-Encoding` whose last coding is `chunked` frames the
//!   body in chunks; any other `Transfer-Encoding` makes the body run to the
//!   end of the connection. Either way a `Content-Length` beside it is
//!   ignored for framing. `Transfer-Encoding` in HTTP/1.0 is refused.
//! - rule 5: a `Content-Length` must be one number
//!   ([`super::content_length`]); repeated with equal values it is that
//!   number, with different values or anything but digits the response is
//!   refused.
//! - rule 8: with neither, the body runs to the end of the connection, which
//!   is then not reused.
//!
//! A connection may carry another exchange only when the response said
//! nothing against it (`Connection: close`, HTTP/1.0 without `keep-alive`)
//! and its body has a delimited end.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version, header};

use super::connection;
use super::length::content_length;
use super::request::MAX_HEADERS;

/// Why a response head could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadError(pub &'static str);

/// Whether a response with this status has no body (RFC 9112 6.3 rule 1),
/// for the one who reads it and the one who writes it.
#[inline]
pub fn bodiless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (rule 1).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// To the end of the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    /// Bytes the head took, from the start of the buffer it was parsed in.
    pub len: usize,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub reusable: bool,
}

/// What the head's framing fields say, gathered in one pass.
#[derive(Debug, Default)]
struct Fields {
    length: Option<u64>,
    bad_length: bool,
    transfer_encoding: bool,
    chunked: bool,
    connection: connection::Options,
}

impl Fields {
    fn read(&mut self, name: &HeaderName, value: &[u8]) {
        if name == header::CONTENT_LENGTH {
            match content_length(value) {
                Some(n) if self.length.is_none_or(|m| m == n) => self.length = Some(n),
                _ => self.bad_length = true,
            }
        } else if name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
            // The last coding of the last field decides (RFC 9112 6.1).
            self.chunked = value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            self.connection.read(value);
        }
    }

    /// How the body is delimited (rules 1, 3, 5 and 8).
    fn framing(&self, status: StatusCode, version: Version) -> Result<Framing, HeadError> {
        if bodiless(status) {
            return Ok(Framing::Empty);
        }
        if self.transfer_encoding {
            if version == Version::HTTP_10 {
                return Err(HeadError("transfer-encoding in HTTP/1.0"));
            }
            return Ok(if self.chunked {
                Framing::Chunked
            } else {
                Framing::Close
            });
        }
        if self.bad_length {
            return Err(HeadError("invalid content-length"));
        }
        Ok(self.length.map_or(Framing::Close, Framing::Length))
    }
}

/// Parses the response head at the start of `buf`: `Ok(None)` while it is
/// not whole. `max_head`: the largest head read.
pub fn parse(buf: &[u8], max_head: usize) -> Result<Option<ResponseHead>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > max_head => {
            return Err(HeadError("too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError("too many headers")),
        Err(_) => return Err(HeadError("malformed")),
    };
    if len > max_head {
        return Err(HeadError("too large"));
    }
    let status = StatusCode::from_u16(response.code.unwrap_or_default())
        .map_err(|_| HeadError("bad status"))?;
    let version = match response.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut fields = Fields::default();
    for h in response.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| HeadError("bad name"))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| HeadError("bad value"))?;
        fields.read(&name, h.value);
        headers.append(name, value);
    }
    let framing = fields.framing(status, version)?;
    let options = fields.connection;
    let reusable = framing != Framing::Close
        && status != StatusCode::SWITCHING_PROTOCOLS
        && !options.close
        && (version == Version::HTTP_11 || options.keep_alive);
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        len,
        framing,
        reusable,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_HEAD: usize = 8192 + 4096 * 100;

    fn head(text: &str) -> ResponseHead {
        parse(text.as_bytes(), MAX_HEAD).unwrap().unwrap()
    }

    #[test]
    fn response_framing_follows_rfc_9112_section_6_3() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                Framing::Close,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", Framing::Close, false),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n",
                Framing::Length(5),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
                Framing::Empty,
                false,
            ),
        ];
        for (text, framing, reusable) in cases {
            let parsed = head(text);
            assert_eq!(parsed.framing, framing, "{text:?}");
            assert_eq!(parsed.reusable, reusable, "{text:?}");
            assert_eq!(parsed.len, text.len(), "{text:?}");
        }
    }

    #[test]
    fn ambiguous_or_malformed_response_heads_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1000000000000000\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\r\n b\r\n\r\n",
            "HTTX/1.1 200 OK\r\n\r\n",
        ] {
            assert!(parse(text.as_bytes(), MAX_HEAD).is_err(), "{text:?}");
        }
        assert!(
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n", MAX_HEAD)
                .unwrap()
                .is_none()
        );
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert!(parse(huge.as_bytes(), MAX_HEAD).is_err());
    }

    #[test]
    fn only_1xx_204_and_304_responses_are_bodiless() {
        for (status, none) in [(100, true), (101, true), (204, true), (304, true)] {
            assert_eq!(bodiless(StatusCode::from_u16(status).unwrap()), none);
        }
        for status in [200, 205, 302, 404, 500] {
            assert!(!bodiless(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }

    mod properties {
        use super::super::*;
        use super::MAX_HEAD;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes: the response parser answers (never panics), and a
            /// parsed head is within the bytes given.
            #[test]
            fn the_response_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(Some(head)) = parse(&bytes, MAX_HEAD) {
                    prop_assert!(head.len <= bytes.len());
                }
            }
        }
    }
}
