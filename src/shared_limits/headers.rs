//! The response side of quotas: the `RateLimit-Policy` and `RateLimit`
//! fields of the IETF httpapi rate-limit headers draft on every answer under a
//! quota, and the 429 of a refused request.

use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::dimension::Dimension;
use super::rate::Rate;
use crate::body::Body;
use crate::error::ApiError;

/// The quotas a request was admitted under, for its response headers.
#[derive(Debug, Default)]
pub struct Grant {
    pub(super) items: Vec<Item>,
}

/// A request refused by a quota.
#[derive(Debug)]
pub struct Refusal {
    pub(super) items: Vec<Item>,
    pub(super) retry_after: Duration,
}

/// One quota that applied to a request, as the headers report it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub dimension: Dimension,
    pub rate: Rate,
    /// Requests this replica may still admit.
    pub remaining: u64,
    /// Milliseconds until the window ends.
    pub reset_ms: u64,
}

pub(super) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(super) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `RateLimit-Policy` and `RateLimit` fields of the IETF httpapi
/// rate-limit headers draft: one item per quota that applied, e.g.
/// `"per-key";q=100;w=1` and `"per-key";r=42;t=1`.
pub(super) fn write_headers(items: &[Item], headers: &mut HeaderMap) {
    if items.is_empty() {
        return;
    }
    let mut put = |name: &HeaderName, item: fn(&mut String, &Item) -> std::fmt::Result| {
        let mut text = String::with_capacity(32 * items.len());
        for (i, each) in items.iter().enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            let _ = item(&mut text, each);
        }
        // Policy names and numbers only: always a valid value.
        if let Ok(value) = HeaderValue::try_from(text) {
            headers.insert(name.clone(), value);
        }
    };
    put(&RATELIMIT_POLICY, |text, i| {
        let (policy, rate) = (i.dimension.policy(), i.rate);
        write!(
            text,
            "\"{policy}\";q={};w={}",
            rate.limit,
            rate.window.as_secs()
        )
    });
    put(&RATELIMIT, |text, i| {
        let reset = i.reset_ms.div_ceil(1000);
        write!(
            text,
            "\"{}\";r={};t={reset}",
            i.dimension.policy(),
            i.remaining
        )
    });
}

impl Grant {
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        write_headers(&self.items, headers);
    }
}

impl Refusal {
    /// 429 with the contract's JSON (code 33), `Retry-After` and the
    /// rate-limit headers.
    pub fn into_response(self) -> http::Response<Body> {
        let seconds = self.retry_after.as_millis().div_ceil(1000) as u64;
        let mut response = ApiError::too_many_requests(seconds).into_response();
        write_headers(&self.items, response.headers_mut());
        response
    }
}
