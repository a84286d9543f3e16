//! The threads that serve accepted connections: `server.workers` of them, one
//! per core by default, each running a single-threaded runtime of its own.
//!
//! The accept loop hands every accepted connection to the worker serving the
//! fewest, and the connection lives there until it closes: its TLS, its HTTP
//! serving, the requests it carries and the upstream connections they use
//! (whose pool is per thread, `proxy::client`). Nothing of a request moves
//! between threads, so no request pays for waking a task on another core.
//! On the work-stealing runtime that served connections before, the request
//! and its upstream exchange often ran on different cores, and the kernel's
//! task switching and the scheduler's wakes of parked workers showed high in
//! the profile (BENCHMARKS.md, "Choices in the code").
//!
//! The runtime keygate starts on (the home runtime) keeps everything else:
//! the accept loops, background tasks, and the store, whose PostgreSQL
//! connections belong to the runtime that opened them ([`crate::store::Store::at_home`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// A connection's work, made on the worker that runs it (it registers its
/// socket with that worker's reactor).
type Job = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

struct Worker {
    jobs: mpsc::UnboundedSender<Job>,
    /// Connections handed to this worker and not yet finished.
    open: Arc<AtomicUsize>,
}

/// The worker threads. They stop when this is dropped: each finishes the
/// connections it holds no longer (the listener drained them before).
pub struct Workers {
    workers: Box<[Worker]>,
    /// Where the search for the least busy worker starts, turning, so ties
    /// are spread.
    next: AtomicUsize,
}

impl Workers {
    /// Starts `count` worker threads (at least one); each calls `on_start`
    /// with its index (from 0) first, on its own thread.
    pub fn start(
        count: usize,
        on_start: impl Fn(usize) + Clone + Send + 'static,
    ) -> std::io::Result<Arc<Workers>> {
        let mut workers = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
            let on_start = on_start.clone();
            std::thread::Builder::new()
                .name(format!("keygate-worker-{index}"))
                .spawn(move || {
                    on_start(index);
                    runtime.block_on(async move {
                        while let Some(job) = queue.recv().await {
                            tokio::spawn(job());
                        }
                    });
                })?;
            workers.push(Worker {
                jobs,
                open: Arc::default(),
            });
        }
        Ok(Arc::new(Workers {
            workers: workers.into(),
            next: AtomicUsize::new(0),
        }))
    }

    /// Runs `work` as a task on the worker holding the fewest connections.
    /// `work` is called on that worker's thread, inside its runtime.
    pub fn run<F, Fut>(&self, work: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let worker = self.least_busy();
        let open = worker.open.clone();
        open.fetch_add(1, Ordering::Relaxed);
        let finished = Finished(open);
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let _finished = finished;
                work().await;
            })
        });
        // Fails only when the worker's thread is gone (its runtime could not
        // run): the job, and the connection in it, are dropped.
        let _ = worker.jobs.send(job);
    }

    fn least_busy(&self) -> &Worker {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.workers.len();
        (0..count)
            .map(|i| &self.workers[(start + i) % count])
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .unwrap_or(&self.workers[0])
    }

    /// Connections each worker holds now (for tests and diagnostics).
    pub fn open(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.open.load(Ordering::Relaxed))
            .collect()
    }
}

/// Counts a connection out of its worker when its task ends or is dropped.
struct Finished(Arc<AtomicUsize>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn work_runs_on_worker_threads_and_is_counted_until_it_ends() {
        let workers = Workers::start(2, |_| ()).unwrap();
        let (release, released) = tokio::sync::watch::channel(false);
        let (names_tx, mut names) = mpsc::unbounded_channel();
        for _ in 0..4 {
            let mut released = released.clone();
            let names_tx = names_tx.clone();
            workers.run(move || async move {
                let name = std::thread::current().name().map(str::to_owned);
                names_tx.send(name).unwrap();
                let _ = released.wait_for(|r| *r).await;
            });
        }
        for _ in 0..4 {
            let name = names.recv().await.unwrap().unwrap();
            assert!(name.starts_with("keygate-worker-"), "ran on {name}");
        }
        assert_eq!(workers.open(), vec![2, 2], "spread to the least busy");
        release.send(true).unwrap();
        for _ in 0..100 {
            if workers.open() == vec![0, 0] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("finished work still counted: {:?}", workers.open());
    }

    #[tokio::test]
    async fn a_new_connection_goes_to_the_worker_holding_fewer() {
        let workers = Workers::start(2, |_| ()).unwrap();
        let (_hold, held) = tokio::sync::watch::channel(false);
        for _ in 0..3 {
            let mut held = held.clone();
            workers.run(move || async move {
                let _ = held.wait_for(|r| *r).await;
            });
        }
        let mut open = workers.open();
        open.sort_unstable();
        assert_eq!(open, vec![1, 2]);
    }
}
