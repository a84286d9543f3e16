//! Request quotas per API key, user and tenant, enforced after
//! authentication on proxied routes.
//!
//! A request is decided from this replica's counters alone (see
//! [`super::counter`]); [`Quotas::sync`] (the `sync` task) reconciles them with Redis every
//! `quota.sync_interval`, in the background. When Redis is unreachable the
//! counters keep deciding: each replica keeps to its share of what was last
//! known to remain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::counter::{Budget, Verdict, until_reset};
use super::dimension::Dimension;
use super::headers::Item;
pub use super::headers::{Grant, Refusal};
use super::link::RedisLink;
use super::rate::{Rate, RouteRate};
use crate::telemetry::Metrics;
use crate::vocab::identity::Identity;

pub use crate::config::{QuotaSettings, RouteQuota};

/// A dimension that applies to a request, at its rate.
#[derive(Debug, Clone, Copy)]
struct Applied {
    dimension: Dimension,
    rate: Rate,
}

/// Which budget a counter belongs to: the global one (`scope` "*") or a
/// route's own, per dimension and subject.
type CounterKey = (Arc<str>, Dimension, Uuid);

pub(super) struct Counter {
    /// `<prefix>quota:<scope>:<dimension>:<subject>:`; the window index
    /// completes the Redis key.
    pub(super) redis_key: String,
    budget: Mutex<Budget>,
}

impl Counter {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Quotas {
    pub(super) settings: QuotaSettings,
    global_scope: Arc<str>,
    pub(super) counters: moka::sync::Cache<CounterKey, Arc<Counter>>,
    /// Live replicas as last learned from Redis (1 without it).
    pub(super) replicas: AtomicU64,
    pub(super) link: Option<Arc<RedisLink>>,
    /// This replica's name in the replica set.
    pub(super) instance: String,
    pub(super) metrics: Arc<Metrics>,
    /// Budgets used since the last sync, each once: a sync visits these
    /// only, however many budgets are held.
    pub(super) queue: Mutex<Vec<Arc<Counter>>>,
}

impl Quotas {
    pub fn new(
        settings: QuotaSettings,
        link: Option<Arc<RedisLink>>,
        instance: Uuid,
        metrics: Arc<Metrics>,
    ) -> Quotas {
        Quotas {
            counters: moka::sync::Cache::builder()
                .name("quota_budgets")
                .max_capacity(settings.capacity)
                .time_to_idle(Duration::from_secs(2 * 86_400))
                .build(),
            settings,
            global_scope: Arc::from("*"),
            replicas: AtomicU64::new(1),
            link,
            instance: instance.to_string(),
            metrics,
            queue: Mutex::new(Vec::new()),
        }
    }

    /// Whether the quotas are shared through Redis (and so need syncing).
    pub fn is_shared(&self) -> bool {
        self.link.is_some()
    }

    /// The rate and budget scope of one dimension on a route.
    fn policy(
        &self,
        scope: &Arc<str>,
        route: &RouteQuota,
        d: Dimension,
    ) -> Option<(Arc<str>, Rate)> {
        match route.0[d as usize] {
            RouteRate::Inherit => {
                self.settings.rates[d as usize].map(|r| (self.global_scope.clone(), r))
            }
            RouteRate::Off => None,
            RouteRate::Own(rate) => Some((scope.clone(), rate)),
        }
    }

    /// Decides one request from local counters only: admitted in every
    /// budget that applies, or refused by one and counted in none.
    pub fn admit(
        &self,
        scope: &Arc<str>,
        route: &RouteQuota,
        identity: &Identity,
    ) -> Result<Grant, Refusal> {
        let applied = self.applying(scope, route, identity);
        if applied.is_empty() {
            return Ok(Grant::default());
        }
        let now_ms = crate::clock::now_ms().max(0) as u64;
        let replicas = self.replicas.load(Ordering::Relaxed);
        // Locked in dimension order, so concurrent requests cannot deadlock.
        let mut budgets: Vec<_> = applied.iter().map(|(_, c)| c.lock()).collect();
        let mut refused = None;
        for ((d, counter), budget) in applied.iter().zip(budgets.iter_mut()) {
            budget.roll(d.rate, now_ms / d.rate.window_ms(), replicas);
            self.enqueue(counter, budget);
            match budget.verdict() {
                Verdict::Admit => {}
                verdict if refused.is_none() => refused = Some((*d, verdict)),
                _ => {}
            }
        }
        if refused.is_none() {
            budgets.iter_mut().for_each(|b| b.admit());
        }
        let items = applied
            .iter()
            .zip(budgets.iter())
            .map(|((d, _), b)| Item {
                dimension: d.dimension,
                rate: d.rate,
                remaining: b.remaining(),
                reset_ms: until_reset(&d.rate, now_ms),
            })
            .collect();
        match refused {
            None => Ok(Grant { items }),
            Some((d, verdict)) => Err(self.refuse(d, verdict, items, now_ms)),
        }
    }

