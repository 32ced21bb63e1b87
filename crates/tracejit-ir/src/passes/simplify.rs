//! `simplify`: algebraic rewrites that are exact under IEEE 754 (see the
//! module docs of [`crate::passes`] for the one NaN caveat). Each rule, and
//! why it is exact:
//!
//! | rewrite | why it is exact |
//! |---|---|
//! | `x + (-0.0)`, `(-0.0) + x` → `x` | `-0.0` is the additive identity: `-0 + -0 = -0`, `+0 + -0 = +0`. **Not** `x + 0.0`: `-0.0 + 0.0 = +0.0`, so that one is kept |
//! | `x - 0.0` → `x` | `x - (+0) = x + (-0)` |
//! | integer `x + 0`, `0 + x`, `x - 0` → `x` | wrapping arithmetic has no signed zero |
//! | `x * 1`, `1 * x`, `x / 1` → `x` | exact for every `x`, `-0.0`, infinities and NaN included. `x * 0 → 0` is never done: `inf * 0` and `NaN * 0` are NaN, `-1 * 0` is `-0` |
//! | `neg(neg(x))` → `x` | negation flips the sign bit, twice is the identity (integers: wrapping) |
//! | `a + neg(b)`, `neg(b) + a` → `a - b`; `a - neg(b)` → `a + b` | IEEE defines `a - b` as `a + (-b)`, with the same rounding |
//! | `x / c` → `x * (1/c)` | only when every element of the constant `c` is a power of two whose reciprocal is also representable (finite, not subnormal-overflowing): then `x * 2^-k` and `x / 2^k` are the same real number, rounded once |
//! | `transpose(transpose(x, p), q)` → `transpose(x, p∘q)`, identity permutations dropped | data movement only |
//! | `reshape(reshape(x))` → `reshape(x)`; a reshape to the input's own type dropped | the row-major order of elements is unchanged |
//! | `reshape(slice(x, last axis s..s+h·d), [.., h, d])` → `slice(reshape(x, [.., n/d, d]), axis -2 s/d..s/d+h)` when `d` divides `s` and the axis's length `n` (the other axes whole) | the same elements in the same order; the new reshape is of `x` itself, a contiguous buffer's view, where the old one copied a strided slice (attention's q/k/v split from one product) |
//! | `pad(a, +0.0) + pad(b, +0.0)` where the two cover adjacent, disjoint ranges of one axis (padded alike elsewhere) → `pad(concat(a, b), +0.0) + 0.0`; an operand `x + 0.0` is read as `x` | every element is one operand's value plus `+0.0` (or `0.0 + 0.0`), which the new form adds too (`-0.0 + 0.0 = +0.0` both ways); a slice's gradients summed back into one tensor (attention's `dq`, `dk`, `dv`) stop writing and reading three full-size tensors |
//! | `pad(x)` by nothing on every axis → `x` | the same elements |
//! | an operand `broadcast_to(s, shape)` of an elementwise op, with `s` holding one element → `s` | the op broadcasts `s` itself, element for element the same values |
//!
//! A rule fires only where it keeps the node's result type exactly (a
//! constant operand that broadcasts `x` to a bigger shape keeps the op), so
//! no consumer's type changes. Nodes are visited in order with their inputs
//! already rewritten, so chains (`neg(neg(neg(x)))`) collapse in one pass;
//! the operands left unused are removed by `dce`.

use smallvec::SmallVec;
use tracejit_tensor::{BinaryOp, SliceSpec, Storage, UnaryOp};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, Op, ValueId};

/// The arithmetic simplification pass (`simplify`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Simplify;

/// What a rule wants done with a node.
enum Rewrite {
    /// The node's result is this existing value.
    Alias(ValueId),
    /// The node becomes this op on these inputs.
    Replace(Op, SmallVec<[ValueId; 3]>),
    /// The node becomes `x * c` with the new constant `c`.
    MulByConstant(ValueId, Storage),
    /// The node becomes a slice (these specs) of a new `reshape(x, shape)`.
    SliceOfReshape(ValueId, Vec<i64>, Vec<SliceSpec>),
    /// The node becomes `pad(concat(parts, axis), pads) + 0` (the pad left
    /// out when it adds nothing).
    PaddedConcat { parts: Vec<ValueId>, axis: usize, pads: Vec<(usize, usize)> },
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Nested code first, so this level sees simplified subgraphs.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g, cx))
    }
}

