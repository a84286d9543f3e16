//! Limits that hold across replicas: password-attempt windows and request
//! quotas, shared through Redis when `[redis] url` is set, kept in this
//! process otherwise.
//!
//! - [`rate`]: quota rates as configured (`"100/s"`).
//! - [`link`]: the Redis connection, its timeouts, state and fallbacks.
//! - [`login`]: password-attempt windows in Redis, checked and counted in one
//!   script; `auth::limiter` asks it after its local windows and
//!   decides from those alone when Redis does not answer (never fails open).
//! - [`counter`]: one quota budget's local arithmetic and its accuracy bound.
//! - [`quota`]: quotas per API key, user and tenant, decided from local
//!   counters on the request path; [`sync`] reconciles them with Redis in the
//!   background; [`headers`] writes the rate-limit headers and the 429.
//! - [`budget`]: fixed-window budgets per key kept in this process (management
//!   writes per user, unknown API keys per address).
//! - [`seats`]: open WebSockets per user and per tenant, counted across
//!   replicas.

pub mod budget;
pub mod counter;
pub mod dimension;
pub mod headers;
pub mod link;
pub mod login;
pub mod quota;
/// Rates are read with the configuration.
pub use crate::config::rate;
pub mod seats;
pub mod sync;

use std::sync::Arc;

/// The limits a replica shares with the others through Redis, or keeps
/// alone without it.
pub struct SharedLimits {
    pub quotas: Arc<quota::Quotas>,
    /// Open WebSockets per user and tenant across replicas; `None` without
    /// Redis (each replica's own counts are then the limit).
    pub seats: Option<Arc<seats::Seats>>,
}
