//! Why the lean HTTP/1 path (`listener::h1fast`) left a request to hyper:
//! decided there, counted by `telemetry`.

/// Why the lean path left a request to hyper; the label of
/// `keygate_fast_path_declined_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// Not HTTP/1.1.
    Version,
    /// `HEAD` or `CONNECT`.
    Method,
    /// An `Upgrade` header (WebSockets and the like).
    Upgrade,
    /// An `Expect` header (`100-continue`).
    Expect,
    /// A `Transfer-Encoding` header (chunked bodies, ambiguous framing).
    TransferEncoding,
    /// A `Content-Length` that is not one plain decimal number.
    Length,
    /// The body did not arrive with its head.
    BodyPending,
    /// `Connection: close` or another connection option.
    Connection,
    /// A header name that folds to a framing one (`Content_Length`): hyper's
    /// path refuses it (`proxy::headers::refuse_folded_framing`).
    FoldedName,
    /// The head does not parse, or is over its size limit: hyper answers.
    Malformed,
    /// The path does not normalise.
    Path,
    /// A secret sent in clear (the rule and its counting are hyper's path's).
    InClear,
    /// Not a proxied route: keygate's own endpoints, the API browser, 404s.
    NotProxied,
}

impl Decline {
    pub const ALL: [Decline; 13] = [
        Decline::Version,
        Decline::Method,
        Decline::Upgrade,
        Decline::Expect,
        Decline::TransferEncoding,
        Decline::Length,
        Decline::BodyPending,
        Decline::Connection,
        Decline::FoldedName,
        Decline::Malformed,
        Decline::Path,
        Decline::InClear,
        Decline::NotProxied,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Decline::Version => "version",
            Decline::Method => "method",
            Decline::Upgrade => "upgrade",
            Decline::Expect => "expect",
            Decline::TransferEncoding => "transfer_encoding",
            Decline::Length => "content_length",
            Decline::BodyPending => "body_pending",
            Decline::Connection => "connection",
            Decline::FoldedName => "folded_name",
            Decline::Malformed => "malformed",
            Decline::Path => "path",
            Decline::InClear => "in_clear",
            Decline::NotProxied => "not_proxied",
        }
    }
}
