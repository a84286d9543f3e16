//! keygate: a TLS-terminating authentication gateway for a device-platform REST API.
//!
//! The modules in the order a request meets them (the `mod` lines below
//! follow it):
//!
//! 1. [`server`] starts everything from the settings and stops it; [`tls`]
//!    serves the certificate.
//! 2. [`listener`]: TCP, TLS, limits, deadlines, and [`listener::peer`]: the
//!    connection context, worked out once at accept. A plain proxied
//!    HTTP/1.1 request may take the lean path, [`listener::h1fast`]; the
//!    admin listener's requests go to [`probes`].
//! 3. [`app`]: the request path as named phases on hyper's driver and the
//!    lean one, asking [`decision`] (admission, dispatch, what the target
//!    requires, the scope check and the rules added to it: one decision
//!    that every driver, WebSocket sessions included, asks) and its gate
//!    (verification, quotas, refusals counted and logged), then headers to
//!    upstream, forward, headers to client, log.
//! 4. [`path`] normalises the path.
//! 5. [`auth`]: parsing ([`auth::credential`]) and verification through
//!    [`auth::cache`] and [`store`]; then [`shared_limits`]: the limits
//!    shared with the other replicas through Redis.
//! 6. keygate's own endpoints: [`api`] (through [`accounts`], mailing with
//!    [`mail`], signing users on through [`sso`]: OpenID Connect providers,
//!    their keys and tokens) and [`api_browser`].
//! 7. [`identity`] and [`proxy::headers`] (strip and inject, one function
//!    per direction) → [`proxy`] (forwarding). A WebSocket upgrade leaves
//!    the request path at dispatch for [`websocket`].
//! 8. Errors leave through [`error`]; every step counts and logs through
//!    [`telemetry`].
//!
//! Beside the request path: [`import`] (the platform's users, once and in
//! sync) and [`dev`] (`serve --dev`); the binary adds its command line
//! (`cli`).
//!
//! Beneath them all: [`config`] (the settings), [`table`] (the bounded cache
//! tables), [`body`] (the one body type), [`tls_client`] (the TLS client
//! settings every outgoing connection builds from), and the leaves, which import
//! nothing of keygate's but each other: [`vocab`] (the values every floor
//! shares), [`http1`] (the one HTTP/1.1 codec outside hyper: the lean path,
//! the upstream wire and the scan for ambiguous framing read and write
//! with it), [`address`], [`clock`], [`email`] and [`fnv`].
//!
//! Dependencies point down: a module imports only modules on lower floors
//! (docs/inside.md, "Layers").
#![forbid(unsafe_code)]

// The request path, in order.
pub mod server;
// Certificates.
pub mod tls;
// Connections; the lean path (`listener::h1fast`).
pub mod listener;
// The admin listener's requests.
pub(crate) mod probes;
// The request path's phases.
pub(crate) mod app;
// The one decision every driver asks.
pub mod decision;
// Path normalisation.
pub(crate) mod path;
// Credentials and their verification.
pub mod auth;
// The database.
pub mod store;
// Limits shared with the other replicas.
pub mod shared_limits;
// keygate's own endpoints.
pub mod api;
// Single sign-on through OpenID Connect.
pub mod sso;
// Creating users and keys.
pub mod accounts;
// Outgoing mail.
pub mod mail;
// The API browser.
pub(crate) mod api_browser;
// What goes upstream about the caller.
pub mod identity;
// Forwarding.
pub mod proxy;
// WebSockets.
pub(crate) mod websocket;
// Refusals and errors.
pub(crate) mod error;
// Metrics and the access log.
pub mod telemetry;

// Beside the request path.
pub mod import;
// `serve --dev`.
pub mod dev;

// Beneath them all.
pub mod config;
// Bounded cache tables.
pub(crate) mod table;
// The one body type.
pub(crate) mod body;
// TLS client settings.
pub mod tls_client;

// The leaves.
pub mod vocab;
// The HTTP/1.1 codec.
pub mod http1;
// Client address keys.
pub(crate) mod address;
// Time.
pub mod clock;
// E-mail addresses.
pub mod email;
// A hasher.
mod fnv;
