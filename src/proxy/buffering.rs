//! Request buffering, as nginx's `proxy_request_buffering` does it: a small
//! proxied request body is read whole, at its pace ([`super::pacing`]),
//! before an upstream connection or an in-flight slot is taken, so that a
//! client trickling small bodies holds nothing upstream while it trickles.
//!
//! - A declared length (`Content-Length`) up to the limit
//!   (`limits.buffered_body_bytes`, bounded by `limits.max_body_bytes`): the
//!   body is read whole, then forwarded with its length.
//! - No declared length (HTTP/1.1 chunked, HTTP/2 without
//!   `content-length`): read up to the limit; a body that ends within it is
//!   forwarded whole, with a `Content-Length`; one that passes it is
//!   forwarded as the part read followed by the rest, streamed.
//! - A larger declared length, an empty body, a limit of 0: streamed as
//!   before.
//!
//! What bodies being read hold is bounded per connection
//! ([`CONNECTION_BUDGET`]): an HTTP/2 connection's streams share it, and a
//! body that finds it spent is forwarded as the part read, then the rest,
//! streamed, as a large one is (taking its in-flight slot then).
//!
//! Trailers end a body; they are not forwarded (nor are they when a body
//! streams: the `Trailer` header that would announce them is hop-by-hop).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;

/// The most the bodies being read whole on one connection hold together
/// (or the limit of one body, when larger): 1 MiB, what hyper's HTTP/2
/// connection window already lets a client have keygate hold unread.
pub(super) const CONNECTION_BUDGET: u64 = 1 << 20;

/// What reading up to the limit found.
pub(super) enum Buffered<B> {
    /// The body ended within the limit: all of it.
    Whole(Bytes),
    /// The body passed the limit: what was read, and the body to read on.
    Begun(Bytes, B),
}

/// Reads `body` until it ends, until more than `limit` bytes were read, or
/// until `take` refuses to hold the bytes of a frame (its connection's
/// budget is spent). A body that comes in one frame (the usual) is kept as
/// it came, uncopied.
pub(super) async fn read_up_to<B>(
    mut body: B,
    limit: u64,
    mut take: impl FnMut(u64) -> bool,
) -> Result<Buffered<B>, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut read = 0u64;
    loop {
        let Some(frame) = body.frame().await else {
            break;
        };
        let Ok(data) = frame?.into_data() else {
            // Trailers come last.
            break;
        };
        if data.is_empty() {
            continue;
        }
        read += data.len() as u64;
        let held = read <= limit && take(data.len() as u64);
        match &first {
            None => first = Some(data),
            Some(first) => {
                let joined = more.get_or_insert_with(|| {
                    // Room for what is declared to follow, within the limit.
                    let capacity = body
                        .size_hint()
                        .exact()
                        .map_or(read, |rest| read.saturating_add(rest))
                        .min(limit.saturating_add(1));
                    let mut joined = BytesMut::with_capacity(capacity as usize);
                    joined.extend_from_slice(first);
                    joined
                });
                joined.extend_from_slice(&data);
            }
        }
        if !held {
            return Ok(Buffered::Begun(joined(first, more), body));
        }
    }
    Ok(Buffered::Whole(joined(first, more)))
}

fn joined(first: Option<Bytes>, more: Option<BytesMut>) -> Bytes {
    match more {
        Some(more) => more.freeze(),
        None => first.unwrap_or_default(),
    }
}

/// A body begun: the bytes already read, then the rest of it.
pub(super) struct Resumed<B> {
    pub(super) read: Option<Bytes>,
    pub(super) rest: B,
}

impl<B> Body for Resumed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read.as_ref().map_or(0, |b| b.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{StreamBody, combinators::UnsyncBoxBody};

    type TestBody = UnsyncBoxBody<Bytes, std::convert::Infallible>;

    /// A connection budget never spent.
    fn any(_: u64) -> bool {
        true
    }

    /// A body of these frames, of unknown length.
    fn chunks(parts: &[&'static [u8]]) -> TestBody {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    #[tokio::test]
    async fn a_body_that_ends_within_the_limit_is_read_whole() {
        let Ok(Buffered::Whole(bytes)) = read_up_to(chunks(&[b"ab", b"", b"cd"]), 4, any).await
        else {
            panic!("not whole")
        };
        assert_eq!(bytes, "abcd");
        let Ok(Buffered::Whole(bytes)) = read_up_to(chunks(&[]), 4, any).await else {
            panic!("not whole")
        };
        assert!(bytes.is_empty());
    }

    #[tokio::test]
    async fn a_body_of_one_frame_is_kept_as_it_came() {
        let frame = Bytes::from_static(b"one frame");
        let body = http_body_util::Full::new(frame.clone());
        let Ok(Buffered::Whole(bytes)) = read_up_to(body, 64, any).await else {
            panic!("not whole")
        };
        assert_eq!(bytes.as_ptr(), frame.as_ptr(), "not copied");
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_resumed_with_what_was_read_then_the_rest() {
        let Ok(Buffered::Begun(read, rest)) =
            read_up_to(chunks(&[b"ab", b"cd", b"ef", b"gh"]), 3, any).await
        else {
            panic!("not begun")
        };
        assert_eq!(read, "abcd", "read until past the limit, no further");
        let resumed = Resumed {
            read: Some(read),
            rest,
        };
        let all = resumed.collect().await.unwrap().to_bytes();
        assert_eq!(all, "abcdefgh", "nothing lost, nothing twice, in order");
    }

    #[tokio::test]
    async fn a_body_that_finds_its_connections_budget_spent_is_resumed_not_held() {
        let mut budget = 5u64;
        let take = |bytes: u64| {
            let taken = bytes <= budget;
            if taken {
                budget -= bytes;
            }
            taken
        };
        let Ok(Buffered::Begun(read, rest)) =
            read_up_to(chunks(&[b"abc", b"def", b"gh"]), 64, take).await
        else {
            panic!("not begun")
        };
        assert_eq!(read, "abcdef", "what was read goes first");
        let resumed = Resumed {
            read: Some(read),
            rest,
        };
        assert_eq!(resumed.collect().await.unwrap().to_bytes(), "abcdefgh");
    }

    #[tokio::test]
    async fn trailers_end_a_body() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", http::HeaderValue::from_static("1"));
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        let Ok(Buffered::Whole(bytes)) = read_up_to(body, 64, any).await else {
            panic!("not whole")
        };
        assert_eq!(bytes, "ab");
    }

    #[test]
    fn a_resumed_body_counts_what_was_read_in_its_size() {
        let resumed = Resumed {
            read: Some(Bytes::from_static(b"abc")),
            rest: http_body_util::Full::new(Bytes::from_static(b"de")),
        };
        assert_eq!(resumed.size_hint().exact(), Some(5));
        assert!(!resumed.is_end_stream());
    }
}
