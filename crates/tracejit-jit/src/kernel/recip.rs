//! Division by a row invariant as a multiplication by its reciprocal.
//!
//! Softmax's last pass divides every element of a row by the row's sum.
//! Cranelift's vectors are 128 bits wide, and a `divps` costs several times
//! a `mulps` on this class of CPU, so the final pass of a row region
//! computes `1 / d` once per row for every invariant divisor `d` and
//! multiplies. `x * fl(1 / d)` is within one epsilon (relative) of
//! `fl(x / d)` whenever `1 / d` is a normal number; a row whose divisor is
//! zero, infinite, NaN, subnormal or so large that its reciprocal would be
//! (`|d|` outside `[2^-(emax-1), 2^(emax-1)]`) runs the same loop with
//! true divisions instead, so those rows give exactly what the reference
//! gives (`x / 0 = ±inf`, `0 / 0 = NaN`, no flush of tiny quotients).

use std::collections::HashSet;

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use tracejit_ir::tensor::{BinaryOp, DType};

use crate::analysis::{LNodeId, LOp};
use crate::clif_ops::Mode;

use super::{Dest, Gen};

impl Gen<'_, '_, '_> {
    /// The invariant float divisors of varying divisions the loop storing
    /// `stores` evaluates, in node order.
    fn invariant_divisors(&self, stores: &[(LNodeId, Dest)]) -> Vec<LNodeId> {
        let an = self.an;
        let mut seen = HashSet::new();
        let mut found = Vec::new();
        let mut stack: Vec<LNodeId> = stores.iter().map(|&(v, _)| v).collect();
        while let Some(v) = stack.pop() {
            let node = &an.nodes[v];
            if !seen.insert(v) || !node.varying || self.sources.contains_key(&v) {
                continue;
            }
            if let LOp::Binary(BinaryOp::Div) = node.op {
                let d = node.inputs[1];
                if matches!(node.dtype, DType::F32 | DType::F64) && !an.nodes[d].varying && !found.contains(&d) {
                    found.push(d);
                }
            }
            stack.extend(node.inputs.iter().copied());
        }
        found.sort_unstable();
        found
    }

    /// The inner loop storing `stores` (no reductions), with divisions by
    /// row invariants turned into multiplications where that is exact
    /// enough (see the module docs).
    pub(super) fn inner_dividing(&mut self, stores: &[(LNodeId, Dest)]) {
        let divisors = self.invariant_divisors(stores);
        if divisors.is_empty() {
            self.inner(stores, &[]);
            return;
        }
        // Reciprocals and the check, in the row's block (they dominate both
        // versions of the loop).
        let mut ok: Option<Value> = None;
        let mut recips = Vec::new();
        for &d in &divisors {
            let t = self.an.nodes[d].dtype;
            let s = self.inv_scalar(d);
            let one = self.e.kf(t, Mode::Scalar, 1.0);
            let r = self.e.b.ins().fdiv(one, s);
            let emax = if t == DType::F32 { 127 } else { 1023 };
            let lo = self.e.kf(t, Mode::Scalar, 2f64.powi(1 - emax));
            let hi = self.e.kf(t, Mode::Scalar, 2f64.powi(emax - 1));
            let a = self.e.b.ins().fabs(s);
            // Ordered comparisons: NaN fails both.
            let above = self.e.b.ins().fcmp(FloatCC::GreaterThanOrEqual, a, lo);
            let below = self.e.b.ins().fcmp(FloatCC::LessThanOrEqual, a, hi);
            let this = self.e.b.ins().band(above, below);
            ok = Some(match ok {
                Some(o) => self.e.b.ins().band(o, this),
                None => this,
            });
            recips.push((d, r));
        }
        let ok = ok.expect("at least one divisor");
        let fast = self.e.b.create_block();
        let slow = self.e.b.create_block();
        let join = self.e.b.create_block();
        self.e.b.ins().brif(ok, fast, &[], slow, &[]);
        // Invariants computed inside one version do not dominate the other
        // or the join: each version starts from, and leaves, the row's.
        let (inv, splat) = (self.inv.clone(), self.splat.clone());

        self.e.b.switch_to_block(fast);
        for (d, r) in recips {
            let t = self.an.nodes[d].dtype;
            let splat = if self.vector {
                let vty = self.e.ty(t, Mode::Vector);
                Some(self.e.b.ins().splat(vty, r))
            } else {
                None
            };
            self.recip.insert(d, (r, splat));
        }
        self.inner(stores, &[]);
        self.recip.clear();
        self.e.b.ins().jump(join, &[]);
        (self.inv, self.splat) = (inv.clone(), splat.clone());

        self.e.b.switch_to_block(slow);
        self.inner(stores, &[]);
        self.e.b.ins().jump(join, &[]);
        (self.inv, self.splat) = (inv, splat);

        self.e.b.switch_to_block(join);
    }

    /// `x / d` for a division whose divisor has a reciprocal in this loop
    /// version: `x * (1 / d)`.
    pub(super) fn divide_by_reciprocal(&mut self, d: LNodeId, mode: Mode, x: Value) -> Option<Value> {
        let &(r, splat) = self.recip.get(&d)?;
        let r = match mode {
            Mode::Scalar => r,
            Mode::Vector => splat.expect("vector loops only run in vector kernels"),
        };
        Some(self.e.b.ins().fmul(x, r))
    }
}
