//! Transparent huge pages for the large buffers of products and kernels.
//!
//! glibc serves every allocation of 32 MiB or more (its mmap threshold at
//! most, and what tracejit sets) with a fresh `mmap`, so each call that
//! makes such a buffer pays a page fault for every 4 KiB of it when it is
//! first written, and the kernel clears each page on the way. W13's
//! per-example gradients write a 205 MB batched product per call: in eager
//! mode at two threads the faults were most of the call (195-240 ms;
//! `perf` put 28% of the time in `clear_page_erms` and the fault handler,
//! the rest of the profile waiting on the memory cgroup's locks). Asking
//! for transparent huge pages on such a buffer before it is written turns
//! 512 faults into one: with glibc's own switch for it
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) the same eager call took
//! 90-103 ms and the compiled step's first call 97-112 ms instead of
//! 187-231.
//!
//! tracejit cannot set that switch for a program that links it (glibc reads
//! it when the process starts), so the kernels that make large buffers ask
//! for huge pages themselves, with `madvise(MADV_HUGEPAGE)` on the whole
//! 2 MiB pages inside the buffer, right after allocating it. Only buffers
//! of [`MIN_BYTES`] or more are advised: they are fresh mappings (nothing
//! written yet, nothing else sharing the range), and one system call is
//! nothing beside filling 32 MiB. A smaller buffer comes from the heap,
//! where advice would split the heap's mapping on every call.
//!
//! The advice changes no value, only how the pages are backed; where the
//! kernel has no transparent huge pages (or they are set to `never`) it is
//! ignored. Turn it off with `TRACEJIT_HUGE_PAGES=0` (for example where
//! the kernel compacts memory slowly to find huge pages).

/// Buffers of at least this many bytes get the advice: glibc's largest
/// mmap threshold, from which every allocation is a fresh mapping.
pub const MIN_BYTES: usize = 32 << 20;

/// The huge page size the advice is rounded to (x86-64's 2 MiB).
const HUGE_PAGE: usize = 2 << 20;

/// Whether buffers get the advice: on unless `TRACEJIT_HUGE_PAGES=0`, read
/// once per process.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRACEJIT_HUGE_PAGES").map_or(true, |v| v != "0"))
}

/// Asks for transparent huge pages on the whole 2 MiB pages inside `buf`
/// when it holds at least [`MIN_BYTES`]; true when the advice was given
/// and accepted. Call it before the buffer is first written: pages already
/// faulted in stay small until the kernel's background thread merges them.
pub fn advise<T>(buf: &[T]) -> bool {
    let bytes = std::mem::size_of_val(buf);
    if bytes < MIN_BYTES || !enabled() {
        return false;
    }
    let advised = advise_inside(buf.as_ptr().cast(), bytes);
    if advised {
        ADVISED.with(|n| n.set(n.get() + 1));
    }
    advised
}

/// Asks for transparent huge pages on the whole 2 MiB pages inside the
/// `bytes` bytes from `ptr`, whatever their size (see [`advise`] for when
/// that helps); true when there was such a page and the kernel accepted.
/// The range must lie in one live allocation of the caller's.
pub fn advise_inside(ptr: *const u8, bytes: usize) -> bool {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize).saturating_add(bytes) / HUGE_PAGE * HUGE_PAGE;
    end > start && advise_range(start, end - start)
}

