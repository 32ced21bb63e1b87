//! The buffer pool of an executable, and the plan of which freed buffers
//! it keeps.
//!
//! A freed intermediate kept in the pool is reused as a later kernel's
//! output, so a steady-state call takes few fresh pages (each fresh 4 MiB
//! buffer costs a thousand page faults). But a kept buffer is memory too:
//! kept from its release until its reuse, it adds to the call's peak. An
//! executable therefore records its second call (the first runs while
//! kernels compile) — every buffer request and release, and the bytes its
//! live values hold after each step — and plans from it, as a static
//! buffer assignment would (XLA's, TVM's memory planner): a released
//! buffer is kept only for the first later request of its dtype and
//! length (in this call or at the start of the next), and
//! only if holding it until then keeps live plus kept bytes within
//! [`HEADROOM`] (or [`HEADROOM_BYTES`]) of the call's own peak of live
//! bytes; a call whose live values peak below [`PLAN_MIN_PEAK`] keeps every
//! buffer. Later calls follow the plan; a call whose releases differ from the recording (shapes that
//! change, a loop's trip count) falls back to keeping every buffer and
//! the next call records again, a few times at most.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

use tracejit_ir::tensor::{DType, Storage};

use crate::region::same_shape;

/// Most buffers a pool keeps.
pub(crate) const POOL_MAX: usize = 64;

/// How far above the peak of live bytes kept buffers may take a call:
/// 10% (measured on W10's training step: the peak of live plus kept bytes
/// 135 -> 89 MiB with more reuse than keeping every buffer, 76 -> 100 of
/// 143 requests served from the pool), or [`HEADROOM_BYTES`] if that is
/// more.
const HEADROOM: f64 = 1.1;

/// The least headroom: a few MiB are not worth their page faults on every
/// call (a small model's weight-sized buffers, written by one step and
/// taken again by the next).
const HEADROOM_BYTES: f64 = 4.0 * 1024.0 * 1024.0;

/// Calls whose live values peak below this keep every buffer: there the
/// memory a plan saves is small, and the allocator hands freed buffers
/// back to the system and faults them in again on the next call (W9's
/// transformer block, 8 MiB at its peak: 3 MiB saved cost 3 ms of its 18).
const PLAN_MIN_PEAK: f64 = 16.0 * 1024.0 * 1024.0;

/// Calls recorded before an executable stops planning (shapes that keep
/// changing).
const MAX_RECORDINGS: u8 = 3;

/// Buffers kept for reuse as kernel outputs, so that a steady-state call
/// takes no fresh pages. An entry may still be held elsewhere (a result the
/// caller has not dropped yet); it is only reused once the pool holds the
/// sole reference, so a live result is never overwritten.
///
/// Pools are not shared while in use: a caller moves the pool out of its
/// `Mutex` with `try_lock` (never blocking; a concurrent call that finds it
/// taken starts with an empty pool) and merges it back afterwards.
#[derive(Default)]
pub(crate) struct BufPool {
    bufs: Vec<Storage>,
    /// The row kernels' scratch space, kept between calls.
    pub(crate) scratch: Vec<u64>,
    /// An executable's slot table, kept between calls (empty between them).
    pub(crate) table: Vec<Option<Storage>>,
    /// The plan this call follows, and how many releases it has seen.
    follow: Option<(Arc<ReusePlan>, usize)>,
    /// True once a release differed from the plan: the rest of the call
    /// keeps every buffer.
    strayed: bool,
    /// The events of a call being recorded.
    recording: Option<Vec<Event>>,
}

/// True when no other `Storage` shares `s`'s buffer.
pub(crate) fn is_unique(s: &Storage) -> bool {
    tracejit_ir::tensor::with_array!(s, a => a.is_unique())
}