    /// The budgets a request counts in: each dimension that has a rate on the
    /// route and a subject in the identity.
    fn applying(
        &self,
        scope: &Arc<str>,
        route: &RouteQuota,
        identity: &Identity,
    ) -> Vec<(Applied, Arc<Counter>)> {
        let mut applied = Vec::new();
        for dimension in Dimension::ALL {
            let (Some((budget_scope, rate)), Some(subject)) = (
                self.policy(scope, route, dimension),
                dimension.subject(identity),
            ) else {
                continue;
            };
            let counter = self.counter(budget_scope, dimension, subject);
            applied.push((Applied { dimension, rate }, counter));
        }
        applied
    }

    /// Queues a budget for the next sync, once, when there is Redis to sync with.
    pub(super) fn enqueue(&self, counter: &Arc<Counter>, budget: &mut Budget) {
        if self.link.is_some() && !budget.queued {
            budget.queued = true;
            self.queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(counter.clone());
        }
    }

    /// Counts the refusal; a spent share is worth trying again after the
    /// next sync, a spent quota after the window.
    fn refuse(&self, by: Applied, verdict: Verdict, items: Vec<Item>, now_ms: u64) -> Refusal {
        self.metrics.limits.quota_rejected(by.dimension.label());
        let retry_after = match verdict {
            Verdict::ShareUsed => self.settings.sync_interval,
            _ => Duration::from_millis(until_reset(&by.rate, now_ms)),
        };
        Refusal { items, retry_after }
    }

