//! The VJP rule of every op, in one exhaustive `match` ([`vjp`]): given an
//! op's inputs, outputs and output cotangents, the cotangents of its
//! inputs, emitted as ops. See the module above for the conventions.

use tracejit_tensor::{BinaryOp, DType, ReduceOp, SliceSpec, UnaryOp};

mod indexing;
mod spatial;
mod window;

use indexing::{concat_vjp, gather_vjp, slice_vjp};
use window::{
    cumsum_vjp, dynamic_slice_vjp, dynamic_update_slice_vjp, gather_elements_vjp, pad_vjp, scatter_add_vjp, top_k_vjp,
};

use super::{broadcast_like, scalar, true_like, vjp_control, AutodiffError, Emitter};
use crate::{Op, TensorType};

type R<T> = Result<T, AutodiffError>;

/// Shorthands over an [`Emitter`].
struct B<'e, E: Emitter> {
    e: &'e mut E,
}

impl<E: Emitter> B<'_, E> {
    fn op(&mut self, op: Op, xs: &[E::Value]) -> R<E::Value> {
        Ok(self.e.emit(op, xs)?.remove(0))
    }
    fn un(&mut self, u: UnaryOp, x: &E::Value) -> R<E::Value> {
        self.op(Op::Unary(u), std::slice::from_ref(x))
    }
    fn bin(&mut self, b: BinaryOp, x: &E::Value, y: &E::Value) -> R<E::Value> {
        self.op(Op::Binary(b), &[x.clone(), y.clone()])
    }
    fn mul(&mut self, x: &E::Value, y: &E::Value) -> R<E::Value> {
        self.bin(BinaryOp::Mul, x, y)
    }
    fn div(&mut self, x: &E::Value, y: &E::Value) -> R<E::Value> {
        self.bin(BinaryOp::Div, x, y)
    }
    fn neg(&mut self, x: &E::Value) -> R<E::Value> {
        self.un(UnaryOp::Neg, x)
    }
    /// A scalar of `like`'s dtype.
    fn k(&mut self, like: &E::Value, v: f64) -> E::Value {
        let dtype = self.e.value_type(like).dtype;
        scalar(self.e, dtype, v)
    }
    /// `x * v` for a scalar `v`.
    fn scale(&mut self, x: &E::Value, v: f64) -> R<E::Value> {
        let k = self.k(x, v);
        self.mul(x, &k)
    }
    /// `cond ? g : 0`, broadcast.
    fn mask(&mut self, cond: &E::Value, g: &E::Value) -> R<E::Value> {
        let zero = self.k(g, 0.0);
        self.op(Op::Select, &[cond.clone(), g.clone(), zero])
    }
    fn ty(&self, v: &E::Value) -> TensorType {
        self.e.value_type(v)
    }

    /// `g` (of a broadcast result's type) summed back to `to`'s shape:
    /// leading axes `to` lacks, and axes where `to` is 1 and the result
    /// is not.
    fn unbroadcast(&mut self, g: E::Value, to: &TensorType) -> R<E::Value> {
        let gt = self.ty(&g);
        if gt.dims == to.dims {
            return Ok(g);
        }
        let lead = gt.rank().checked_sub(to.rank()).ok_or_else(|| AutodiffError::Unsupported {
            op: "unbroadcast".into(),
            message: format!("a gradient of type {gt} is of lower rank than its value {to}"),
        })?;
        let mut g = g;
        if lead > 0 {
            let axes = (0..lead).collect();
            g = self.op(Op::Reduce { op: ReduceOp::Sum, axes, keepdims: false }, &[g])?;
        }
        let gt = self.ty(&g);
        let axes: Vec<usize> = (0..to.rank()).filter(|&i| to.dims[i] == Some(1) && gt.dims[i] != Some(1)).collect();
        if !axes.is_empty() {
            g = self.op(Op::Reduce { op: ReduceOp::Sum, axes, keepdims: true }, &[g])?;
        }
        Ok(g)
    }

    /// A reduction's cotangent `g` (reduced over `axes`) given back its
    /// reduced axes as size 1, then broadcast to `x`'s shape.
    fn unreduce(&mut self, g: &E::Value, axes: &[usize], keepdims: bool, x: &E::Value) -> R<E::Value> {
        let mut g = g.clone();
        if !keepdims {
            for &a in axes {
                g = self.op(Op::ExpandDims { axis: a }, &[g])?;
            }
        }
        broadcast_like(self.e, g, x)
    }

    /// The number of elements a reduction over `axes` of `x` combines, as a
    /// scalar (static) or a tensor of the kept shape (unknown dims).
    fn count(&mut self, x: &E::Value, axes: &[usize]) -> R<E::Value> {
        let t = self.ty(x);
        let known: Option<usize> = axes.iter().map(|&a| t.dims[a]).product();
        match known {
            Some(n) => Ok(self.k(x, n as f64)),
            None => {
                let ones = true_like(self.e, x)?;
                let ones = self.op(Op::Cast { to: t.dtype }, &[ones])?;
                self.op(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec(), keepdims: true }, &[ones])
            }
        }
    }
}

