//! Tolerances: how far an optimized, compiled result may be from the
//! interpreter's on the graph as traced, per op, and the comparison shadow
//! validation (`Function::validate`) makes.
//!
//! Each value gets an error *budget* `B` (in units of its dtype's epsilon)
//! and a *scale* `S` (a magnitude taken from the reference run), and an
//! optimized result `a` passes against the reference `r` when, element by
//! element, `|a - r| <= SAFETY * B * eps * S` — or, with `B = 0`, when they
//! are equal (any NaN equals any NaN, `-0` equals `+0`). The budget of a
//! value is its own op's (below) plus its inputs'; its scale is the largest
//! of its own magnitude and its inputs' scales (a product of them for
//! `mul`, times the reduced length for sums and matrix products). Own
//! budgets follow what the JIT documents:
//!
//! | op | own budget (eps units) |
//! |---|---|
//! | exact ops (add, mul, max, compare, shape ops, ...) | 0 |
//! | float `div` (the JIT may multiply by a row invariant's reciprocal) | 1 |
//! | f32 transcendentals the JIT approximates (`Exactness::ApproxF32`) | 4 |
//! | float `sum` / `mean` / `prod` over `K` elements | `K` (scale × `K` for sum) |
//! | float `matmul` with inner size `K` | `K` (scale × `K`) |
//! | a composite call or registered kernel (may run a native kernel) | 256 |
//! | a call, fused region or loop: its body's, along the longest path (× trip count) | |
//!
//! An integer or bool value computed from inexact floats (a comparison, a
//! cast, an argmax) can legitimately differ by a whole step, so it is
//! *unverifiable* and not compared. `SAFETY` is 8: the bound is a sum of
//! worst cases, but conditioning (a division by a small number, a
//! cancellation) is not modelled, so budgets leave room for it.

use std::collections::HashMap;

use cranelift_entity::EntityRef;
use tracejit_tensor::{with_array, BinaryOp, DType, Exactness, ReduceOp, Storage};

use crate::{Graph, Node, Op, TensorType, ValueId};

/// Multiplies every budget (see the module docs).
pub const SAFETY: f64 = 8.0;

/// The own budget of a composite call or registered kernel.
pub const KERNEL_BUDGET: f64 = 256.0;

/// The error budget and scale of one value (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Accumulated error, in units of the dtype's epsilon.
    pub eps: f64,
    /// The magnitude errors are relative to.
    pub scale: f64,
    /// An integer or bool value computed from inexact floats: not compared.
    pub unverifiable: bool,
}

impl Budget {
    /// An exact value of magnitude `scale`.
    pub fn exact(scale: f64) -> Budget {
        Budget { eps: 0.0, scale, unverifiable: false }
    }

    /// The largest difference allowed for a value of `dtype`.
    pub fn allowed(&self, dtype: DType) -> f64 {
        SAFETY * self.eps * epsilon(dtype) * self.scale
    }
}

/// The machine epsilon of a float dtype (0 for the others).
pub fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        // Half an ulp of rounding per result: 2^-8 and 2^-11.
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        DType::I32
        | DType::I64
        | DType::Bool
        | DType::I8
        | DType::U8
        | DType::I16
        | DType::U16
        | DType::U32
        | DType::U64 => 0.0,
    }
}

/// The largest finite magnitude of a value (0 for an empty one).
pub fn magnitude(s: &Storage) -> f64 {
    with_array!(s, a => a.iter().map(|x| tracejit_tensor::Element::to_f64(*x).abs()).filter(|m| m.is_finite()).fold(0.0, f64::max))
}

/// Where `got` differs from `reference` beyond what `budget` allows.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// Row-major index of the worst element (0 for a dtype or shape mismatch).
    pub index: usize,
    /// The reference element (NaN for a dtype or shape mismatch).
    pub expected: f64,
    /// The element found.
    pub found: f64,
    /// `|found - expected|` (infinite where one is NaN or infinite and the other is not).
    pub difference: f64,
    /// What the budget allowed.
    pub allowed: f64,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "largest difference {:e} at element {} ({} instead of {}; allowed {:e})",
            self.difference, self.index, self.found, self.expected, self.allowed
        )
    }
}

