//! [`Target`]: what compiled code runs on and how — the instruction set,
//! the thread count and the split thresholds — as one value the entry
//! point passes down.
//!
//! Why: the instruction set used to be read from the environment inside
//! kernels, and the thread count and thresholds from process-wide statics
//! at run time, so a function could not be run for another CPU in the same
//! process, and a schedule froze one threshold while its kernels read the
//! others live. Now a traced function carries a `Target`
//! (`tracejit::Function::target`), its executable is built for it (the
//! ISA picks the code, the GEMM threshold is planned into the schedule)
//! and every call runs inside [`Target::enter`], which is what
//! [`crate::threads::num_threads`], [`crate::threads::gemm_threshold`],
//! [`crate::threads::split_threshold`] and [`Isa::current`] answer while it
//! lasts — on the calling thread and on the pool's workers running the
//! call's parts.
//!
//! A `None` field follows the process's setting at the time of the call
//! (`tracejit::config::set_num_threads`, `set_gemm_threshold`,
//! `set_split_threshold`), which is what [`Target::host`] does for all of
//! them: a program that never names a target behaves as before.
//!
//! Only the ISA changes the code a kernel compiles to, so only the ISA is
//! part of a compiled kernel's key (the compile cache's and an artifact's);
//! the thread count and thresholds decide how work is split, never its
//! results (see [`crate::threads`]).

use std::cell::Cell;
use std::fmt;

use crate::Isa;

/// The instruction set, thread count and split thresholds code runs with
/// (see the module documentation).
///
/// ```
/// use tracejit_kernels::{Isa, Target};
///
/// // The code an AMD Zen 3 runs, on two threads, whatever the process says.
/// let t = Target::avx2().with_threads(2);
/// assert_eq!(t.isa, Isa::avx2());
/// t.enter(|| {
///     assert_eq!(tracejit_kernels::threads::num_threads(), 2);
///     assert_eq!(Isa::current(), Isa::avx2());
/// });
/// assert_eq!(Target::current(), Target::host());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The vector code kernels may run.
    pub isa: Isa,
    /// Threads for large kernels and matrix products (at least 1;
    /// [`Target::with_threads`] clamps to `threads::max_threads`);
    /// `None`: the process's count.
    pub threads: Option<usize>,
    /// Matrix products with fewer multiply-adds stay on one thread; `None`:
    /// the process's `threads::gemm_threshold`.
    pub gemm_threshold: Option<usize>,
    /// The least work a split region kernel gives each thread; `None`: the
    /// process's `threads::split_threshold`.
    pub split_threshold: Option<u64>,
}

impl Default for Target {
    /// [`Target::host`].
    fn default() -> Target {
        Target::host()
    }
}

thread_local! {
    /// The target [`Target::enter`] set on this thread, if any.
    static CURRENT: Cell<Option<Target>> = const { Cell::new(None) };
}

impl Target {
    /// What the process allows: [`Isa::from_env`] (`TRACEJIT_ISA`), and the
    /// process's thread count and thresholds at the time of each call.
    pub fn host() -> Target {
        Target::for_isa(Isa::from_env())
    }

    /// The code of an AVX2 machine without AVX-512 (an AMD Zen 3), with
    /// the process's threads and thresholds: run a function as a Zen 3
    /// would on an AVX-512 machine, to compare.
    pub fn avx2() -> Target {
        Target::for_isa(Isa::avx2())
    }

    /// `isa`, with the process's threads and thresholds.
    pub fn for_isa(isa: Isa) -> Target {
        Target { isa, threads: None, gemm_threshold: None, split_threshold: None }
    }

    /// This target with another instruction set.
    pub fn with_isa(self, isa: Isa) -> Target {
        Target { isa, ..self }
    }

    /// This target on `n` threads (0: the process's count; above
    /// `threads::max_threads` is clamped here, once, so a call never asks
    /// the OS for the core count).
    pub fn with_threads(self, n: usize) -> Target {
        Target { threads: (n > 0).then(|| n.min(crate::threads::max_threads())), ..self }
    }

