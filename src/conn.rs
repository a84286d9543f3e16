//! What is known about the sender of a request before any header is believed:
//! the connection, whether its peer is a trusted proxy, and whether the request
//! reached keygate over HTTPS.

use crate::listener::Transport;

/// Who sent a request, as far as the connection and a trusted proxy tell;
/// worked out once per request.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub transport: Transport,
    /// The peer is one of the configured trusted proxies.
    pub trusted: bool,
    /// The request reached keygate over HTTPS: TLS here, or a trusted proxy
    /// that reports `X-Forwarded-Proto: https`.
    pub secure: bool,
}

impl Client {
    /// May this request carry a password or a token? Over HTTPS always; in
    /// clear only from a loopback peer that is not a proxy (a sidecar's
    /// neighbour: the secret never left the machine), or when allowed. A
    /// trusted proxy that reports plain HTTP saw the secret cross the network
    /// in clear, wherever the proxy itself runs.
    pub fn may_send_secrets(&self, allow_plaintext: bool) -> bool {
        self.secure || (!self.trusted && self.transport.peer.ip().is_loopback()) || allow_plaintext
    }
}