impl Simplify {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph, _cx: &PassContext) -> PassResult {
        let mut rw = Rewriter::new(g);
        let mut rewrites = 0usize;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let inputs = rw.inputs(id);
            let Ok(expected) = rw.infer(&node.op, &inputs) else {
                rw.copy(id);
                continue;
            };
            // Rules apply to the node and then to what it became, so one run
            // leaves nothing for a second (`a + neg(b)` -> `a - b` -> `a` when
            // `b` is `+0.0`). Every rule removes an op or a level of nesting;
            // the cap is a guard.
            let (mut op, mut args): (Op, SmallVec<[ValueId; 3]>) = (node.op.clone(), inputs.iter().copied().collect());
            let mut outcome: Option<ValueId> = None;
            let mut applied = 0usize;
            while applied < 8 {
                let next = match rule(&rw, &op, &args) {
                    Some(Rewrite::Alias(v)) if expected.len() == 1 && *rw.value_type(v) == expected[0] => {
                        outcome = Some(v);
                        applied += 1;
                        break;
                    }
                    Some(Rewrite::Replace(new_op, new_args)) => (new_op, new_args),
                    Some(Rewrite::MulByConstant(x, c)) => {
                        let c = rw.constant(c);
                        (Op::Binary(BinaryOp::Mul), smallvec::smallvec![x, c])
                    }
                    Some(Rewrite::PaddedConcat { parts, axis, pads }) => {
                        let dtype = rw.value_type(parts[0]).dtype;
                        let Ok(joined) = rw.emit(Op::Concat { axis }, &parts, &[], node.location) else { break };
                        let mut x = ValueId { node: joined, index: 0 };
                        if pads.iter().any(|&p| p != (0, 0)) {
                            let Ok(padded) = rw.emit(Op::Pad { pads, value: 0.0 }, &[x], &[], node.location) else {
                                break;
                            };
                            x = ValueId { node: padded, index: 0 };
                        }
                        let zero = rw.constant(Storage::scalar_of(dtype, 0.0));
                        (Op::Binary(BinaryOp::Add), smallvec::smallvec![x, zero])
                    }
                    Some(Rewrite::SliceOfReshape(x, shape, specs)) => {
                        // Left for `dce` when the slice does not type-check.
                        let Ok(r) = rw.emit(Op::Reshape { shape }, &[x], &[], node.location) else { break };
                        (Op::Slice { specs }, smallvec::smallvec![ValueId { node: r, index: 0 }])
                    }
                    _ => break,
                };
                match rw.infer(&next.0, &next.1) {
                    Ok(types) if types[..] == expected[..] => {
                        (op, args) = next;
                        applied += 1;
                    }
                    _ => break,
                }
            }
            match outcome {
                Some(v) => rw.alias(id, &[v]),
                None if applied > 0 => {
                    let ok = rw.replace_if_types(id, op, &args, &expected);
                    debug_assert!(ok, "the rewritten node was type-checked");
                }
                None => {
                    rw.copy(id);
                }
            }
            rewrites += applied.min(1);
        }
        if rewrites == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(rewrites, if rewrites == 1 { "node rewritten" } else { "nodes rewritten" })
    }
}

