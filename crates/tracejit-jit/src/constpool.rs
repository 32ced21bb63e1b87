//! A process-wide table of 16-byte vector constants that generated code
//! reads from memory.
//!
//! Why: Cranelift hoists every loop-invariant value, so a polynomial's dozen
//! splatted coefficients all compete for the 16 xmm registers and the loop
//! spills and reloads them (and shuffles registers on the back edge). A
//! coefficient loaded from this table at its use instead becomes a memory
//! operand of the instruction that uses it (`vfmadd213ps (%rax), ...`): no
//! register, no spill. Entries are written once, before any kernel that reads
//! them exists, and never change or move, so a kernel may embed their address.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Entries the table holds; the math library needs under a hundred. When it
/// is full, callers keep constants in registers instead.
const CAPACITY: usize = 1024;

/// One 16-byte, 16-aligned entry.
#[repr(C, align(16))]
struct Entry([AtomicU64; 2]);

static TABLE: [Entry; CAPACITY] = [const { Entry([AtomicU64::new(0), AtomicU64::new(0)]) }; CAPACITY];

/// The 128-bit patterns stored so far, in table order.
static INDEX: Mutex<Vec<u128>> = Mutex::new(Vec::new());

/// The table's base address (entries are 16 bytes apart).
pub(crate) fn base() -> u64 {
    TABLE.as_ptr() as u64
}

/// The index of the entry holding `pattern`, stored if new; `None` when the
/// table is full.
pub(crate) fn intern(pattern: u128) -> Option<usize> {
    let mut index = INDEX.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = index.iter().position(|&p| p == pattern) {
        return Some(i);
    }
    let i = index.len();
    if i == CAPACITY {
        return None;
    }
    TABLE[i].0[0].store(pattern as u64, Ordering::Relaxed);
    TABLE[i].0[1].store((pattern >> 64) as u64, Ordering::Relaxed);
    index.push(pattern);
    // Kernels compiled after this point read the entry; publishing the code
    // (finalizing the module, handing out its pointer through a lock or an
    // Arc) orders these stores before those reads.
    Some(i)
}

/// The 128-bit splat of a lane of `lane_bits` bits holding `bits`.
pub(crate) fn splat(lane_bits: u32, bits: u64) -> u128 {
    let lane = if lane_bits >= 64 { u128::from(bits) } else { u128::from(bits & ((1u64 << lane_bits) - 1)) };
    (0..128 / lane_bits).fold(0u128, |acc, k| acc | (lane << (k * lane_bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splats_and_interns() {
        assert_eq!(splat(32, 0x3f80_0000), 0x3f80_0000_3f80_0000_3f80_0000_3f80_0000);
        assert_eq!(splat(64, 7), (7u128 << 64) | 7);
        let p = splat(32, 0x1234_5678);
        let i = intern(p).unwrap();
        assert_eq!(intern(p), Some(i));
        let e = &TABLE[i].0;
        assert_eq!(u128::from(e[0].load(Ordering::Relaxed)) | (u128::from(e[1].load(Ordering::Relaxed)) << 64), p);
        assert_eq!(base() % 16, 0);
    }
}
