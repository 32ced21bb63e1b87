//! Where a region kernel writes its outputs: fresh or pooled buffers, or
//! — for an elementwise kernel whose input dies at this step — that
//! input's own buffer, written in place ([`CompiledRegion::in_place_output`]).
//!
//! Why in place: an optimizer's `w - lr·dw` over a [784, 512] weight reads
//! `dw` right after the GEMM wrote it, still in cache; a pooled output
//! buffer, last touched a whole step ago, is cold, and writing it costs
//! its cache lines' round trip to memory (the update ran 2-5x slower in
//! W6 than alone). Writing over `dw` touches only lines already in cache.

use tracejit_ir::tensor::{DType, Storage};
use tracejit_kernels::pages;

use super::{CompiledRegion, Launch};
use crate::analysis::{KernelKind, LoadSource};

pub(super) enum OutBuf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    /// A buffer from the pool, uniquely owned here, already of the output's shape.
    Reused(Storage),
    /// An input's buffer written in place: the input (one more reference
    /// to it) and its element pointer, taken while it was unique.
    Aliased(Storage, i64),
}

impl OutBuf {
    pub(super) fn new(dtype: DType, len: usize) -> OutBuf {
        match dtype {
            DType::F32 => OutBuf::F32(pages::with_capacity(len)),
            DType::F64 => OutBuf::F64(pages::with_capacity(len)),
            DType::I32 => OutBuf::I32(pages::with_capacity(len)),
            DType::I64 => OutBuf::I64(pages::with_capacity(len)),
            DType::Bool => OutBuf::Bool(pages::with_capacity(len)),
            DType::I8 => OutBuf::I8(pages::with_capacity(len)),
            DType::U8 => OutBuf::U8(pages::with_capacity(len)),
            DType::I16 => OutBuf::I16(pages::with_capacity(len)),
            DType::U16 => OutBuf::U16(pages::with_capacity(len)),
            DType::U32 => OutBuf::U32(pages::with_capacity(len)),
            DType::BF16 | DType::F16 | DType::U64 => {
                unreachable!("16-bit floats and u64 never reach a region (analysis rejects them)")
            }
        }
    }

    pub(super) fn ptr(&mut self) -> i64 {
        match self {
            OutBuf::F32(v) => v.as_mut_ptr() as i64,
            OutBuf::F64(v) => v.as_mut_ptr() as i64,
            OutBuf::I32(v) => v.as_mut_ptr() as i64,
            OutBuf::I64(v) => v.as_mut_ptr() as i64,
            OutBuf::Bool(v) => v.as_mut_ptr() as i64,
            OutBuf::I8(v) => v.as_mut_ptr() as i64,
            OutBuf::U8(v) => v.as_mut_ptr() as i64,
            OutBuf::I16(v) => v.as_mut_ptr() as i64,
            OutBuf::U16(v) => v.as_mut_ptr() as i64,
            OutBuf::U32(v) => v.as_mut_ptr() as i64,
            // Unique, so `as_mut_ptr` copies nothing; standard layout, so the
            // elements follow the pointer.
            OutBuf::Reused(s) => match s {
                Storage::F32(a) => a.as_mut_ptr() as i64,
                Storage::F64(a) => a.as_mut_ptr() as i64,
                Storage::I32(a) => a.as_mut_ptr() as i64,
                Storage::I64(a) => a.as_mut_ptr() as i64,
                Storage::Bool(a) => a.as_mut_ptr() as i64,
                Storage::BF16(a) => a.as_mut_ptr() as i64,
                Storage::F16(a) => a.as_mut_ptr() as i64,
                Storage::I8(a) => a.as_mut_ptr() as i64,
                Storage::U8(a) => a.as_mut_ptr() as i64,
                Storage::I16(a) => a.as_mut_ptr() as i64,
                Storage::U16(a) => a.as_mut_ptr() as i64,
                Storage::U32(a) => a.as_mut_ptr() as i64,
                Storage::U64(a) => a.as_mut_ptr() as i64,
            },
            OutBuf::Aliased(_, p) => *p,
        }
    }