/// The first rule that applies to `op` on (new) `inputs`, if any.
fn rule(rw: &Rewriter<'_>, op: &Op, inputs: &[ValueId]) -> Option<Rewrite> {
    let g = rw.graph();
    let producer = |v: ValueId| -> &Op { &g.node(v.node).op };
    let constant = |v: ValueId| -> Option<&Storage> {
        let Op::Constant { value } = producer(v) else { return None };
        Some(value)
    };
    let negated = |v: ValueId| -> Option<ValueId> {
        let Op::Unary(UnaryOp::Neg) = producer(v) else { return None };
        Some(g.node(v.node).inputs[0])
    };
    let is = |v: ValueId, want: Identity| constant(v).is_some_and(|c| all_are(c, want));

    if let Some(r) = fold_scalar_broadcast(rw, op, inputs) {
        return Some(r);
    }
    match op {
        Op::Binary(b) => {
            let (a, c) = (inputs[0], inputs[1]);
            match b {
                BinaryOp::Add if is(c, Identity::AddZero) => Some(Rewrite::Alias(a)),
                BinaryOp::Add if is(a, Identity::AddZero) => Some(Rewrite::Alias(c)),
                BinaryOp::Add if padded_parts(rw, a).is_some() && padded_parts(rw, c).is_some() => join_pads(rw, a, c),
                BinaryOp::Add => match (negated(c), negated(a)) {
                    (Some(nb), _) => Some(Rewrite::Replace(Op::Binary(BinaryOp::Sub), smallvec::smallvec![a, nb])),
                    (None, Some(na)) => Some(Rewrite::Replace(Op::Binary(BinaryOp::Sub), smallvec::smallvec![c, na])),
                    _ => None,
                },
                BinaryOp::Sub if is(c, Identity::SubZero) => Some(Rewrite::Alias(a)),
                BinaryOp::Sub => {
                    negated(c).map(|nb| Rewrite::Replace(Op::Binary(BinaryOp::Add), smallvec::smallvec![a, nb]))
                }
                BinaryOp::Mul if is(c, Identity::One) => Some(Rewrite::Alias(a)),
                BinaryOp::Mul if is(a, Identity::One) => Some(Rewrite::Alias(c)),
                BinaryOp::Div if is(c, Identity::One) => Some(Rewrite::Alias(a)),
                BinaryOp::Div => constant(c).and_then(exact_reciprocal).map(|r| Rewrite::MulByConstant(a, r)),
                BinaryOp::Mul
                | BinaryOp::Pow
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Rem
                | BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge
                | BinaryOp::LogicalAnd
                | BinaryOp::LogicalOr
                | BinaryOp::BitwiseAnd
                | BinaryOp::BitwiseOr
                | BinaryOp::BitwiseXor => None,
            }
        }
        // neg(neg(x)) = x; no other unary op has an exact identity here.
        Op::Unary(u) => (*u == UnaryOp::Neg).then(|| negated(inputs[0]).map(Rewrite::Alias)).flatten(),
        Op::Transpose { perm } => {
            if is_identity(perm) {
                return Some(Rewrite::Alias(inputs[0]));
            }
            let Op::Transpose { perm: inner } = producer(inputs[0]) else { return None };
            let x = g.node(inputs[0].node).inputs[0];
            let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
            if is_identity(&composed) {
                Some(Rewrite::Alias(x))
            } else {
                Some(Rewrite::Replace(Op::Transpose { perm: composed }, smallvec::smallvec![x]))
            }
        }
        Op::Reshape { shape } => {
            let x = inputs[0];
            let out = rw.infer(op, inputs).ok()?;
            if *rw.value_type(x) == out[0] {
                return Some(Rewrite::Alias(x));
            }
            if let Op::Slice { specs } = producer(x) {
                return slice_split(rw, g.node(x.node).inputs[0], specs, &out[0]);
            }
            if !matches!(producer(x), Op::Reshape { .. }) {
                return None;
            }
            let inner = g.node(x.node).inputs[0];
            if *rw.value_type(inner) == out[0] {
                return Some(Rewrite::Alias(inner));
            }
            Some(Rewrite::Replace(Op::Reshape { shape: shape.clone() }, smallvec::smallvec![inner]))
        }
        Op::Pad { pads, .. } if pads.iter().all(|&p| p == (0, 0)) => Some(Rewrite::Alias(inputs[0])),
        // Every other op: no identity this pass knows of.
        _ => None,
    }
}

