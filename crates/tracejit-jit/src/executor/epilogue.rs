//! A mid-sized matrix product and the region right after it that consumes
//! it, run together in row halves: each thread computes its rows of the
//! product and then the region's rows that read them
//! ([`crate::threads::epilogue_rows`], `CompiledRegion::try_run_after`).
//!
//! Why: a loop step `h = tanh(x_t + h · wh + b)` (W8) ran its product in
//! halves on two threads and then the region on the calling thread only,
//! which read half of the product from the other core's cache; and the
//! next step's product read all of `h` from both. In halves of rows, a
//! thread's rows of `h` stay in its own core from one step to the next.
//! The `epilogues` codegen pass decides which products run this way
//! (`codegen/products.rs`), f32 ones and those on the bf16 GEMM alike
//! (whose right operand is packed once, before the halves).

use smallvec::SmallVec;
use tracejit_ir::tensor::{DType, Storage};
use tracejit_ir::IrError;

use super::pairs::Gemm;
use super::Executable;
use crate::region::{unique_mut_ptr, BufPool, Product};
use crate::schedule::{Step, StepKind};

/// What [`run`] made: the product and the region's outputs by slot.
pub(super) type Made = (Storage, SmallVec<[(usize, Storage); 2]>);

/// Runs the product at `step` (operands `args`) and the region at step
/// `j` together. `Ok(None)` when the operands are not 2-D floats of sizes
/// [`crate::threads::epilogue_rows`] takes (the caller runs the product
/// alone); the region's outputs are missing from the result when its
/// inputs do not fit its static launch (its own step runs it).
pub(super) fn run(
    exe: &Executable,
    step: &Step,
    j: usize,
    args: &[&Storage],
    values: &[Option<Storage>],
    pool: &mut BufPool,
) -> Result<Option<Made>, IrError> {
    let next = &exe.schedule.steps[j];
    let StepKind::Region(r) = &next.kind else { return Ok(None) };
    let (a, b) = (args[0], args[1]);
    let (&[m, k], &[k2, n]) = (a.shape(), b.shape()) else { return Ok(None) };
    let gemm = super::gemm_of(step);
    // The product's dtype, and the bf16 GEMM's rhs packed once for both
    // halves.
    let (dtype, packed) = match gemm {
        Gemm::Plain if a.dtype() == b.dtype() && a.dtype().is_float() => (a.dtype(), None),
        Gemm::Plain => return Ok(None),
        Gemm::Bf16(p) if p.takes_rows_of(a) => (DType::F32, Some(p.packed_rhs(b, exe.target.isa))),
        Gemm::Bf16(_) => return Ok(None),
    };
    let Some(half) = crate::threads::epilogue_rows(m, n, k).filter(|_| k == k2) else { return Ok(None) };
    let fresh = || match dtype {
        DType::F64 => Storage::from_vec(vec![0f64; m * n], &[m, n]),
        _ => Storage::from_vec(vec![0f32; m * n], &[m, n]),
    };
    let mut product = match pool.take(dtype, &[m, n]) {
        Some(buf) => buf,
        None => fresh().map_err(|e| IrError::BadInput { graph: exe.graph.name.clone(), message: e.to_string() })?,
    };
    let Some(out) = unique_mut_ptr(&mut product) else { return Ok(None) };
    let slot = step.outputs[0];
    let alias = next.in_place.filter(|&p| next.inputs[p] == slot).map(|p| (p, out));
    let rows = |rows: std::ops::Range<usize>| {
        // SAFETY: `out` addresses the unique `[m, n]` buffer of `product`,
        // which aliases neither operand; blocks take disjoint rows.
        let done = unsafe {
            match (gemm, &packed) {
                (Gemm::Bf16(p), Some(packed)) => p.product_rows(exe.target.isa, a, packed, out, rows),
                _ => crate::gemm::product_rows(exe.target.isa, a, b, out, rows),
            }
        };
        assert!(done, "2-D operands the product takes");
    };
    let mut inputs: SmallVec<[&Storage; 4]> = SmallVec::new();
    for &x in &next.inputs {
        inputs.push(if x == slot {
            &product
        } else {
            values[x].as_ref().ok_or_else(|| IrError::Verifier {
                graph: exe.graph.name.clone(),
                node: next.node,
                message: format!("slot {x} is not available"),
            })?
        });
    }
    exe.check_step(next, &inputs, pool)?;
    // One block on one thread: the halves have the whole's bits.
    let (halves, whole) = ([0..half, half..m], 0..m);
    let blocks = if crate::threads::num_threads() > 1 { &halves[..] } else { std::slice::from_ref(&whole) };
    let outs = match r.product_row_map(m, n, half) {
        Some(map) => r.try_run_after(&inputs, pool, alias, Product { m, n, map, blocks, rows: &rows }),
        None => None,
    };
    drop(inputs);
    match outs {
        Some(outs) if outs.len() == next.outputs.len() => {
            Ok(Some((product, next.outputs.iter().copied().zip(outs).collect())))
        }
        Some(outs) => Err(IrError::Verifier {
            graph: exe.graph.name.clone(),
            node: next.node,
            message: format!("produced {} values for {} outputs", outs.len(), next.outputs.len()),
        }),
        // Inputs off the static plan (a strided view): the product as the
        // plain step computes it (split in blocks), the region at its own
        // step.
        None => {
            let mut buf = Some(product);
            let whole = match gemm {
                Gemm::Plain => crate::gemm::matmul_with(exe.target.isa, a, b, &mut |_, _| buf.take()),
                Gemm::Bf16(p) => p.run_with(exe.target.isa, a, b, &mut |_, _| buf.take()),
            };
            Ok(Some((whole, SmallVec::new())))
        }
    }
}