fn unsupported(op: &Op, message: impl Into<String>) -> AutodiffError {
    AutodiffError::Unsupported { op: op.name().to_string(), message: message.into() }
}

/// The cotangents of `op`'s inputs, given its `inputs`, `outputs` and the
/// cotangents of its outputs (`None`: zero). `None` in the result: no
/// gradient flows to that input (an integer or bool value, or a piecewise
/// constant op).
pub fn vjp<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
) -> Result<Vec<Option<E::Value>>, AutodiffError> {
    vjp_wanted(e, op, inputs, outputs, cotangents, &[])
}

/// [`vjp`] for the inputs marked in `wanted` only (one flag per input,
/// inputs past its end wanted; the others' cotangents are `None`). A product's or convolution's cotangent
/// for an operand no gradient is asked of is not computed at all: an
/// eager tape's backward through `x · w` with only `w` watched is one
/// product, not two (as PyTorch's autograd skips inputs that need no
/// gradient); a traced graph would drop the unused one later anyway.
pub fn vjp_wanted<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wanted: &[bool],
) -> Result<Vec<Option<E::Value>>, AutodiffError> {
    let mut cts = vjp_of(e, op, inputs, outputs, cotangents, wanted)?;
    for (ct, &w) in cts.iter_mut().zip(wanted) {
        if !w {
            *ct = None;
        }
    }
    Ok(cts)
}

