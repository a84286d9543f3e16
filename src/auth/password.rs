//! Password hashing: Argon2id for new hashes, run off the async threads: on
//! threads of lower CPU priority for the endpoints ([`HashThreads`]), on the
//! blocking pool for the command line and start-up.
//!
//! Parameters (OWASP's recommendation for Argon2id): 19 MiB memory, 2 passes,
//! 1 lane, 32-byte output, 16-byte random salt, PHC string format. bcrypt
//! hashes (`$2a$`, `$2b$`, `$2y$`) of imported users are verified too, and
//! re-hashed with Argon2id on the next successful login.

use argon2::{Algorithm, Argon2, Params, PasswordHasher, PasswordVerifier, Version};

pub const MEMORY_KIB: u32 = 19 * 1024;
pub const ITERATIONS: u32 = 2;
pub const LANES: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error("password hashing task failed")]
    Join,
}

fn hasher() -> Argon2<'static> {
    let params = Params::new(MEMORY_KIB, ITERATIONS, LANES, Some(32))
        .expect("static argon2 params are valid");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password with Argon2id, synchronously. Prefer [`hash`] on async paths.
pub(crate) fn hash_blocking(password: &str) -> Result<String, PasswordError> {
    hasher()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// Checks a password against a stored Argon2id or bcrypt hash, synchronously.
/// An unparsable hash is a mismatch, never a panic.
pub fn verify_blocking(password: &str, stored: &str) -> bool {
    if is_bcrypt(stored) {
        return bcrypt::verify(password, stored).unwrap_or(false);
    }
    hasher()
        .verify_password(password.as_bytes(), stored)
        .is_ok()
}

/// The cost of a bcrypt hash (`$2a$10$...` is 10), or `None` for another
/// scheme. A check of a bcrypt hash takes 2^cost rounds: each step up
/// doubles it (cost 10 is about 60 ms of a core, 15 about 2 s, 31 days).
pub fn bcrypt_cost(stored: &str) -> Option<u32> {
    if !is_bcrypt(stored) {
        return None;
    }
    let digits = stored.get(4..6)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || stored.as_bytes().get(6) != Some(&b'$') {
        // Not a cost bcrypt reads: as costly as the most, refused by any cap.
        return Some(u32::MAX);
    }
    digits.parse().ok()
}

/// Whether checking `stored` would cost more than bcrypt cost `cap`: such a
/// hash is refused without being run.
pub fn over_cost_cap(stored: &str, cap: u32) -> bool {
    bcrypt_cost(stored).is_some_and(|cost| cost > cap)
}

fn is_bcrypt(stored: &str) -> bool {
    ["$2a$", "$2b$", "$2y$"]
        .iter()
        .any(|p| stored.starts_with(p))
}

/// True when a stored hash is not in the current scheme and should be
/// replaced after the next successful login.
pub(crate) fn needs_rehash(stored: &str) -> bool {
    !stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$")
}

/// Hashes on the blocking pool, so async workers keep proxying.
pub async fn hash(password: String) -> Result<String, PasswordError> {
    tokio::task::spawn_blocking(move || hash_blocking(&password))
        .await
        .map_err(|_| PasswordError::Join)?
}

/// Verifies on the blocking pool.
pub async fn verify(password: String, stored: String) -> Result<bool, PasswordError> {
    tokio::task::spawn_blocking(move || verify_blocking(&password, &stored))
        .await
        .map_err(|_| PasswordError::Join)
}

/// One turn at a time per account: a password check of an account waits
/// while another check of the same account runs, so one account never holds
/// more than one hashing thread, however many requests name it. Without
/// it, concurrent wrong logins to one account with a costly hash would take
/// every hashing slot, and everyone else's logins would wait for them.
#[derive(Default)]
pub struct Turns {
    busy: std::sync::Mutex<
        std::collections::HashMap<uuid::Uuid, std::sync::Arc<tokio::sync::Notify>>,
    >,
}

/// An account's turn; the next check of the account may start once it is
/// dropped.
pub struct Turn<'a> {
    turns: &'a Turns,
    account: uuid::Uuid,
}

