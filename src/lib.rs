//! keygate: a TLS-terminating authentication gateway for a device-platform REST API.
//!
//! A request meets the modules in this order: [`listener`] (TCP, TLS, limits,
//! deadlines, and [`listener::peer`]: the connection context, worked out once at accept;
//! [`address`]: the client's address key the per-address limits count by)
//! → [`app`] (the request path as named phases: admit, dispatch, authenticate,
//! headers to upstream, forward, headers to client, log) → [`path`]
//! (normalisation) → [`api`] and [`api_browser`] (the endpoints keygate
//! answers itself) → [`auth::credential`] (parsing) → [`auth`] (verification
//! through [`auth::cache`] and [`store`]; [`shared_limits`]: password-attempt
//! windows and quotas across replicas) → [`identity`] and
//! [`proxy::headers`] (strip and inject, one function per direction) →
//! [`proxy`] (forwarding), its bodies as [`body`]. Errors leave through [`error`]; every
//! request ends in [`telemetry`] (metrics, access log). A WebSocket
//! upgrade leaves the request path at dispatch for [`websocket`].
//!
//! Around the request path: [`server`] starts and stops the whole (with
//! [`config`], [`tls`] and [`probes`], the admin listener); [`accounts`] and
//! [`email`] hold the rules for users and keys that the endpoints and the
//! command line (`cli`, in the binary) share; [`mail`] sends outgoing mail off
//! the request path; [`import`] brings the platform's accounts in; [`dev`] is
//! `keygate serve --dev`; [`clock`] and `fnv` are small helpers.
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
pub(crate) mod websocket;
