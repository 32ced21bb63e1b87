//! glibc malloc's mmap threshold, raised once when the first executable is
//! built.
//!
//! glibc serves an allocation of at least `M_MMAP_THRESHOLD` bytes (128 KiB
//! at start) with a fresh `mmap` and returns it with `munmap` when freed;
//! the threshold rises only when such a block is freed, to that block's
//! size. A compiled call allocates buffers of 0.1-4 MiB that its buffer
//! pool does not keep (native kernels' outputs, reference ops' results,
//! what the pool's plan releases to keep the call's peak low), so until
//! the threshold had risen a call paid a page fault per 4 KiB of them, and
//! at two threads each `munmap` interrupts the other core to flush its
//! TLB. W10 at two threads, in a fresh process, alternating runs: first
//! call 115-123 ms without this and 110 with it, second call 85-90 against
//! 71-74 ms; later calls alike (66-72 ms). In a process that had run W10
//! eagerly first (its threshold risen to that run's blocks), trace, compile and first call took
//! 110 ms without it and 90-95 ms with it.
//!
//! Fixing the threshold at glibc's own ceiling for the dynamic one (32 MiB)
//! gives every process the warm behaviour: blocks below it come from the
//! heap and are reused. glibc's warm-up also raises the trim threshold
//! (`M_TRIM_THRESHOLD`, free memory at the heap's top kept rather than
//! returned to the system) to twice the mmap threshold, but a threshold
//! set with `mallopt` stops that adjustment and left the trim threshold at
//! its 128 KiB start: a call's large temporaries at the top of the heap
//! could be returned when freed and faulted in again by the next call
//! (the harness's profiler of W9's bf16 block at one thread: 12.6 ms per
//! call against 10.9 with the top kept, its first product 3.7 against
//! 2.2 ms; the timed medians, whose calls reuse one layout, moved within
//! the noise). So the trim
//! threshold is set too, to 128 MiB (four times the mmap threshold where
//! glibc's own would stop at two: see the reservation below, which it must
//! keep). What it costs: up to that much freed memory stays mapped, as
//! after any warm-up. Opt out with
//! `TRACEJIT_MALLOC_TUNING=0`; a threshold the user set
//! (`MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_`, or
//! `GLIBC_TUNABLES` naming `mmap_threshold` or `trim_threshold`) is left
//! alone, and then so is the other.
//!
//! When it sets the thresholds it also reserves the next 112 MiB of the
//! calling thread's heap for transparent huge pages: four blocks of 28 MiB,
//! advised as `tracejit_kernels::pages` advises large buffers, then freed,
//! which the raised trim threshold keeps in the heap unbacked. A compiled
//! call's first run faults its buffers in from fresh heap: W10's loaded
//! artifact took 20,116 page faults on its first call against 978 on a
//! steady one. With these 112 MiB it takes 1,575 and its steady calls
//! 30-80 (their temporaries at the heap's top are no longer given back and
//! faulted in again); the first call is 1.11-1.12x a steady one against
//! 1.16-1.20x with a reservation of 56 MiB under a 64 MiB trim threshold,
//! which took 8,900 faults (the Xeon, one thread, six alternating rounds of
//! five fresh processes: 98-102 against 104-107 ms, steady calls alike at
//! 87-91 ms). What it costs: address space, and memory in 2 MiB steps as
//! those 112 MiB are used. On a thread other than the main one glibc
//! serves malloc from an arena of heaps of 64 MiB each: there the blocks
//! that needed a heap of their own are unmapped with it when freed, and
//! about 56 MiB stay reserved.
//! Off with `TRACEJIT_HUGE_PAGES=0` (or with the malloc tuning).

/// The threshold set: glibc's `DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit.
pub(crate) const MMAP_THRESHOLD: usize = 32 << 20;
/// The trim threshold set with it: four times the mmap threshold (glibc's
/// own adjustment would give twice), above the heap reservation's
/// `RESERVE_BLOCKS × RESERVE_BLOCK` (112 MiB), which a lower one would hand
/// back as soon as it is freed.
pub(crate) const TRIM_THRESHOLD: usize = 4 * MMAP_THRESHOLD;

