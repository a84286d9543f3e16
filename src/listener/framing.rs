//! Ambiguous HTTP/1 framing, from the connection to the request path.
//!
//! hyper reads a request head naming both `Content-Length` and
//! `Transfer-Encoding` as chunked and drops `Content-Length`, so the request
//! that reaches keygate's handler no longer shows the conflict. The
//! connection's transport feeds the bytes hyper reads to
//! [`crate::http1::FramingScanner`]; when a head named both, a request on
//! that connection carrying `Transfer-Encoding` is marked, and the request
//! path refuses it.

/// Marks a request (in its extensions) that carries `Transfer-Encoding` on a
/// connection where a head named both lengths: the request path refuses it.
#[derive(Debug, Clone, Copy)]
pub struct AmbiguousFraming;