    fn counter(&self, scope: Arc<str>, d: Dimension, subject: Uuid) -> Arc<Counter> {
        let key = (scope, d, subject);
        if let Some(counter) = self.counters.get(&key) {
            return counter;
        }
        let redis_key = match &self.link {
            Some(link) => link.key(format_args!("quota:{}:{}:{subject}:", key.0, d.label())),
            None => String::new(),
        };
        let replicas = self.replicas.load(Ordering::Relaxed);
        self.counters.get_with(key, || {
            Arc::new(Counter {
                redis_key,
                budget: Mutex::new(Budget::new(
                    Rate {
                        limit: 1,
                        window: Duration::from_secs(1),
                    },
                    u64::MAX,
                    replicas,
                )),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_limits::headers::{RATELIMIT, RATELIMIT_POLICY, write_headers};
    use crate::vocab::identity::{AuthMethod, Authority, NULL_UUID, Principal, id_header_value};
    use http::{HeaderMap, HeaderName};

    fn quotas(rates: [Option<&str>; 3]) -> Quotas {
        let settings = QuotaSettings {
            rates: rates.map(|r| r.map(|r| Rate::parse(r).unwrap())),
            sync_interval: Duration::from_millis(100),
            capacity: 1000,
        };
        Quotas::new(settings, None, Uuid::new_v4(), Arc::new(Metrics::new()))
    }

    fn identity(tenant: Uuid, key: Option<Uuid>) -> Identity {
        let principal = Principal::new(
            Uuid::new_v4(),
            tenant,
            NULL_UUID,
            Authority::TenantAdmin,
            "q@example.com".into(),
        );
        let method = match key {
            Some(key_id) => AuthMethod::ApiKey { key_id },
            None => AuthMethod::Jwt {
                session_id: Uuid::new_v4(),
            },
        };
        Identity::new(
            Arc::new(principal),
            method,
            id_header_value(&Uuid::new_v4()),
        )
    }

    fn headers(result: &Result<Grant, Refusal>) -> (String, String) {
        let mut map = HeaderMap::new();
        match result {
            Ok(grant) => grant.write_headers(&mut map),
            Err(refusal) => write_headers(&refusal.items, &mut map),
        }
        let get = |name: &HeaderName| {
            map.get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        (get(&RATELIMIT_POLICY), get(&RATELIMIT))
    }

    #[test]
    fn a_request_over_one_quota_is_counted_in_none() {
        let q = quotas([Some("3/h"), None, Some("100/h")]);
        let scope: Arc<str> = Arc::from("route:api");
        let route = RouteQuota::default();
        let tenant = Uuid::new_v4();
        let caller = identity(tenant, Some(Uuid::new_v4()));
        for _ in 0..3 {
            assert!(q.admit(&scope, &route, &caller).is_ok());
        }
        let refused = q.admit(&scope, &route, &caller);
        let (policy, limit) = headers(&refused);
        assert_eq!(policy, r#""per-key";q=3;w=3600, "per-tenant";q=100;w=3600"#);
        assert!(limit.starts_with(r#""per-key";r=0;t="#), "{limit}");
        assert!(limit.contains(r#""per-tenant";r=97;t="#), "{limit}");
        let refusal = refused.unwrap_err();
        assert!(refusal.retry_after > Duration::from_secs(1));
        let response = refusal.into_response();
        assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert!(response.headers().contains_key(http::header::RETRY_AFTER));
        // Another key of the same tenant still passes: the tenant counted 3.
        let other = identity(tenant, Some(Uuid::new_v4()));
        let (_, limit) = headers(&q.admit(&scope, &route, &other));
        assert!(limit.contains(r#""per-tenant";r=96;t="#), "{limit}");
    }

    #[test]
    fn a_jwt_has_no_key_quota_and_a_system_administrator_no_tenant_quota() {
        let q = quotas([Some("1/h"), None, Some("1/h")]);
        let scope: Arc<str> = Arc::from("route:api");
        let route = RouteQuota::default();
        let jwt = identity(Uuid::new_v4(), None);
        assert!(q.admit(&scope, &route, &jwt).is_ok());
        let (policy, _) = headers(&q.admit(&scope, &route, &jwt));
        assert_eq!(policy, r#""per-tenant";q=1;w=3600"#);
        let admin = identity(NULL_UUID, None);
        for _ in 0..5 {
            let grant = q.admit(&scope, &route, &admin).unwrap();
            assert!(grant.items.is_empty());
        }
    }

    #[test]
    fn routes_inherit_override_or_turn_off_each_dimension() {
        let q = quotas([Some("2/h"), None, None]);
        let caller = identity(Uuid::new_v4(), Some(Uuid::new_v4()));
        let inherit = RouteQuota::default();
        let own = RouteQuota([
            RouteRate::Own(Rate::parse("1/m").unwrap()),
            RouteRate::Inherit,
            RouteRate::Inherit,
        ]);
        let off = RouteQuota([RouteRate::Off, RouteRate::Inherit, RouteRate::Inherit]);
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = (
            Arc::from("route:a"),
            Arc::from("route:b"),
            Arc::from("route:c"),
        );
        // Two inheriting routes share the global budget.
        assert!(q.admit(&a, &inherit, &caller).is_ok());
        assert!(q.admit(&b, &inherit, &caller).is_ok());
        assert!(q.admit(&a, &inherit, &caller).is_err());
        // A route's own rate has a budget of its own; "off" has none.
        let (policy, _) = headers(&q.admit(&c, &own, &caller));
        assert_eq!(policy, r#""per-key";q=1;w=60"#);
        assert!(q.admit(&c, &own, &caller).is_err());
        for _ in 0..3 {
            assert!(q.admit(&c, &off, &caller).unwrap().items.is_empty());
        }
    }

    #[test]
    fn without_redis_nothing_waits_for_a_sync() {
        let q = quotas([Some("1000/h"), Some("1000/h"), None]);
        let scope: Arc<str> = Arc::from("route:api");
        for _ in 0..50 {
            let caller = identity(Uuid::new_v4(), Some(Uuid::new_v4()));
            assert!(q.admit(&scope, &RouteQuota::default(), &caller).is_ok());
        }
        assert!(q.queue.lock().unwrap().is_empty());
    }
}