/// Compares an optimized result with the reference under `budget`; `None`
/// when they agree.
pub fn compare(reference: &Storage, got: &Storage, budget: &Budget) -> Option<Difference> {
    if reference.dtype() != got.dtype() || reference.shape() != got.shape() {
        return Some(Difference {
            index: 0,
            expected: f64::NAN,
            found: f64::NAN,
            difference: f64::INFINITY,
            allowed: 0.0,
        });
    }
    if budget.unverifiable {
        return None;
    }
    let allowed = budget.allowed(reference.dtype());
    let (r, g) = (reference.to_standard(), got.to_standard());
    let rv: Vec<f64> = with_array!(&r, a => a.iter().map(|x| tracejit_tensor::Element::to_f64(*x)).collect());
    let gv: Vec<f64> = with_array!(&g, a => a.iter().map(|x| tracejit_tensor::Element::to_f64(*x)).collect());
    let mut worst: Option<Difference> = None;
    for (i, (&e, &f)) in rv.iter().zip(&gv).enumerate() {
        let same = e == f || (e.is_nan() && f.is_nan());
        if same {
            continue;
        }
        let d = if e.is_finite() && f.is_finite() { (e - f).abs() } else { f64::INFINITY };
        if d <= allowed {
            continue;
        }
        if worst.as_ref().is_none_or(|w| d > w.difference) {
            worst = Some(Difference { index: i, expected: e, found: f, difference: d, allowed });
        }
    }
    worst
}

