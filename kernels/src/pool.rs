//! A persistent pool of worker threads for [`crate::cpu::for_each_item`].
//!
//! # Why a pool
//! A decode step of a small model is dozens of short products (seven projections per layer,
//! the head): at hidden 512 each is 20–100 µs of work. Spawning and joining scoped threads for
//! each one (a `clone3`, a stack `mmap`/`munmap`, a join) cost about as much as the product,
//! and was most of a one-sequence decode step's fixed cost. The pool's workers live for the
//! process: a call posts its closure, runs it on the calling thread too, and returns once
//! every worker that joined has left it. Workers spin briefly after a job (the next projection
//! usually follows within microseconds) and then park on a condition variable, so an idle pool
//! costs nothing.
//!
//! A worker that is late (parked, or descheduled on a busy machine) is not waited for: the
//! items are handed out dynamically, so the caller takes whatever no one else has, then
//! *closes* the job; a worker that arrives after that does not enter it. The caller waits only
//! for the workers that entered, which are busy with items. Waiting for every worker to wake
//! up instead cost each product a futex wake-up latency, more than the spawn it replaced.
//!
//! # Why the results do not change
//! The pool changes only *which* thread runs a work item, never the items nor the arithmetic
//! inside one (see the reproducibility argument in [`crate::cpu`]): class D bits are the same
//! with the pool, with scoped threads, and on one thread.
//!
//! One caller uses the pool at a time. A second caller that finds it busy (another thread's
//! product, or a nested call from inside a work item) runs on scoped threads as before, so
//! the pool can never deadlock and concurrent callers still run in parallel.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long a worker, and a caller waiting for its workers, spin before parking: longer than
/// the gap between two projections of a step, short enough that an idle pool yields its cores
/// at once.
const SPIN: Duration = Duration::from_micros(200);

/// Most workers the pool will ever hold (callers asking for more run on scoped threads).
const MAX_WORKERS: usize = 255;

/// The job word: the job's number in the high 32 bits, [`CLOSED`], and the count of workers
/// inside the job in the low bits. One word, so that entering checks "this job, still open"
/// and counts the entry in one compare-and-swap.
const CLOSED: u64 = 1 << 31;
const ENTERED: u64 = CLOSED - 1;
/// The job number's bits kept in the job word (it wraps after 2³² jobs; only equality counts).
const LOW: u64 = u32::MAX as u64;

/// A job: the caller's closure, its lifetime erased. It is only called by workers that entered
/// the job while it was open, and the caller waits for every one of them before it returns.
#[derive(Clone, Copy)]
struct Task(*const (dyn Fn() + Sync));

// SAFETY: the pointee is `Sync` (shared calls from several threads are allowed) and outlives
// every use (see `Task`); the pointer itself is just an address.
unsafe impl Send for Task {}

struct State {
    /// Bumped for every job; workers compare it with the last one they saw.
    epoch: u64,
    task: Option<Task>,
    /// Workers `0..participants` may take part in the current job.
    participants: usize,
    /// Workers parked on `work_ready` (only they need a wake-up call: a condition variable's
    /// notify is a system call even when no one waits).
    parked_workers: usize,
    /// The caller is parked on `work_done`.
    caller_parked: bool,
}

struct Pool {
    /// Held by the one caller using the pool.
    dispatch: Mutex<()>,
    state: Mutex<State>,
    /// Mirrors `state.epoch`, for spinning without the lock.
    epoch: AtomicU64,
    /// The job word (see [`CLOSED`]).
    job: AtomicU64,
    /// A worker's job panicked (the caller re-raises it).
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    work_ready: Condvar,
    work_done: Condvar,
    spawned: Mutex<usize>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        dispatch: Mutex::new(()),
        state: Mutex::new(State {
            epoch: 0,
            task: None,
            participants: 0,
            parked_workers: 0,
            caller_parked: false,
        }),
        epoch: AtomicU64::new(0),
        job: AtomicU64::new(CLOSED),
        panicked: Mutex::new(None),
        work_ready: Condvar::new(),
        work_done: Condvar::new(),
        spawned: Mutex::new(0),
    })
}

/// Runs `run` on the calling thread and on up to `helpers` pool workers at once, returning
/// when every copy has returned; `run` must hand out its own work (the caller's copy alone
/// must be able to finish it). `None` when the pool is busy or cannot grow (the caller then
/// runs on scoped threads itself); a panic in any copy of `run` is re-raised here after all
/// have finished.
pub(crate) fn run_on_pool(helpers: usize, run: &(dyn Fn() + Sync)) -> Option<()> {
    let pool = pool();
    if helpers > MAX_WORKERS {
        return None;
    }
    let _dispatch = match pool.dispatch.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if !pool.grow(helpers) {
        return None;
    }
    // SAFETY: only the lifetime is erased; `Pool::run` closes the job and waits (even when
    // `run` panics on this thread) until no worker is inside it, before this borrow ends.
    let task = Task(unsafe {
        std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync + 'static)>(
            run as *const (dyn Fn() + Sync),
        )
    });
    pool.run(helpers, task, run);
    Some(())
}