/// The whole buffer under `s` (uniquely held, in any axis order that
/// covers a contiguous block) as a flat array, without copying; `None` when
/// its elements are not one block.
fn whole_buffer(s: Storage) -> Option<Storage> {
    macro_rules! flat {
        ($($v:ident),*) => {
            match s {
                $(Storage::$v(a) => {
                    // The elements' lowest address: the first logical
                    // element only where no stride is negative.
                    let lo = a.as_slice_memory_order()?.as_ptr() as usize;
                    let len = a.len();
                    // Unique: `into_owned` takes the buffer as it is. The
                    // elements may start inside it ([`aligned_f32`]).
                    let (v, _) = a.into_owned().into_raw_vec_and_offset();
                    let size = std::mem::size_of_val(v.first()?);
                    let at = lo.checked_sub(v.as_ptr() as usize)? / size;
                    if at + len > v.len() {
                        return None;
                    }
                    let flat = ndarray::ArcArray::from_vec(v).slice_move(ndarray::s![at..at + len]);
                    Some(Storage::$v(flat.into_dyn()))
                })*
            }
        };
    }
    flat!(F32, F64, I32, I64, Bool, BF16, F16, I8, U8, I16, U16, U32, U64)
}

/// Bytes a fresh f32 buffer's first element is aligned to: a cache line,
/// so that a kernel's 64-byte vector stores each write one line, not two.
/// (glibc's `malloc` aligns to 16 bytes: three in four of a channels-last
/// convolution's stores then straddled two lines, and a layer that writes
/// 25 MB, ResNet-50's 56×56 stage at batch 8, ran 6-10% slower.)
pub(crate) const ALIGN_BYTES: usize = 64;

/// A new f32 buffer of `shape` (zeros, large ones advised for huge pages
/// as [`tracejit_kernels::pages::zeros`]), its first element on an
/// [`ALIGN_BYTES`] boundary: the elements start inside a slightly longer
/// vector, which the array keeps whole (the pool's [`whole_buffer`] keeps
/// the start when it flattens one).
pub(crate) fn aligned_f32(shape: &[usize]) -> ndarray::ArcArray<f32, ndarray::IxDyn> {
    const PAD: usize = ALIGN_BYTES / 4 - 1;
    let len: usize = shape.iter().product();
    let v: Vec<f32> = tracejit_kernels::pages::zeros(len + PAD);
    let at = v.as_ptr().align_offset(ALIGN_BYTES).min(PAD);
    ndarray::ArcArray::from_vec(v)
        .slice_move(ndarray::s![at..at + len])
        .into_shape_with_order(ndarray::IxDyn(shape))
        .expect("a contiguous slice of the shape's length")
}

impl BufPool {
    /// Takes a buffer of `dtype` with `shape`'s element count that nothing
    /// else references, shaped as `shape`.
    pub(crate) fn take(&mut self, dtype: DType, shape: &[usize]) -> Option<Storage> {
        let len: usize = shape.iter().product();
        if len == 0 {
            return None;
        }
        if let Some(events) = self.recording.as_mut() {
            events.push(Event::Request(dtype, len));
        }
        // The most recently freed match: the likeliest to be in cache.
        let i = self.bufs.iter().rposition(|s| s.dtype() == dtype && s.len() == len && is_unique(s))?;
        let s = self.bufs.remove(i);
        // Pairs with the release decrement of the last other holder's drop:
        // its accesses happen before our writes.
        fence(Ordering::Acquire);
        if same_shape(s.shape(), shape) {
            return Some(s);
        }
        macro_rules! reshape {
            ($($v:ident),*) => {
                match s {
                    $(Storage::$v(a) => a.into_shape_with_order(ndarray::IxDyn(shape)).ok().map(Storage::$v),)*
                }
            };
        }
        reshape!(F32, F64, I32, I64, Bool, BF16, F16, I8, U8, I16, U16, U32, U64)
    }

    /// Gives back every buffer kept for reuse (see
    /// `Executable::release_buffers`); returns their bytes (each counted
    /// whole, also where a result still shares it).
    pub(crate) fn release(&mut self) -> usize {
        self.bufs.drain(..).map(|s| tracejit_ir::tensor::byte_size(s.dtype(), s.shape()).unwrap_or(0)).sum()
    }