/// [`vjp_wanted`] before the unwanted cotangents are dropped (the rules
/// that can skip work read `wanted`; the others compute every input's).
fn vjp_of<E: Emitter>(
    e: &mut E,
    op: &Op,
    inputs: &[E::Value],
    outputs: &[E::Value],
    cotangents: &[Option<E::Value>],
    wanted: &[bool],
) -> Result<Vec<Option<E::Value>>, AutodiffError> {
    let none = || vec![None; inputs.len()];
    // Control flow has many outputs and its own rule; without values for
    // the variables its subgraphs read, it refuses to differentiate those.
    if let Op::Cond { .. } | Op::While { .. } = op {
        return Ok(vjp_control(e, op, inputs, outputs, cotangents, &[])?.0);
    }
    // Spatial ops may have two outputs (a filter gradient with the bias's),
    // either one's cotangent given.
    if let Op::Spatial(sp) = op {
        let float = cotangents.iter().flatten().all(|g| e.value_type(g).dtype.is_float());
        if !float {
            return Ok(none());
        }
        return spatial::spatial_vjp(&mut B { e }, op, sp, inputs, outputs, cotangents, wanted);
    }
    let Some(g) = cotangents.first().cloned().flatten() else {
        return Ok(none());
    };
    let mut b = B { e };
    // Integer and bool results carry no gradient.
    if !b.ty(&g).dtype.is_float() {
        return Ok(none());
    }
    let float_in = |b: &B<'_, E>, i: usize| b.ty(&inputs[i]).dtype.is_float();
    let x = inputs.first().cloned();
    let y = outputs.first().cloned();
    Ok(match op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::ReadVariable { .. } | Op::AssignVariable { .. } => none(),
        Op::Unary(u) => {
            let (x, y) = (x.expect("unary input"), y.expect("unary output"));
            vec![unary(&mut b, *u, &x, &y, &g)?]
        }
        Op::Binary(op2) => binary_vjp(&mut b, *op2, inputs, &y.expect("binary output"), &g)?,
        Op::Select => select_vjp(&mut b, inputs, g)?,
        Op::Cast { .. } => {
            let x = x.expect("cast input");
            if !float_in(&b, 0) {
                return Ok(none());
            }
            let from = b.ty(&x).dtype;
            vec![Some(b.op(Op::Cast { to: from }, &[g])?)]
        }
        Op::Clamp { min, max } => vec![Some(clamp_vjp(&mut b, &x.expect("clamp input"), *min, *max, &g)?)],
        Op::Reduce { op: r, axes, keepdims } => {
            let (x, y) = (x.expect("reduce input"), y.expect("reduce output"));
            vec![Some(reduce(&mut b, *r, axes, *keepdims, &x, &y, &g)?)]
        }
        Op::ArgReduce { .. } | Op::OneHot { .. } => none(),
        Op::MatMul => matmul_vjp(&mut b, &inputs[0], &inputs[1], g, wanted)?,
        Op::Reshape { .. } => vec![Some(reshape_vjp(&mut b, op, &x.expect("reshape input"), g)?)],
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(b.op(Op::Transpose { perm: inverse }, &[g])?)]
        }
        Op::BroadcastTo { .. } => {
            let t = b.ty(&x.expect("broadcast input"));
            vec![Some(b.unbroadcast(g, &t)?)]
        }
        Op::ExpandDims { axis } => vec![Some(b.op(Op::Squeeze { axes: vec![*axis] }, &[g])?)],
        Op::Squeeze { axes } => {
            let mut g = g;
            for &a in axes {
                g = b.op(Op::ExpandDims { axis: a }, &[g])?;
            }
            vec![Some(g)]
        }
        Op::Concat { axis } => concat_vjp(&mut b, op, *axis, inputs, &g)?,
        Op::Stack { axis } => stack_vjp(&mut b, *axis, inputs.len(), &g)?,
        Op::Slice { specs } => vec![Some(slice_vjp(&mut b, op, specs, &x.expect("slice input"), g)?)],
        Op::Gather { axis } => vec![Some(gather_vjp(&mut b, op, *axis, &inputs[0], &inputs[1], g)?), None],
        Op::GatherElements { axis } => {
            vec![Some(gather_elements_vjp(&mut b, *axis, &inputs[0], &inputs[1], g)?), None]
        }
        Op::ScatterAdd { axis } => {
            let [gx, gu] = scatter_add_vjp(&mut b, *axis, &inputs[1], &inputs[2], g)?;
            vec![Some(gx), None, Some(gu)]
        }
        Op::DynamicSlice { .. } => vec![Some(dynamic_slice_vjp(&mut b, &inputs[0], &inputs[1], g)?), None],
        Op::DynamicUpdateSlice => {
            let [gx, gu] = dynamic_update_slice_vjp(&mut b, op, &inputs[1], &inputs[2], g)?;
            vec![Some(gx), Some(gu), None]
        }
        Op::Pad { pads, .. } => vec![Some(pad_vjp(&mut b, pads, g)?)],
        Op::Cumsum { axis } => vec![Some(cumsum_vjp(&mut b, *axis, g)?)],
        Op::TopK { .. } => {
            let indices = outputs.get(1).ok_or_else(|| unsupported(op, "top_k without its indices output"))?;
            vec![Some(top_k_vjp(&mut b, &inputs[0], indices, g)?)]
        }
        // A draw's values depend on its state only through the stream: no
        // gradient (the state is an integer).
        Op::Random { .. } => none(),
        Op::Spatial(_) => unreachable!("spatial ops are differentiated above"),
        Op::Cond { .. } | Op::While { .. } => unreachable!("control flow is differentiated above"),
        Op::Kernel { kernel, .. } if kernel.gradient_passes_through().is_some_and(|i| i < inputs.len()) => {
            let through = kernel.gradient_passes_through();
            (0..inputs.len()).map(|i| (Some(i) == through).then(|| g.clone())).collect()
        }
        Op::Call { .. } | Op::Kernel { .. } | Op::Fused { .. } => {
            return Err(unsupported(
                op,
                "differentiate before the implementation selector and fusion, with calls inlined",
            ));
        }
    })
}

