//! Which regions are a row layer norm, and its entry points: the region's
//! whole program must be `y = ((h - m) · r) · γ + β` with `m = mean(h)`, `r =
//! rsqrt(mean((h - m) · (h - m)) + ε)`, `h` one contiguous input or the sum
//! `(t₀ + t₁) + t₂` of two or three, `γ` and `β` contiguous inputs, `ε` a
//! constant or an input that does not vary along the row; outputs `y`, and
//! `h` too when it is a sum (a pre-norm block's residual stream). Every
//! operation is matched with its operands' roles (commutative ones in either
//! order), so the kernel rounds as the program does, one operation at a
//! time; anything else in the region (another output, a cast, a kept
//! statistic) leaves it to generated code.

use std::collections::HashSet;

use cranelift_entity::EntityRef;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, UnaryOp};
use tracejit_kernels::layer_norm::{rows, Epsilon, Operand, Output};
use tracejit_kernels::Width;

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp, LoadId};
use crate::kernel::abi::SlotId;
use crate::scalar::Scalar;

/// Plan layout (slot numbers of `kernel::abi`): the term count, three term
/// slots, `γ`, `β`, the kind of `ε` (0: the f32 bits that follow, 1: the
/// slot that follows), that value, `y`'s slot and `h`'s (or -1).
const PLAN_LEN: usize = 10;

/// The plan of `an` if it is a row layer norm.
pub(super) fn plan(an: &Analysis) -> Option<Box<[i64]>> {
    if an.kind != KernelKind::Row || an.passes != 2 || !(1..=2).contains(&an.outputs.len()) {
        return None;
    }
    let f32s = an.nodes.values().all(|n| n.dtype == DType::F32) && an.loads.values().all(|l| l.dtype == DType::F32);
    if !f32s || an.outputs.iter().any(|o| o.kept || o.dtype != DType::F32) {
        return None;
    }
    let m = Matcher { an, seen: HashSet::new() };
    let (y_out, h_out) = match an.outputs.len() {
        1 => (0, None),
        _ if m.clone().layer_norm(an.outputs[0].node).is_some() => (0, Some(1)),
        _ => (1, Some(0)),
    };
    let mut m = m;
    let ln = m.layer_norm(an.outputs[y_out].node)?;
    if let Some(h) = h_out {
        // The second output is `h`, a sum (a region never returns its input).
        if an.outputs[h].node != ln.h || ln.terms.len() < 2 {
            return None;
        }
    }
    // Nothing else is computed.
    if m.seen.len() != an.nodes.len() {
        return None;
    }
    let slot = |l: LoadId| SlotId::of_load(l).index() as i64;
    let out_slot = |o: usize| SlotId::of_output(an.loads.len(), o).index() as i64;
    let mut plan = [-1i64; PLAN_LEN];
    plan[0] = ln.terms.len() as i64;
    for (k, &t) in ln.terms.iter().enumerate() {
        plan[1 + k] = slot(t);
    }
    plan[4] = slot(ln.gamma);
    plan[5] = slot(ln.beta);
    (plan[6], plan[7]) = match ln.eps {
        Eps::Value(v) => (0, i64::from(v.to_bits())),
        Eps::Load(l) => (1, slot(l)),
    };
    plan[8] = out_slot(y_out);
    plan[9] = h_out.map_or(-1, out_slot);
    Some(plan.into())
}

/// Where `ε` comes from.
#[derive(Clone, Copy)]
enum Eps {
    Value(f32),
    Load(LoadId),
}

/// A matched layer norm: the operands and the node of `h`.
struct LayerNorm {
    terms: Vec<LoadId>,
    h: LNodeId,
    gamma: LoadId,
    beta: LoadId,
    eps: Eps,
}

/// Walks the program from `y`, recording every node it matches.
#[derive(Clone)]
struct Matcher<'a> {
    an: &'a Analysis,
    seen: HashSet<LNodeId>,
}