    /// Whether a buffer of `dtype` and `len` elements that nothing else
    /// references is here for [`BufPool::take`].
    pub(crate) fn has_free(&self, dtype: DType, len: usize) -> bool {
        self.bufs.iter().any(|s| s.dtype() == dtype && s.len() == len && is_unique(s))
    }

    /// Keeps `s` (which others may still hold) for later reuse, unless the
    /// plan says no later request needs it.
    pub(crate) fn give(&mut self, s: Storage) {
        if s.is_empty() || !s.is_standard_layout() {
            return;
        }
        let key = (s.dtype(), s.len());
        if let Some(events) = self.recording.as_mut() {
            events.push(Event::Release(key.0, key.1));
        }
        if !self.planned_keep(key) {
            return;
        }
        if self.bufs.len() >= POOL_MAX {
            self.bufs.remove(0);
        }
        self.bufs.push(s);
    }

    /// Whether the plan keeps this call's next release (of `key`); true
    /// without a plan or once the call has strayed from it.
    fn planned_keep(&mut self, key: (DType, usize)) -> bool {
        let Some((plan, seen)) = self.follow.as_mut() else { return true };
        let k = *seen;
        *seen += 1;
        match plan.releases.get(k) {
            Some(&(expected, keep)) if expected == key && !self.strayed => keep,
            _ => {
                self.strayed = true;
                true
            }
        }
    }

    /// Keeps `s` if nothing else holds it (a freed intermediate). A
    /// transposed view holding the last reference to its buffer (a GEMM
    /// operand) gives the buffer back, flat.
    pub(crate) fn give_if_unique(&mut self, s: Storage) {
        if !is_unique(&s) {
            return;
        }
        if s.is_standard_layout() {
            self.give(s);
        } else if let Some(flat) = whole_buffer(s) {
            self.give(flat);
        }
    }

    /// True while this call is recorded: the executor then reports the
    /// bytes its values hold after each step ([`BufPool::note_live`]).
    pub(crate) fn recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Records that the call's live values hold `bytes` now.
    pub(crate) fn note_live(&mut self, bytes: usize) {
        if let Some(events) = self.recording.as_mut() {
            events.push(Event::Live(bytes));
        }
    }

    /// After a call that followed its plan: keeps at most `wanted`
    /// buffers of each dtype and length (a call's requests of it; none of a
    /// kind no request takes), preferring those nothing else holds (free
    /// for the next call now), then the most recently kept. What it drops
    /// are buffers a caller's holding pattern left over: W13's
    /// per-example gradients (343 MB a set) were kept twice, the second set
    /// from a call made while the first call's results were held, through
    /// every later call's peak (893 MB against 343 live).
    fn trim(&mut self, wanted: &HashMap<(DType, usize), usize>) {
        let mut order: Vec<usize> = (0..self.bufs.len()).collect();
        order.sort_by_key(|&i| (!is_unique(&self.bufs[i]), std::cmp::Reverse(i)));
        let mut left = wanted.clone();
        let mut keep = vec![false; self.bufs.len()];
        for i in order {
            let s = &self.bufs[i];
            if let Some(n) = left.get_mut(&(s.dtype(), s.len())).filter(|n| **n > 0) {
                *n -= 1;
                keep[i] = true;
            }
        }
        let mut flags = keep.into_iter();
        self.bufs.retain(|_| flags.next().unwrap_or(false));
    }

    /// Moves the pool out of `m` without blocking (empty if `m` is busy).
    pub(crate) fn checkout(m: &Mutex<BufPool>) -> BufPool {
        match m.try_lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => BufPool::default(),
        }
    }

    /// Puts the pool back into `m` without blocking (dropped if `m` is busy).
    pub(crate) fn checkin(mut self, m: &Mutex<BufPool>) {
        self.follow = None;
        self.recording = None;
        if let Ok(mut p) = m.try_lock() {
            if p.bufs.is_empty() && p.scratch.capacity() <= self.scratch.capacity() {
                *p = self;
            } else {
                for s in self.bufs {
                    p.give(s);
                }
                if p.scratch.capacity() < self.scratch.capacity() {
                    p.scratch = self.scratch;
                }
                if p.table.capacity() < self.table.capacity() {
                    p.table = self.table;
                }
            }
        }
    }
}

