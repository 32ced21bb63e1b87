//! Size limits: shapes whose element count or byte size overflows, and
//! buffers the allocator cannot give.
//!
//! Rust aborts the process when an allocation fails (`memory allocation of
//! N bytes failed`), and `usize` arithmetic on shapes wraps in release
//! builds. Shape inference therefore rejects types whose size overflows
//! ([`byte_size`]), and every executor asks [`check_allocation`] before it
//! runs an op whose result is big: a buffer of [`PROBE_BYTES`] or more is
//! first reserved fallibly (`try_reserve_exact`) and released at once, so a
//! request the allocator refuses becomes an error naming the op instead of
//! an abort. The probe costs one `mmap`/`munmap` pair (the pages are never
//! touched), which is nothing next to filling such a buffer; smaller
//! buffers are not probed.
//!
//! The probe tells what the allocator would give *now*; under Linux's
//! default overcommit policy that refuses requests beyond RAM plus swap.
//! With overcommit forced on (`vm.overcommit_memory = 1`) a huge request
//! succeeds and the kernel's OOM killer decides later; no user-space check
//! can prevent that.

use crate::{DType, TensorError};

/// Buffers at least this big are reserved fallibly before an op allocates
/// them (see [`check_allocation`]).
pub const PROBE_BYTES: usize = 1 << 26;

/// The element count of `shape` (0 if any dim is 0, even when the others
/// would overflow), or `None` when it overflows `usize`.
pub fn element_count(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The bytes a `dtype` tensor of `shape` occupies, or `None` when that is
/// more than a Rust allocation can hold (`isize::MAX` bytes).
pub fn byte_size(dtype: DType, shape: &[usize]) -> Option<usize> {
    element_count(shape)?.checked_mul(dtype.size_of()).filter(|&b| b <= isize::MAX as usize)
}

/// `Ok` when a `dtype` tensor of `shape` can be allocated; else
/// [`TensorError::TooLarge`] with the byte count (`None`: it overflows).
///
/// A buffer of [`PROBE_BYTES`] or more is reserved with
/// `try_reserve_exact` and released at once (its pages are never touched),
/// so a request the allocator refuses is an error here rather than an
/// abort later. Under Linux's default overcommit policy that refuses
/// requests beyond RAM plus swap; with overcommit forced on, no user-space
/// check can foresee the OOM killer.
pub fn check_allocation(dtype: DType, shape: &[usize]) -> Result<(), TensorError> {
    let too_large = |bytes| TensorError::TooLarge { dtype, shape: shape.to_vec(), bytes };
    let bytes = byte_size(dtype, shape).ok_or_else(|| too_large(None))?;
    if bytes >= PROBE_BYTES {
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(bytes).map_err(|_| too_large(Some(bytes)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes_are_checked() {
        assert_eq!(element_count(&[]), Some(1));
        assert_eq!(element_count(&[3, 5]), Some(15));
        assert_eq!(element_count(&[1 << 40, 1 << 40, 0]), Some(0));
        assert_eq!(element_count(&[1 << 32, 1 << 32, 4]), None);
        assert_eq!(byte_size(DType::F64, &[2, 3]), Some(48));
        assert_eq!(byte_size(DType::F32, &[1 << 62]), None);
        assert_eq!(byte_size(DType::Bool, &[1 << 62]), Some(1 << 62));
    }

    #[test]
    fn small_buffers_pass_and_impossible_ones_are_errors() {
        assert!(check_allocation(DType::F32, &[1000]).is_ok());
        let e = check_allocation(DType::F32, &[1 << 32, 1 << 32, 4]).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        // 2^62 bytes fits in isize but no machine has it.
        let e = check_allocation(DType::F32, &[1 << 60]).unwrap_err();
        assert!(e.to_string().contains("4611686018427387904 bytes"), "{e}");
    }
}
