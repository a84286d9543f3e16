//! Password-attempt windows counted in Redis, so that every replica counts
//! every attempt: a failure at one replica counts at all of them.
//!
//! The same windows as the local limiter (per address, per account and
//! address, per account), each a Redis key that expires when its window ends.
//! One Lua script checks every window and takes a slot in each, or in none:
//! check and count are one atomic step across replicas, as they are in one
//! process. Account names are keyed digests in Redis, never the name as typed
//! (people type passwords there); addresses are address keys
//! (`login:address:2001:db8:1:2::/64`), like the local windows. Second-factor
//! codes are counted in windows of their own (`login:code:...`), which a
//! right password never clears.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use redis::Script;

use super::link::{LinkError, RedisLink};
use crate::address::AddressKey;
use crate::config::LimiterSettings;

/// What an attempt guesses: a password (or a token standing in for one), or
/// a second-factor code. Each kind is counted in windows of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guess {
    Password,
    Code,
}

impl Guess {
    /// The part of a Redis key naming the kind: `login:` or `login:code:`.
    fn prefix(self) -> &'static str {
        match self {
            Guess::Password => "login",
            Guess::Code => "login:code",
        }
    }
}

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
/// (the (account, address) windows a success clears, if any).
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
    /// The attempt's own (account, address) window.
    pair: Option<String>,
    /// The password (account, address) window of the same account and
    /// address (for a code: a login completed with it clears both).
    password_pair: Option<String>,
}

impl SharedSlots {
    /// The slots of windows in [`SharedLogins::windows`] order.
    fn of(windows: Vec<SharedWindow>, password_pair: Option<String>) -> SharedSlots {
        let mut keys = windows.into_iter().map(|w| w.key);
        let address = keys.next();
        let pair = keys.next();
        let account = keys.next();
        SharedSlots {
            counted: address.into_iter().chain(account).collect(),
            pair,
            password_pair,
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

    /// Takes a slot in the address window of `guess` and, for an account
    /// (already in its counter form), in its (account, address) and account
    /// windows. `Ok(Err(..))` is a refusal; `Err` means Redis could not decide.
    pub async fn acquire(
        &self,
        guess: Guess,
        account: Option<&str>,
        address: AddressKey,
    ) -> Result<Result<SharedSlots, Limited>, LinkError> {
        let windows = self.windows(guess, account, address);
        let mut invocation = self.acquire.prepare_invoke();
        for w in &windows {
            invocation
                .key(&w.key)
                .arg(w.limit)
                .arg(w.length.as_millis() as u64);
        }
        let (full, remaining_ms): (usize, i64) = self.link.invoke(&invocation).await?;
        let Some(refused_by) = full.checked_sub(1).and_then(|i| windows.get(i)) else {
            let password_pair = match (guess, account) {
                (Guess::Code, Some(account)) => {
                    Some(self.pair_key(Guess::Password, account, address))
                }
                _ => None,
            };
            return Ok(Ok(SharedSlots::of(windows, password_pair)));
        };
        let retry_after =
            Duration::from_millis(remaining_ms.max(0) as u64).max(Duration::from_secs(1));
        Ok(Err(Limited {
            by: refused_by.by,
            retry_after,
        }))
    }

    /// The key of the (account, address) window of `guess`.
    fn pair_key(&self, guess: Guess, account: &str, address: AddressKey) -> String {
        let kind = guess.prefix();
        let account = self.account_digest(account);
        self.link
            .key(format_args!("{kind}:pair:{account}:{address}"))
    }

    /// The windows of an attempt, in the order the script checks them:
    /// address, then (account, address) and account.
    fn windows(
        &self,
        guess: Guess,
        account: Option<&str>,
        address: AddressKey,
    ) -> Vec<SharedWindow> {
        let s = &self.settings;
        let kind = guess.prefix();
        let mut windows = vec![SharedWindow {
            key: self.link.key(format_args!("{kind}:address:{address}")),
            limit: s.address_max_failures,
            length: s.address_window,
            by: "address",
        }];
        if let Some(account) = account {
            windows.push(SharedWindow {
                key: self.pair_key(guess, account, address),
                limit: s.account_address_max_failures,
                length: s.account_window,
                by: "account",
            });
            let account = self.account_digest(account);
            windows.push(SharedWindow {
                key: self.link.key(format_args!("{kind}:account:{account}")),
                limit: s.account_max_failures,
                length: s.account_window,
                by: "account",
            });
        }
        windows
    }

    /// The attempt succeeded: its slots go back and, with `clear_pair`, its
    /// own (account, address) window is cleared (else its slot there goes
    /// back too). Runs in the background: a success never waits on it.
    pub fn succeeded(self: &Arc<Self>, slots: SharedSlots, clear_pair: bool) {
        let SharedSlots {
            mut counted, pair, ..
        } = slots;
        if clear_pair {
            self.return_slots(counted, pair.into_iter().collect());
        } else {
            counted.extend(pair);
            self.return_slots(counted, Vec::new());
        }
    }

    /// A login completed with its second factor: the code's slots go back,
    /// the (account, address) windows of codes and passwords are cleared.
    pub fn completed_with_second_factor(self: &Arc<Self>, slots: SharedSlots) {
        let cleared = slots.pair.into_iter().chain(slots.password_pair).collect();
        self.return_slots(slots.counted, cleared);
    }

    /// Gives a slot back in each of `counted` and deletes `cleared`, in the
    /// background.
    fn return_slots(self: &Arc<Self>, counted: Vec<String>, cleared: Vec<String>) {
        let shared = self.clone();
        tokio::spawn(async move {
            let mut invocation = shared.give_back.prepare_invoke();
            invocation.arg(counted.len());
            for key in counted.iter().chain(cleared.iter()) {
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
