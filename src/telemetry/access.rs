//! The access log: one line per request (target `keygate::access`), the same
//! shape for HTTP and WebSockets. Fields without a value (no upstream, no
//! trace, no identity) are left out of the line rather than written empty.
//! Never a credential: the identity is named by its ids.

use std::net::SocketAddr;
use std::time::Duration;

use crate::vocab::identity::Identity;
use crate::vocab::refusal::AuthRefusal;

/// What one access line says.
pub struct AccessLine<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub route: &'a str,
    pub status: u16,
    pub elapsed: Duration,
    pub peer: SocketAddr,
    pub upstream: Option<&'a str>,
    pub identity: Option<&'a Identity>,
    /// Why the credential was refused, and whose it was when known.
    pub refusal: Option<&'a AuthRefusal>,
    /// The response body's length, when known.
    pub bytes: Option<u64>,
    pub trace_id: Option<&'a str>,
    /// How a WebSocket ended, for the line of a socket.
    pub socket: Option<SocketEnd<'a>>,
}

/// The end of a WebSocket's life: why, its close code, and the bytes each
/// way.
pub struct SocketEnd<'a> {
    pub ending: &'a str,
    pub close_code: Option<u16>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl AccessLine<'_> {
    /// Writes the line.
    pub(crate) fn emit(&self) {
        let identity = self.identity;
        let socket = self.socket.as_ref();
        let refusal = self.refusal;
        tracing::info!(
            target: "keygate::access",
            request_id = self.request_id,
            method = %self.method,
            path = %self.path,
            route = self.route,
            status = self.status,
            websocket = socket.map(|s| s.ending),
            close_code = socket.and_then(|s| s.close_code),
            duration_ms = duration_ms(self.elapsed),
            bytes = self.bytes,
            bytes_in = socket.map(|s| s.bytes_in),
            bytes_out = socket.map(|s| s.bytes_out),
            upstream = self.upstream,
            trace_id = self.trace_id,
            peer = %self.peer,
            auth = identity.map(|i| i.method.label()),
            refused = refusal.map(|r| r.failure.label()),
            user_id = identity
                .map(|i| i.principal.user_id)
                .or(refusal.and_then(|r| r.user_id))
                .map(tracing::field::display),
            key_id = identity
                .and_then(|i| i.api_key_id())
                .or(refusal.and_then(|r| r.key_id))
                .map(tracing::field::display),
        );
    }
}

/// Milliseconds rounded to whole microseconds: `0.021`, not `0.020661000000000002`.
pub fn duration_ms(elapsed: Duration) -> f64 {
    let micros = elapsed.as_nanos().saturating_add(500) / 1000;
    micros as f64 / 1000.0
}
