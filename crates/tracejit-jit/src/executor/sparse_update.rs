//! A variable's sparse update, `assign_sub(w, scale · scatter_add(0, ids,
//! rows))` (the `sparse_updates` pass made it one step): the rows are
//! summed per id and subtracted from the variable's own buffer, touching
//! only the named rows, under the variable's lock. When the kernel
//! declines (a scale that is negative or not finite, an elementwise
//! scatter, an integer table) the step computes the dense form instead,
//! with the same bits as the steps it replaced.

use tracejit_ir::tensor::{kernels, BinaryOp, Storage};
use tracejit_ir::{Graph, VarId};

/// Where a sparse update's scale comes from.
#[derive(Clone, Debug)]
pub(crate) enum Scale {
    /// No scale (`assign_sub(w, scatter_add(0, ..))`).
    One,
    /// A constant of the fused product.
    Constant(Storage),
    /// The step's third input, a scalar.
    Input,
}

/// What a sparse-update step writes.
#[derive(Clone, Debug)]
pub(crate) struct SparseUpdate {
    pub var: VarId,
    pub axis: usize,
    pub scale: Scale,
}

impl SparseUpdate {
    /// Listings: `var0 -= scale · rows at ids (axis 0)`.
    pub(crate) fn describe(&self) -> String {
        let scaled = match self.scale {
            Scale::One => "",
            Scale::Constant(_) | Scale::Input => "scale · ",
        };
        format!("{} -= {scaled}rows at ids (axis {})", self.var, self.axis)
    }

    /// Runs the update on `args` (`ids`, `rows`, and the scale when it is
    /// an input). `None` when the variable is unknown (a broken schedule).
    pub(crate) fn run(&self, g: &Graph, args: &[&Storage]) -> Option<()> {
        let v = g.variables.get(self.var)?;
        let (ids, rows) = (args[0], args[1]);
        let scale = match &self.scale {
            Scale::One => None,
            Scale::Constant(c) => Some(c),
            Scale::Input => Some(*args.get(2)?),
        };
        v.update_in_place(&mut |w| {
            if !kernels::scatter_sub_in_place(w, ids, rows, self.axis, scale) {
                *w = dense(w, ids, rows, self.axis, scale);
            }
        });
        Some(())
    }
}

/// `w - scale · scatter_add(0, ids, rows)` as the replaced steps computed it.
fn dense(w: &Storage, ids: &Storage, rows: &Storage, axis: usize, scale: Option<&Storage>) -> Storage {
    let zeros = Storage::full(w.shape(), w.dtype(), 0.0);
    let s = kernels::scatter_add(&zeros, ids, rows, axis);
    let s = match scale {
        Some(c) => kernels::binary(BinaryOp::Mul, &s, c),
        None => s,
    };
    kernels::binary(BinaryOp::Sub, w, &s)
}