/// What one call's pool saw, in order.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// A kernel asked for an output buffer.
    Request(DType, usize),
    /// A buffer came back.
    Release(DType, usize),
    /// The call's live values held this many bytes (after a step).
    Live(usize),
}

/// Which of a call's releases to keep, in order, with the dtype and length
/// each is expected to have.
#[derive(Debug)]
pub(crate) struct ReusePlan {
    releases: Vec<((DType, usize), bool)>,
    /// How many buffers of each dtype and length a call requests: the
    /// most worth keeping between calls.
    requests: HashMap<(DType, usize), usize>,
}

/// An executable's planning state (`Executable::run`).
#[derive(Debug, Default)]
pub(crate) struct Planner {
    plan: Option<Arc<ReusePlan>>,
    recordings: u8,
    /// Calls started: the first (whose kernels are still being compiled
    /// and whose pool is empty) is not recorded.
    calls: u8,
}

impl Planner {
    /// Sets `pool` up for one call: following the plan, or recording the
    /// call when there is none yet.
    pub(crate) fn start(m: &Mutex<Planner>, pool: &mut BufPool) {
        let Ok(mut p) = m.lock() else { return };
        p.calls = p.calls.saturating_add(1);
        match &p.plan {
            Some(plan) => pool.follow = Some((plan.clone(), 0)),
            None if p.calls > 1 && p.recordings < MAX_RECORDINGS => pool.recording = Some(Vec::new()),
            None => {}
        }
        pool.strayed = false;
    }

    /// After the call: a recorded call becomes the plan; a call that
    /// strayed from the plan drops it, so the next one records again.
    pub(crate) fn finish(m: &Mutex<Planner>, pool: &mut BufPool, ok: bool) {
        let Ok(mut p) = m.lock() else { return };
        if let Some(events) = pool.recording.take() {
            p.recordings = p.recordings.saturating_add(1);
            if ok {
                p.plan = Some(Arc::new(plan(&events)));
            }
        } else if pool.strayed {
            p.plan = None;
        }
        if let Some(plan) = p.plan.as_ref().filter(|_| !pool.strayed) {
            pool.trim(&plan.requests);
        }
    }
}

/// The plan for a call that saw `events` (see the module docs): each
/// release is matched with the first unclaimed later request of its dtype
/// and length (cyclically: a release late in the call serves a request
/// early in the next), and kept if live plus kept bytes stay within
/// [`HEADROOM`] (or [`HEADROOM_BYTES`]) of the peak of live bytes all the
/// while. A call that peaks below [`PLAN_MIN_PEAK`] keeps every buffer.
fn plan(events: &[Event]) -> ReusePlan {
    let live = live_bytes(events);
    let peak = live.iter().copied().fold(0.0, f64::max);
    let cap = (HEADROOM * peak).max(peak + HEADROOM_BYTES);
    let mut releases = matched(events, &live, cap);
    if peak < PLAN_MIN_PEAK {
        releases.iter_mut().for_each(|r| r.1 = true);
    }
    let mut requests = HashMap::new();
    for e in events {
        if let Event::Request(d, len) = *e {
            *requests.entry((d, len)).or_insert(0) += 1;
        }
    }
    ReusePlan { releases, requests }
}

fn bytes_of(d: DType, len: usize) -> f64 {
    tracejit_ir::tensor::byte_size(d, &[len]).unwrap_or(usize::MAX) as f64
}