/// Sets glibc's mmap threshold to [`MMAP_THRESHOLD`] the first time it is
/// called (see the module), unless opted out or set by the user; true when
/// this process's threshold is (now) the one set here.
pub(crate) fn tune_once() -> bool {
    static TUNED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TUNED.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok();
        let opted_out = var("TRACEJIT_MALLOC_TUNING").is_some_and(|v| v == "0");
        let user_set = var("MALLOC_MMAP_THRESHOLD_").is_some()
            || var("MALLOC_TRIM_THRESHOLD_").is_some()
            || var("GLIBC_TUNABLES").is_some_and(|t| t.contains("mmap_threshold") || t.contains("trim_threshold"));
        let tuned = !opted_out && !user_set && set_threshold(MMAP_THRESHOLD);
        if tuned && tracejit_kernels::pages::enabled() {
            reserve_heap();
        }
        tuned
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_threshold(bytes: usize) -> bool {
    let Ok(bytes) = i32::try_from(bytes) else { return false };
    let Ok(trim) = i32::try_from(TRIM_THRESHOLD) else { return false };
    // SAFETY: `mallopt` takes a parameter and a value and only changes
    // malloc's settings; it is thread-safe (it takes the arena's lock).
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1 }
}

/// Bytes of each block [`reserve_heap`] takes: below the mmap threshold,
/// so they come from the heap.
const RESERVE_BLOCK: usize = 28 << 20;

/// How many blocks [`reserve_heap`] takes: together under the trim
/// threshold, so the heap keeps them when they are freed.
const RESERVE_BLOCKS: usize = 4;
const _: () = assert!(RESERVE_BLOCK < MMAP_THRESHOLD && RESERVE_BLOCKS * RESERVE_BLOCK < TRIM_THRESHOLD);

/// Grows the calling thread's heap by [`RESERVE_BLOCKS`] blocks of
/// [`RESERVE_BLOCK`] bytes asked transparent huge pages and frees them
/// again, so that the next 112 MiB of buffers the heap serves are faulted
/// in 2 MiB at a time (see the module). Nothing is written but malloc's
/// headers: the memory stays unbacked until used.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn reserve_heap() {
    tracejit_kernels::pages::free_heap_blocks(advised_blocks());
}

/// The blocks of [`reserve_heap`], allocated and advised, untouched.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn advised_blocks() -> Vec<(usize, usize)> {
    tracejit_kernels::pages::heap_blocks(RESERVE_BLOCKS * RESERVE_BLOCK, RESERVE_BLOCK, false)
}

/// Most bytes [`warm`] faults in on the calling thread: the heap
/// reservation's, which the trim threshold keeps once freed.
pub const WARM_MAX: usize = RESERVE_BLOCKS * RESERVE_BLOCK;

/// Most bytes [`warm`] faults in on each worker of the pool.
pub const WARM_WORKER_MAX: usize = 16 << 20;

/// What [`warm`] faulted in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Warmed {
    /// Bytes of the calling thread's heap.
    pub caller: usize,
    /// Workers of the pool whose heaps were warmed.
    pub workers: usize,
    /// Bytes of each of those workers' heaps.
    pub per_worker: usize,
}

