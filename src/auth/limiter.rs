//! Brute-force defence for the endpoints that check a password: attempts
//! counted per client address, per account from one address, and per account
//! over every address, in fixed windows. "Address" is the client's address
//! key ([`AddressKey`]: IPv6 per /64 by default), so rotating through the
//! addresses of one network never buys a fresh window.
//!
//! An attempt takes its slot in every window *before* the password is checked
//! (check and count are one atomic step), so however many guesses arrive at
//! once, no more than the limit are ever evaluated. A successful attempt gives
//! its slots back and clears its own (account, address) window; a failed one
//! keeps them.
//!
//! Second-factor codes are counted in windows of their own ([`Guess::Code`]),
//! with the same limits: a right password gives its own slots back but never
//! clears a code window, so logging in again buys no fresh code guesses. Only
//! a login completed with its second factor clears the (account, address)
//! windows of both kinds ([`LoginLimiter::completed_with_second_factor`]); a
//! password accepted while a second factor is still due clears nothing
//! ([`LoginLimiter::released`]).
//!
//! The limit is meant to cost the attacker, not the owner: the tight limit is
//! per account *and* address, so guessing from one place never locks the owner
//! out from another. The per-account ceiling over all addresses is higher and
//! stops a spread-out attack; only an attacker with many addresses can reach it,
//! and then the owner is refused too until the window ends (the trade-off).
//!
//! Every counter lives in a bounded moka cache, so memory stays bounded however
//! many distinct usernames or addresses an attacker sprays: past the capacity
//! the least useful windows are evicted (an evicted window only forgets
//! attempts; it never blocks anyone wrongly).
//!
//! With Redis configured, the same windows are also counted there
//! ([`crate::shared_limits::login`]), so every replica counts every attempt. The
//! local windows are always counted first: when Redis does not answer within
//! its timeout the attempt is decided by them alone (never admitted
//! unchecked), the fallback is counted and a warning logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use moka::future::Cache;

use crate::address::AddressKey;

use crate::shared_limits::link::Fallback;
use crate::shared_limits::login::{SharedLogins, SharedSlots};

/// Longest account name kept as a counter key; longer names are cut, so a
/// huge username cannot inflate memory.
const MAX_ACCOUNT_KEY: usize = 256;

pub use crate::config::LimiterSettings;

#[derive(Debug)]
struct Window {
    started: Instant,
    taken: AtomicU32,
}

impl Window {
    fn fresh() -> Arc<Window> {
        Arc::new(Window {
            started: Instant::now(),
            taken: AtomicU32::new(0),
        })
    }

    /// Takes one slot if fewer than `limit` are taken: check and count in one step.
    fn take(&self, limit: u32) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        let _ = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    fn retry_after(&self, length: Duration) -> Duration {
        length
            .saturating_sub(self.started.elapsed())
            .max(Duration::from_secs(1))
    }
}

pub use crate::shared_limits::login::{Guess, Limited};

/// The slots one attempt holds. Dropping it counts the attempt as a failure;
/// [`LoginLimiter::succeeded`] gives the slots back.
#[must_use = "an attempt is a failure unless reported as succeeded"]
pub struct Attempt {
    guess: Guess,
    taken: Vec<Arc<Window>>,
    pair: Option<(AddressKey, String)>,
    /// The slots taken in Redis, when it decided too.
    shared: Option<SharedSlots>,
}

/// The windows of one kind of guess.
struct Windows {
    accounts: Cache<String, Arc<Window>>,
    pairs: Cache<(AddressKey, String), Arc<Window>>,
    addresses: Cache<AddressKey, Arc<Window>>,
}

impl Windows {
    fn new(prefix: &str, settings: &LimiterSettings) -> Windows {
        let capacity = settings.capacity;
        Windows {
            accounts: windows(
                &format!("{prefix}_accounts"),
                capacity,
                settings.account_window,
            ),
            pairs: windows(
                &format!("{prefix}_account_addresses"),
                capacity,
                settings.account_window,
            ),
            addresses: windows(
                &format!("{prefix}_addresses"),
                capacity,
                settings.address_window,
            ),
        }
    }