    /// This target with another GEMM threshold (see
    /// [`crate::threads::gemm_threshold`]).
    pub fn with_gemm_threshold(self, flops: usize) -> Target {
        Target { gemm_threshold: Some(flops), ..self }
    }

    /// This target with another split threshold (at least 1; see
    /// [`crate::threads::split_threshold`]).
    pub fn with_split_threshold(self, work: u64) -> Target {
        Target { split_threshold: Some(work.max(1)), ..self }
    }

    /// The target entered on this thread ([`Target::enter`]), else
    /// [`Target::host`].
    pub fn current() -> Target {
        Target::entered().unwrap_or_else(Target::host)
    }

    /// The target entered on this thread, if any.
    pub fn entered() -> Option<Target> {
        CURRENT.with(Cell::get)
    }

    /// Runs `f` with this target as the calling thread's current one (the
    /// previous one, if any, is restored after, also when `f` panics).
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        Target::enter_opt(Some(*self), f)
    }

    /// [`Target::enter`] for `Some`; plain `f()` for `None`. The pool uses
    /// it to carry a call's target to the workers running its parts.
    pub fn enter_opt<R>(target: Option<Target>, f: impl FnOnce() -> R) -> R {
        let _scope = target.map(Target::scope);
        f()
    }

    /// Makes this target the calling thread's current one until the
    /// returned guard is dropped (which restores the previous one): for
    /// callers that cannot wrap their work in a closure.
    #[must_use = "the target is current only while the guard lives"]
    pub fn scope(self) -> TargetScope {
        TargetScope { previous: CURRENT.with(|c| c.replace(Some(self))) }
    }

    /// The thread count this target runs with now: its own, else the
    /// process's.
    pub fn resolved_threads(&self) -> usize {
        match self.threads {
            // A count set in the field directly is held to the hard cap.
            Some(n) => n.clamp(1, crate::threads::MAX_THREADS),
            None => crate::threads::process_num_threads(),
        }
    }

    /// The GEMM threshold this target runs with now.
    pub fn resolved_gemm_threshold(&self) -> usize {
        self.gemm_threshold.unwrap_or_else(crate::threads::process_gemm_threshold)
    }

    /// The split threshold this target runs with now.
    pub fn resolved_split_threshold(&self) -> u64 {
        self.split_threshold.unwrap_or_else(crate::threads::process_split_threshold)
    }
}

/// The guard of [`Target::scope`]: restores the thread's previous target
/// when dropped (also while unwinding).
#[derive(Debug)]
pub struct TargetScope {
    previous: Option<Target>,
}

impl Drop for TargetScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

impl fmt::Display for Target {
    /// `avx512+amx, threads 2, gemm 524288, split process`: the ISA by its
    /// widest code (and AMX where allowed), then each policy, `process`
    /// for a `None`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let amx = if self.isa.amx_allowed() && self.isa.avx512_allowed() { "+amx" } else { "" };
        let isa = if self.isa.avx512_allowed() { "avx512" } else { "avx2" };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "process".into());
        write!(
            f,
            "{isa}{amx}, threads {}, gemm {}, split {}",
            opt(self.threads.map(|n| n.to_string())),
            opt(self.gemm_threshold.map(|n| n.to_string())),
            opt(self.split_threshold.map(|n| n.to_string()))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_nests_and_restores_also_after_a_panic() {
        let outer = Target::avx2().with_threads(3);
        outer.enter(|| {
            assert_eq!(Target::entered(), Some(outer));
            let inner = outer.with_split_threshold(7);
            let r = std::panic::catch_unwind(|| inner.enter(|| panic!("inside")));
            assert!(r.is_err());
            assert_eq!(Target::entered(), Some(outer), "the panic restored the outer target");
            inner.enter(|| assert_eq!(crate::threads::split_threshold(), 7));
            assert_eq!(crate::threads::num_threads(), 3);
        });
        assert_eq!(Target::entered(), None);
    }

    #[test]
    fn with_threads_zero_follows_the_process() {
        assert_eq!(Target::host().with_threads(0).threads, None);
        assert_eq!(Target::host().with_split_threshold(0).split_threshold, Some(1));
        assert_eq!(Target::avx2().with_threads(2).to_string(), "avx2, threads 2, gemm process, split process");
    }
}
