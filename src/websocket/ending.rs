//! How a socket ends, and the close frames each ending sends both ways.

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use crate::auth::AuthFailure;

/// The client's socket, over the upgraded connection.
pub type ClientSocket = WebSocketStream<TokioIo<Upgraded>>;
/// The socket keygate opened to the upstream.
pub type UpstreamSocket = WebSocketStream<crate::proxy::stream::Stream>;

/// How a socket ended: closed by one side (its frame passed on to the
/// other), or closed by keygate with a code and a reason.
#[derive(Debug)]
pub enum Ending {
    ClientClosed(Option<CloseFrame>),
    UpstreamClosed(Option<CloseFrame>),
    /// The client's connection broke without a close frame.
    ClientGone,
    MissingAuthCmd,
    AuthDeadline,
    BadCredential(AuthFailure),
    /// An expired JWT in `?token=`: the platform closes 1011.
    QueryTokenExpired,
    PlaintextRefused(&'static str),
    UserLimit,
    TenantLimit,
    /// Over a request quota of its identity on its route.
    RateLimited,
    /// Verified again (after a revocation or at its expiry) and refused.
    Revoked(AuthFailure),
    MessageTooBig,
    Idle,
    Shutdown,
    UpstreamUnavailable,
}

impl Ending {
    /// Every label, for creating the series up front.
    pub const LABELS: [&'static str; 17] = [
        "client_closed",
        "upstream_closed",
        "client_gone",
        "missing_auth_cmd",
        "auth_deadline",
        "bad_credential",
        "token_expired",
        "plaintext_refused",
        "user_limit",
        "tenant_limit",
        "rate_limited",
        "revoked",
        "expired",
        "message_too_big",
        "idle",
        "shutdown",
        "upstream_unavailable",
    ];

    pub fn label(&self) -> &'static str {
        match self {
            Ending::ClientClosed(_) => "client_closed",
            Ending::UpstreamClosed(_) => "upstream_closed",
            Ending::ClientGone => "client_gone",
            Ending::MissingAuthCmd => "missing_auth_cmd",
            Ending::AuthDeadline => "auth_deadline",
            Ending::BadCredential(_) => "bad_credential",
            Ending::QueryTokenExpired => "token_expired",
            Ending::PlaintextRefused(_) => "plaintext_refused",
            Ending::UserLimit => "user_limit",
            Ending::TenantLimit => "tenant_limit",
            Ending::RateLimited => "rate_limited",
            Ending::Revoked(AuthFailure::TokenExpired | AuthFailure::Expired) => "expired",
            Ending::Revoked(_) => "revoked",
            Ending::MessageTooBig => "message_too_big",
            Ending::Idle => "idle",
            Ending::Shutdown => "shutdown",
            Ending::UpstreamUnavailable => "upstream_unavailable",
        }
    }

    /// The close frame keygate sends the client.
    pub fn client_frame(&self) -> Option<CloseFrame> {
        let (code, reason): (u16, &str) = match self {
            Ending::ClientClosed(_) | Ending::ClientGone => return None,
            Ending::UpstreamClosed(frame) => return frame.clone(),
            Ending::MissingAuthCmd => (1008, "Auth cmd is missing"),
            Ending::AuthDeadline => (1008, "Auth cmd was not received in time"),
            Ending::BadCredential(AuthFailure::StoreUnavailable)
            | Ending::Revoked(AuthFailure::StoreUnavailable) => {
                (1011, message(AuthFailure::StoreUnavailable))
            }
            // A policy the credential does not meet, not a bad credential.
            Ending::BadCredential(AuthFailure::OutOfScope) => {
                (1008, message(AuthFailure::OutOfScope))
            }
            Ending::BadCredential(failure) => (1007, message(*failure)),
            Ending::QueryTokenExpired => (1011, message(AuthFailure::TokenExpired)),
            Ending::PlaintextRefused(reason) => (1008, *reason),
            Ending::UserLimit => (1008, "Max regular user sessions limit reached!"),
            Ending::TenantLimit => (1008, "Max tenant sessions limit reached!"),
            Ending::RateLimited => (1008, "Too many requests"),
            Ending::Revoked(failure) => (1008, message(*failure)),
            Ending::MessageTooBig => (1009, "Message is too big"),
            Ending::Idle => (1001, "Idle timeout"),
            Ending::Shutdown => (1001, "Server is shutting down"),
            Ending::UpstreamUnavailable => (1011, "Upstream is unavailable"),
        };
        Some(CloseFrame {
            code: code.into(),
            reason: reason.into(),
        })
    }

    /// The close frame keygate sends the upstream: the client's own, or
    /// "going away" when keygate ends the socket.
    pub(super) fn upstream_frame(&self) -> Option<CloseFrame> {
        match self {
            Ending::ClientClosed(frame) => frame.clone(),
            _ => Some(CloseFrame {
                code: 1001.into(),
                reason: "Client socket closed".into(),
            }),
        }
    }
}

/// The contract's message for a failure: the close reason the platform gives.
fn message(failure: AuthFailure) -> &'static str {
    match failure.to_api_error().message {
        std::borrow::Cow::Borrowed(text) => text,
        std::borrow::Cow::Owned(_) => "Authentication failed",
    }
}
