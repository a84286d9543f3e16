//! A bounded, sharded, concurrent table with a lifetime per entry: what each
//! credential cache (`auth::cache`) and the passport cache are built on.
//!
//! Written for the credential checks' hit path, which runs on every request:
//! one keyed hash, one read lock on one shard, one probe, a clock read, a
//! copy of the value. No recording of the read in a queue and no
//! bookkeeping per entry beyond a "used" bit: faster on a hit and smaller
//! per cached key than the general cache it replaced (BENCHMARKS.md, "Choices in the code").
//!
//! - **Lifetimes**: each entry has its own deadline, checked on read; an
//!   expired entry is a miss and is dropped by the next eviction pass.
//! - **Bound**: each shard holds at most its share of the capacity. Over
//!   it, one pass drops expired entries, then entries not used since the
//!   previous pass (their bit is cleared as the pass goes by: a second
//!   chance), until an eighth of the shard is free.
//! - **One fetch per missing key** ([`Table::get_or_fetch`]): concurrent
//!   misses of one key wait for the first one's fetch.
//! - **Invalidation wins over a fetch in flight**: every invalidation moves
//!   the table's generation on, and a fetch that began before it answers its
//!   own request but does not fill the table, so a revocation is never
//!   undone by a read of the store that raced it.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::telemetry::CacheSeries;

/// A key with its hash worked out once: it picks the shard and is the hash
/// inside the shard's map.
#[derive(Clone, PartialEq, Eq)]
struct Hashed<K> {
    hash: u64,
    key: K,
}

impl<K> Hash for Hashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Passes [`Hashed::hash`] through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is called, by `Hashed`; fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type ShardMap<K, V> = HashMap<Hashed<K>, Slot<V>, BuildHasherDefault<PassThrough>>;

struct Slot<V> {
    value: V,
    /// [`crate::clock::coarse_monotonic_ms`] at which it expires.
    deadline: u64,
    /// Read since the last eviction pass.
    used: AtomicBool,
}

/// Ends one caller's part in a shared fetch: the first caller to finish
/// removes it, unless an invalidation already replaced it.
struct Done<'a, K: Hash + Eq, V> {
    table: &'a Table<K, V>,
    key: &'a K,
    cell: &'a Arc<tokio::sync::OnceCell<V>>,
}

impl<K: Hash + Eq, V> Drop for Done<'_, K, V> {
    fn drop(&mut self) {
        let mut inflight = self
            .table
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if inflight
            .get(self.key)
            .is_some_and(|c| Arc::ptr_eq(c, self.cell))
        {
            inflight.remove(self.key);
        }
    }
}

pub struct Table<K, V> {
    shards: Box<[RwLock<ShardMap<K, V>>]>,
    /// Keyed with a random key per process, so that keys chosen by a client
    /// (digests of made-up API keys) cannot be made to collide.
    hasher: std::collections::hash_map::RandomState,
    per_shard: usize,
    generation: AtomicU64,
    inflight: Mutex<HashMap<K, Arc<tokio::sync::OnceCell<V>>>>,
    series: CacheSeries,
}

/// Shards for a capacity: one per 1,024 entries, a power of two, at most 64,
/// so a small table evicts close to its exact capacity and a large one
/// spreads its locks.
fn shard_count(capacity: u64) -> usize {
    let wanted = (capacity / 1024).clamp(1, 64) as usize;
    wanted.next_power_of_two().min(64)
}

