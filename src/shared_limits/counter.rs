//! The local counter of one quota budget (one subject in one window), and
//! the arithmetic that keeps N replicas near the quota without asking Redis
//! on the request path.
//!
//! Windows are fixed and aligned to the clock (`now / window`), so every
//! replica agrees on them without talking. Each replica admits from its
//! *allowance*: at each sync with Redis it learns the global count `known`
//! and the number of live replicas `n`, and may then admit
//! `ceil((limit - known) / n)` requests until its next sync. A new budget (a
//! new window, or a subject seen for the first time) starts from
//! `ceil(limit / n)`. With one replica (or no Redis) the allowance is the
//! whole remaining quota: an exact local counter.

use super::rate::Rate;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub rate: Rate,
    /// Index of the window: epoch ms / window ms.
    pub window: u64,
    /// The global count as last learned from Redis (0 before a sync).
    pub known: u64,
    /// Admitted here and not yet pushed to Redis.
    pub unsynced: u64,
    /// How many this replica may admit between two syncs.
    pub allowance: u64,
    /// Waiting for the next sync: set by the first request after a sync
    /// (admitted or refused), cleared when a sync takes the budget.
    pub queued: bool,
}

/// What a budget says to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// The quota is used up for this window (here and as far as known).
    Exhausted,
    /// This replica's share until the next sync is used up.
    ShareUsed,
}

/// `ceil(remaining / replicas)`, 0 when nothing remains.
pub fn share(limit: u64, known: u64, replicas: u64) -> u64 {
    limit.saturating_sub(known).div_ceil(replicas.max(1))
}

impl Budget {
    pub fn new(rate: Rate, window: u64, replicas: u64) -> Budget {
        Budget {
            rate,
            window,
            known: 0,
            unsynced: 0,
            allowance: share(rate.limit, 0, replicas),
            queued: false,
        }
    }

    /// Starts over when the window or the rate changed.
    pub fn roll(&mut self, rate: Rate, window: u64, replicas: u64) {
        if self.window != window || self.rate != rate {
            let queued = self.queued;
            *self = Budget::new(rate, window, replicas);
            self.queued = queued;
        }
    }

    pub fn verdict(&self) -> Verdict {
        if self.known + self.unsynced >= self.rate.limit {
            Verdict::Exhausted
        } else if self.unsynced >= self.allowance {
            Verdict::ShareUsed
        } else {
            Verdict::Admit
        }
    }

    pub fn admit(&mut self) {
        self.unsynced += 1;
    }

    /// Requests this replica may still admit before its next sync.
    pub fn remaining(&self) -> u64 {
        let global = self.rate.limit.saturating_sub(self.known + self.unsynced);
        global.min(self.allowance.saturating_sub(self.unsynced))
    }

    /// Applies a sync: `pushed` of the unsynced requests reached Redis,
    /// which now counts `total` for the window, with `replicas` alive.
    pub fn synced(&mut self, pushed: u64, total: u64, replicas: u64) {
        self.unsynced = self.unsynced.saturating_sub(pushed);
        self.known = total;
        self.allowance = share(self.rate.limit, total, replicas);
    }
}

