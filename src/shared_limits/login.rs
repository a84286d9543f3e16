//! Password-attempt windows counted in Redis, so that every replica counts
//! every attempt: a failure at one replica counts at all of them.
//!
//! The same windows as the local limiter (per address, per account and
//! address, per account), each a Redis key that expires when its window ends.
//! One Lua script checks every window and takes a slot in each, or in none:
//! check and count are one atomic step across replicas, as they are in one
//! process. Account names are keyed digests in Redis, never the name as typed
//! (people type passwords there); addresses are address keys
//! (`login:address:2001:db8:1:2::/64`), like the local windows.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use redis::Script;

use super::link::{LinkError, RedisLink};
use crate::address::AddressKey;
use crate::config::LimiterSettings;

/// Which limit refused an attempt, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub by: &'static str,
    pub retry_after: Duration,
}

/// Takes a slot in each window (KEYS), or in none when one is full.
/// ARGV holds limit and window length (ms) per key. Returns {0, 0} when
/// taken, else {index of the full window, its remaining ms}.
const ACQUIRE: &str = r"
for i = 1, #KEYS do
  local taken = tonumber(redis.call('GET', KEYS[i]) or '0')
  if taken >= tonumber(ARGV[2 * i - 1]) then
    return {i, redis.call('PTTL', KEYS[i])}
  end
end
for i = 1, #KEYS do
  redis.call('INCR', KEYS[i])
  if redis.call('PTTL', KEYS[i]) < 0 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  end
end
return {0, 0}
";

/// Gives one slot back in each of the first ARGV[1] keys and clears the rest
/// (the account and address window of a success).
const GIVE_BACK: &str = r"
local counted = tonumber(ARGV[1])
for i = 1, #KEYS do
  if i <= counted then
    if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 then
      redis.call('DECR', KEYS[i])
    end
  else
    redis.call('DEL', KEYS[i])
  end
end
return 0
";

/// The slots one attempt holds in Redis.
#[derive(Debug)]
pub struct SharedSlots {
    /// Address, then account; given back on success.
    counted: Vec<String>,
    /// The (account, address) window, cleared on success.
    pair: Option<String>,
}

impl SharedSlots {
    /// The slots of windows in [`SharedLogins::windows`] order.
    fn of(windows: Vec<SharedWindow>) -> SharedSlots {
        let mut keys = windows.into_iter().map(|w| w.key);
        let address = keys.next();
        let pair = keys.next();
        let account = keys.next();
        SharedSlots {
            counted: address.into_iter().chain(account).collect(),
            pair,
        }
    }
}

/// One window an attempt takes a slot in.
struct SharedWindow {
    key: String,
    limit: u32,
    length: Duration,
    /// Which limit it is, as [`Limited::by`] names it.
    by: &'static str,
}

pub struct SharedLogins {
    link: Arc<RedisLink>,
    settings: LimiterSettings,
    digest: hmac::Key,
    acquire: Script,
    give_back: Script,
}

impl SharedLogins {
    /// `secret` keys the account digests: the signing key, the same on every
    /// replica, so every replica names an account's windows alike.
    pub fn new(link: Arc<RedisLink>, settings: LimiterSettings, secret: &[u8]) -> SharedLogins {
        let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derived = hmac::sign(&root, b"keygate login limiter v1");
        SharedLogins {
            link,
            settings,
            digest: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
            acquire: Script::new(ACQUIRE),
            give_back: Script::new(GIVE_BACK),
        }
    }

    pub fn link(&self) -> &RedisLink {
        &self.link
    }

    /// Takes a slot in the address window and, for an account (already in its
    /// counter form), in its (account, address) and account windows.
    /// `Ok(Err(..))` is a refusal; `Err` means Redis could not decide.
    pub async fn acquire(
        &self,
        account: Option<&str>,
        address: AddressKey,
    ) -> Result<Result<SharedSlots, Limited>, LinkError> {
        let windows = self.windows(account, address);
        let mut invocation = self.acquire.prepare_invoke();
        for w in &windows {
            invocation
                .key(&w.key)
                .arg(w.limit)
                .arg(w.length.as_millis() as u64);
        }
        let (full, remaining_ms): (usize, i64) = self.link.invoke(&invocation).await?;
        let Some(refused_by) = full.checked_sub(1).and_then(|i| windows.get(i)) else {
            return Ok(Ok(SharedSlots::of(windows)));
        };
        let retry_after =
            Duration::from_millis(remaining_ms.max(0) as u64).max(Duration::from_secs(1));
        Ok(Err(Limited {
            by: refused_by.by,
            retry_after,
        }))
    }

    /// The windows of an attempt, in the order the script checks them:
    /// address, then (account, address) and account.
    fn windows(&self, account: Option<&str>, address: AddressKey) -> Vec<SharedWindow> {
        let s = &self.settings;
        let mut windows = vec![SharedWindow {
            key: self.link.key(format_args!("login:address:{address}")),
            limit: s.address_max_failures,
            length: s.address_window,
            by: "address",
        }];
        if let Some(account) = account {
            let account = self.account_digest(account);
            windows.push(SharedWindow {
                key: self
                    .link
                    .key(format_args!("login:pair:{account}:{address}")),
                limit: s.account_address_max_failures,
                length: s.account_window,
                by: "account",
            });
            windows.push(SharedWindow {
                key: self.link.key(format_args!("login:account:{account}")),
                limit: s.account_max_failures,
                length: s.account_window,
                by: "account",
            });
        }
        windows
    }

    /// The attempt succeeded: its slots go back, its own (account, address)
    /// window is cleared. Runs in the background: a success never waits on it.
    pub fn succeeded(self: &Arc<Self>, slots: SharedSlots) {
        let shared = self.clone();
        tokio::spawn(async move {
            let mut invocation = shared.give_back.prepare_invoke();
            invocation.arg(slots.counted.len());
            for key in slots.counted.iter().chain(slots.pair.iter()) {
                invocation.key(key);
            }
            if let Err(error) = shared.link.invoke::<i64>(&invocation).await {
                tracing::debug!(%error, "could not give password-attempt slots back in redis");
            }
        });
    }

    fn account_digest(&self, account: &str) -> String {
        let tag = hmac::sign(&self.digest, account.as_bytes());
        tag.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
