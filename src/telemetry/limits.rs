//! Metrics of the limits shared through Redis: the link's state, decisions
//! taken locally because Redis did not answer, and quota refusals by
//! dimension (never by key, user or tenant id).

use prometheus::{IntCounterVec, IntGauge, Registry};

use super::Registrar;

pub struct LimitMetrics {
    registry: Registry,
    redis_up: IntGauge,
    replicas: IntGauge,
    fallbacks: IntCounterVec,
    quota_rejected: IntCounterVec,
}

/// Quota dimensions ([`LimitMetrics::quota_rejected`]).
pub const QUOTA_DIMENSIONS: [&str; 3] = ["key", "user", "tenant"];
/// What falls back to local counters ([`LimitMetrics::fallback`]).
pub const FALLBACKS: [&str; 3] = ["login", "quota", "websocket"];

impl LimitMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> LimitMetrics {
        let quota_rejected = r.counter(
            "keygate_quota_rejected_total",
            "Requests refused by a quota (429), by dimension (key, user, tenant).",
            &["dimension"],
        );
        for dimension in QUOTA_DIMENSIONS {
            quota_rejected.with_label_values(&[dimension]);
        }
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        LimitMetrics {
            registry: r.0.clone(),
            redis_up: gauge(
                "keygate_redis_up",
                "1 while the last command to Redis succeeded, else 0. Exported only when [redis] url is set.",
            ),
            replicas: gauge(
                "keygate_quota_replicas",
                "Live replicas sharing the quotas, as last learned from Redis. Exported only when [redis] url is set.",
            ),
            fallbacks: IntCounterVec::new(
                prometheus::Opts::new(
                    "keygate_redis_fallbacks_total",
                    "Limit decisions taken from this replica's own counters because Redis did not answer: \
                     password attempts (login) and quota syncs (quota). Exported only when [redis] url is set.",
                ),
                &["limits"],
            )
            .expect("valid metric"),
            quota_rejected,
        }
    }

    /// Exports the Redis series (at 0) once a link to Redis exists.
    pub(crate) fn init_redis(&self) {
        // Already registered is the only possible error, and the same metrics.
        let _ = self.registry.register(Box::new(self.redis_up.clone()));
        let _ = self.registry.register(Box::new(self.replicas.clone()));
        let _ = self.registry.register(Box::new(self.fallbacks.clone()));
        for kind in FALLBACKS {
            self.fallbacks.with_label_values(&[kind]);
        }
    }

    pub(crate) fn redis_up(&self, up: bool) {
        self.redis_up.set(i64::from(up));
    }

    pub fn replicas(&self, n: u64) {
        self.replicas.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn fallback(&self, kind: &str) {
        self.fallbacks.with_label_values(&[kind]).inc();
    }

    pub(crate) fn quota_rejected(&self, dimension: &str) {
        self.quota_rejected.with_label_values(&[dimension]).inc();
    }
}