/// `reshape(slice(x, specs), out)` as a slice of a reshape of `x` (the
/// module's table): `x [.., n]` sliced to `s..s + h·d` on its last axis
/// only (step 1), reshaped to `[.., h, d]`, with `d` dividing `s` and `n`.
fn slice_split(rw: &Rewriter<'_>, x: ValueId, specs: &[SliceSpec], out: &crate::TensorType) -> Option<Rewrite> {
    let (src, out) = (rw.value_type(x).shape()?, out.shape()?);
    let r = src.len();
    if r == 0 || out.len() != r + 1 || specs.len() > r || out[..r - 1] != src[..r - 1] {
        return None;
    }
    let spec = |i: usize| specs.get(i).copied().unwrap_or(SliceSpec::FULL).resolve(src[i]);
    if (0..r - 1).any(|i| spec(i) != (0, src[i], 1)) {
        return None;
    }
    let ((start, len, step), (h, d), n) = (spec(r - 1), (out[r - 1], out[r]), src[r - 1]);
    let start = usize::try_from(start).ok()?;
    if step != 1 || d == 0 || h * d != len || start % d != 0 || n % d != 0 {
        return None;
    }
    let mut shape: Vec<i64> = src[..r - 1].iter().map(|&v| v as i64).collect();
    shape.extend([(n / d) as i64, d as i64]);
    let mut new_specs = vec![SliceSpec::FULL; r + 1];
    new_specs[r - 1] = SliceSpec::range((start / d) as i64, (start / d + h) as i64);
    Some(Rewrite::SliceOfReshape(x, shape, new_specs))
}

/// Pads per axis, `(before, after)`.
type Pads = Vec<(usize, usize)>;

/// A summand `v` of the pad rule (the module's table): `pad(x, +0.0)`,
/// possibly under `+ 0`, as `(x, pads)` — `None` for anything else or an
/// `x` of unknown shape.
fn padded_parts(rw: &Rewriter<'_>, v: ValueId) -> Option<(ValueId, Pads)> {
    let g = rw.graph();
    let mut node = g.node(v.node);
    if let (Op::Binary(BinaryOp::Add), [x, z]) = (&node.op, &node.inputs[..]) {
        let zero = matches!(&g.node(z.node).op, Op::Constant { value } if all_are(value, Identity::SubZero) && value.len() == 1);
        if zero && g.value_type(*x) == g.value_type(v) {
            node = g.node(x.node);
        }
    }
    let Op::Pad { pads, value } = &node.op else { return None };
    if value.to_bits() != 0 || !g.value_type(v).dtype.is_float() {
        return None;
    }
    rw.value_type(node.inputs[0]).shape()?;
    Some((node.inputs[0], pads.clone()))
}

/// `a + c` for two summands of the pad rule covering adjacent ranges of
/// one axis, as a padded concat of their pieces in order.
fn join_pads(rw: &Rewriter<'_>, a: ValueId, c: ValueId) -> Option<Rewrite> {
    let ((pa, da), (pc, dc)) = (padded_parts(rw, a)?, padded_parts(rw, c)?);
    let (sa, sc) = (rw.value_type(pa).shape()?, rw.value_type(pc).shape()?);
    if da.len() != dc.len() || sa.len() != da.len() || sc.len() != dc.len() {
        return None;
    }
    let differ: Vec<usize> = (0..da.len()).filter(|&i| da[i] != dc[i] || sa[i] != sc[i]).collect();
    let &[axis] = &differ[..] else { return None };
    let (ra, rc) = ((da[axis].0, da[axis].0 + sa[axis]), (dc[axis].0, dc[axis].0 + sc[axis]));
    let total = da[axis].0 + sa[axis] + da[axis].1;
    let (first, second, lo) = if ra.1 == rc.0 {
        (pa, pc, ra.0)
    } else if rc.1 == ra.0 {
        (pc, pa, rc.0)
    } else {
        return None;
    };
    let len = sa[axis] + sc[axis];
    let mut pads = da.clone();
    pads[axis] = (lo, total - lo - len);
    // A piece that is itself a join along the axis contributes its pieces.
    let parts: Vec<ValueId> = [first, second].into_iter().flat_map(|p| concat_inputs(rw, p, axis)).collect();
    Some(Rewrite::PaddedConcat { parts, axis, pads })
}

/// The inputs of `v` when it is a concat along `axis` (so nested joins
/// copy once), else `v`.
fn concat_inputs(rw: &Rewriter<'_>, v: ValueId, axis: usize) -> Vec<ValueId> {
    let node = rw.graph().node(v.node);
    match &node.op {
        Op::Concat { axis: a } if *a == axis => node.inputs.to_vec(),
        _ => vec![v],
    }
}