/// The live bytes at each event: the last step's report, plus the buffers
/// requested and less those released since.
fn live_bytes(events: &[Event]) -> Vec<f64> {
    let first = events.iter().find_map(|e| if let Event::Live(b) = e { Some(*b) } else { None }).unwrap_or(0);
    let mut cur = first as f64;
    events
        .iter()
        .map(|e| {
            cur = match *e {
                Event::Live(b) => b as f64,
                Event::Request(d, len) => cur + bytes_of(d, len),
                Event::Release(d, len) => (cur - bytes_of(d, len)).max(0.0),
            };
            cur
        })
        .collect()
}

/// Whether each release is kept: matched with a later request within `cap`.
fn matched(events: &[Event], live: &[f64], cap: f64) -> Vec<((DType, usize), bool)> {
    let n = events.len();
    let mut requests: HashMap<(DType, usize), Vec<usize>> = HashMap::new();
    for (j, e) in events.iter().enumerate() {
        if let Event::Request(d, len) = *e {
            requests.entry((d, len)).or_default().push(j);
        }
    }
    let mut held = vec![0.0f64; n];
    let mut claimed: HashSet<usize> = HashSet::new();
    let mut releases = Vec::new();
    for (k, e) in events.iter().enumerate() {
        let Event::Release(d, len) = *e else { continue };
        let bytes = bytes_of(d, len);
        // The first unclaimed request after k, this call's or the next's.
        let next = requests.get(&(d, len)).and_then(|js| {
            let later = js.iter().map(|&j| if j > k { j } else { j + n });
            later.filter(|j| !claimed.contains(&(j % n))).min()
        });
        let keep = next.is_some_and(|j| {
            let fits = (k..j).all(|t| live[t % n] + held[t % n] + bytes <= cap);
            if fits {
                (k..j).for_each(|t| held[t % n] += bytes);
                claimed.insert(j % n);
            }
            fits
        });
        releases.push(((d, len), keep));
    }
    releases
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: DType = DType::F32;

    /// A fresh buffer starts on a cache line; given back as a transposed
    /// view (a GEMM operand's last holder), the pool keeps its elements,
    /// start included, and hands the same memory out again.
    #[test]
    fn aligned_buffers_keep_their_start_through_the_pool() {
        for shape in [&[0usize][..], &[1], &[3, 5], &[2, 7, 3, 9]] {
            let a = aligned_f32(shape);
            assert_eq!(a.shape(), shape);
            assert!(a.is_standard_layout() && a.iter().all(|&v| v == 0.0));
            // (An empty array's pointer addresses nothing.)
            assert!(a.is_empty() || (a.as_ptr() as usize).is_multiple_of(ALIGN_BYTES), "{shape:?}");
        }
        let mut a = aligned_f32(&[6, 10]);
        a.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        let start = a.as_ptr() as usize;
        let view = Storage::F32(a).to_standard();
        let t = tracejit_ir::tensor::kernels::transpose(&view, &[1, 0]);
        drop(view);
        let mut pool = BufPool::default();
        pool.give_if_unique(t);
        let Some(Storage::F32(b)) = pool.take(F, &[60]) else { panic!("the buffer was not kept") };
        assert_eq!(b.as_ptr() as usize, start);
        assert_eq!(b.iter().copied().collect::<Vec<_>>(), (0..60).map(|i| i as f32).collect::<Vec<_>>());
        // A view with a reversed axis (its first element at its highest
        // row): the same memory, from its lowest address.
        let mut c = aligned_f32(&[4, 5]);
        c.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        let start = c.as_ptr() as usize;
        c.invert_axis(ndarray::Axis(0));
        pool.give_if_unique(Storage::F32(c));
        let Some(Storage::F32(d)) = pool.take(F, &[20]) else { panic!("the reversed buffer was not kept") };
        assert_eq!(d.as_ptr() as usize, start);
        assert_eq!(d.iter().copied().collect::<Vec<_>>(), (0..20).map(|i| i as f32).collect::<Vec<_>>());
    }

    /// `n` MiB of f32, in elements.
    const fn mib(n: usize) -> usize {
        n << 18
    }

    #[test]
    fn a_buffer_is_kept_for_a_later_request_that_fits_under_the_peak() {
        // Live 100 MiB at the peak; 8 MiB released and requested right
        // after; 32 MiB released before the peak and wanted only after it
        // (holding them would take the call to 132 MiB, past 110): dropped;
        // 1 MiB with no later request: dropped.
        let events = [
            Event::Live(40 << 20),
            Event::Release(F, mib(8)),
            Event::Request(F, mib(8)),
            Event::Live(90 << 20),
            Event::Release(F, mib(32)),
            Event::Live(100 << 20),
            Event::Live(10 << 20),
            Event::Request(F, mib(32)),
            Event::Release(F, mib(1)),
        ];
        let keeps: Vec<bool> = plan(&events).releases.iter().map(|r| r.1).collect();
        assert_eq!(keeps, [true, false, false]);
        // A small call may go a few MiB over its peak: 2 MiB held across a
        // peak of 10 is kept.
        let events = [Event::Release(F, mib(2)), Event::Live(10 << 20), Event::Request(F, mib(2))];
        assert_eq!(plan(&events).releases, [((F, mib(2)), true)]);
    }

    #[test]
    fn a_small_call_keeps_every_buffer() {
        // 6 MiB held across a peak of 12 MiB would take the call to 18,
        // past 16 (12 and the 4 MiB floor), but the call peaks under
        // 16 MiB: every buffer is kept.
        let events =
            [Event::Release(F, mib(6)), Event::Live(12 << 20), Event::Live(1 << 20), Event::Request(F, mib(6))];
        assert_eq!(plan(&events).releases, [((F, mib(6)), true)]);
    }

    #[test]
    fn a_late_release_serves_the_next_calls_first_request() {
        let events =
            [Event::Request(F, mib(8)), Event::Live(64 << 20), Event::Live(8 << 20), Event::Release(F, mib(8))];
        assert_eq!(plan(&events).releases, [((F, mib(8)), true)]);
    }

    #[test]
    fn a_followed_call_keeps_no_more_buffers_than_a_call_requests() {
        // Two free buffers of 4 values and a held one, one of 3: a call
        // requests one of 4 and none of 3.
        let mut pool = BufPool::default();
        let held = Storage::full(&[4], F, 1.0);
        for s in [Storage::full(&[4], F, 2.0), Storage::full(&[3], F, 0.0), Storage::full(&[4], F, 3.0), held.clone()] {
            pool.bufs.push(s);
        }
        pool.trim(&HashMap::from([((F, 4), 1)]));
        // The most recent free one stays: the next call can take it now.
        assert_eq!(pool.bufs.len(), 1);
        assert!(is_unique(&pool.bufs[0]) && pool.bufs[0].get_f64(&[0]) == 3.0);
        // With only held buffers, the most recent is kept.
        pool.bufs = vec![held.clone(), Storage::full(&[4], F, 5.0)];
        let other = pool.bufs[1].clone();
        pool.trim(&HashMap::from([((F, 4), 1)]));
        assert_eq!(pool.bufs.len(), 1);
        assert_eq!(pool.bufs[0].get_f64(&[0]), 5.0);
        drop((held, other));
    }

    #[test]
    fn a_call_that_strays_from_the_plan_keeps_everything_after() {
        let mut pool = BufPool {
            follow: Some((
                Arc::new(ReusePlan { releases: vec![((F, 4), false), ((F, 4), true)], requests: HashMap::new() }),
                0,
            )),
            ..BufPool::default()
        };
        pool.give(Storage::full(&[4], F, 0.0));
        assert!(pool.bufs.is_empty(), "the plan drops the first release");
        pool.give(Storage::full(&[3], F, 0.0));
        pool.give(Storage::full(&[4], F, 0.0));
        assert_eq!(pool.bufs.len(), 2, "a release of another length: every buffer kept from then on");
        assert!(pool.strayed);
    }
}
