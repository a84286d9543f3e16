//! The HTTP/1.1 codec: message heads, body framing and the chunked coding,
//! for requests and responses alike, shared by every reader and writer of
//! HTTP/1 keygate has besides hyper: the lean server path
//! (`listener::h1fast`), the upstream client's wire (`proxy::wire`) and the
//! scan of the bytes hyper reads for ambiguous framing (`listener::serve`).
//!
//! Each rule of RFC 9112 is decided once, here:
//!
//! - [`content_length`]: the one reading of a `Content-Length` value (6.3
//!   rule 5), with its one digit cap.
//! - [`connection`]: the one reading of a `Connection` header (9.6).
//! - [`request`]: request heads, and whether one is plain (6.1 to 6.3).
//! - [`response`]: response heads and how their body is delimited (6.3),
//!   and which statuses have none ([`bodiless`]).
//! - [`chunked`]: the chunked coding (7.1), read and written.
//! - [`write`]: heads written in one pass into one buffer.
//! - [`scan`]: heads naming both `Content-Length` and `Transfer-Encoding`.
//!
//! A low module: it uses `http`, `httparse` and `bytes`, nothing of keygate.

pub mod chunked;
pub mod connection;
pub mod length;
pub mod request;
pub mod response;
pub mod scan;
pub mod write;

pub use chunked::{ChunkError, Chunked, write_chunk, write_last_chunk};
pub use length::content_length;
pub use response::{Framing, HeadError, ResponseHead, bodiless};
pub use scan::FramingScanner;