/// The permutation swapping the last two of `rank` axes.
fn swap_last(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}

fn unary<E: Emitter>(b: &mut B<'_, E>, u: UnaryOp, x: &E::Value, y: &E::Value, g: &E::Value) -> R<Option<E::Value>> {
    use UnaryOp::*;
    Ok(Some(match u {
        Neg => b.neg(g)?,
        Abs => {
            let s = b.un(Sign, x)?;
            b.mul(g, &s)?
        }
        Exp => b.mul(g, y)?,
        Expm1 => {
            let one = b.k(y, 1.0);
            let e = b.bin(BinaryOp::Add, y, &one)?;
            b.mul(g, &e)?
        }
        Log => b.div(g, x)?,
        Log1p => {
            let one = b.k(x, 1.0);
            let d = b.bin(BinaryOp::Add, x, &one)?;
            b.div(g, &d)?
        }
        Sqrt => {
            let h = b.scale(g, 0.5)?;
            b.div(&h, y)?
        }
        Rsqrt => {
            // d/dx x^-1/2 = -1/2 · y / x
            let h = b.scale(g, -0.5)?;
            let h = b.mul(&h, y)?;
            b.div(&h, x)?
        }
        Square => {
            let two_x = b.scale(x, 2.0)?;
            b.mul(g, &two_x)?
        }
        Reciprocal => {
            let yy = b.mul(y, y)?;
            let h = b.mul(g, &yy)?;
            b.neg(&h)?
        }
        Tanh => {
            let yy = b.mul(y, y)?;
            let one = b.k(y, 1.0);
            let d = b.bin(BinaryOp::Sub, &one, &yy)?;
            b.mul(g, &d)?
        }
        Sigmoid => {
            let one = b.k(y, 1.0);
            let d = b.bin(BinaryOp::Sub, &one, y)?;
            let d = b.mul(y, &d)?;
            b.mul(g, &d)?
        }
        Relu => {
            let zero = b.k(x, 0.0);
            let pos = b.bin(BinaryOp::Gt, x, &zero)?;
            b.mask(&pos, g)?
        }
        Erf => {
            // 2/sqrt(pi) · exp(-x²)
            let xx = b.mul(x, x)?;
            let n = b.neg(&xx)?;
            let ex = b.un(Exp, &n)?;
            let d = b.scale(&ex, std::f64::consts::FRAC_2_SQRT_PI)?;
            b.mul(g, &d)?
        }
        Sin => {
            let c = b.un(Cos, x)?;
            b.mul(g, &c)?
        }
        Cos => {
            let s = b.un(Sin, x)?;
            let h = b.mul(g, &s)?;
            b.neg(&h)?
        }
        Sinh => {
            let c = b.un(Cosh, x)?;
            b.mul(g, &c)?
        }
        Cosh => {
            let s = b.un(Sinh, x)?;
            b.mul(g, &s)?
        }
        Atan => {
            // d atan(x) = 1 / (1 + x²): no cancellation, and 0 (not NaN)
            // at ±inf, as x² overflows to inf.
            let sq = b.un(Square, x)?;
            let one = b.k(x, 1.0);
            let d = b.bin(BinaryOp::Add, &sq, &one)?;
            b.div(g, &d)?
        }
        Softplus => {
            let s = b.un(Sigmoid, x)?;
            b.mul(g, &s)?
        }
        // Piecewise constant, or not a float function: no gradient.
        Sign | Floor | Ceil | Round | LogicalNot | IsNan | IsFinite => return Ok(None),
    }))
}