impl Matcher<'_> {
    /// The operands of `id` if it is `op` with `N` of them (the node then
    /// counted as matched).
    fn take<const N: usize>(&mut self, id: LNodeId, op: LOp) -> Option<[LNodeId; N]> {
        let n = &self.an.nodes[id];
        let inputs: [LNodeId; N] = n.inputs.as_slice().try_into().ok().filter(|_| n.op == op)?;
        self.seen.insert(id);
        Some(inputs)
    }

    /// The operands of `id` if it is the binary `op`.
    fn binary(&mut self, id: LNodeId, op: BinaryOp) -> Option<(LNodeId, LNodeId)> {
        self.take(id, LOp::Binary(op)).map(|[a, b]| (a, b))
    }

    /// The operand of `id` if it is a mean over the row.
    fn mean(&mut self, id: LNodeId) -> Option<LNodeId> {
        self.take(id, LOp::Reduce(ReduceOp::Mean)).map(|[a]| a)
    }

    /// The input of `id` if it is a load that varies along the row.
    fn row_load(&mut self, id: LNodeId) -> Option<LoadId> {
        match self.an.nodes[id].op {
            LOp::Load(l) if self.an.loads[l].contig => {
                self.seen.insert(id);
                Some(l)
            }
            _ => None,
        }
    }

    /// `id` as `ε`: an f32 constant, or a load constant along the row.
    fn eps(&mut self, id: LNodeId) -> Option<Eps> {
        let eps = match self.an.nodes[id].op {
            LOp::Const(Scalar::F32(v)) => Eps::Value(v),
            LOp::Load(l) if !self.an.loads[l].contig && !self.an.nodes[id].varying => Eps::Load(l),
            _ => return None,
        };
        self.seen.insert(id);
        Some(eps)
    }

    /// `(a, b)` or `(b, a)`: the first order in which `f` matches.
    fn either<A, B>(
        &mut self,
        (a, b): (LNodeId, LNodeId),
        f: impl Fn(&mut Self, LNodeId, LNodeId) -> Option<(A, B)>,
    ) -> Option<(A, B)> {
        let before = self.seen.clone();
        if let Some(r) = f(self, a, b) {
            return Some(r);
        }
        self.seen = before;
        f(self, b, a)
    }

    /// `h`'s terms in the order `(t₀ + t₁) + t₂` adds them.
    fn terms(&mut self, h: LNodeId) -> Option<Vec<LoadId>> {
        if let Some(l) = self.row_load(h) {
            return Some(vec![l]);
        }
        let sum = self.binary(h, BinaryOp::Add)?;
        let (mut inner, last) = self.either(sum, |m, a, b| {
            let last = m.row_load(b)?;
            let inner = match m.row_load(a) {
                Some(l) => vec![l],
                None => {
                    let pair = m.binary(a, BinaryOp::Add)?;
                    let (x, y) = (m.row_load(pair.0)?, m.row_load(pair.1)?);
                    vec![x, y]
                }
            };
            Some((inner, last))
        })?;
        inner.push(last);
        Some(inner)
    }

    /// The layer norm whose output is `y`.
    fn layer_norm(&mut self, y: LNodeId) -> Option<LayerNorm> {
        // y = u + β, u = t · γ, t = d · r.
        let sum = self.binary(y, BinaryOp::Add)?;
        let (u, beta) = self.either(sum, |m, u, b| Some((m.binary(u, BinaryOp::Mul)?, m.row_load(b)?)))?;
        let (t, gamma) = self.either(u, |m, t, g| Some((m.binary(t, BinaryOp::Mul)?, m.row_load(g)?)))?;
        let ((d, (h, mu)), shifted) = self.either(t, |m, d, r| {
            Some(((d, m.binary(d, BinaryOp::Sub)?), m.take::<1>(r, LOp::Unary(UnaryOp::Rsqrt))?[0]))
        })?;
        // d = h - m, m = mean(h).
        if self.mean(mu)? != h {
            return None;
        }
        // r = rsqrt(v + ε), v = mean(d · d).
        let var_eps = self.binary(shifted, BinaryOp::Add)?;
        let (sq, eps) = self.either(var_eps, |m, v, e| Some((m.mean(v)?, m.eps(e)?)))?;
        if self.binary(sq, BinaryOp::Mul)? != (d, d) {
            return None;
        }
        let terms = self.terms(h)?;
        Some(LayerNorm { terms, h, gamma, beta, eps })
    }
}

macro_rules! entry {
    ($name:ident, $width:expr) => {
        /// The row layer norm over the ABI's argument block (`kernel::abi`)
        /// with the slots of its `plan` ([`plan`]'s layout).
        ///
        /// # Safety
        /// `args` is such an argument block for the region the plan was
        /// made from, its pointers addressing rows of readable (input) and
        /// writable (output) values, no output aliasing an input; the CPU
        /// has the width's features (`kernel_for` hands it out only then).
        pub(super) unsafe extern "C" fn $name(args: *const i64, plan: *const i64) {
            // SAFETY: forwarded from the caller (the layout of `kernel::abi`
            // and of the plan).
            unsafe {
                let a = |i: usize| *args.add(i);
                let p = std::slice::from_raw_parts(plan, PLAN_LEN);
                let (count, n) = (a(0).max(0) as usize, a(1).max(0) as usize);
                let slot = |s: i64| crate::kernel::ARG_SLOTS + 2 * s as usize;
                let input = |s: i64| Operand { ptr: a(slot(s)) as *const f32, row_stride: a(slot(s) + 1) as isize };
                let output = |s: i64| Output { ptr: a(slot(s)) as *mut f32, row_stride: a(slot(s) + 1) as isize };
                let k = p[0] as usize;
                let terms = [
                    input(p[1]),
                    if k > 1 { input(p[2]) } else { input(p[1]) },
                    if k > 2 { input(p[3]) } else { input(p[1]) },
                ];
                let eps =
                    if p[6] == 0 { Epsilon::Value(f32::from_bits(p[7] as u32)) } else { Epsilon::PerRow(input(p[7])) };
                let h = (p[9] >= 0).then(|| output(p[9]));
                rows(count, n, &terms[..k], input(p[4]), input(p[5]), eps, output(p[8]), h, $width);
            }
        }
    };
}
entry!(rows_x16, Width::W16);
entry!(rows_x8, Width::W8);
