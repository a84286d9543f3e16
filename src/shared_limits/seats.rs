//! Open WebSockets per user and per tenant, counted across replicas.
//!
//! Each replica counts its own sockets exactly (in the credential registry)
//! and publishes, per user and per tenant it holds sockets for, its count as
//! one field of a Redis hash (`ws:user:<id>`, `ws:tenant:<id>`, the field
//! named after the replica). A new socket is admitted by one script that adds
//! the counts of the other live replicas (those in the replica set the quota
//! sync keeps) to this replica's own and, when within the limits, publishes
//! this replica's new count in the same step. So two replicas opening the
//! last seat at once cannot both have it.
//!
//! A socket's close publishes the new count at once, so a client that
//! reconnects through another replica finds its seat free. Periodically
//! each replica publishes all its counts again, which
//! repairs a publish lost to a Redis failure (a third of the staleness
//! below, so every second by default); a replica that stops drops out
//! of the replica set, and its counts stop counting, after the set's
//! staleness (ten sync intervals, at least 3 s).
//!
//! When Redis does not answer, a socket is admitted on this replica's count
//! alone, as without Redis: at worst N replicas each allow the limit.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::Script;
use uuid::Uuid;

use super::link::{Fallback, LinkError, RedisLink};

/// Checks the other live replicas' counts and, within the limits, publishes
/// this replica's. KEYS[1]: the replica set; then the hash of each limited
/// owner (user, tenant). ARGV: replica id, now (ms), staleness (ms), then
/// per hash this replica's count with the new socket and the limit.
/// Returns 0 (admitted) or the 1-based index of the owner that is full.
const ADMIT: &str = r"
local now = tonumber(ARGV[2])
local stale = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
local function others(key)
  local total = 0
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    if fields[i] ~= ARGV[1] then
      local seen = redis.call('ZSCORE', KEYS[1], fields[i])
      if seen and tonumber(seen) >= now - stale then
        total = total + tonumber(fields[i + 1])
      end
    end
  end
  return total
end
for i = 2, #KEYS do
  if others(KEYS[i]) + tonumber(ARGV[2 * i]) > tonumber(ARGV[2 * i + 1]) then
    return i - 1
  end
end
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[1], ARGV[2 * i])
  redis.call('PEXPIRE', KEYS[i], stale * 2)
end
return 0
";

/// Publishes this replica's counts: a count of 0 removes its field.
/// KEYS: the hashes; ARGV: replica id, hash lifetime (ms), one count per key.
const PUBLISH: &str = r"
for i = 1, #KEYS do
  local count = tonumber(ARGV[i + 2])
  if count > 0 then
    redis.call('HSET', KEYS[i], ARGV[1], count)
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
return #KEYS
";

/// Hashes published by one script call at most.
const PUBLISH_BATCH: usize = 500;

/// Whose sockets a count is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    User(Uuid),
    Tenant(Uuid),
}

/// The limits on open sockets, per user and per tenant (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatLimits {
    pub per_user: Option<usize>,
    pub per_tenant: Option<usize>,
}

/// Which shared limit refused a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    User,
    Tenant,
}

pub struct Seats {
    link: Arc<RedisLink>,
    limits: SeatLimits,
    instance: String,
    stale: Duration,
    admit: Script,
    publish: Script,
    /// Owners whose count this replica has published and not yet removed:
    /// the next full publish removes those it no longer holds sockets for.
    published: Mutex<HashSet<Owner>>,
}

impl Seats {
    /// Shared counts for the limits that are set; `None` when neither is:
    /// then there is nothing to count.
    pub fn new(
        link: Arc<RedisLink>,
        limits: SeatLimits,
        instance: Uuid,
        sync_interval: Duration,
    ) -> Option<Seats> {
        if limits.per_user.is_none() && limits.per_tenant.is_none() {
            return None;
        }
        Some(Seats {
            link,
            limits,
            instance: instance.to_string(),
            stale: super::sync::staleness(sync_interval),
            admit: Script::new(ADMIT),
            publish: Script::new(PUBLISH),
            published: Mutex::new(HashSet::new()),
        })
    }

    /// The owners of a socket whose counts are limited, each with its limit.
    fn limited(&self, user: Uuid, tenant: Option<Uuid>) -> Vec<(Owner, usize)> {
        let mut owners = Vec::with_capacity(2);
        if let Some(limit) = self.limits.per_user {
            owners.push((Owner::User(user), limit));
        }
        if let (Some(limit), Some(tenant)) = (self.limits.per_tenant, tenant) {
            owners.push((Owner::Tenant(tenant), limit));
        }
        owners
    }