    async fn entries(&self) -> (u64, u64, u64) {
        self.accounts.run_pending_tasks().await;
        self.pairs.run_pending_tasks().await;
        self.addresses.run_pending_tasks().await;
        (
            self.accounts.entry_count(),
            self.pairs.entry_count(),
            self.addresses.entry_count(),
        )
    }
}

pub struct LoginLimiter {
    settings: LimiterSettings,
    shared: Option<Arc<SharedLogins>>,
    passwords: Windows,
    codes: Windows,
}

impl LoginLimiter {
    pub fn new(settings: LimiterSettings) -> LoginLimiter {
        LoginLimiter {
            passwords: Windows::new("login", &settings),
            codes: Windows::new("second_factor", &settings),
            settings,
            shared: None,
        }
    }

    fn windows(&self, guess: Guess) -> &Windows {
        match guess {
            Guess::Password => &self.passwords,
            Guess::Code => &self.codes,
        }
    }

    /// Counts in Redis too, so that the limits hold across replicas.
    pub fn shared(mut self, shared: SharedLogins) -> LoginLimiter {
        self.shared = Some(Arc::new(shared));
        self
    }

    fn account_key(account: &str) -> String {
        let lower = crate::email::fold(account);
        match lower.char_indices().nth(MAX_ACCOUNT_KEY) {
            Some((cut, _)) => lower[..cut].to_string(),
            None => lower,
        }
    }

    /// Takes a slot for a password attempt on `account` from `address`, in the
    /// address, (account, address) and account windows; refused, it holds none.
    pub async fn acquire(&self, account: &str, address: AddressKey) -> Result<Attempt, Limited> {
        self.acquire_guess(Guess::Password, account, address).await
    }

    /// Takes a slot for a second-factor code of `account` from `address`, in
    /// the code windows (address, pair and account), which no password clears.
    pub async fn acquire_code(
        &self,
        account: &str,
        address: AddressKey,
    ) -> Result<Attempt, Limited> {
        self.acquire_guess(Guess::Code, account, address).await
    }

    async fn acquire_guess(
        &self,
        guess: Guess,
        account: &str,
        address: AddressKey,
    ) -> Result<Attempt, Limited> {
        let account = Self::account_key(account);
        let attempt = self.acquire_locally(guess, &account, address).await?;
        self.acquire_shared(attempt, Some(&account), address).await
    }

    async fn acquire_locally(
        &self,
        guess: Guess,
        account: &str,
        address: AddressKey,
    ) -> Result<Attempt, Limited> {
        let s = &self.settings;
        let account = account.to_string();
        let mut attempt = self.acquire_address_locally(guess, address).await?;
        let pair = (address, account.clone());
        let by_pair = self
            .windows(guess)
            .pairs
            .get_with(pair.clone(), async { Window::fresh() })
            .await;
        attempt.hold(
            by_pair,
            s.account_address_max_failures,
            s.account_window,
            "account",
        )?;
        let by_account = self
            .windows(guess)
            .accounts
            .get_with(account, async { Window::fresh() })
            .await;
        attempt.hold(
            by_account,
            s.account_max_failures,
            s.account_window,
            "account",
        )?;
        attempt.pair = Some(pair);
        Ok(attempt)
    }

    /// Takes a slot in the address window only: for unauthenticated endpoints
    /// that name no account (activation).
    pub async fn acquire_address(&self, address: AddressKey) -> Result<Attempt, Limited> {
        let attempt = self
            .acquire_address_locally(Guess::Password, address)
            .await?;
        self.acquire_shared(attempt, None, address).await
    }

    async fn acquire_address_locally(
        &self,
        guess: Guess,
        address: AddressKey,
    ) -> Result<Attempt, Limited> {
        let mut attempt = Attempt {
            guess,
            taken: Vec::with_capacity(3),
            pair: None,
            shared: None,
        };
        let window = self
            .windows(guess)
            .addresses
            .get_with(address, async { Window::fresh() })
            .await;
        attempt.hold(
            window,
            self.settings.address_max_failures,
            self.settings.address_window,
            "address",
        )?;
        Ok(attempt)
    }

