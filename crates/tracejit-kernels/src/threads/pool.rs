//! The worker threads: `n - 1` of them for a thread count of `n` (the
//! calling thread takes tasks too), each spinning a while for the next
//! split kernel before it sleeps.
//!
//! Why not rayon's pool, which ran these tasks before: a loop body dispatches a split
//! product every ~8 µs (W8's step at two threads), and rayon's idle
//! workers went to sleep between them, so the caller finished its half
//! and then waited for a worker still waking (12% of its time in the wait,
//! the worker 14% in the scheduler); with as many workers as threads the
//! spare one's `sched_yield` loop took the caller's core instead. Here a
//! worker that ran a task watches for the next one for [`SPIN`] before it
//! parks, and the caller never waits for a worker that has not started.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an idle worker watches for the next task before it parks:
/// long enough to span the gaps between a loop's steps, short enough
/// that a core is not held long after the last call.
const SPIN: Duration = Duration::from_micros(100);

/// `f` of a [`Job`], shared with workers (see [`Pool::run`]).
struct FnPtr(&'static (dyn Fn(usize) + Sync));

/// One split kernel call: tasks claimed in order by the caller and the
/// workers that arrive in time.
struct Job {
    f: FnPtr,
    tasks: usize,
    next: AtomicUsize,
    /// Workers the job still wants (its tasks but the caller's): each
    /// worker that sees the job takes one, and one that finds none left
    /// parks at once.
    wanted: AtomicUsize,
    /// Workers inside `work`.
    active: AtomicUsize,
    /// Set by the caller once every task is claimed and it stops waiting
    /// for newcomers.
    closed: AtomicBool,
    /// A worker's panic, raised again on the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Job {
    /// Claims and runs tasks until none are left.
    fn work(&self) {
        loop {
            let t = self.next.fetch_add(1, Ordering::Relaxed);
            if t >= self.tasks {
                break;
            }
            (self.f.0)(t);
        }
    }

    /// A worker's entry: true (and counted in `active`) if the caller is
    /// still waiting for workers. Both sides use `SeqCst`: either the
    /// caller's wait sees this increment, or this load sees `closed`.
    fn enter(&self) -> bool {
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.active.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// A worker's turn at the job: its tasks, a panic kept for the caller.
    fn join_in(&self) {
        if !self.enter() {
            return;
        }
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.work())) {
            *self.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            // No task is claimed after a panic: the caller stops at the
            // next claim too.
            self.next.store(self.tasks, Ordering::Relaxed);
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the caller and the workers share.
struct Board {
    /// Bumped once per job posted (after `job` is set).
    posted: AtomicU64,
    /// The latest job, and how many workers are parked.
    slot: Mutex<Slot>,
    /// Parked workers wait here (with `slot`'s lock) for `posted` to move.
    wake: Condvar,
    /// Set when the pool is dropped: workers return.
    closing: AtomicBool,
}

/// What [`Board::slot`]'s lock guards.
struct Slot {
    job: Option<Arc<Job>>,
    /// Workers waiting on [`Board::wake`]: a post wakes only as many as
    /// the job wants, and none (no futex call) while all of them spin.
    parked: usize,
}

/// A pool of worker threads and the thread count it serves (its workers
/// and the calling thread).
pub struct Pool {
    threads: usize,
    board: Arc<Board>,
}

impl Pool {
    /// Starts `threads - 1` workers.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let board = Arc::new(Board {
            posted: AtomicU64::new(0),
            slot: Mutex::new(Slot { job: None, parked: 0 }),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        let pool = Pool { threads, board };
        for i in 1..threads {
            let board = pool.board.clone();
            // On an error, dropping `pool` stops the workers started so far.
            std::thread::Builder::new().name(format!("tracejit-{i}")).spawn(move || worker(&board))?;
        }
        Ok(pool)
    }

    /// Threads the pool serves (its workers and the caller).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(t)` for every `t` in `0..tasks` and waits for all of them;
    /// `f` sees each task exactly once — or, after a panic in one, no
    /// further task starts and the panic is raised again here once every
    /// thread has left `f`. The calling thread works too: it posts the job
    /// for the workers and claims tasks alongside them. It never waits for
    /// a worker that has not started: a worker that comes after the tasks
    /// are gone returns without touching `f`, so a late worker costs
    /// nothing but its wake-up.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        super::DISPATCHES.with(|d| d.set(d.get() + 1));
        // The workers run the parts under the caller's target, so a kernel
        // part reads the thresholds and ISA the call was made with.
        let target = crate::Target::entered();
        let scoped = move |i: usize| crate::Target::enter_opt(target, || f(i));
        let f: &(dyn Fn(usize) + Sync) = &scoped;
        // SAFETY: the lifetime is erased only to hand `f` to workers that
        // outlive this call; `Job::enter` lets a worker use `f` only while
        // `closed` is unset, and this function returns only after setting
        // it and seeing every worker that entered leave (`active == 0`).
        let f: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        let job = Arc::new(Job {
            f: FnPtr(f),
            tasks,
            next: AtomicUsize::new(0),
            wanted: AtomicUsize::new(tasks.saturating_sub(1).min(self.threads - 1)),
            active: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            panic: Mutex::new(None),
        });
        if tasks > 1 {
            let mut slot = self.board.slot.lock().unwrap_or_else(|e| e.into_inner());
            slot.job = Some(job.clone());
            self.board.posted.fetch_add(1, Ordering::SeqCst);
            // Under the lock: a worker about to park either saw `posted`
            // move or is already counted in `parked`.
            for _ in 0..slot.parked.min(tasks - 1) {
                self.board.wake.notify_one();
            }
        }
        // The caller's own panic waits for the workers too: they use `f`.
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.work()));
        if own.is_err() {
            job.next.store(job.tasks, Ordering::Relaxed);
        }
        job.closed.store(true, Ordering::SeqCst);
        // Workers still inside finish tasks they claimed (bounded time).
        let mut spins = 0u32;
        while job.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1 << 10 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = own {
            std::panic::resume_unwind(p);
        }
        let worker = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = worker {
            std::panic::resume_unwind(p);
        }
    }
}