/// An elementwise binary op or select with an operand `broadcast_to(s)`,
/// where `s` holds one element, takes `s` directly.
fn fold_scalar_broadcast(rw: &Rewriter<'_>, op: &Op, inputs: &[ValueId]) -> Option<Rewrite> {
    if !matches!(op, Op::Binary(_) | Op::Select) {
        return None;
    }
    let g = rw.graph();
    let mut changed = false;
    let new_inputs: SmallVec<[ValueId; 3]> = inputs
        .iter()
        .map(|&v| {
            let node = g.node(v.node);
            let scalar_broadcast =
                matches!(node.op, Op::BroadcastTo { .. }) && g.value_type(node.inputs[0]).num_elements() == Some(1);
            if scalar_broadcast {
                changed = true;
                node.inputs[0]
            } else {
                v
            }
        })
        .collect();
    changed.then(|| Rewrite::Replace(op.clone(), new_inputs))
}

/// Which identity element a constant must be made of.
#[derive(Clone, Copy)]
enum Identity {
    /// `-0.0` for floats, `0` for integers.
    AddZero,
    /// `+0.0` for floats, `0` for integers.
    SubZero,
    /// `1`.
    One,
}

/// True when every element of `c` is the identity `want` (and `c` is not
/// empty).
fn all_are(c: &Storage, want: Identity) -> bool {
    if c.is_empty() {
        return false;
    }
    let float = c.dtype().is_float();
    let test = |x: f64| match want {
        Identity::AddZero => x == 0.0 && (!float || x.is_sign_negative()),
        Identity::SubZero => x == 0.0 && (!float || x.is_sign_positive()),
        Identity::One => x == 1.0,
    };
    match c {
        Storage::F32(a) => a.iter().all(|&x| test(x as f64)),
        Storage::F64(a) => a.iter().all(|&x| test(x)),
        Storage::I32(a) => a.iter().all(|&x| test(x as f64)),
        // Only 0 and 1 convert to 0.0 and 1.0.
        Storage::I64(a) => a.iter().all(|&x| test(x as f64)),
        Storage::BF16(a) => a.iter().all(|&x| test(x.to_f64())),
        Storage::F16(a) => a.iter().all(|&x| test(x.to_f64())),
        Storage::Bool(_) => false,
        // The narrow integers, like I64: only 0 and 1 convert to 0.0 and 1.0.
        Storage::I8(_) | Storage::U8(_) | Storage::I16(_) | Storage::U16(_) | Storage::U32(_) | Storage::U64(_) => {
            tracejit_tensor::with_array!(c, a => a.iter().all(|&x| test(tracejit_tensor::Element::to_f64(x))))
        }
    }
}

/// `1/c` when every element of the float constant `c` is a power of two
/// with a representable reciprocal, so that `x / c == x * (1/c)` exactly.
fn exact_reciprocal(c: &Storage) -> Option<Storage> {
    if c.is_empty() {
        return None;
    }
    match c {
        Storage::F32(a) => {
            a.iter().all(|&x| exact_pow2_f32(x)).then(|| Storage::F32(a.mapv(|x| 1.0 / x).into_shared()))
        }
        Storage::F64(a) => {
            a.iter().all(|&x| exact_pow2_f64(x)).then(|| Storage::F64(a.mapv(|x| 1.0 / x).into_shared()))
        }
        _ => None,
    }
}

/// `x` is ±2^k and `1/x` is finite and also a power of two.
fn exact_pow2_f32(x: f32) -> bool {
    let pow2 = |v: f32| {
        let b = v.abs().to_bits();
        let (exp, mant) = (b >> 23, b & ((1 << 23) - 1));
        if exp == 0 {
            mant.is_power_of_two()
        } else {
            mant == 0
        }
    };
    x.is_finite() && x != 0.0 && pow2(x) && (1.0 / x).is_finite() && pow2(1.0 / x)
}

/// `x` is ±2^k and `1/x` is finite and also a power of two.
fn exact_pow2_f64(x: f64) -> bool {
    let pow2 = |v: f64| {
        let b = v.abs().to_bits();
        let (exp, mant) = (b >> 52, b & ((1 << 52) - 1));
        if exp == 0 {
            mant.is_power_of_two()
        } else {
            mant == 0
        }
    };
    x.is_finite() && x != 0.0 && pow2(x) && (1.0 / x).is_finite() && pow2(1.0 / x)
}

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}