    /// Asks Redis for the same slots the local windows gave `attempt`;
    /// refused there, the local slots go back. When Redis does not answer,
    /// the local windows alone decide.
    async fn acquire_shared(
        &self,
        mut attempt: Attempt,
        account: Option<&str>,
        address: AddressKey,
    ) -> Result<Attempt, Limited> {
        let Some(shared) = &self.shared else {
            return Ok(attempt);
        };
        match shared.acquire(attempt.guess, account, address).await {
            Ok(Ok(slots)) => {
                attempt.shared = Some(slots);
                Ok(attempt)
            }
            Ok(Err(limited)) => {
                attempt.give_back();
                Err(limited)
            }
            Err(error) => {
                shared.link().fell_back(Fallback::Login, &error);
                Ok(attempt)
            }
        }
    }

    /// The password was right and nothing more is due: its slots are given
    /// back and its own (account, address) password window is cleared. The
    /// account ceiling keeps what others spent. A code window is never
    /// cleared here: see [`LoginLimiter::completed_with_second_factor`].
    pub async fn succeeded(&self, mut attempt: Attempt) {
        attempt.give_back();
        if attempt.guess == Guess::Password
            && let Some(pair) = &attempt.pair
        {
            self.passwords.pairs.invalidate(pair).await;
        }
        if let (Some(shared), Some(slots)) = (&self.shared, attempt.shared.take()) {
            shared.succeeded(slots, attempt.guess == Guess::Password);
        }
    }

    /// The guess was right, but it completes nothing yet (a password while a
    /// second factor is due, a code that saves a second factor): its slots
    /// are given back and no window is cleared.
    pub async fn released(&self, mut attempt: Attempt) {
        attempt.give_back();
        if let (Some(shared), Some(slots)) = (&self.shared, attempt.shared.take()) {
            shared.succeeded(slots, false);
        }
    }

    /// A login completed with its second factor: the code's slots are given
    /// back, and the (account, address) windows of both passwords and codes
    /// are cleared. The only way a code window is cleared before it ends.
    pub async fn completed_with_second_factor(&self, mut attempt: Attempt) {
        attempt.give_back();
        if let Some(pair) = &attempt.pair {
            self.passwords.pairs.invalidate(pair).await;
            self.codes.pairs.invalidate(pair).await;
        }
        if let (Some(shared), Some(slots)) = (&self.shared, attempt.shared.take()) {
            shared.completed_with_second_factor(slots);
        }
    }

    /// Entries held, for the memory bound: (accounts, pairs, addresses), of
    /// passwords and codes together.
    pub async fn entries(&self) -> (u64, u64, u64) {
        let (a, p, d) = self.passwords.entries().await;
        let (ca, cp, cd) = self.codes.entries().await;
        (a + ca, p + cp, d + cd)
    }
}

/// A bounded cache of windows that end `length` after they start.
fn windows<K>(name: &str, capacity: u64, length: Duration) -> Cache<K, Arc<Window>>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    Cache::builder()
        .name(name)
        .max_capacity(capacity)
        .time_to_live(length)
        .build()
}

