//! Limits that hold across replicas: password-attempt windows and request
//! quotas, shared through Redis when `[redis] url` is set, kept in this
//! process otherwise.
//!
//! - [`rate`]: quota rates as configured (`"100/s"`).
//! - [`link`]: the Redis connection, its timeouts, state and fallbacks.
//! - [`login`]: password-attempt windows in Redis, checked and counted in one
//!   script; [`crate::auth::limiter`] asks it after its local windows and
//!   decides from those alone when Redis does not answer (never fails open).
//! - [`counter`]: one quota budget's local arithmetic and its accuracy bound.
//! - [`quota`]: quotas per API key, user and tenant, decided from local
//!   counters on the request path; [`sync`] reconciles them with Redis in the
//!   background; [`headers`] writes the rate-limit headers and the 429.

pub mod counter;
pub mod headers;
pub mod link;
pub mod login;
pub mod quota;
/// Rates are read with the configuration.
pub use crate::config::rate;
pub mod sync;