    /// # Safety
    /// The kernel wrote all `len` elements (bools as 0 or 1).
    pub(super) unsafe fn finish(self, shape: &[usize]) -> Storage {
        let len: usize = shape.iter().product();
        macro_rules! fin {
            ($v:ident) => {{
                let mut v = $v;
                // SAFETY: the caller guarantees every element was written.
                unsafe { v.set_len(len) };
                Storage::from_vec(v, shape).expect("length matches the shape")
            }};
        }
        match self {
            OutBuf::F32(v) => fin!(v),
            OutBuf::F64(v) => fin!(v),
            OutBuf::I32(v) => fin!(v),
            OutBuf::I64(v) => fin!(v),
            OutBuf::Bool(v) => fin!(v),
            OutBuf::I8(v) => fin!(v),
            OutBuf::U8(v) => fin!(v),
            OutBuf::I16(v) => fin!(v),
            OutBuf::U16(v) => fin!(v),
            OutBuf::U32(v) => fin!(v),
            OutBuf::Reused(s) | OutBuf::Aliased(s, _) => s,
        }
    }
}

pub(crate) fn data_ptr(s: &Storage) -> i64 {
    tracejit_ir::tensor::with_array!(s, a => a.as_ptr() as i64)
}

/// Whether two shapes are equal, element by element: slice equality
/// calls `memcmp`, which cost ~50 ns a call on these short (often empty)
/// shapes — an eighth of a scalar loop trip, which takes two buffers.
pub(crate) fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// The element pointer of `s` for writing, if no other `Storage` shares
/// its buffer and it is in standard layout (`as_mut_ptr` then copies
/// nothing).
pub(crate) fn unique_mut_ptr(s: &mut Storage) -> Option<i64> {
    if !s.is_standard_layout() || !tracejit_ir::tensor::with_array!(&*s, a => a.is_unique()) {
        return None;
    }
    Some(tracejit_ir::tensor::with_array!(s, a => a.as_mut_ptr() as i64))
}

impl CompiledRegion {
    /// Whether output 0 may overwrite input `p` in place — the caller
    /// checks at run time that the input is unique and standard: an
    /// elementwise kernel of one output (its loop, or each 512-element
    /// chunk of a staged one, reads an element's inputs before it stores
    /// that element, and never reads it again),
    /// `p` of the output's dtype and static shape and read by no load
    /// under another access pattern (checked at launch).
    pub(crate) fn may_write_in_place(&self, p: usize) -> bool {
        let an = &self.an;
        let (Some(shapes), Some(out)) = (&self.static_shapes, an.outputs.first()) else { return false };
        an.kind == KernelKind::Elementwise
            && an.outputs.len() == 1
            && self.kernel.native.is_none()
            && self.param_types.get(p).is_some_and(|t| t.dtype == out.dtype)
            && self.static_launch.as_ref().is_some_and(|l| l.out_shapes[0][..] == shapes[p][..])
            && an.loads.values().any(|l| matches!(l.source, LoadSource::Param(q) if q == p))
    }

    /// Output 0 written over input `p` (at `ptr`, the address
    /// [`unique_mut_ptr`] gave while it was unique): `Some` when every load
    /// of that buffer walks it exactly as the kernel walks the output (same
    /// row and outer strides: element `i` is read only for output `i`).
    pub(super) fn in_place_output(
        &self,
        inputs: &[&Storage],
        l: &Launch,
        alias: Option<(usize, i64)>,
    ) -> Option<OutBuf> {
        let (p, ptr) = alias?;
        let an = &self.an;
        let x = inputs.get(p)?;
        let out_slot = an.loads.len();
        if data_ptr(x) != ptr || !same_shape(x.shape(), &l.out_shapes[0]) || !l.materialize.is_empty() {
            return None;
        }
        // Every load of the buffer, also through another parameter that
        // was given the same value.
        let reads_buffer = |q: usize| q == p || inputs.get(q).is_some_and(|y| data_ptr(y) == ptr);
        let same_walk =
            an.loads.iter().filter(|(_, ld)| matches!(ld.source, LoadSource::Param(q) if reads_buffer(q))).all(
                |(id, _)| {
                    let i = cranelift_entity::EntityRef::index(id);
                    l.row_strides[i] == l.row_strides[out_slot] && l.outer.iter().all(|(_, st)| st[i] == st[out_slot])
                },
            );
        same_walk.then(|| OutBuf::Aliased((*x).clone(), ptr))
    }
}