impl Pool {
    /// Runs `f` once on each worker thread (not on the caller), for work
    /// that belongs to a thread rather than to a kernel: warming its heap
    /// before a first call ([`crate::pages::prefault_heap`]). The caller
    /// waits up to `patience` for the workers to come; one busy with
    /// another caller's job past that is skipped. Returns how many workers
    /// ran `f`.
    pub fn on_each_worker(&self, f: &(dyn Fn() + Sync), patience: Duration) -> usize {
        let caller = std::thread::current().id();
        let deadline = Instant::now() + patience;
        let started = AtomicUsize::new(0);
        let ran = Mutex::new(Vec::new());
        let tasks = self.threads;
        self.run(tasks, &|_| {
            // Every thread holds its task until all are claimed, so that
            // no thread takes two while another has none.
            started.fetch_add(1, Ordering::SeqCst);
            while started.load(Ordering::SeqCst) < tasks && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let me = std::thread::current().id();
            if me == caller {
                return;
            }
            let first = {
                let mut ran = ran.lock().unwrap_or_else(|e| e.into_inner());
                let first = !ran.contains(&me);
                if first {
                    ran.push(me);
                }
                first
            };
            if first {
                f();
            }
        });
        ran.into_inner().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _slot = self.board.slot.lock().unwrap_or_else(|e| e.into_inner());
        self.board.closing.store(true, Ordering::SeqCst);
        self.board.wake.notify_all();
    }
}

