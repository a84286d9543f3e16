//! Wall-clock helpers: the contract speaks epoch milliseconds and JWTs seconds.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn now_secs() -> i64 {
    now_ms() / 1000
}

/// Milliseconds of the monotonic clock as of the kernel's last tick (1 to
/// 4 ms old), for lifetimes of seconds. A read of memory the kernel shares
/// with the process, where `Instant::now` also reads the time-stamp counter
/// and scales it: in the credential check on a cache hit that read was 15%
/// of the time (criterion `verify/api_key_hit`, perf).
#[cfg(target_os = "linux")]
pub(crate) fn coarse_monotonic_ms() -> u64 {
    use rustix::time::{ClockId, clock_gettime};
    let now = clock_gettime(ClockId::MonotonicCoarse);
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

/// Elsewhere, the precise clock, from the first read.
#[cfg(not(target_os = "linux"))]
pub(crate) fn coarse_monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_moves_forward_with_time() {
        let before = coarse_monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let after = coarse_monotonic_ms();
        assert!(after >= before + 40, "{before} -> {after}");
        assert!(after <= before + 5000, "{before} -> {after}");
    }
}
