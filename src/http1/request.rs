//! Request heads: parsed once with `httparse` into `http` types, and told
//! apart as *plain* (what a server may take without hyper: HTTP/1.1, simple
//! framing) or not, with the first reason in the head's order.
//!
//! Framing (RFC 9112 section 6) as read here:
//!
//! - 6.1: a request carrying `Transfer-Encoding` is not plain
//!   ([`NotPlain::TransferEncoding`]): chunked bodies, and the smuggling a
//!   `Transfer-Encoding` beside a `Content-Length` allows (6.3 rule 3).
//! - 6.2 / 6.3 rule 5: `Content-Length` must be one decimal number
//!   ([`super::content_length`]). A repeated `Content-Length` (even with
//!   equal values), a list, a sign, spaces inside or anything but digits is
//!   not plain ([`NotPlain::Length`]).
//! - 6.3 rule 6: a request with neither has no body (length 0).

use http::{HeaderName, HeaderValue, Method, Request, Uri, Version, header};

use super::connection;
use super::length::content_length;

/// As many header lines as hyper's server accepts; more is hyper's to refuse.
pub const MAX_HEADERS: usize = 100;

/// Why a request head is not a plain one, the first reason met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotPlain {
    /// Not HTTP/1.1.
    Version,
    /// `HEAD` (a response with a length and no body) or `CONNECT`.
    Method,
    /// An `Upgrade` header.
    Upgrade,
    /// An `Expect` header (`100-continue`).
    Expect,
    /// A `Transfer-Encoding` header.
    TransferEncoding,
    /// A `Content-Length` that is not one plain decimal number.
    Length,
    /// A `Connection` header naming `upgrade`.
    Connection,
    /// A header name the caller refuses.
    Name,
    /// The head does not parse, or is over its size limit.
    Malformed,
}

/// A plain request head: the head as `http` types, how many bytes it took,
/// and the length of its body.
#[derive(Debug)]
pub struct RequestHead {
    pub request: Request<()>,
    pub head_len: usize,
    pub body_len: usize,
    /// The client asked to close the connection after this request.
    pub close: bool,
}

/// What the bytes read so far hold. Returned once per head and matched at
/// once: boxing the head would cost an allocation per request.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A whole plain head.
    Plain(RequestHead),
    /// A head (or bytes) that is not plain.
    NotPlain(NotPlain),
}

/// Parses the request head at the start of `buf`. `max_head`: the size past
/// which an unfinished head is not plain ([`NotPlain::Malformed`]).
/// `refused(name)`: a header name that makes the head not plain
/// ([`NotPlain::Name`]), checked in the head's order with the others.
pub fn parse(buf: &[u8], max_head: usize, refused: impl Fn(&HeaderName) -> bool) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > max_head => {
            return Parsed::NotPlain(NotPlain::Malformed);
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::NotPlain(NotPlain::Malformed),
    };
    match build(&req, refused) {
        Ok((request, body_len, close)) => Parsed::Plain(RequestHead {
            request,
            head_len,
            body_len,
            close,
        }),
        Err(reason) => Parsed::NotPlain(reason),
    }
}

