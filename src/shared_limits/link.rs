//! The connection to Redis through which replicas share their limits.
//!
//! One multiplexed connection per replica (the `redis` crate's connection
//! manager), opened lazily and reconnected by itself with backoff. Every
//! command is bounded by `redis.command_timeout`; a failure marks the link
//! down, and callers then decide from local state at once, without asking
//! Redis again, until the background sync finds it answering. The state is
//! exported as `keygate_redis_up`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation};

use crate::config::RedisSettings;
use crate::telemetry::Metrics;

/// How often a fallback warning is logged at most, per kind of limit.
const WARN_EVERY_MS: i64 = 10_000;

/// Why Redis did not answer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis is down; deciding locally until it answers again")]
    Down,
}

pub struct RedisLink {
    manager: ConnectionManager,
    prefix: String,
    command_timeout: Duration,
    /// Set when a command failed, cleared when one succeeds. A link not yet
    /// used is not down: the first command tries.
    down: AtomicBool,
    metrics: Arc<Metrics>,
    /// When each kind of fallback was last logged (epoch ms), by kind.
    warned: [AtomicI64; 3],
}

/// What fell back to local state, for the metric and the warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    Login = 0,
    Quota = 1,
    WebSocket = 2,
}

impl Fallback {
    pub const ALL: [Fallback; 3] = [Fallback::Login, Fallback::Quota, Fallback::WebSocket];

    pub fn label(self) -> &'static str {
        match self {
            Fallback::Login => "login",
            Fallback::Quota => "quota",
            Fallback::WebSocket => "websocket",
        }
    }
}

impl RedisLink {
    /// A link to the configured Redis; nothing is connected until first use.
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<RedisLink, LinkError> {
        let client = redis::Client::open(settings.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.command_timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(2);
        let manager = ConnectionManager::new_lazy_with_config(client, config)?;
        metrics.limits.init_redis();
        Ok(RedisLink {
            manager,
            prefix: settings.key_prefix.clone(),
            command_timeout: settings.command_timeout,
            down: AtomicBool::new(false),
            metrics,
            warned: [AtomicI64::new(0), AtomicI64::new(0), AtomicI64::new(0)],
        })
    }

    /// `parts` after the configured key prefix.
    pub fn key(&self, parts: std::fmt::Arguments<'_>) -> String {
        format!("{}{parts}", self.prefix)
    }

    /// Whether the last command failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Runs a script unless the link is down; see [`RedisLink::probe`].
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LinkError> {
        if self.is_down() {
            return Err(LinkError::Down);
        }
        self.probe(invocation).await
    }

    /// Runs a script whatever the link's state, within the command timeout,
    /// and records whether Redis answered.
    pub async fn probe<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LinkError> {
        let mut connection = self.manager.clone();
        let answer = tokio::time::timeout(
            self.command_timeout,
            invocation.invoke_async(&mut connection),
        )
        .await;
        let result = match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(LinkError::Redis(error)),
            Err(_) => Err(LinkError::Timeout(self.command_timeout)),
        };
        self.record(result.is_ok());
        result
    }

    fn record(&self, ok: bool) {
        self.metrics.limits.redis_up(ok);
        let was_down = self.down.swap(!ok, Ordering::Relaxed);
        if was_down && ok {
            tracing::info!("redis answers again: limits are shared between replicas");
        }
    }

    /// Counts a decision taken locally because Redis did not answer, and
    /// warns about it at most every ten seconds per kind.
    pub fn fell_back(&self, kind: Fallback, error: &LinkError) {
        self.metrics.limits.fallback(kind.label());
        let now = crate::clock::now_ms();
        let last = &self.warned[kind as usize];
        let previous = last.load(Ordering::Relaxed);
        if now - previous >= WARN_EVERY_MS
            && last
                .compare_exchange(previous, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                limits = kind.label(),
                %error,
                "redis unreachable: limits decided from this replica's own counters"
            );
        }
    }
}
