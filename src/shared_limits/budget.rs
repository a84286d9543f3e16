//! Fixed-window budgets kept in this process, one per key (a user, an
//! address key): what the management-write limit and the unknown-API-key
//! budget count with. A unit is taken before the work it pays for, in one
//! atomic step, so however many requests arrive at once no more than the
//! budget get through; the windows live in a bounded cache, so keys sprayed
//! by a client cannot grow memory (an evicted window only forgets).

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moka::sync::Cache;

use super::rate::Rate;

#[derive(Debug)]
struct Window {
    started: Instant,
    taken: AtomicU64,
}

/// One unit taken from a budget; [`Taken::give_back`] returns it when the
/// work turned out not to be what the budget counts.
#[must_use = "a unit is spent unless given back"]
pub struct Taken(Arc<Window>);

impl Taken {
    pub fn give_back(self) {
        let _ = self
            .0
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

pub struct Budgets<K> {
    rate: Rate,
    windows: Cache<K, Arc<Window>>,
}

impl<K> Budgets<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// `rate.limit` units per key per `rate.window`; at most `capacity`
    /// keys tracked.
    pub fn new(name: &str, rate: Rate, capacity: u64) -> Budgets<K> {
        Budgets {
            rate,
            windows: Cache::builder()
                .name(name)
                .max_capacity(capacity)
                .time_to_live(rate.window)
                .build(),
        }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes one unit of `key`'s budget, or says how long until its window
    /// ends (at least a second).
    pub fn take(&self, key: K) -> Result<Taken, Duration> {
        let window = self.windows.get_with(key, || {
            Arc::new(Window {
                started: Instant::now(),
                taken: AtomicU64::new(0),
            })
        });
        let limit = self.rate.limit;
        let taken = window
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Taken(window)),
            Err(_) => Err(self
                .rate
                .window
                .saturating_sub(window.started.elapsed())
                .max(Duration::from_secs(1))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(limit: u64, window: Duration) -> Budgets<u32> {
        Budgets::new("test", Rate { limit, window }, 100)
    }

    #[test]
    fn a_key_gets_its_budget_and_then_waits_for_its_window() {
        let b = budgets(3, Duration::from_secs(60));
        for _ in 0..3 {
            drop(b.take(1).unwrap());
        }
        let wait = b.take(1).err().unwrap();
        assert!(wait > Duration::from_secs(50) && wait <= Duration::from_secs(60));
        assert!(b.take(2).is_ok(), "other keys have their own");
    }

    #[test]
    fn a_unit_given_back_can_be_taken_again() {
        let b = budgets(1, Duration::from_secs(60));
        b.take(1).unwrap().give_back();
        drop(b.take(1).unwrap());
        assert!(b.take(1).is_err());
    }

    #[test]
    fn a_new_window_refills_the_budget() {
        let b = budgets(1, Duration::from_millis(50));
        drop(b.take(1).unwrap());
        assert!(b.take(1).is_err());
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.take(1).is_err() {
            assert!(Instant::now() < deadline, "the window never ended");
            std::thread::yield_now();
        }
    }

    #[test]
    fn parallel_takes_never_exceed_the_budget() {
        let b = Arc::new(budgets(10, Duration::from_secs(60)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..20).filter(|_| b.take(7).is_ok()).count())
            })
            .collect();
        let taken: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(taken, 10);
    }
}