/// The own budget of `node` in `graph` (see the module docs), given its
/// input types.
pub fn own_budget(graph: &Graph, node: &Node) -> f64 {
    let input = |i: usize| graph.value_type(node.inputs[i]);
    let reduced = |t: &TensorType, axes: &[usize]| -> f64 {
        axes.iter().map(|&a| t.dims.get(a).copied().flatten().unwrap_or(1024) as f64).product()
    };
    match &node.op {
        Op::Unary(u) => match u.exactness() {
            Exactness::Exact => 0.0,
            Exactness::ApproxF32 if input(0).dtype == DType::F32 => 4.0,
            Exactness::ApproxF32 => 0.0,
        },
        Op::Reduce { op, axes, .. } => match op {
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod if input(0).dtype.is_float() => reduced(input(0), axes),
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min => 0.0,
        },
        Op::MatMul if input(0).dtype.is_float() => {
            let a = input(0);
            a.dims.last().copied().flatten().unwrap_or(1024) as f64
        }
        // The JIT may divide by a row invariant as a multiplication by its
        // reciprocal (one extra rounding).
        Op::Binary(BinaryOp::Div) if input(0).dtype.is_float() => 1.0,
        Op::Kernel { .. } => KERNEL_BUDGET,
        Op::Spatial(sp) => spatial_terms(sp, input(0), input(node.inputs.len().min(2) - 1)),
        Op::Call { func } => {
            let f = graph.library.get(*func);
            let body = body_budget(&f.graph);
            if f.implements().is_some() {
                body.max(KERNEL_BUDGET)
            } else {
                body
            }
        }
        Op::Fused { body } => body_budget(body),
        Op::Cond { branches } => branches.iter().map(|b| body_budget(b)).fold(0.0, f64::max),
        Op::While { parts, trip_count, .. } => {
            let per_trip = parts.iter().map(|p| body_budget(p)).fold(0.0, f64::max);
            per_trip * trip_count.unwrap_or(64).max(1) as f64
        }
        Op::MatMul
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Binary(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::Clamp { .. }
        | Op::ArgReduce { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::BroadcastTo { .. }
        | Op::ExpandDims { .. }
        | Op::Squeeze { .. }
        | Op::Concat { .. }
        | Op::Stack { .. }
        | Op::Slice { .. }
        | Op::Gather { .. }
        | Op::OneHot { .. }
        | Op::GatherElements { .. }
        | Op::ScatterAdd { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::Pad { .. }
        | Op::Cumsum { .. }
        | Op::TopK { .. }
        | Op::Random { .. }
        | Op::ReadVariable { .. }
        | Op::AssignVariable { .. } => 0.0,
    }
}

/// How many terms a spatial op's outputs sum (its own budget): a
/// convolution's per-group channels times taps (plus the bias), a
/// gradient's pixels or channels, a pool's window (0 for the max, which
/// rounds nothing). Unknown sizes count 1024, as elsewhere.
fn spatial_terms(op: &tracejit_tensor::SpatialOp, a: &TensorType, b: &TensorType) -> f64 {
    use tracejit_tensor::SpatialOp as S;
    if !a.dtype.is_float() {
        return 0.0;
    }
    let d = |t: &TensorType, i: usize| t.dims.get(i).copied().flatten().unwrap_or(1024) as f64;
    match op {
        // x, w: w's [in/g, kh, kw] per output.
        S::Conv2d { .. } => d(b, 1) * d(b, 2) * d(b, 3) + 1.0,
        // The epilogue's product and residual add round once more each.
        S::Conv2dNhwc { scale, residual, .. } => {
            d(b, 1) * d(b, 2) * d(b, 3) + 1.0 + f64::from(u8::from(*scale) + u8::from(*residual))
        }
        // dy, w: [out/g, kh, kw] per input value.
        S::Conv2dBackwardData { conv, .. } => d(b, 0) / conv.groups.max(1) as f64 * d(b, 2) * d(b, 3),
        // x, dy: images times output pixels.
        S::Conv2dBackwardFilter { .. } => d(b, 0) * d(b, 2) * d(b, 3),
        S::MaxPool2d { .. } | S::MaxPool2dNhwc { .. } | S::MaxPool2dBackward { .. } => 0.0,
        S::AvgPool2d { pool } | S::AvgPool2dBackward { pool, .. } => (pool.kernel[0] * pool.kernel[1]) as f64 + 1.0,
    }
}

/// The largest budget along any path of `body` (no values: scales are not
/// tracked inside a nested graph).
pub fn body_budget(body: &Graph) -> f64 {
    let mut acc: Vec<f64> = vec![0.0; body.len()];
    for (id, node) in body.nodes() {
        let from_inputs: f64 = node.inputs.iter().map(|v| acc.get(v.node.index()).copied().unwrap_or(0.0)).sum();
        acc[id.index()] = from_inputs + own_budget(body, node);
    }
    body.outputs.iter().map(|v| acc.get(v.node.index()).copied().unwrap_or(0.0)).fold(0.0, f64::max)
}

/// The budget of every value of `graph`, given the reference value of
/// every node output (`values[node][output]`, `None` where a node did not
/// run or has no outputs).
pub fn budgets(graph: &Graph, values: &[Option<Vec<Storage>>]) -> HashMap<ValueId, Budget> {
    let mut out: HashMap<ValueId, Budget> = HashMap::new();
    for (id, node) in graph.nodes() {
        let ins: Vec<Budget> = node.inputs.iter().map(|v| out.get(v).copied().unwrap_or(Budget::exact(0.0))).collect();
        let in_eps: f64 = ins.iter().map(|b| b.eps).sum();
        let in_scale = ins.iter().map(|b| b.scale).fold(0.0, f64::max);
        let inexact_inputs = ins.iter().any(|b| b.eps > 0.0 || b.unverifiable);
        let own = own_budget(graph, node);
        // Products multiply magnitudes; sums and matrix products add up to
        // K of them.
        let grown = match &node.op {
            Op::Binary(tracejit_tensor::BinaryOp::Mul) => ins.iter().map(|b| b.scale.max(1.0)).product::<f64>(),
            Op::Reduce { op: ReduceOp::Sum, .. } => in_scale * own.max(1.0),
            Op::MatMul => ins.iter().map(|b| b.scale.max(1.0)).product::<f64>() * own.max(1.0),
            // Sums of products, like a matrix product's (a pool's inputs
            // are one value: its own terms times its scale).
            Op::Spatial(_) => ins.iter().map(|b| b.scale.max(1.0)).product::<f64>() * own.max(1.0),
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::Gather { .. }
            | Op::OneHot { .. }
            | Op::GatherElements { .. }
            | Op::ScatterAdd { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::Random { .. }
            | Op::Call { .. }
            | Op::Fused { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. } => in_scale,
        };
        for (k, ty) in node.outputs.iter().enumerate() {
            let own_mag =
                values.get(id.index()).and_then(|v| v.as_ref()).and_then(|v| v.get(k)).map(magnitude).unwrap_or(0.0);
            let eps = in_eps + own;
            let unverifiable = !ty.dtype.is_float() && (inexact_inputs || own > 0.0);
            out.insert(ValueId::new(id, k as u32), Budget { eps, scale: own_mag.max(grown), unverifiable });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Storage {
        Storage::from_vec(v.to_vec(), &[v.len()]).unwrap()
    }

    #[test]
    fn exact_budgets_compare_bits_and_inexact_ones_allow_a_scaled_difference() {
        let exact = Budget::exact(1.0);
        assert!(compare(&f32s(&[1.0, f32::NAN, 0.0]), &f32s(&[1.0, f32::NAN, -0.0]), &exact).is_none());
        let d = compare(&f32s(&[1.0, 2.0]), &f32s(&[1.0, 2.0 + 2.4e-7]), &exact).unwrap();
        assert_eq!(d.index, 1);
        let loose = Budget { eps: 4.0, scale: 2.0, unverifiable: false };
        assert!(compare(&f32s(&[1.0, 2.0]), &f32s(&[1.0, 2.0 + 2.4e-7]), &loose).is_none());
        let d = compare(&f32s(&[1.0, 2.0]), &f32s(&[1.01, 2.0]), &loose).unwrap();
        assert!((d.difference - 0.01).abs() < 1e-6 && d.expected == 1.0, "{d}");
        assert!(compare(&f32s(&[1.0]), &f32s(&[f32::INFINITY]), &loose).is_some());
        let skipped = Budget { unverifiable: true, ..loose };
        assert!(compare(&f32s(&[1.0]), &f32s(&[5.0]), &skipped).is_none());
        assert!(compare(&f32s(&[1.0]), &f32s(&[1.0, 1.0]), &skipped).is_some(), "shapes always count");
    }
}
