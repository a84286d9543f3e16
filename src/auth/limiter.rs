//! Brute-force defence for the login endpoint: failed attempts counted per
//! account and per client address in fixed windows.
//!
//! Both counters live in bounded moka caches, so memory stays bounded however
//! many distinct usernames or addresses an attacker sprays: past the capacity
//! the least useful windows are evicted (an evicted window only forgets
//! failures; it never blocks anyone wrongly).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use moka::future::Cache;

/// Longest account name kept as a counter key; longer names are cut, so a
/// huge username cannot inflate memory.
const MAX_ACCOUNT_KEY: usize = 256;

#[derive(Debug, Clone)]
pub struct LimiterSettings {
    pub account_max_failures: u32,
    pub account_window: Duration,
    pub address_max_failures: u32,
    pub address_window: Duration,
    pub capacity: u64,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    failures: AtomicU32,
}

/// Which limit refused an attempt, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub by: &'static str,
    pub retry_after: Duration,
}

pub struct LoginLimiter {
    settings: LimiterSettings,
    accounts: Cache<String, Arc<Window>>,
    addresses: Cache<IpAddr, Arc<Window>>,
}

impl LoginLimiter {
    pub fn new(settings: LimiterSettings) -> LoginLimiter {
        LoginLimiter {
            accounts: Cache::builder()
                .name("login_accounts")
                .max_capacity(settings.capacity)
                .time_to_live(settings.account_window)
                .build(),
            addresses: Cache::builder()
                .name("login_addresses")
                .max_capacity(settings.capacity)
                .time_to_live(settings.address_window)
                .build(),
            settings,
        }
    }

    fn account_key(account: &str) -> String {
        let lower = account.trim().to_lowercase();
        match lower.char_indices().nth(MAX_ACCOUNT_KEY) {
            Some((cut, _)) => lower[..cut].to_string(),
            None => lower,
        }
    }

    /// Refuses when either counter has reached its limit in the current window.
    pub async fn check(&self, account: &str, address: IpAddr) -> Result<(), Limited> {
        if let Some(window) = self.addresses.get(&address).await {
            over(
                &window,
                self.settings.address_max_failures,
                self.settings.address_window,
                "address",
            )?;
        }
        if let Some(window) = self.accounts.get(&Self::account_key(account)).await {
            over(
                &window,
                self.settings.account_max_failures,
                self.settings.account_window,
                "account",
            )?;
        }
        Ok(())
    }

    pub async fn record_failure(&self, account: &str, address: IpAddr) {
        let fresh = || {
            Arc::new(Window {
                started: Instant::now(),
                failures: AtomicU32::new(0),
            })
        };
        let by_address = self.addresses.get_with(address, async { fresh() }).await;
        by_address.failures.fetch_add(1, Ordering::Relaxed);
        let by_account = self
            .accounts
            .get_with(Self::account_key(account), async { fresh() })
            .await;
        by_account.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A successful login clears the account's window (not the address's).
    pub async fn record_success(&self, account: &str) {
        self.accounts.invalidate(&Self::account_key(account)).await;
    }

    /// Entries held, for the memory bound: (accounts, addresses).
    pub async fn entries(&self) -> (u64, u64) {
        self.accounts.run_pending_tasks().await;
        self.addresses.run_pending_tasks().await;
        (self.accounts.entry_count(), self.addresses.entry_count())
    }
}

fn over(window: &Window, limit: u32, length: Duration, by: &'static str) -> Result<(), Limited> {
    if window.failures.load(Ordering::Relaxed) < limit {
        return Ok(());
    }
    let retry_after = length
        .saturating_sub(window.started.elapsed())
        .max(Duration::from_secs(1));
    Err(Limited { by, retry_after })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(account: u32, address: u32, window: Duration, capacity: u64) -> LoginLimiter {
        LoginLimiter::new(LimiterSettings {
            account_max_failures: account,
            account_window: window,
            address_max_failures: address,
            address_window: window,
            capacity,
        })
    }

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    #[tokio::test]
    async fn account_is_limited_after_its_failures_and_reset_after_the_window() {
        let l = limiter(3, 100, Duration::from_millis(300), 1000);
        for _ in 0..3 {
            l.check("victim@example.com", HOME).await.unwrap();
            l.record_failure("Victim@Example.com", HOME).await;
        }
        let limited = l.check("victim@example.com", HOME).await.unwrap_err();
        assert_eq!(limited.by, "account");
        assert!(limited.retry_after >= Duration::from_secs(1));
        l.check("other@example.com", HOME).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        l.check("victim@example.com", HOME).await.unwrap();
    }

    #[tokio::test]
    async fn address_is_limited_across_accounts() {
        let l = limiter(100, 5, Duration::from_secs(60), 1000);
        for i in 0..5 {
            l.record_failure(&format!("user{i}@example.com"), HOME)
                .await;
        }
        assert_eq!(
            l.check("fresh@example.com", HOME).await.unwrap_err().by,
            "address"
        );
        let elsewhere: IpAddr = "198.51.100.7".parse().unwrap();
        l.check("fresh@example.com", elsewhere).await.unwrap();
    }

    #[tokio::test]
    async fn success_clears_the_account_window() {
        let l = limiter(2, 100, Duration::from_secs(60), 1000);
        l.record_failure("a@example.com", HOME).await;
        l.record_success("a@example.com").await;
        l.record_failure("a@example.com", HOME).await;
        l.check("a@example.com", HOME).await.unwrap();
    }

    #[tokio::test]
    async fn memory_stays_bounded_under_a_username_spray() {
        let l = limiter(5, 1_000_000, Duration::from_secs(60), 2_000);
        for i in 0..50_000u32 {
            let address = IpAddr::from((i.wrapping_mul(2_654_435_761)).to_be_bytes());
            l.record_failure(&format!("spray-{i}-{}", "x".repeat(500)), address)
                .await;
        }
        let (accounts, addresses) = l.entries().await;
        assert!(accounts <= 2_000, "{accounts} account windows kept");
        assert!(addresses <= 2_000, "{addresses} address windows kept");
    }
}
