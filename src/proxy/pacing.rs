//! The pace a proxied request body must keep, so that a client trickling a
//! body cannot hold an upstream connection for the whole request timeout
//! (a slow-POST attack: declare a large body, send a byte, wait).
//!
//! Two bounds, on the time the body is *waited on* (while the upstream is
//! slow to take what was read, keygate is not waiting on the client, and that
//! time does not count):
//! - a gap: no wait for the next bytes may last longer than
//!   `limits.body_read_timeout`;
//! - a rate: once the waits add up to `body_read_timeout`, the body must have
//!   brought at least `limits.min_body_rate` bytes per second of waiting.
//!
//! Either one ends the body with [`BodyTooSlow`], the client's fault: the
//! request is answered 408 and its connection closed.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, ClientBodyError};

/// A client's body that did not keep the required pace.
#[derive(Debug)]
pub struct BodyTooSlow;

impl std::fmt::Display for BodyTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client's request body arrived too slowly")
    }
}

impl std::error::Error for BodyTooSlow {}

/// The bounds, from `[limits]`.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub gap: Duration,
    /// Bytes per second of waiting; 0: no rate bound.
    pub min_rate: u64,
}

/// A client's request body held to a [`Pace`]. Its read errors are marked
/// [`ClientBodyError`], so a body that broke off is the client's 400, not the
/// upstream's 502.
pub struct Paced {
    inner: Incoming,
    pace: Pace,
    /// Armed while waiting for the client; `None` until the first wait.
    deadline: Option<Pin<Box<Sleep>>>,
    /// When the current wait began, while waiting.
    waiting_since: Option<Instant>,
    /// Time spent waiting on the client so far, ended waits only.
    waited: Duration,
    read: u64,
}

impl Paced {
    pub fn new(inner: Incoming, pace: Pace) -> Paced {
        Paced {
            inner,
            pace,
            deadline: None,
            waiting_since: None,
            waited: Duration::ZERO,
            read: 0,
        }
    }

    /// Starts (or goes on with) a wait for the client at `now`; ready when
    /// the gap bound has passed.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        let since = *self.waiting_since.get_or_insert(now);
        let due = since + self.pace.gap;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if deadline.deadline() != due {
            deadline.as_mut().reset(due);
        }
        deadline.as_mut().poll(cx)
    }

    /// Ends the current wait with `bytes` received; `false` when the body
    /// is now below the rate bound.
    fn arrived(&mut self, bytes: usize) -> bool {
        if let Some(since) = self.waiting_since.take() {
            self.waited += since.elapsed();
        }
        self.read += bytes as u64;
        keeps_pace(self.pace, self.waited, self.read)
    }
}

/// Whether `read` bytes in `waited` time of waiting keep `pace`'s rate.
fn keeps_pace(pace: Pace, waited: Duration, read: u64) -> bool {
    if pace.min_rate == 0 || waited < pace.gap {
        return true;
    }
    u128::from(read) * 1000 >= u128::from(pace.min_rate) * waited.as_millis()
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                ready!(this.wait(cx));
                Poll::Ready(Some(Err(Box::new(BodyTooSlow))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                if !this.arrived(bytes) {
                    return Poll::Ready(Some(Err(Box::new(BodyTooSlow))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                Poll::Ready(Some(Err(Box::new(ClientBodyError(error)))))
            }
            Poll::Ready(None) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Pace = Pace {
        gap: Duration::from_secs(10),
        min_rate: 1024,
    };

    #[test]
    fn the_rate_is_judged_only_after_the_first_gap_of_waiting() {
        assert!(keeps_pace(PACE, Duration::from_secs(9), 1));
        assert!(!keeps_pace(PACE, Duration::from_secs(10), 1));
        assert!(keeps_pace(PACE, Duration::from_secs(10), 10 * 1024));
        assert!(!keeps_pace(PACE, Duration::from_secs(60), 10 * 1024));
    }

    #[test]
    fn a_zero_rate_bounds_only_the_gap() {
        let pace = Pace {
            min_rate: 0,
            ..PACE
        };
        assert!(keeps_pace(pace, Duration::from_secs(3600), 1));
    }
}