impl Attempt {
    /// Gives back every local slot held.
    fn give_back(&mut self) {
        for held in self.taken.drain(..) {
            held.give_back();
        }
    }
    /// Takes a slot in `window`; when refused, gives back the slots already held.
    fn hold(
        &mut self,
        window: Arc<Window>,
        limit: u32,
        length: Duration,
        by: &'static str,
    ) -> Result<(), Limited> {
        if window.take(limit) {
            self.taken.push(window);
            return Ok(());
        }
        for held in self.taken.drain(..) {
            held.give_back();
        }
        Err(Limited {
            by,
            retry_after: window.retry_after(length),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(pair: u32, account: u32, address: u32, window: Duration) -> LoginLimiter {
        LoginLimiter::new(LimiterSettings {
            account_max_failures: account,
            account_address_max_failures: pair,
            account_window: window,
            address_max_failures: address,
            address_window: window,
            capacity: 1000,
        })
    }

    use std::net::IpAddr;

    fn key(address: IpAddr) -> AddressKey {
        AddressKey::of(address, 64)
    }

    const HOME_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const ATTACKER_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7));

    #[tokio::test]
    async fn account_is_limited_from_one_address_and_reset_after_the_window() {
        let l = limiter(3, 100, 100, Duration::from_millis(300));
        for _ in 0..3 {
            drop(l.acquire("Victim@Example.com", key(HOME_IP)).await.unwrap());
        }
        let limited = l
            .acquire("victim@example.com", key(HOME_IP))
            .await
            .err()
            .unwrap();
        assert_eq!(limited.by, "account");
        assert!(limited.retry_after >= Duration::from_secs(1));
        drop(l.acquire("other@example.com", key(HOME_IP)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        drop(l.acquire("victim@example.com", key(HOME_IP)).await.unwrap());
    }

    #[tokio::test]
    async fn guesses_from_one_address_do_not_lock_the_owner_out_elsewhere() {
        let l = limiter(3, 100, 100, Duration::from_secs(60));
        for _ in 0..10 {
            let _ = l.acquire("owner@example.com", key(ATTACKER_IP)).await;
        }
        assert!(
            l.acquire("owner@example.com", key(ATTACKER_IP))
                .await
                .is_err()
        );
        let attempt = l.acquire("owner@example.com", key(HOME_IP)).await.unwrap();
        l.succeeded(attempt).await;
    }

    #[tokio::test]
    async fn the_account_ceiling_stops_guesses_spread_over_addresses() {
        let l = limiter(3, 5, 100, Duration::from_secs(60));
        for i in 0..5u8 {
            let from = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, i));
            drop(l.acquire("owner@example.com", key(from)).await.unwrap());
        }
        let limited = l
            .acquire("owner@example.com", key(HOME_IP))
            .await
            .err()
            .unwrap();
        assert_eq!(limited.by, "account");
    }

    #[tokio::test]
    async fn address_is_limited_across_accounts() {
        let l = limiter(100, 100, 5, Duration::from_secs(60));
        for i in 0..5 {
            drop(
                l.acquire(&format!("user{i}@example.com"), key(HOME_IP))
                    .await
                    .unwrap(),
            );
        }
        let limited = l
            .acquire("fresh@example.com", key(HOME_IP))
            .await
            .err()
            .unwrap();
        assert_eq!(limited.by, "address");
        drop(
            l.acquire("fresh@example.com", key(ATTACKER_IP))
                .await
                .unwrap(),
        );
    }

    #[tokio::test]
    async fn addresses_of_one_ipv6_prefix_share_the_address_and_pair_windows() {
        let l = limiter(2, 100, 3, Duration::from_secs(60));
        let in_64 = |i: u16| key(IpAddr::from([0x2001, 0xdb8, 1, 2, 0, 0, 0, i]));
        for i in 1..=2 {
            drop(l.acquire("owner@example.com", in_64(i)).await.unwrap());
        }
        let by_pair = l.acquire("owner@example.com", in_64(3)).await;
        assert_eq!(by_pair.err().unwrap().by, "account");
        drop(l.acquire("other@example.com", in_64(4)).await.unwrap());
        let by_address = l.acquire("third@example.com", in_64(5)).await;
        assert_eq!(by_address.err().unwrap().by, "address");
        let mapped = key("::ffff:192.0.2.1".parse().unwrap());
        assert_eq!(mapped, key(HOME_IP));
        drop(l.acquire("owner@example.com", mapped).await.unwrap());
    }

    #[tokio::test]
    async fn success_gives_the_slots_back() {
        let l = limiter(2, 2, 2, Duration::from_secs(60));
        for _ in 0..10 {
            let attempt = l.acquire("a@example.com", key(HOME_IP)).await.unwrap();
            l.succeeded(attempt).await;
        }
        drop(l.acquire("a@example.com", key(HOME_IP)).await.unwrap());
        drop(l.acquire("a@example.com", key(HOME_IP)).await.unwrap());
    }

    #[tokio::test]
    async fn a_right_password_never_refunds_second_factor_guesses() {
        let l = limiter(3, 100, 100, Duration::from_secs(60));
        for _ in 0..5 {
            let password = l.acquire("a@example.com", key(HOME_IP)).await.unwrap();
            l.succeeded(password).await;
            if let Ok(code) = l.acquire_code("a@example.com", key(HOME_IP)).await {
                drop(code);
            }
        }
        let refused = l.acquire_code("a@example.com", key(HOME_IP)).await;
        assert_eq!(refused.err().unwrap().by, "account");
        // Passwords count apart: the owner's password is still checked.
        let password = l.acquire("a@example.com", key(HOME_IP)).await.unwrap();
        l.released(password).await;
        // From another address the codes have a window of their own.
        drop(
            l.acquire_code("a@example.com", key(ATTACKER_IP))
                .await
                .unwrap(),
        );
    }

    #[tokio::test]
    async fn only_a_login_completed_with_its_second_factor_clears_the_code_window() {
        let l = limiter(3, 100, 100, Duration::from_secs(60));
        for _ in 0..2 {
            drop(l.acquire_code("a@example.com", key(HOME_IP)).await.unwrap());
            drop(l.acquire("a@example.com", key(HOME_IP)).await.unwrap());
        }
        let right = l.acquire_code("a@example.com", key(HOME_IP)).await.unwrap();
        l.completed_with_second_factor(right).await;
        for _ in 0..3 {
            drop(l.acquire_code("a@example.com", key(HOME_IP)).await.unwrap());
            drop(l.acquire("a@example.com", key(HOME_IP)).await.unwrap());
        }
        assert!(l.acquire_code("a@example.com", key(HOME_IP)).await.is_err());
        assert!(l.acquire("a@example.com", key(HOME_IP)).await.is_err());
    }

    #[tokio::test]
    async fn a_refused_attempt_holds_no_slot() {
        let l = limiter(1, 100, 3, Duration::from_secs(60));
        drop(l.acquire("a@example.com", key(HOME_IP)).await.unwrap());
        // Refused by the pair limit: the address slot it took is given back.
        for _ in 0..5 {
            assert!(l.acquire("a@example.com", key(HOME_IP)).await.is_err());
        }
        drop(l.acquire("b@example.com", key(HOME_IP)).await.unwrap());
        drop(l.acquire("c@example.com", key(HOME_IP)).await.unwrap());
        assert_eq!(
            l.acquire("d@example.com", key(HOME_IP))
                .await
                .err()
                .unwrap()
                .by,
            "address"
        );
    }

    #[tokio::test]
    async fn parallel_attempts_never_exceed_the_limit() {
        let l = Arc::new(limiter(10, 100, 100, Duration::from_secs(60)));
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(
                    async move { l.acquire("victim@example.com", key(HOME_IP)).await.is_ok() },
                )
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += usize::from(task.await.unwrap());
        }
        assert_eq!(admitted, 10);
    }

    #[tokio::test]
    async fn memory_stays_bounded_under_a_username_spray() {
        let l = LoginLimiter::new(LimiterSettings {
            account_max_failures: 5,
            account_address_max_failures: 5,
            account_window: Duration::from_secs(60),
            address_max_failures: 1_000_000,
            address_window: Duration::from_secs(60),
            capacity: 2_000,
        });
        for i in 0..50_000u32 {
            let address = IpAddr::from((i.wrapping_mul(2_654_435_761)).to_be_bytes());
            drop(
                l.acquire(&format!("spray-{i}-{}", "x".repeat(500)), key(address))
                    .await,
            );
        }
        let (accounts, pairs, addresses) = l.entries().await;
        assert!(accounts <= 2_000, "{accounts} account windows kept");
        assert!(pairs <= 2_000, "{pairs} account-address windows kept");
        assert!(addresses <= 2_000, "{addresses} address windows kept");
    }
}
