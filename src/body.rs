//! The one body type that leaves keygate: upstream bodies stream through it,
//! keygate's own answers are built into it.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::UnsyncBoxBody};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming, type-erased body.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Box any body whose errors can be boxed.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// An error reading a client's request body (a malformed chunk, a connection
/// that broke off): the client's fault, told apart from an upstream's.
#[derive(Debug)]
pub struct ClientBodyError(pub hyper::Error);

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reading the client's request body: {}", self.0)
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Reads what is left of a refused request body and throws it away, in the
/// background, after the refusal has been answered.
///
/// Over HTTP/2 a stream whose request body is dropped unread ends with
/// RST_STREAM right after the response. A client still uploading (its body
/// larger than the flow-control window) may then fail on the reset before it
/// reads the 413 it was sent (curl does). Reading the rest lets the upload
/// finish and the stream close normally. Bounded: a body whose total size
/// (`already_read` plus what follows) would pass `max_total`, or that does not
/// end within `within`, is dropped, and the stream reset after the response.
pub fn discard_rest<B>(body: B, already_read: u64, max_total: u64, within: std::time::Duration)
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    use bytes::Buf as _;
    let declared_total = body
        .size_hint()
        .exact()
        .map(|rest| already_read.saturating_add(rest));
    if body.is_end_stream() || declared_total.is_some_and(|total| total > max_total) {
        return;
    }
    tokio::spawn(async move {
        let drain = async {
            let mut body = std::pin::pin!(body);
            let mut total = already_read;
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    total = total.saturating_add(data.remaining() as u64);
                    if total > max_total {
                        return;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(within, drain).await;
    });
}

/// [`discard_rest`] for a body refused over `version`: HTTP/2 only. HTTP/1.1
/// closes the connection after the response instead, and its client reads
/// the answer as it writes.
pub fn discard_rest_if_http2<B>(
    version: http::Version,
    body: B,
    already_read: u64,
    limits: &crate::config::HttpLimits,
) where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    if version == http::Version::HTTP_2 {
        discard_rest(
            body,
            already_read,
            limits.max_body_bytes.saturating_mul(2),
            limits.body_read_timeout,
        );
    }
}