impl<K, V> Table<K, V>
where
    K: Hash + Eq + Clone,
    V: Clone,
{
    /// At most `capacity` entries (0: nothing is kept, every read misses).
    pub fn new(capacity: u64, series: CacheSeries) -> Table<K, V> {
        let shards = shard_count(capacity);
        Table {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            per_shard: (capacity as usize).div_ceil(shards),
            generation: AtomicU64::new(0),
            inflight: Mutex::default(),
            series,
        }
    }

    /// The coarse clock: lifetimes are seconds, and a hit reads it once.
    fn now(&self) -> u64 {
        crate::clock::coarse_monotonic_ms()
    }

    fn hashed(&self, key: K) -> Hashed<K> {
        Hashed {
            hash: self.hasher.hash_one(&key),
            key,
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<ShardMap<K, V>> {
        // Bits the shard's map uses least: it indexes by the low bits and
        // tags with the top seven.
        &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)]
    }

    /// The live value of `key`, counted as a hit or a miss.
    pub fn get(&self, key: &K) -> Option<V> {
        let found = self.peek(key);
        match found {
            Some(_) => self.series.hit(),
            None => self.series.miss(),
        }
        found
    }

    fn peek(&self, key: &K) -> Option<V> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read().unwrap_or_else(|p| p.into_inner());
        let slot = shard.get(&Hashed {
            hash,
            key: key.clone(),
        })?;
        if slot.deadline <= self.now() {
            return None;
        }
        // Written only when it changes: a store on every hit would move the
        // cache line between cores on every request.
        if !slot.used.load(Ordering::Relaxed) {
            slot.used.store(true, Ordering::Relaxed);
        }
        Some(slot.value.clone())
    }

    /// The value of `key`, else what `fetch` returns, kept for the lifetime
    /// it returns with it (zero: not kept). Concurrent misses of one key
    /// share one fetch; a failed fetch is not shared.
    pub(crate) async fn get_or_fetch<E, F, Fut>(&self, key: &K, fetch: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), E>>,
    {
        if let Some(hit) = self.get(key) {
            return Ok(hit);
        }
        // The miss is boxed: its future (the shared fetch and the store's
        // query) is many times the size of a hit's, and every request's
        // future would carry that size, copied with it at each move, for the
        // few that miss.
        Box::pin(self.fetch(key, fetch)).await
    }

    /// [`Table::get_or_fetch`] on a miss.
    async fn fetch<E, F, Fut>(&self, key: &K, fetch: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), E>>,
    {
        let generation = self.generation.load(Ordering::Acquire);
        let cell = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            inflight.entry(key.clone()).or_default().clone()
        };
        // Removes the shared fetch however this call ends, dropped with a
        // closed connection included: otherwise a client sending made-up
        // keys and hanging up mid-fetch would grow the map without bound.
        let _done = Done {
            table: self,
            key,
            cell: &cell,
        };
        cell.get_or_try_init(|| async {
            let (value, lifetime) = fetch().await?;
            self.insert_since(key.clone(), value.clone(), lifetime, generation);
            Ok(value)
        })
        .await
        .cloned()
    }

    /// Keeps `value` for `lifetime`.
    pub fn insert(&self, key: K, value: V, lifetime: Duration) {
        let generation = self.generation.load(Ordering::Acquire);
        self.insert_since(key, value, lifetime, generation);
    }

    /// Keeps `value` unless the table was invalidated after `generation`.
    fn insert_since(&self, key: K, value: V, lifetime: Duration, generation: u64) {
        if self.per_shard == 0 || lifetime.is_zero() {
            return;
        }
        let key = self.hashed(key);
        let deadline = self.now().saturating_add(lifetime.as_millis() as u64);
        let mut shard = self
            .shard(key.hash)
            .write()
            .unwrap_or_else(|p| p.into_inner());
        // Checked under the shard's lock, which every invalidation takes
        // after moving the generation on: either this insert comes first and
        // is removed, or it sees the new generation.
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        shard.insert(
            key,
            Slot {
                value,
                deadline,
                used: AtomicBool::new(false),
            },
        );
        if shard.len() > self.per_shard {
            self.evict(&mut shard);
        }
    }

    /// One pass over a full shard: expired entries out, then entries unused
    /// since the last pass, until an eighth of the shard is free.
    fn evict(&self, shard: &mut ShardMap<K, V>) {
        let target = self.per_shard - self.per_shard / 8;
        let now = self.now();
        let mut excess = shard.len().saturating_sub(target);
        let mut pushed_out = 0u64;
        shard.retain(|_, slot| {
            if slot.deadline <= now {
                excess = excess.saturating_sub(1);
                return false;
            }
            if excess > 0 && !slot.used.load(Ordering::Relaxed) {
                excess -= 1;
                pushed_out += 1;
                return false;
            }
            slot.used.store(false, Ordering::Relaxed);
            true
        });
        if excess > 0 {
            // Everything was used since the last pass: drop some anyway.
            shard.retain(|_, _| {
                if excess == 0 {
                    return true;
                }
                excess -= 1;
                pushed_out += 1;
                false
            });
        }
        self.series.evictions(pushed_out);
    }

    /// Moves the generation on, so fetches in flight do not fill the table
    /// with what they read before this invalidation.
    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Detaches fetches in flight that `doomed` picks: a request that
    /// arrives after an invalidation starts its own fetch rather than
    /// waiting for the answer of one that read the store before it.
    fn detach_inflight(&self, doomed: impl Fn(&K) -> bool) {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| !doomed(key));
    }

    pub(crate) fn invalidate(&self, key: &K) {
        self.bump();
        self.detach_inflight(|k| k == key);
        let key = self.hashed(key.clone());
        self.shard(key.hash)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    /// Drops every entry `doomed` picks (a pass over the whole table).
    pub(crate) fn invalidate_if(&self, doomed: impl Fn(&K, &V) -> bool) {
        self.bump();
        // The value a fetch in flight will find is not known yet.
        self.detach_inflight(|_| true);
        for shard in self.shards.iter() {
            shard
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|key, slot| !doomed(&key.key, &slot.value));
        }
    }

    pub fn clear(&self) {
        self.bump();
        self.detach_inflight(|_| true);
        for shard in self.shards.iter() {
            shard.write().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries held, expired ones not yet dropped included.
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|p| p.into_inner()).len() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    fn table(capacity: u64) -> (Table<u32, u32>, Metrics) {
        let metrics = Metrics::new();
        let series = metrics.init_cache("test");
        (Table::new(capacity, series), metrics)
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn a_kept_value_is_read_until_its_lifetime_ends() {
        let (t, _m) = table(100);
        t.insert(1, 10, LONG);
        t.insert(2, 20, Duration::from_millis(30));
        assert_eq!(t.get(&1), Some(10));
        assert_eq!(t.get(&2), Some(20));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.get(&2), None);
        assert_eq!(t.get(&1), Some(10));
    }

    #[test]
    fn a_table_without_capacity_keeps_nothing() {
        let (t, _m) = table(0);
        t.insert(1, 10, LONG);
        assert_eq!(t.get(&1), None);
        assert!(t.is_empty());
    }

    #[test]
    fn a_full_table_pushes_out_unused_entries_before_used_ones() {
        let (t, m) = table(64);
        for k in 0..64 {
            t.insert(k, k, LONG);
        }
        // Entries 0..8 are read between every insert; the rest never.
        let hot: Vec<u32> = (0..8).collect();
        for k in 1000..1200 {
            for h in &hot {
                assert_eq!(t.get(h), Some(*h), "a used entry was pushed out");
            }
            t.insert(k, k, LONG);
            assert!(t.len() <= 64, "{}", t.len());
        }
        // 264 inserted, at most 64 held: the rest were pushed out, and counted.
        let text = m.render();
        let counted: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("keygate_cache_evictions_total{cache=\"test\"} "))
            .and_then(|n| n.parse().ok())
            .expect("the eviction series");
        assert_eq!(counted, 264 - t.len());
    }

    #[test]
    fn the_bound_holds_under_any_number_of_inserts() {
        let (t, _m) = table(5000);
        for k in 0..100_000 {
            t.insert(k, k, LONG);
        }
        assert!(t.len() <= 5000, "{}", t.len());
        assert!(t.len() >= 5000 * 7 / 8 - 64, "{}", t.len());
    }

    #[test]
    fn invalidation_drops_by_key_by_predicate_and_all() {
        let (t, _m) = table(100);
        for k in 0..10 {
            t.insert(k, k * 10, LONG);
        }
        t.invalidate(&3);
        assert_eq!(t.get(&3), None);
        t.invalidate_if(|_, v| *v >= 50);
        assert_eq!(t.get(&5), None);
        assert_eq!(t.get(&4), Some(40));
        t.clear();
        assert_eq!(t.get(&4), None);
    }

    #[tokio::test]
    async fn a_fetch_that_raced_an_invalidation_does_not_fill_the_table() {
        let (t, _m) = table(100);
        let value = t
            .get_or_fetch(&7, || async {
                // The store was read; a revocation lands before the fill.
                t.invalidate(&7);
                Ok::<_, ()>((70, LONG))
            })
            .await;
        assert_eq!(value, Ok(70), "the request that fetched gets its answer");
        assert_eq!(t.get(&7), None, "but the table does not keep it");
        let value = t
            .get_or_fetch(&7, || async { Ok::<_, ()>((71, LONG)) })
            .await;
        assert_eq!(value, Ok(71));
        assert_eq!(t.get(&7), Some(71));
    }

    #[tokio::test]
    async fn concurrent_misses_of_one_key_share_one_fetch() {
        let (t, _m) = table(100);
        let fetches = std::sync::atomic::AtomicUsize::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, ()>((5, LONG))
        };
        let all = futures_util::future::join_all((0..10).map(|_| t.get_or_fetch(&1, fetch))).await;
        assert!(all.iter().all(|r| *r == Ok(5)));
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert!(t.inflight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_fetch_abandoned_by_its_caller_leaves_nothing_in_flight() {
        let (t, _m) = table(100);
        for k in 0..50 {
            // The caller goes away (a closed connection) mid-fetch.
            let fetch = t.get_or_fetch(&k, || async {
                tokio::time::sleep(LONG).await;
                Ok::<_, ()>((0, LONG))
            });
            let gave_up = tokio::time::timeout(Duration::from_millis(1), fetch).await;
            assert!(gave_up.is_err());
        }
        assert!(t.inflight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_request_after_an_invalidation_does_not_wait_for_a_fetch_begun_before_it() {
        let (t, _m) = table(100);
        let (read_tx, read_rx) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let before = t.get_or_fetch(&1, || async {
            // Read the store: the key was still valid.
            read_tx.send(()).unwrap();
            release_rx.await.unwrap();
            Ok::<_, ()>((100, LONG))
        });
        let after = async {
            read_rx.await.unwrap();
            t.invalidate(&1); // revoked
            let fresh = t
                .get_or_fetch(&1, || async { Ok::<_, ()>((200, LONG)) })
                .await;
            release_tx.send(()).unwrap();
            fresh
        };
        let (before, after) = tokio::join!(before, after);
        assert_eq!(before, Ok(100));
        assert_eq!(after, Ok(200), "joined the stale fetch");
        assert_eq!(t.get(&1), Some(200));
    }

    #[tokio::test]
    async fn a_failed_fetch_is_not_kept_and_the_next_miss_fetches_again() {
        let (t, _m) = table(100);
        assert_eq!(
            t.get_or_fetch(&1, || async { Err::<(u32, _), _>("down") })
                .await,
            Err("down")
        );
        assert_eq!(
            t.get_or_fetch(&1, || async { Ok::<_, &str>((9, LONG)) })
                .await,
            Ok(9)
        );
        assert!(t.inflight.lock().unwrap().is_empty());
    }
}