/// A worker: joins each job posted after the last one it saw while the
/// job wants more workers; after a job it watches for the next for
/// [`SPIN`] and then parks until one is posted. A worker the job did not
/// want parks at once, so that on a machine of many cores a two-task
/// kernel keeps one worker busy, not all of them spinning.
fn worker(board: &Board) {
    // Workers start with the board, before any post: a job posted before
    // this thread first runs is still new to it.
    let mut seen = 0;
    let mut worked = false;
    loop {
        let since = Instant::now();
        let mut spins = 0u32;
        while board.posted.load(Ordering::SeqCst) == seen && !board.closing.load(Ordering::SeqCst) {
            spins = spins.wrapping_add(1);
            // The clock is read every 64 spins (~1-2 µs).
            if !worked || (spins.is_multiple_of(64) && since.elapsed() > SPIN) {
                let mut slot = board.slot.lock().unwrap_or_else(|e| e.into_inner());
                slot.parked += 1;
                while board.posted.load(Ordering::SeqCst) == seen && !board.closing.load(Ordering::SeqCst) {
                    slot = board.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                }
                slot.parked -= 1;
                break;
            }
            std::hint::spin_loop();
        }
        if board.closing.load(Ordering::SeqCst) {
            return;
        }
        // `posted` and the job change together, under the lock (see
        // `Pool::run`).
        let job = {
            let slot = board.slot.lock().unwrap_or_else(|e| e.into_inner());
            seen = board.posted.load(Ordering::SeqCst);
            slot.job.clone()
        };
        worked = job.is_some_and(|job| {
            let wanted = job.wanted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| w.checked_sub(1)).is_ok();
            if wanted {
                job.join_in();
            }
            wanted
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Waits (up to a generous limit, so a loaded machine only slows the
    /// test) until `count` reaches `want`.
    fn wait_for(count: &AtomicUsize, want: usize) -> bool {
        let start = Instant::now();
        while count.load(Ordering::SeqCst) < want {
            if start.elapsed() > Duration::from_secs(20) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// Runs `tasks` tasks that each wait for all of them to start (so
    /// they finish only if `tasks - 1` workers join) and returns how many
    /// threads ran them.
    fn meeting(pool: &Pool, tasks: usize) -> usize {
        let started = AtomicUsize::new(0);
        let threads = Mutex::new(HashSet::new());
        pool.run(tasks, &|_| {
            started.fetch_add(1, Ordering::SeqCst);
            assert!(wait_for(&started, tasks), "a wanted worker did not come");
            threads.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(started.load(Ordering::SeqCst), tasks);
        threads.into_inner().unwrap().len()
    }

    /// `on_each_worker` runs once on every worker and never on the caller.
    #[test]
    fn on_each_worker_runs_once_per_worker() {
        let pool = Pool::new(4).unwrap();
        let caller = std::thread::current().id();
        let threads = Mutex::new(Vec::new());
        let n =
            pool.on_each_worker(&|| threads.lock().unwrap().push(std::thread::current().id()), Duration::from_secs(20));
        let threads = threads.into_inner().unwrap();
        assert_eq!(n, 3);
        assert_eq!(threads.len(), 3);
        assert!(!threads.contains(&caller));
        assert_eq!(threads.iter().collect::<HashSet<_>>().len(), 3, "a worker ran it twice");
    }

    /// The pool's workers do join, job after job (parked or spinning),
    /// and each task runs once.
    #[test]
    fn a_worker_joins_every_job() {
        let pool = Pool::new(2).unwrap();
        for round in 0..50 {
            assert_eq!(meeting(&pool, 2), 2);
            if round % 10 == 9 {
                // Long enough for the worker to stop watching and park.
                std::thread::sleep(SPIN * 3);
            }
        }
    }

    /// On a pool of three threads a two-task job runs on the caller and
    /// one worker (the other is not wanted, and parks), and a three-task
    /// job gets both workers.
    #[test]
    fn jobs_get_the_workers_they_want() {
        let pool = Pool::new(3).unwrap();
        for _ in 0..20 {
            assert_eq!(meeting(&pool, 2), 2);
        }
        assert_eq!(meeting(&pool, 3), 3);
    }

    /// Callers on several threads share one pool: each job's tasks run
    /// exactly once, whichever jobs the workers join.
    #[test]
    fn concurrent_callers_each_get_all_their_tasks() {
        let pool = Arc::new(Pool::new(3).unwrap());
        let callers: Vec<_> = (0..3)
            .map(|c| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for round in 0..2000 {
                        let tasks = 1 + (round + c) % 5;
                        let seen: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                        pool.run(tasks, &|t| {
                            seen[t].fetch_add(1, Ordering::SeqCst);
                        });
                        assert!(seen.iter().all(|s| s.load(Ordering::SeqCst) == 1), "caller {c}, round {round}");
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    }

    /// A panic in a worker's task is raised on the caller, after which the
    /// pool still runs jobs.
    #[test]
    fn a_workers_panic_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2).unwrap();
        let caller = std::thread::current().id();
        let started = AtomicUsize::new(0);
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(2, &|_| {
                started.fetch_add(1, Ordering::SeqCst);
                assert!(wait_for(&started, 2));
                if std::thread::current().id() != caller {
                    panic!("worker task failed");
                }
            })
        }));
        let message = got.expect_err("the panic was lost");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"worker task failed"));
        let done = AtomicUsize::new(0);
        pool.run(4, &|_| {
            done.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 4);
    }
}
