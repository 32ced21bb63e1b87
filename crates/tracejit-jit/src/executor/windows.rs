//! `dynamic_update_slice` in place: when the buffer it updates dies at its
//! step and nothing else holds it (the `in_place` codegen pass marks the
//! step; uniqueness is checked when it runs), the window is written into
//! that buffer instead of a copy of it: O(window), not O(buffer). A loop
//! body's carried buffer is one of its parameters, which the body does not
//! own (the loop keeps a reference), so a row written per trip still
//! copies the buffer; handing the carried state to the body by value
//! would make those writes in place too.

use tracejit_ir::tensor::{Storage, StorageElement};

/// Writes `update` into `x`'s buffer at `starts` (clamped as XLA's
/// DynamicUpdateSlice) through `ptr`, the address of `x`'s unique,
/// standard-layout buffer, and returns `x` (now updated). `None` when the
/// operands are not of a kind handled here (the reference kernel then
/// makes a copy as usual).
pub(super) fn update_in_place(args: &[&Storage], ptr: i64) -> Option<Storage> {
    let [x, update, starts] = args else { return None };
    if x.dtype() != update.dtype() || x.rank() != update.rank() || starts.rank() != 1 || starts.len() != x.rank() {
        return None;
    }
    if !x.is_standard_layout() || tracejit_ir::tensor::with_array!(*x, a => a.as_ptr() as i64) != ptr {
        return None;
    }
    if update.shape().iter().zip(x.shape()).any(|(u, d)| u > d) {
        return None;
    }
    let at = clamped(starts, x.shape(), update.shape())?;
    match (x, update) {
        (Storage::F32(_), _) => write::<f32>(x.shape(), update, &at, ptr),
        (Storage::F64(_), _) => write::<f64>(x.shape(), update, &at, ptr),
        (Storage::I32(_), _) => write::<i32>(x.shape(), update, &at, ptr),
        (Storage::I64(_), _) => write::<i64>(x.shape(), update, &at, ptr),
        (Storage::BF16(_), _) => write::<tracejit_ir::tensor::bf16>(x.shape(), update, &at, ptr),
        (Storage::F16(_), _) => write::<tracejit_ir::tensor::f16>(x.shape(), update, &at, ptr),
        (Storage::I8(_), _) => write::<i8>(x.shape(), update, &at, ptr),
        (Storage::U8(_), _) => write::<u8>(x.shape(), update, &at, ptr),
        (Storage::I16(_), _) => write::<i16>(x.shape(), update, &at, ptr),
        (Storage::U16(_), _) => write::<u16>(x.shape(), update, &at, ptr),
        (Storage::U32(_), _) => write::<u32>(x.shape(), update, &at, ptr),
        (Storage::U64(_), _) => write::<u64>(x.shape(), update, &at, ptr),
        (Storage::Bool(_), _) => return None,
    }
    Some((*x).clone())
}

/// Each start clamped into `[0, dim - size]`.
fn clamped(starts: &Storage, dims: &[usize], sizes: &[usize]) -> Option<Vec<usize>> {
    let raw: Vec<i64> = match starts {
        Storage::I64(_) => starts.to_vec::<i64>().ok()?,
        Storage::I32(_) => starts.to_vec::<i32>().ok()?.into_iter().map(i64::from).collect(),
        _ => return None,
    };
    Some(raw.iter().zip(dims.iter().zip(sizes)).map(|(&s, (&d, &n))| s.clamp(0, (d - n) as i64) as usize).collect())
}

/// Copies `update`'s rows (its last axis) into the row-major buffer at
/// `ptr` of shape `dims`, offset by `at`.
fn write<T: StorageElement>(dims: &[usize], update: &Storage, at: &[usize], ptr: i64) {
    let src: Vec<T> = update.to_vec::<T>().expect("dtype matched");
    let rank = dims.len();
    let sizes = update.shape();
    let last = sizes.last().copied().unwrap_or(1);
    if src.is_empty() || last == 0 {
        return;
    }
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    let base = ptr as *mut T;
    let mut idx = vec![0usize; rank.saturating_sub(1)];
    for row in src.chunks_exact(last) {
        let offset: usize = idx.iter().enumerate().map(|(k, &i)| (i + at[k]) * strides[k]).sum::<usize>()
            + at.last().copied().unwrap_or(0);
        // SAFETY: the caller's contract: `ptr` is the unique buffer of a
        // standard-layout tensor of `dims`; the window (clamped starts,
        // sizes within dims) lies inside it.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), base.add(offset), last) };
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < sizes[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}
