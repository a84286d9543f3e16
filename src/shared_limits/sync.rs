//! Reconciling quota counters with Redis, in the background: every
//! `quota.sync_interval` each replica pushes what it admitted, reads back the
//! global count of every budget it used and the number of live replicas, and
//! renews its own registration, in one script call per batch of budgets.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::link::{Fallback, LinkError, RedisLink};
use super::quota::{Counter, Quotas};

/// Pushes what each budget counted since the last sync and reads the global
/// count back; registers this replica and counts the live ones.
/// KEYS[1]: the replica set; then one key per budget. ARGV: replica id, now
/// (ms), staleness (ms); then per budget its increment and key lifetime (ms).
/// Returns {replicas, total of each budget...}.
const SYNC: &str = r"
local now = tonumber(ARGV[2])
local stale = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - stale)
redis.call('PEXPIRE', KEYS[1], stale * 2)
local out = {redis.call('ZCARD', KEYS[1])}
for i = 2, #KEYS do
  out[i] = redis.call('INCRBY', KEYS[i], ARGV[2 * i])
  if redis.call('PTTL', KEYS[i]) < 0 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i + 1])
  end
end
return out
";

/// The script of [`SYNC`], loaded into Redis by its digest once.
static SYNC_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SYNC));

/// How long a replica that stopped syncing still counts as live: ten sync
/// intervals, and at least 3 s.
pub(super) fn staleness(sync_interval: Duration) -> Duration {
    (sync_interval * 10).max(Duration::from_secs(3))
}

/// Budgets pushed by one script call at most.
const SYNC_BATCH: usize = 500;

/// A budget to reconcile: what it pushes, for which window.
struct Due {
    counter: Arc<Counter>,
    window: u64,
    pushing: u64,
    lifetime_ms: u64,
}

impl Due {
    /// Takes a queued budget for this sync: what it counted so far. Requests
    /// from here on queue it again for the next one.
    fn of(counter: Arc<Counter>) -> Due {
        let mut budget = counter.lock();
        budget.queued = false;
        let (window, pushing) = (budget.window, budget.unsynced);
        // Long enough for replicas whose clocks differ a little.
        let lifetime_ms = 2 * budget.rate.window_ms() + 1000;
        drop(budget);
        Due {
            counter,
            window,
            pushing,
            lifetime_ms,
        }
    }
}

impl Quotas {
    /// Reconciles every budget used since the last sync with Redis, and
    /// renews this replica's registration. Without Redis there is nothing to do.
    pub async fn sync(&self) {
        let Some(link) = &self.link else {
            return;
        };
        let queued = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        let due: Vec<Due> = queued.into_iter().map(Due::of).collect();
        let mut batches: Vec<&[Due]> = due.chunks(SYNC_BATCH).collect();
        if batches.is_empty() {
            batches.push(&[]);
        }
        for (i, batch) in batches.iter().enumerate() {
            if let Err(error) = self.sync_batch(link, batch).await {
                link.fell_back(Fallback::Quota, &error);
                // What did not reach Redis goes at the next sync.
                for due in batches[i..].iter().flat_map(|b| b.iter()) {
                    self.enqueue(&due.counter, &mut due.counter.lock());
                }
                return;
            }
        }
    }

    async fn sync_batch(&self, link: &RedisLink, batch: &[Due]) -> Result<(), LinkError> {
        let stale = staleness(self.settings.sync_interval);
        let mut invocation = SYNC_SCRIPT.prepare_invoke();
        invocation
            .key(link.key(format_args!("quota:replicas")))
            .arg(&self.instance)
            .arg(crate::clock::now_ms())
            .arg(stale.as_millis() as u64);
        for due in batch {
            invocation
                .key(format!("{}{}", due.counter.redis_key, due.window))
                .arg(due.pushing)
                .arg(due.lifetime_ms);
        }
        let totals: Vec<u64> = link.probe(&invocation).await?;
        let replicas = totals.first().copied().unwrap_or(1).max(1);
        self.replicas.store(replicas, Ordering::Relaxed);
        self.metrics.limits.replicas(replicas);
        for (due, total) in batch.iter().zip(totals.iter().skip(1)) {
            let mut budget = due.counter.lock();
            // A budget that moved on to a new window meanwhile keeps its own.
            if budget.window == due.window {
                budget.synced(due.pushing, *total, replicas);
            }
        }
        Ok(())
    }

    /// Runs [`Quotas::sync`] every `sync_interval` until shutdown.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.settings.sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.sync().await,
            }
        }
    }
}