thread_local! {
    /// Buffers advised on this thread (see [`advised_buffers`]).
    static ADVISED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many buffers calls made on this thread have advised (and the
/// kernel accepted): a diagnostic, counted per thread like
/// [`crate::threads::pool_dispatches`] so other threads do not disturb it.
pub fn advised_buffers() -> u64 {
    ADVISED.with(std::cell::Cell::get)
}

#[cfg(target_os = "linux")]
fn advise_range(start: usize, len: usize) -> bool {
    // SAFETY: `[start, start + len)` lies inside a live allocation the
    // caller holds (whole pages of it, 2 MiB-aligned), and MADV_HUGEPAGE
    // changes how those pages are backed, never their contents.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn advise_range(_start: usize, _len: usize) -> bool {
    false
}

/// A vector of `len` zeros for a kernel to overwrite, large ones advised
/// ([`advise`]). The zeros come from `calloc`, which leaves a fresh
/// mapping untouched (the kernel's pages read as zero), so the vector
/// costs no write of its own: the kernel's first write faults each page in
/// once, as a huge page where advised.
pub fn zeros<T: Copy + Default>(len: usize) -> Vec<T> {
    // `vec!` of a zero float or integer allocates with `alloc_zeroed`.
    let v = vec![T::default(); len];
    advise(&v);
    v
}

/// An empty vector with room for `len` elements, advised when large
/// ([`advise`]), for a kernel that writes every element before `set_len`.
pub fn with_capacity<T>(len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    advise(&v.spare_capacity_mut()[..len]);
    v
}

/// Blocks of the calling thread's heap, `bytes` in all in blocks of at
/// most `block` bytes (at least a page each), their whole 2 MiB pages
/// advised ([`advise_inside`], where enabled) and, with `touch`, written
/// once per 4 KiB page; their addresses and lengths, fewer where `malloc`
/// failed. Hand them to [`free_heap_blocks`]. The JIT's heap reservation
/// (`tracejit_jit::malloc`) takes them untouched; [`prefault_heap`]
/// touched.
pub fn heap_blocks(bytes: usize, block: usize, touch: bool) -> Vec<(usize, usize)> {
    const PAGE: usize = 4096;
    let block = block.max(PAGE);
    let mut blocks = Vec::new();
    let mut taken = 0;
    while taken < bytes {
        let len = block.min(bytes - taken).max(PAGE);
        // SAFETY: a plain allocation, freed by `free_heap_blocks`.
        let p = unsafe { libc::malloc(len) }.cast::<u8>();
        if p.is_null() {
            break;
        }
        if enabled() {
            advise_inside(p, len);
        }
        if touch {
            for at in (0..len).step_by(PAGE) {
                // SAFETY: `at < len`, inside the block just allocated; a
                // volatile write so that the page is really written.
                unsafe { p.add(at).write_volatile(0) };
            }
        }
        blocks.push((p as usize, len));
        taken += len;
    }
    blocks
}

/// Frees [`heap_blocks`]'s blocks, the last first, so that each joins the
/// free space at the top of the thread's heap.
pub fn free_heap_blocks(blocks: Vec<(usize, usize)>) {
    for (p, _) in blocks.into_iter().rev() {
        // SAFETY: allocated by `heap_blocks` with `malloc`, freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
    }
}

/// Faults in `bytes` of the calling thread's heap before the calls that
/// will use it: [`heap_blocks`] of at most `block` bytes, touched, then
/// freed again into the free space at the top of the thread's heap.
/// Returns the bytes touched.
///
/// It helps only where the allocator keeps freed memory mapped (glibc with
/// the trim threshold tracejit's JIT sets, `tracejit_jit::malloc`), and
/// only on this thread's heap: the zeroing of fresh pages (and, for huge
/// pages, the kernel's compaction, which can stall for a tenth of a
/// second) then happens here, at a time of the program's choosing (a
/// loaded artifact's load), instead of inside its first call. `block`
/// must stay below the allocator's mmap threshold, or each block is a
/// mapping of its own, unmapped when freed.
pub fn prefault_heap(bytes: usize, block: usize) -> usize {
    let blocks = heap_blocks(bytes, block, true);
    let touched = blocks.iter().map(|&(_, len)| len).sum();
    free_heap_blocks(blocks);
    touched
}

/// The value of `field` (`"AnonHugePages"`, `"VmFlags"`, ...) for the
/// mapping of this process that holds `addr`, from `/proc/self/smaps`:
/// how tests see whether a buffer got huge pages. `None` where there is
/// no such file, mapping or field.
///
/// ```
/// let v = vec![1u8; 4096];
/// let rss = tracejit_kernels::pages::mapping_field(v.as_ptr() as usize, "Rss");
/// assert!(rss.is_some() || !cfg!(target_os = "linux"));
/// ```
pub fn mapping_field(addr: usize, field: &str) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((lo, hi)) = range {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        let value = line.strip_prefix(field).and_then(|rest| rest.strip_prefix(':'));
        if let Some(value) = value.filter(|_| inside) {
            return Some(value.trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `AnonHugePages` of the mapping holding `addr`, in KiB.
    #[cfg(target_os = "linux")]
    fn anon_huge_kib(addr: usize) -> Option<usize> {
        mapping_field(addr, "AnonHugePages")?.trim_end_matches("kB").trim().parse().ok()
    }

    #[test]
    fn prefault_heap_touches_what_it_is_asked() {
        assert_eq!(prefault_heap(0, 1 << 20), 0);
        assert_eq!(prefault_heap(3 << 20, 1 << 20), 3 << 20);
        // A tail shorter than a block is still one block of its size.
        assert_eq!(prefault_heap((1 << 20) + 4096, 1 << 20), (1 << 20) + 4096);
    }

    #[test]
    fn small_buffers_are_left_alone_and_values_are_kept() {
        let v: Vec<f32> = zeros(1000);
        assert!(!advise(&v));
        assert!(v.iter().all(|&x| x == 0.0));
        let w: Vec<f64> = with_capacity(10);
        assert!(w.capacity() >= 10 && w.is_empty());
    }

    #[test]
    fn large_zeros_are_zero_and_advised_where_the_kernel_has_huge_pages() {
        let n = MIN_BYTES / 4 + 12_345;
        let mut v: Vec<f32> = zeros(n);
        assert!(v.iter().all(|&x| x.to_bits() == 0));
        v[n - 1] = 1.0;
        for (i, x) in v.iter_mut().enumerate().step_by(1024) {
            *x = i as f32;
        }
        assert_eq!(v[4096], 4096.0);
        assert_eq!(v[n - 1], 1.0);
        #[cfg(target_os = "linux")]
        {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
            let thp = mode.contains("[always]") || mode.contains("[madvise]");
            if enabled() && thp {
                // The advice was accepted, so the mapping is marked; whether
                // the kernel found free huge pages is up to it, so only the
                // advice is asserted, and the backing is reported.
                let before = advised_buffers();
                assert!(advise(&v), "madvise(MADV_HUGEPAGE) refused on a {n}-element buffer");
                assert_eq!(advised_buffers(), before + 1);
                eprintln!("AnonHugePages: {:?} KiB", anon_huge_kib(v.as_ptr() as usize + (4 << 20)));
            }
        }
    }
}