    /// Whether a count is of a limited kind: only those are published.
    fn is_limited(&self, owner: Owner) -> bool {
        match owner {
            Owner::User(_) => self.limits.per_user.is_some(),
            Owner::Tenant(_) => self.limits.per_tenant.is_some(),
        }
    }

    fn key(&self, owner: Owner) -> String {
        match owner {
            Owner::User(id) => self.link.key(format_args!("ws:user:{id}")),
            Owner::Tenant(id) => self.link.key(format_args!("ws:tenant:{id}")),
        }
    }

    /// Whether the other replicas leave room for this one's new socket.
    /// `users` and `tenants` are this replica's own counts with the new
    /// socket, already within the limits; `tenant` is `None` for the
    /// platform's "no tenant". Without an answer from Redis the socket is
    /// admitted: this replica's own count is all that is known.
    pub async fn admit(
        &self,
        user: Uuid,
        users: usize,
        tenant: Option<Uuid>,
        tenants: usize,
    ) -> Result<(), Full> {
        let limited = self.limited(user, tenant);
        if limited.is_empty() {
            return Ok(());
        }
        let mut invocation = self.admit.prepare_invoke();
        invocation
            .key(self.link.key(format_args!("quota:replicas")))
            .arg(&self.instance)
            .arg(crate::clock::now_ms())
            .arg(self.stale.as_millis() as u64);
        for (owner, limit) in &limited {
            let count = match owner {
                Owner::User(_) => users,
                Owner::Tenant(_) => tenants,
            };
            invocation.key(self.key(*owner)).arg(count).arg(*limit);
        }
        match self.link.invoke::<u8>(&invocation).await {
            Ok(0) => {
                self.lock().extend(limited.iter().map(|(owner, _)| *owner));
                Ok(())
            }
            Ok(refused) => match limited.get(usize::from(refused) - 1) {
                Some((Owner::Tenant(_), _)) => Err(Full::Tenant),
                _ => Err(Full::User),
            },
            Err(error) => {
                self.link.fell_back(Fallback::WebSocket, &error);
                Ok(())
            }
        }
    }

    /// Publishes the counts of the owners a closed socket belonged to, on
    /// a task of its own: a close never waits for Redis.
    pub fn left(self: &Arc<Self>, user: (Uuid, usize), tenant: Option<(Uuid, usize)>) {
        let counts: Vec<(Owner, usize)> = [
            Some((Owner::User(user.0), user.1)),
            tenant.map(|(id, count)| (Owner::Tenant(id), count)),
        ]
        .into_iter()
        .flatten()
        .filter(|(owner, _)| self.is_limited(*owner))
        .collect();
        let seats = self.clone();
        tokio::spawn(async move {
            if let Err(error) = seats.publish(&counts).await {
                seats.link.fell_back(Fallback::WebSocket, &error);
            }
        });
    }

    /// Publishes every count this replica holds, and removes the ones it
    /// published before and no longer holds.
    pub async fn publish_all(&self, held: Vec<(Owner, usize)>) -> Result<(), LinkError> {
        let mut counts: Vec<(Owner, usize)> = held
            .into_iter()
            .filter(|(owner, _)| self.is_limited(*owner))
            .collect();
        let holding: HashSet<Owner> = counts.iter().map(|(owner, _)| *owner).collect();
        counts.extend(
            self.lock()
                .iter()
                .filter(|owner| !holding.contains(owner))
                .map(|owner| (*owner, 0)),
        );
        self.publish(&counts).await
    }

    async fn publish(&self, counts: &[(Owner, usize)]) -> Result<(), LinkError> {
        for batch in counts.chunks(PUBLISH_BATCH) {
            let mut invocation = self.publish.prepare_invoke();
            invocation
                .arg(&self.instance)
                .arg(2 * self.stale.as_millis() as u64);
            for (owner, count) in batch {
                invocation.key(self.key(*owner)).arg(*count);
            }
            self.link.probe::<u64>(&invocation).await?;
            let mut published = self.lock();
            for (owner, count) in batch {
                if *count == 0 {
                    published.remove(owner);
                } else {
                    published.insert(*owner);
                }
            }
        }
        Ok(())
    }

    /// Publishes this replica's counts until shutdown, three times per
    /// staleness period (every second by default): often enough to keep
    /// the hashes alive and repair a lost publish, without writing every
    /// count at each quota sync. `held` reads them from the credential
    /// registry.
    pub async fn run(
        self: Arc<Self>,
        held: impl Fn() -> Vec<(Owner, usize)> + Send,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.stale / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    if let Err(error) = self.publish_all(held()).await {
                        self.link.fell_back(Fallback::WebSocket, &error);
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Owner>> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