/// Faults in the heap a first call will use before it runs: `caller`
/// bytes (at most [`WARM_MAX`]) of the calling thread's heap, and
/// `per_worker` (at most [`WARM_WORKER_MAX`]) of each pool worker's,
/// starting the pool if the thread count asks for one (see
/// `tracejit_kernels::pages::prefault_heap`). A fresh process's first
/// call otherwise takes every page of its buffers fresh from the kernel,
/// which zeroes it (and compacts memory for the huge pages of the heap
/// reservation, a stall of up to a tenth of a second now and then): W10's
/// loaded artifact at two threads on the Zen 5 took 2,900 page faults in
/// its first call against ~150 in a steady one, 2,100 of them on the
/// worker, in the products' packing buffers. Nothing is done (all zeros
/// returned) where this module did not tune malloc, since an allocator
/// that gives freed memory back would fault it in again anyway.
pub fn warm(caller: usize, per_worker: usize) -> Warmed {
    if !tune_once() {
        return Warmed::default();
    }
    let caller = tracejit_kernels::pages::prefault_heap(caller.min(WARM_MAX), RESERVE_BLOCK);
    let per_worker = per_worker.min(WARM_WORKER_MAX);
    let workers = match tracejit_kernels::threads::pool() {
        Some(pool) if per_worker > 0 => pool.on_each_worker(
            &|| {
                tracejit_kernels::pages::prefault_heap(per_worker, RESERVE_BLOCK);
            },
            std::time::Duration::from_millis(200),
        ),
        _ => 0,
    };
    Warmed { caller, workers, per_worker: if workers > 0 { per_worker } else { 0 } }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn reserve_heap() {}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_threshold(_bytes: usize) -> bool {
    // Other allocators keep freed blocks of these sizes themselves.
    false
}

#[cfg(test)]
mod tests {
    /// The `VmFlags` of the mapping holding `addr`, from `/proc/self/smaps`.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn vm_flags(addr: usize) -> Option<String> {
        tracejit_kernels::pages::mapping_field(addr, "VmFlags")
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_heap_reservation_is_marked_for_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        // The flags are read while the blocks are held: once freed, a
        // block that needed a heap (or, before the thresholds are set, a
        // mapping) of its own is unmapped, and its addresses may serve
        // another test's allocation.
        let blocks = super::advised_blocks();
        let flags: Vec<(usize, Option<String>)> = blocks
            .iter()
            // A 2 MiB page inside the block (the advice covers only those).
            .map(|&(b, _)| (b + (4 << 20)) / (2 << 20) * (2 << 20))
            .map(|inner| (inner, vm_flags(inner)))
            .collect();
        tracejit_kernels::pages::free_heap_blocks(blocks);
        assert_eq!(flags.len(), super::RESERVE_BLOCKS, "every block reserved");
        if !tracejit_kernels::pages::enabled() || !(thp.contains("[always]") || thp.contains("[madvise]")) {
            return;
        }
        for (inner, f) in flags {
            let f = f.unwrap_or_default();
            assert!(f.split_whitespace().any(|w| w == "hg"), "{inner:#x} not advised: VmFlags {f}");
        }
    }

    /// Minor page faults of the calling thread so far.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn thread_faults() -> i64 {
        // SAFETY: `getrusage` writes the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        u.ru_minflt
    }

    /// After `warm`, a buffer of the warmed size is served from pages
    /// already faulted in: writing it takes a few faults, not one per
    /// 4 KiB. On a thread of its own, whose heap no other test touches.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_warmed_heap_serves_a_buffer_without_faults() {
        if !super::tune_once() {
            return;
        }
        let bytes = 8 << 20;
        std::thread::spawn(move || {
            let w = super::warm(bytes, 0);
            assert_eq!(w.caller, bytes);
            let before = thread_faults();
            let v = std::hint::black_box(vec![1u8; bytes]);
            let faults = thread_faults() - before;
            drop(v);
            let pages = (bytes / 4096) as i64;
            assert!(faults < pages / 8, "{faults} page faults writing {pages} warmed pages");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_threshold_is_set_once_where_glibc_is_the_allocator() {
        let user = ["TRACEJIT_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        let first = super::tune_once();
        assert_eq!(first, super::tune_once(), "the answer is settled by the first call");
        if !user {
            assert_eq!(first, cfg!(all(target_os = "linux", target_env = "gnu")));
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if first {
            // A 4 MiB block now comes from the heap, not from its own mmap.
            // SAFETY: `mallinfo2` only reads malloc's statistics.
            let mapped = || unsafe { libc::mallinfo2() }.hblks;
            let before = mapped();
            let block = std::hint::black_box(vec![1u8; 4 << 20]);
            assert_eq!(mapped(), before, "a 4 MiB block was mmapped");
            drop(block);
            // A freed 16 MiB block stays in the heap: the heap does not
            // shrink (with glibc's 128 KiB trim threshold it shrank by it).
            // SAFETY: as above.
            let heap = || unsafe { libc::mallinfo2() }.arena;
            let block = std::hint::black_box(vec![1u8; 16 << 20]);
            let with_block = heap();
            drop(block);
            assert!(heap() >= with_block, "the heap was trimmed: {} -> {} bytes", with_block, heap());
        }
    }
}