/// The `http` request of a parsed head, its body length and whether it asks
/// to close the connection; or why it is not plain.
fn build(
    req: &httparse::Request<'_, '_>,
    refused: impl Fn(&HeaderName) -> bool,
) -> Result<(Request<()>, usize, bool), NotPlain> {
    if req.version != Some(1) {
        return Err(NotPlain::Version);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| NotPlain::Malformed)?;
    if method == Method::HEAD || method == Method::CONNECT {
        return Err(NotPlain::Method);
    }
    let uri = Uri::try_from(req.path.unwrap_or_default()).map_err(|_| NotPlain::Malformed)?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    headers.reserve(req.headers.len());
    let mut length: Option<u64> = None;
    let mut options = connection::Options::default();
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| NotPlain::Malformed)?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| NotPlain::Malformed)?;
        if name == header::TRANSFER_ENCODING {
            return Err(NotPlain::TransferEncoding);
        }
        if name == header::UPGRADE {
            return Err(NotPlain::Upgrade);
        }
        if name == header::EXPECT {
            return Err(NotPlain::Expect);
        }
        if refused(&name) {
            return Err(NotPlain::Name);
        }
        if name == header::CONTENT_LENGTH {
            if length.is_some() {
                return Err(NotPlain::Length);
            }
            length = Some(content_length(h.value).ok_or(NotPlain::Length)?);
        }
        if name == header::CONNECTION {
            options.read(h.value);
            if options.upgrade {
                return Err(NotPlain::Connection);
            }
        }
        headers.append(name, value);
    }
    let body_len = usize::try_from(length.unwrap_or(0)).map_err(|_| NotPlain::Length)?;
    Ok((request, body_len, options.close))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Parsed {
        parse(text.as_bytes(), 16 * 1024, |name| {
            name.as_str().contains('_')
        })
    }

    #[test]
    fn a_plain_get_is_taken_with_its_headers_in_order() {
        let Parsed::Plain(head) = head(
            "GET /api/x?a=1 HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey k\r\nAccept: */*\r\nAccept: a\r\n\r\n",
        ) else {
            panic!("not taken")
        };
        assert_eq!(head.request.method(), Method::GET);
        assert_eq!(head.request.uri(), "/api/x?a=1");
        assert_eq!(head.body_len, 0);
        let names: Vec<_> = head
            .request
            .headers()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["host", "x-authorization", "accept", "accept"]);
    }

    #[test]
    fn an_unfinished_head_waits_and_an_oversized_one_is_declined() {
        assert!(matches!(
            head("GET /api/x HTTP/1.1\r\nHost: gw\r\n"),
            Parsed::Partial
        ));
        let long = format!("GET /api/x HTTP/1.1\r\nX: {}", "a".repeat(20_000));
        assert!(matches!(head(&long), Parsed::NotPlain(NotPlain::Malformed)));
    }

    #[test]
    fn smuggling_shapes_are_not_plain() {
        for (text, reason) in [
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                NotPlain::TransferEncoding,
            ),
            (
                "POST /api/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                NotPlain::TransferEncoding,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                NotPlain::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n",
                NotPlain::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                NotPlain::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 0x3\r\n\r\n",
                NotPlain::Length,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 1000000000000000\r\n\r\n",
                NotPlain::Length,
            ),
            ("GET /api/x HTTP/1.0\r\n\r\n", NotPlain::Version),
            ("HEAD /api/x HTTP/1.1\r\n\r\n", NotPlain::Method),
            (
                "GET /api/ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
                NotPlain::Upgrade,
            ),
            (
                "POST /api/x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
                NotPlain::Expect,
            ),
            (
                "GET /api/x HTTP/1.1\r\nConnection: Upgrade\r\n\r\n",
                NotPlain::Connection,
            ),
            (
                "GET /api/x HTTP/1.1\r\nConnection: close\r\nConnection: upgrade\r\n\r\n",
                NotPlain::Connection,
            ),
            (
                "GET /api/x HTTP/1.1\r\nBad Name: x\r\n\r\n",
                NotPlain::Malformed,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent-Length: 3\r\nTransfer_Encoding: chunked\r\n\r\n",
                NotPlain::Name,
            ),
            (
                "POST /api/x HTTP/1.1\r\nContent_Length: 3\r\n\r\n",
                NotPlain::Name,
            ),
            (
                "GET /api/x HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
                NotPlain::Malformed,
            ),
        ] {
            match head(text) {
                Parsed::NotPlain(got) => assert_eq!(got, reason, "{text:?}"),
                other => panic!("{text:?} was {other:?}"),
            }
        }
    }

    #[test]
    fn connection_close_is_taken_and_remembered() {
        for (text, close) in [
            (
                "GET /api/x HTTP/1.1\r\nConnection: Close, X-Auth-User-Id\r\n\r\n",
                true,
            ),
            (
                "GET /api/x HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
                false,
            ),
        ] {
            let Parsed::Plain(taken) = head(text) else {
                panic!("not taken: {text:?}")
            };
            assert_eq!(taken.close, close, "{text:?}");
        }
    }

    #[test]
    fn a_content_length_body_is_measured() {
        let Parsed::Plain(head) = head("POST /api/x HTTP/1.1\r\nContent-Length: 12\r\n\r\n") else {
            panic!("not taken")
        };
        assert_eq!(head.body_len, 12);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn parse(bytes: &[u8]) -> Parsed {
            super::super::parse(bytes, 16 * 1024, |_| false)
        }

        proptest! {
            /// Any bytes: the parser answers (never panics), and a head it
            /// takes is a whole HTTP/1.1 head with one plain length.
            #[test]
            fn the_head_parser_never_panics_and_takes_only_plain_heads(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Parsed::Plain(head) = parse(&bytes) {
                    prop_assert!(head.head_len <= bytes.len());
                    prop_assert!(bytes[..head.head_len].ends_with(b"\n"));
                    prop_assert!(!head.request.headers().contains_key(header::TRANSFER_ENCODING));
                    prop_assert!(head.request.headers().get_all(header::CONTENT_LENGTH).iter().count() <= 1);
                }
            }

            /// Generated heads of header lines: taken exactly when nothing
            /// in them is a reason to decline, with the length they state.
            #[test]
            fn generated_heads_are_taken_or_declined_by_their_framing(
                names in proptest::collection::vec(prop_oneof![
                    Just("accept"), Just("content-length"), Just("transfer-encoding"),
                    Just("x-custom"), Just("connection"), Just("upgrade"), Just("Content-Length"),
                ], 0..6),
                values in proptest::collection::vec(prop_oneof![
                    Just("5"), Just("chunked"), Just("keep-alive"), Just("close"), Just("x"), Just("5, 5"),
                ], 6),
            ) {
                let mut text = String::from("POST /api/x HTTP/1.1\r\n");
                for (name, value) in names.iter().zip(&values) {
                    text.push_str(&format!("{name}: {value}\r\n"));
                }
                text.push_str("\r\n");
                let lengths: Vec<&str> = names.iter().zip(&values)
                    .filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| *v).collect();
                let expected_ok = !names.iter().any(|n| *n == "transfer-encoding" || *n == "upgrade")
                    && lengths.len() <= 1
                    && lengths.iter().all(|v| *v == "5");
                match parse(text.as_bytes()) {
                    Parsed::Plain(head) => {
                        prop_assert!(expected_ok, "{text:?}");
                        prop_assert_eq!(head.body_len, if lengths.is_empty() { 0 } else { 5 });
                        prop_assert_eq!(head.head_len, text.len());
                    }
                    Parsed::NotPlain(_) => prop_assert!(!expected_ok, "{text:?}"),
                    Parsed::Partial => prop_assert!(false, "partial: {text:?}"),
                }
            }
        }
    }
}
