//! keygate: a TLS-terminating authentication gateway for a device-platform REST API.
//!
//! A request meets the modules in this order: [`listener`] (TCP, TLS, limits,
//! deadlines, and [`listener::peer`]: the connection context, worked out once at accept)
//! → [`app`] (the request path as named phases: admit, dispatch, authenticate,
//! headers to upstream, forward, headers to client, log) → [`path`]
//! (normalisation) → [`auth::credential`] (parsing) → [`auth`] (verification
//! through [`auth::cache`] and [`store`]) → [`identity`] and
//! [`proxy::headers`] (strip and inject, one function per direction) →
//! [`proxy`] (forwarding). Errors leave through [`error`]. A WebSocket
//! upgrade leaves the request path at dispatch for [`websocket`].
#![forbid(unsafe_code)]

pub mod accounts;
pub(crate) mod address;
pub mod api;
pub(crate) mod api_browser;
pub(crate) mod app;
pub mod auth;
pub(crate) mod body;
pub mod clock;
pub mod config;
pub mod dev;
pub mod email;
pub(crate) mod error;
mod fnv;
pub mod identity;
pub mod import;
pub mod listener;
pub mod mail;
pub(crate) mod path;
pub(crate) mod probes;
pub mod proxy;
pub mod server;
pub(crate) mod shared_limits;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod tls_client;
pub(crate) mod websocket;