impl Turns {
    fn busy(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<uuid::Uuid, std::sync::Arc<tokio::sync::Notify>>,
    > {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for `account`'s turn. A waiter dropped (its request gave up)
    /// leaves nothing behind.
    pub async fn take(&self, account: uuid::Uuid) -> Turn<'_> {
        loop {
            match self.try_take(account) {
                Ok(turn) => return turn,
                Err(notified) => notified.await,
            }
        }
    }

    /// The turn if it is free; else a wake-up for when it is given back,
    /// registered under the lock so that it cannot be missed.
    fn try_take(
        &self,
        account: uuid::Uuid,
    ) -> Result<Turn<'_>, tokio::sync::futures::OwnedNotified> {
        use std::collections::hash_map::Entry;
        match self.busy().entry(account) {
            Entry::Vacant(free) => {
                free.insert(std::sync::Arc::new(tokio::sync::Notify::new()));
                Ok(Turn {
                    turns: self,
                    account,
                })
            }
            Entry::Occupied(taken) => Err(taken.get().clone().notified_owned()),
        }
    }

    /// Accounts with a check running now.
    pub fn running(&self) -> usize {
        self.busy().len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(notify) = self.turns.busy().remove(&self.account) {
            notify.notify_waiters();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The threads the endpoints hash passwords on, at a lower CPU priority
/// than the threads serving requests (`login.hash_nice`): when both want
/// the CPU, proxying gets most of it, and hashing takes what is left, and
/// all of an idle machine. One Argon2id hash is about 25 ms of a core, so
/// 50 logins a second ask for more than half of a 2-core machine; at the
/// same priority they took it from proxying (`benches/run`, logins case:
/// 0.69x of the API-key requests per second).
pub struct HashThreads {
    count: usize,
    nice: i32,
    /// Started at the first hash: an idle server keeps no threads (nor
    /// their allocator heaps) for logins that never come.
    jobs: std::sync::OnceLock<std::io::Result<std::sync::mpsc::Sender<Job>>>,
}

impl HashThreads {
    /// `count` threads (at least one), each `nice` steps below the process's
    /// own priority (0: the same), started at the first hash.
    pub fn new(count: usize, nice: i32) -> HashThreads {
        HashThreads {
            count: count.max(1),
            nice,
            jobs: std::sync::OnceLock::new(),
        }
    }

    fn start(&self) -> std::io::Result<std::sync::mpsc::Sender<Job>> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        for index in 0..self.count {
            let queue = queue.clone();
            let nice = self.nice;
            std::thread::Builder::new()
                .name(format!("keygate-hash-{index}"))
                .spawn(move || {
                    lower_priority(nice);
                    loop {
                        // The lock is held only while waiting for a job.
                        let job = match queue.lock() {
                            Ok(queue) => queue.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(jobs)
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PasswordError> {
        let jobs = match self.jobs.get_or_init(|| self.start()) {
            Ok(jobs) => jobs,
            Err(error) => {
                tracing::error!(%error, "starting the password hashing threads failed");
                return Err(PasswordError::Join);
            }
        };
        let (done, result) = tokio::sync::oneshot::channel();
        jobs.send(Box::new(move || {
            let _ = done.send(work());
        }))
        .map_err(|_| PasswordError::Join)?;
        result.await.map_err(|_| PasswordError::Join)
    }

    /// Hashes a new password with Argon2id.
    pub async fn hash(&self, password: String) -> Result<String, PasswordError> {
        self.run(move || hash_blocking(&password)).await?
    }

    /// Checks a password against a stored hash.
    pub async fn verify(&self, password: String, stored: String) -> Result<bool, PasswordError> {
        self.run(move || verify_blocking(&password, &stored)).await
    }
}

/// Moves the calling thread `nice` steps down in CPU priority. On Linux the
/// nice value belongs to the thread, not the process.
#[cfg(target_os = "linux")]
fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    let lowered = rustix::process::getpriority_process(None)
        .and_then(|now| rustix::process::setpriority_process(None, (now + nice).min(19)));
    if let Err(error) = lowered {
        tracing::warn!(%error, "could not lower the priority of a password hashing thread");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_nice: i32) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hash_threads_hash_and_verify_at_a_lower_priority() {
        let threads = HashThreads::new(1, 5);
        let stored = threads.hash("correct horse".into()).await.unwrap();
        assert!(
            threads
                .verify("correct horse".into(), stored.clone())
                .await
                .unwrap()
        );
        assert!(!threads.verify("wrong".into(), stored).await.unwrap());
        #[cfg(target_os = "linux")]
        {
            let own = rustix::process::getpriority_process(None).unwrap();
            let hashing = threads
                .run(|| rustix::process::getpriority_process(None).unwrap())
                .await
                .unwrap();
            assert_eq!(
                hashing,
                (own + 5).min(19),
                "the hashing thread runs 5 steps lower"
            );
        }
    }

    #[test]
    fn argon2id_hash_verifies_and_rejects_wrong_password() {
        let stored = hash_blocking("correct horse").unwrap();
        assert!(
            stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{stored}"
        );
        assert!(verify_blocking("correct horse", &stored));
        assert!(!verify_blocking("wrong horse", &stored));
        assert!(!verify_blocking("correct horse", "not a hash"));
    }

    #[test]
    fn imported_bcrypt_hashes_verify_and_need_rehash() {
        let stored = bcrypt::hash("imported-secret", 4).unwrap();
        assert!(stored.starts_with("$2b$"));
        assert!(verify_blocking("imported-secret", &stored));
        assert!(!verify_blocking("wrong", &stored));
        let as_2a = stored.replacen("$2b$", "$2a$", 1);
        assert!(verify_blocking("imported-secret", &as_2a));
        assert!(needs_rehash(&stored));
        assert!(!needs_rehash(&hash_blocking("fresh-password").unwrap()));
    }

    #[test]
    fn a_bcrypt_cost_is_read_from_the_hash_without_running_it() {
        let stored = bcrypt::hash("x", 4).unwrap();
        assert_eq!(bcrypt_cost(&stored), Some(4));
        assert_eq!(
            bcrypt_cost("$2a$31$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"),
            Some(31)
        );
        assert_eq!(
            bcrypt_cost("$2y$x1$abc"),
            Some(u32::MAX),
            "unreadable: refused"
        );
        assert_eq!(bcrypt_cost(&hash_blocking("x").unwrap()), None);
        assert!(over_cost_cap(
            "$2b$13$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy",
            12
        ));
        assert!(!over_cost_cap(&stored, 12));
    }

    #[tokio::test]
    async fn concurrent_checks_of_one_account_take_one_turn_while_another_account_runs() {
        use futures_util::FutureExt;
        let turns = std::sync::Arc::new(Turns::default());
        let (victim, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let first = turns.take(victim).await;
        assert!(
            turns.take(victim).now_or_never().is_none(),
            "a second check of the account waits"
        );
        let mut others = turns
            .take(other)
            .now_or_never()
            .expect("another account runs at once");
        assert_eq!(turns.running(), 2);
        drop(others);
        // Many waiters of one account: never two running at once.
        let running = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..8 {
            let (turns, running, most) = (turns.clone(), running.clone(), most.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.take(victim).await;
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        tokio::task::yield_now().await;
        others = turns.take(other).now_or_never().expect("still at once");
        drop(others);
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(turns.running(), 0, "nothing left behind");
        // A waiter that gives up leaves nothing behind either.
        let held = turns.take(victim).await;
        assert!(turns.take(victim).now_or_never().is_none());
        drop(held);
        assert_eq!(turns.running(), 0);
    }

    #[tokio::test]
    async fn hashing_runs_off_the_async_workers() {
        let stored = hash("pw-on-blocking-pool".into()).await.unwrap();
        assert!(verify("pw-on-blocking-pool".into(), stored).await.unwrap());
    }
}