impl Pool {
    /// Makes sure `workers` threads exist; false if one could not be spawned.
    fn grow(&'static self, workers: usize) -> bool {
        let mut spawned = lock(&self.spawned);
        while *spawned < workers {
            let index = *spawned;
            let started = std::thread::Builder::new()
                .name(format!("cx-kernels-{index}"))
                .spawn(move || self.work(index));
            if started.is_err() {
                return false;
            }
            *spawned += 1;
        }
        true
    }

    /// Posts `task` to `helpers` workers, runs `run` here, closes the job, waits for the
    /// workers inside it.
    fn run(&self, helpers: usize, task: Task, run: &(dyn Fn() + Sync)) {
        let wake = {
            let mut state = lock(&self.state);
            state.epoch += 1;
            state.task = Some(task);
            state.participants = helpers;
            self.job.store((state.epoch & LOW) << 32, Ordering::Release);
            self.epoch.store(state.epoch, Ordering::Release);
            state.parked_workers > 0
        };
        if wake {
            self.work_ready.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(run));
        self.job.fetch_or(CLOSED, Ordering::AcqRel);
        self.wait_for_entered();
        lock(&self.state).task = None;
        let theirs = lock(&self.panicked).take();
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if let Some(payload) = theirs {
            resume_unwind(payload);
        }
    }

    /// Waits until no worker is inside the (closed) job.
    fn wait_for_entered(&self) {
        let inside = || self.job.load(Ordering::Acquire) & ENTERED != 0;
        let start = Instant::now();
        let mut spins = 0u32;
        while inside() {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut state = lock(&self.state);
                state.caller_parked = true;
                while inside() {
                    state = self
                        .work_done
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                }
                state.caller_parked = false;
                return;
            }
        }
    }

    /// Enters job `epoch` if it is still open: true if this worker is now counted inside it.
    fn enter(&self, epoch: u64) -> bool {
        let mut word = self.job.load(Ordering::Acquire);
        loop {
            if word >> 32 != epoch & LOW || word & CLOSED != 0 {
                return false;
            }
            match self.job.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// A worker's life: wait for a job newer than the last one seen, take part if asked and
    /// still in time.
    fn work(&self, index: usize) {
        let mut seen = 0;
        loop {
            let start = Instant::now();
            let mut spins = 0u32;
            while self.epoch.load(Ordering::Acquire) == seen {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                    break;
                }
            }
            let (task, participants) = {
                let mut state = lock(&self.state);
                while state.epoch == seen {
                    state.parked_workers += 1;
                    state = self
                        .work_ready
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                    state.parked_workers -= 1;
                }
                seen = state.epoch;
                (state.task, state.participants)
            };
            let Some(Task(task)) = task else { continue };
            if index >= participants || !self.enter(seen) {
                continue;
            }
            // SAFETY: this worker entered the job while it was open, so the caller that
            // posted it is blocked in `wait_for_entered` until the decrement below: the
            // closure is alive.
            let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*task)() }));
            if let Err(payload) = result {
                lock(&self.panicked).get_or_insert(payload);
            }
            let before = self.job.fetch_sub(1, Ordering::AcqRel);
            if before & ENTERED == 1 && before & CLOSED != 0 {
                // Under the lock, so a caller between its check and its wait cannot miss it.
                let state = lock(&self.state);
                if state.caller_parked {
                    self.work_done.notify_all();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Items handed out as `for_each_item` does: every item runs exactly once, whoever joins.
    fn count_items(helpers: usize, items: usize) -> Option<Vec<usize>> {
        let next = AtomicUsize::new(0);
        let done: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
        let run = || {
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= items {
                    break;
                }
                done[item].fetch_add(1, Ordering::Relaxed);
            }
        };
        run_on_pool(helpers, &run)?;
        Some(done.iter().map(|d| d.load(Ordering::Relaxed)).collect())
    }

    #[test]
    fn every_item_runs_once_whoever_joins() {
        for helpers in [1, 2, 3] {
            for items in [1, 7, 64] {
                for _ in 0..100 {
                    if let Some(done) = count_items(helpers, items) {
                        assert!(done.iter().all(|&d| d == 1), "{helpers} {items} {done:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_worker_panic_reaches_the_caller() {
        let caller = std::thread::current().id();
        let started = AtomicUsize::new(0);
        let run = || {
            started.fetch_add(1, Ordering::Relaxed);
            if std::thread::current().id() != caller {
                panic!("worker failed");
            }
            // Keep the job open long enough for the worker to enter it.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(20) {
                std::hint::spin_loop();
            }
        };
        let result = catch_unwind(AssertUnwindSafe(|| run_on_pool(1, &run)));
        match result {
            // The worker entered and panicked, and the panic came back here.
            Err(_) => assert_eq!(started.load(Ordering::Relaxed), 2),
            // The worker came too late (or the pool was busy): only the caller ran.
            Ok(_) => assert!(started.load(Ordering::Relaxed) <= 1),
        }
        // The pool still works afterwards.
        if let Some(done) = count_items(1, 16) {
            assert!(done.iter().all(|&d| d == 1));
        }
    }
}