/// Milliseconds until the window `now_ms` falls in ends.
pub fn until_reset(rate: &Rate, now_ms: u64) -> u64 {
    let length = rate.window_ms();
    length - now_ms % length
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rate(limit: u64) -> Rate {
        Rate {
            limit,
            window: Duration::from_secs(1),
        }
    }

    fn drain(budget: &mut Budget) -> u64 {
        let mut admitted = 0;
        while budget.verdict() == Verdict::Admit {
            budget.admit();
            admitted += 1;
        }
        admitted
    }

    #[test]
    fn one_replica_admits_exactly_the_limit() {
        let mut b = Budget::new(rate(5), 0, 1);
        assert_eq!(b.remaining(), 5);
        assert_eq!(drain(&mut b), 5);
        assert_eq!(b.verdict(), Verdict::Exhausted);
        assert_eq!(b.remaining(), 0);
    }

    #[test]
    fn shares_split_the_remaining_quota_rounding_up() {
        assert_eq!(share(100, 0, 3), 34);
        assert_eq!(share(100, 99, 3), 1);
        assert_eq!(share(100, 100, 3), 0);
        assert_eq!(share(100, 250, 3), 0);
        assert_eq!(share(10, 0, 0), 10);
    }

    #[test]
    fn a_used_share_waits_for_the_next_sync_then_continues() {
        let mut b = Budget::new(rate(100), 7, 2);
        assert_eq!(drain(&mut b), 50);
        assert_eq!(b.verdict(), Verdict::ShareUsed);
        // The other replica admitted 10 meanwhile: 60 in Redis.
        b.synced(50, 60, 2);
        assert_eq!(b.unsynced, 0);
        assert_eq!(b.allowance, 20);
        assert_eq!(drain(&mut b), 20);
        b.synced(20, 100, 2);
        assert_eq!(b.verdict(), Verdict::Exhausted);
    }

    #[test]
    fn requests_admitted_during_a_sync_count_against_the_next_allowance() {
        let mut b = Budget::new(rate(10), 0, 1);
        b.admit();
        b.admit();
        let pushing = b.unsynced;
        b.admit(); // while the sync is in flight
        b.synced(pushing, 2, 1);
        assert_eq!(b.unsynced, 1);
        assert_eq!(b.allowance, 8);
        assert_eq!(b.remaining(), 7);
    }

    #[test]
    fn a_new_window_or_rate_starts_over() {
        let mut b = Budget::new(rate(3), 1, 1);
        drain(&mut b);
        b.roll(rate(3), 1, 1);
        assert_eq!(b.verdict(), Verdict::Exhausted);
        b.roll(rate(3), 2, 1);
        assert_eq!(drain(&mut b), 3);
        b.roll(rate(4), 2, 1);
        assert_eq!(drain(&mut b), 4);
    }

    #[test]
    fn reset_counts_down_to_the_window_end() {
        let r = rate(1);
        assert_eq!(until_reset(&r, 10_000), 1000);
        assert_eq!(until_reset(&r, 10_999), 1);
        let minute = Rate {
            limit: 1,
            window: Duration::from_secs(60),
        };
        assert_eq!(until_reset(&minute, 61_000), 59_000);
    }

    /// The documented bound: N replicas sharing one budget admit at most
    /// `limit + (N - 1) * ceil(limit / N)` in a window (under twice the
    /// limit, plus N), whatever the order of their syncs and requests.
    #[test]
    fn replicas_in_any_interleaving_stay_within_the_documented_bound() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let bound = |limit: u64, n: u64| limit + (n - 1) * limit.div_ceil(n);
        for round in 0..3000u64 {
            let replicas = 2 + round % 5;
            let limit = 1 + next(200);
            let mut redis = 0u64;
            let mut budgets: Vec<Budget> = (0..replicas)
                .map(|_| Budget::new(rate(limit), 0, replicas))
                .collect();
            for _ in 0..200 {
                let b = &mut budgets[next(replicas) as usize];
                if next(2) == 0 {
                    for _ in 0..next(limit + 1) {
                        if b.verdict() == Verdict::Admit {
                            b.admit();
                        }
                    }
                } else {
                    redis += b.unsynced;
                    let pushed = b.unsynced;
                    b.synced(pushed, redis, replicas);
                }
            }
            let admitted = redis + budgets.iter().map(|b| b.unsynced).sum::<u64>();
            assert!(
                admitted <= bound(limit, replicas),
                "{replicas} replicas admitted {admitted} of {limit}"
            );
        }
        // The worst case: every replica spends its first share, then one
        // syncs and spends alone until the quota is gone, then the rest sync.
        for (limit, replicas) in [(100, 3), (37, 4), (1, 2)] {
            let mut budgets: Vec<Budget> = (0..replicas)
                .map(|_| Budget::new(rate(limit), 0, replicas))
                .collect();
            for b in budgets.iter_mut() {
                drain(b);
            }
            let mut redis = 0;
            for _ in 0..100 {
                let b = &mut budgets[0];
                redis += b.unsynced;
                let pushed = b.unsynced;
                b.synced(pushed, redis, replicas);
                drain(b);
            }
            let admitted = redis + budgets.iter().map(|b| b.unsynced).sum::<u64>();
            assert_eq!(admitted, bound(limit, replicas));
        }
    }
}