/// The cotangents of both operands, before unbroadcasting.
#[allow(clippy::type_complexity)]
fn binary<E: Emitter>(
    b: &mut B<'_, E>,
    op: BinaryOp,
    a: &E::Value,
    c: &E::Value,
    y: &E::Value,
    g: &E::Value,
) -> R<(Option<E::Value>, Option<E::Value>)> {
    use BinaryOp::*;
    Ok(match op {
        Add => (Some(g.clone()), Some(g.clone())),
        Sub => (Some(g.clone()), Some(b.neg(g)?)),
        Mul => (Some(b.mul(g, c)?), Some(b.mul(g, a)?)),
        Div => {
            let ga = b.div(g, c)?;
            // -g · a / c² = -g · y / c
            let h = b.mul(g, y)?;
            let h = b.div(&h, c)?;
            (Some(ga), Some(b.neg(&h)?))
        }
        Pow => {
            // d/da = c · a^(c-1); d/dc = y · ln(a) where a > 0, else 0 (TF).
            let one = b.k(c, 1.0);
            let cm1 = b.bin(Sub, c, &one)?;
            let p = b.bin(Pow, a, &cm1)?;
            let d = b.mul(c, &p)?;
            let ga = b.mul(g, &d)?;
            let zero = b.k(a, 0.0);
            let pos = b.bin(Gt, a, &zero)?;
            let ln = b.un(UnaryOp::Log, a)?;
            let ln = b.mask(&pos, &ln)?;
            let h = b.mul(g, y)?;
            (Some(ga), Some(b.mul(&h, &ln)?))
        }
        Maximum | Minimum => {
            // Ties go to the first operand, as TF.
            let first = b.bin(if op == Maximum { Ge } else { Le }, a, c)?;
            let zero = b.k(g, 0.0);
            let ga = b.op(Op::Select, &[first.clone(), g.clone(), zero.clone()])?;
            let gc = b.op(Op::Select, &[first, zero, g.clone()])?;
            (Some(ga), Some(gc))
        }
        Rem => {
            // a mod c = a - floor(a / c) · c
            let q = b.div(a, c)?;
            let f = b.un(UnaryOp::Floor, &q)?;
            let h = b.mul(g, &f)?;
            (Some(g.clone()), Some(b.neg(&h)?))
        }
        Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr | BitwiseXor => (None, None),
    })
}

fn reduce<E: Emitter>(
    b: &mut B<'_, E>,
    r: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    x: &E::Value,
    y: &E::Value,
    g: &E::Value,
) -> R<E::Value> {
    let gb = b.unreduce(g, axes, keepdims, x)?;
    match r {
        ReduceOp::Sum => Ok(gb),
        ReduceOp::Mean => {
            let n = b.count(x, axes)?;
            b.div(&gb, &n)
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Shared equally among the elements equal to the result.
            let yb = b.unreduce(y, axes, keepdims, x)?;
            let hit = b.bin(BinaryOp::Eq, x, &yb)?;
            let dtype: DType = b.ty(x).dtype;
            let ones = b.op(Op::Cast { to: dtype }, std::slice::from_ref(&hit))?;
            let ties = b.op(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec(), keepdims: true }, &[ones])?;
            let share = b.div(&gb, &ties)?;
            b.mask(&hit, &share)
        }
        ReduceOp::Prod => {
            let d = prod_of_others(b, axes, x)?;
            b.mul(&gb, &d)
        }
    }
}

