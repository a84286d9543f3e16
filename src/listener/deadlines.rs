//! How long a connection may wait for its client, and why keygate closes
//! one: what the connection driver (`serve`) and the lean path (`h1fast`)
//! both apply and count.

use std::time::Duration;

/// Why keygate closed a connection; the label of
/// `keygate_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The client address already holds its cap of connections.
    PerAddressCap,
    TlsHandshakeTimeout,
    /// No complete request head (or not even a protocol) in time.
    HeadTimeout,
    /// No request in flight for the idle time.
    Idle,
    /// An HTTP/2 keep-alive ping was not answered in time.
    KeepAliveTimeout,
    /// An owned endpoint's request body did not arrive in time (408).
    BodyTimeout,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::PerAddressCap,
        Reason::TlsHandshakeTimeout,
        Reason::HeadTimeout,
        Reason::Idle,
        Reason::KeepAliveTimeout,
        Reason::BodyTimeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::PerAddressCap => "per_address_cap",
            Reason::TlsHandshakeTimeout => "tls_handshake_timeout",
            Reason::HeadTimeout => "head_timeout",
            Reason::Idle => "idle",
            Reason::KeepAliveTimeout => "keep_alive_timeout",
            Reason::BodyTimeout => "body_timeout",
        }
    }
}

/// The connection deadlines, from `[limits]`.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// First complete request head (`header_read_timeout`).
    pub head: Duration,
    /// No request in flight (`idle_timeout`).
    pub idle: Duration,
    /// Finishing a graceful close (`http2_keep_alive_timeout`).
    pub close: Duration,
}
