//! The views the executor makes itself: a transpose, a gather of one
//! index, and a block of rows, each sharing its input's buffer.

use tracejit_ir::tensor::Storage;

/// The views the executor makes itself.
pub(crate) enum View {
    /// `transpose` with this permutation (a strided view, as the reference
    /// kernel's).
    Transpose(Vec<usize>),
    /// `gather` along this axis with a scalar index: the index's slice,
    /// sharing the input's buffer (the reference kernel copies it).
    Index(usize),
}

/// `$body` applied to whichever array `$x` holds, as a `Storage` of the
/// same dtype (a clone of an `ArcArray` only counts a reference, so a view
/// shares the buffer).
macro_rules! view_of {
    ($x:expr, $a:ident => $body:expr) => {
        match $x {
            Storage::F32($a) => Storage::F32($body),
            Storage::F64($a) => Storage::F64($body),
            Storage::I32($a) => Storage::I32($body),
            Storage::I64($a) => Storage::I64($body),
            Storage::Bool($a) => Storage::Bool($body),
            Storage::BF16($a) => Storage::BF16($body),
            Storage::F16($a) => Storage::F16($body),
            Storage::I8($a) => Storage::I8($body),
            Storage::U8($a) => Storage::U8($body),
            Storage::I16($a) => Storage::I16($body),
            Storage::U16($a) => Storage::U16($body),
            Storage::U32($a) => Storage::U32($body),
            Storage::U64($a) => Storage::U64($body),
        }
    };
}

impl View {
    /// The view of `args`, or `None` when the reference kernel must run
    /// (an index out of range, an invalid permutation: it reports them).
    pub(crate) fn apply(&self, args: &[&Storage]) -> Option<Storage> {
        match self {
            View::Transpose(perm) => {
                let x = args[0];
                let mut seen = [false; 16];
                let valid = perm.len() == x.rank()
                    && perm.len() <= seen.len()
                    && perm.iter().all(|&p| p < perm.len() && !std::mem::replace(&mut seen[p], true));
                valid.then(|| view_of!(x, a => a.clone().permuted_axes(ndarray::IxDyn(perm))))
            }
            View::Index(axis) => {
                let (x, index) = (args[0], args[1]);
                let i = match index {
                    Storage::I64(a) if a.ndim() == 0 => *a.iter().next()?,
                    Storage::I32(a) if a.ndim() == 0 => i64::from(*a.iter().next()?),
                    _ => return None,
                };
                let len = *x.shape().get(*axis)? as i64;
                // Negative indices count from the end, as the reference's.
                let j = if i < 0 { i + len } else { i };
                (0..len)
                    .contains(&j)
                    .then(|| view_of!(x, a => a.clone().index_axis_move(ndarray::Axis(*axis), j as usize)))
            }
        }
    }
}

/// `x`'s rows `r` along axis `a` (a block of a loop's batch): a view
/// sharing its buffer.
pub(super) fn rows(x: &Storage, a: usize, r: std::ops::Range<usize>) -> Storage {
    view_of!(x, v => {
        let mut v = v.clone();
        v.slice_axis_inplace(ndarray::Axis(a), ndarray::Slice::from(r));
        v
    })
}