/// For each element of `x`, the product of the other elements it is
/// reduced with over `axes` (the derivative of a product): what JAX and TF
/// compute from exclusive cumulative products, built here without a
/// cumulative product op. With no zero among them it is `y / x` (as
/// before); with one zero, the product of the nonzero others at the zero
/// and 0 elsewhere; with two or more, 0 everywhere. (`y / x` alone gave
/// NaN at a zero: `[0, 2, 3]` has the gradient `[6, 0, 0]`.)
fn prod_of_others<E: Emitter>(b: &mut B<'_, E>, axes: &[usize], x: &E::Value) -> R<E::Value> {
    let (zero, one) = (b.k(x, 0.0), b.k(x, 1.0));
    let is_zero = b.bin(BinaryOp::Eq, x, &zero)?;
    let nonzero = b.op(Op::Select, &[is_zero.clone(), one, x.clone()])?;
    let reduce = |op| Op::Reduce { op, axes: axes.to_vec(), keepdims: true };
    let product = b.op(reduce(ReduceOp::Prod), std::slice::from_ref(&nonzero))?;
    let zeros = b.op(Op::Cast { to: b.ty(x).dtype }, std::slice::from_ref(&is_zero))?;
    let n_zeros = b.op(reduce(ReduceOp::Sum), &[zeros])?;
    let others = b.div(&product, &nonzero)?;
    let k0 = b.k(x, 0.0);
    let none = b.bin(BinaryOp::Eq, &n_zeros, &k0)?;
    let k1 = b.k(x, 1.0);
    let single = b.bin(BinaryOp::Eq, &n_zeros, &k1)?;
    let at_zero = b.mask(&is_zero, &product)?;
    let with_zero = b.mask(&single, &at_zero)?;
    let d = b.op(Op::Select, &[none, others, with_zero])?;
    // The selects broadcast to `x`'s shape (every operand but the kept
    // reductions has it).
    broadcast_like(b.e, d, x)
}

/// A binary op's VJP, each operand's part summed down to its shape.
fn binary_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    op: BinaryOp,
    inputs: &[E::Value],
    y: &E::Value,
    g: &E::Value,
) -> R<Vec<Option<E::Value>>> {
    let (a, c) = (&inputs[0], &inputs[1]);
    let (ga, gc) = binary(b, op, a, c, y, g)?;
    let (ta, tc) = (b.ty(a), b.ty(c));
    let ga = match ga {
        Some(v) => Some(b.unbroadcast(v, &ta)?),
        None => None,
    };
    let gc = match gc {
        Some(v) => Some(b.unbroadcast(v, &tc)?),
        None => None,
    };
    Ok(vec![ga, gc])
}

/// `select(c, a, b)`: the cotangent goes to the chosen side, none to `c`.
fn select_vjp<E: Emitter>(b: &mut B<'_, E>, inputs: &[E::Value], g: E::Value) -> R<Vec<Option<E::Value>>> {
    let c = &inputs[0];
    let zero = b.k(&g, 0.0);
    let ga = b.op(Op::Select, &[c.clone(), g.clone(), zero.clone()])?;
    let gb = b.op(Op::Select, &[c.clone(), zero, g])?;
    let (ta, tb) = (b.ty(&inputs[1]), b.ty(&inputs[2]));
    Ok(vec![None, Some(b.unbroadcast(ga, &ta)?), Some(b.unbroadcast(gb, &tb)?)])
}

/// `clamp(x, min, max)`: the cotangent where `x` is inside the range.
fn clamp_vjp<E: Emitter>(b: &mut B<'_, E>, x: &E::Value, min: f64, max: f64, g: &E::Value) -> R<E::Value> {
    let lo = b.k(x, min);
    let hi = b.k(x, max);
    let ge = b.bin(BinaryOp::Ge, x, &lo)?;
    let le = b.bin(BinaryOp::Le, x, &hi)?;
    let inside = b.bin(BinaryOp::LogicalAnd, &ge, &le)?;
    b.mask(&inside, g)
}

