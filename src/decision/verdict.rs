//! What the decision answers: a request admitted to its target, or refused
//! (and why), typed so each driver renders it its own way.

use std::borrow::Cow;

use http::HeaderValue;

use crate::auth::AuthFailure;
use crate::auth::in_clear::Exposure;
use crate::body::Body;
use crate::error::ApiError;
use crate::path::PathError;

use super::target::Target;

/// An admitted request: its normalised path and its one target.
pub struct Admitted<'t, 'u> {
    pub path: Cow<'u, str>,
    pub target: Target<'t>,
}

/// Why the decision refuses a request before its credential is verified.
#[derive(Debug)]
pub enum Refusal {
    /// The head is over `limits.max_header_bytes` (431).
    HeadTooLarge,
    /// `Content-Length` beside `Transfer-Encoding` (400, and the
    /// connection closes).
    AmbiguousFraming,
    /// A header name that folds to a framing one (400).
    FoldedName(ApiError),
    /// The path does not normalise (400).
    Path(PathError),
    /// A secret sent in clear ([`crate::auth::in_clear`]); what follows is
    /// the gate's ([`super::Gate::refuse_in_clear`]).
    InClear(Exposure),
    /// No target: an unknown path (404), another method (405), a missing
    /// sync route (503).
    NoTarget(ApiError),
}

impl Refusal {
    /// The response of a refusal that needs nothing more done;
    /// [`Refusal::InClear`] is the gate's to answer.
    pub fn into_response(self) -> http::Response<Body> {
        match self {
            Refusal::HeadTooLarge => ApiError::headers_too_large().into_response(),
            Refusal::AmbiguousFraming => ambiguous_framing(),
            Refusal::FoldedName(error) | Refusal::NoTarget(error) => error.into_response(),
            Refusal::Path(error) => {
                ApiError::bad_request(format!("Invalid request path: {error}")).into_response()
            }
            Refusal::InClear(_) => ApiError::api_key_over_plain_http().into_response(),
        }
    }
}

/// Why a verified (or absent) credential may not have what it asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// A scoped API key whose grants do not hold the request.
    OutOfScope,
    /// A [`super::Rule`] refused, as this failure.
    Rule(AuthFailure),
}

impl Denial {
    pub fn failure(self) -> AuthFailure {
        match self {
            Denial::OutOfScope => AuthFailure::OutOfScope,
            Denial::Rule(failure) => failure,
        }
    }
}

/// A request that stated its body length two ways (`Content-Length` and
/// `Transfer-Encoding`) is refused, not repaired: a server behind keygate might
/// read it the other way (request smuggling). The connection is closed, as what
/// follows on it cannot be trusted to start a new request.
fn ambiguous_framing() -> http::Response<Body> {
    let mut response =
        ApiError::bad_request("Request has both Content-Length and Transfer-Encoding")
            .into_response();
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}