/// A reshape's VJP: the cotangent reshaped back to `x`'s shape.
fn reshape_vjp<E: Emitter>(b: &mut B<'_, E>, op: &Op, x: &E::Value, g: E::Value) -> R<E::Value> {
    let t = b.ty(x);
    if t.dims.iter().filter(|d| d.is_none()).count() > 1 {
        // Reshaping the cotangent back needs x's run-time shape, and a
        // reshape names at most one `-1`: it would take an op that
        // reshapes to another value's shape, which the IR lacks.
        return Err(unsupported(
            op,
            format!(
                "its input {t} has more than one unknown dim, and the cotangent cannot be reshaped back to a \
                 run-time shape (a reshape resolves at most one -1)"
            ),
        ));
    }
    let shape = t.dims.iter().map(|d| d.map_or(-1, |d| d as i64)).collect();
    b.op(Op::Reshape { shape }, &[g])
}

/// A stack's VJP: slice `i` of the cotangent along `axis`, squeezed, for
/// each of the `n` inputs.
fn stack_vjp<E: Emitter>(b: &mut B<'_, E>, axis: usize, n: usize, g: &E::Value) -> R<Vec<Option<E::Value>>> {
    let rank = b.ty(g).rank();
    let mut out = Vec::with_capacity(n);
    for i in 0..n as i64 {
        let mut specs = vec![SliceSpec::FULL; rank];
        specs[axis] = SliceSpec::range(i, i + 1);
        let s = b.op(Op::Slice { specs }, std::slice::from_ref(g))?;
        out.push(Some(b.op(Op::Squeeze { axes: vec![axis] }, &[s])?));
    }
    Ok(out)
}

/// The product's VJP: `g · cᵀ` for `a`, `aᵀ · g` for `c`, each summed
/// down to its operand's shape; only those `wanted` (`[a, c]`).
fn matmul_vjp<E: Emitter>(
    b: &mut B<'_, E>,
    a: &E::Value,
    c: &E::Value,
    g: E::Value,
    wanted: &[bool],
) -> R<Vec<Option<E::Value>>> {
    let (ta, tc) = (b.ty(a), b.ty(c));
    let ga = if wanted.first().copied().unwrap_or(true) {
        let ct = b.op(Op::Transpose { perm: swap_last(tc.rank()) }, std::slice::from_ref(c))?;
        let ga = b.op(Op::MatMul, &[g.clone(), ct])?;
        Some(b.unbroadcast(ga, &ta)?)
    } else {
        None
    };
    if !wanted.get(1).copied().unwrap_or(true) {
        return Ok(vec![ga, None]);
    }
    let known = |t: &TensorType, i: usize| t.dims.get(i).copied().flatten();
    let gc = match (tc.rank(), known(&tc, 0), known(&tc, 1)) {
        // A weight shared by every row of a batched `a` ([.., M, K]
        // @ [K, N]): its gradient is one GEMM over all rows,
        // reshape(a, [-1, K])ᵀ @ reshape(g, [-1, N]), not a batch
        // of [K, N] products summed afterwards (8x the output
        // written and read again in W10's train step).
        (2, Some(k), Some(n)) if ta.rank() > 2 => {
            let n = n as i64;
            let rows = b.op(Op::Reshape { shape: vec![-1, k as i64] }, std::slice::from_ref(a))?;
            let rows_t = b.op(Op::Transpose { perm: vec![1, 0] }, &[rows])?;
            let g_rows = b.op(Op::Reshape { shape: vec![-1, n] }, &[g])?;
            b.op(Op::MatMul, &[rows_t, g_rows])?
        }
        _ => {
            let at = b.op(Op::Transpose { perm: swap_last(ta.rank()) }, std::slice::from_ref(a))?;
            b.op(Op::MatMul, &[at, g])?
        }
    };
    Ok(vec![ga, Some(b.unbroadcast(gc, &tc)?)])
}
