//! The native kernels of the attention composites: the argument checks,
//! broadcasting of the leading axes and the mask's strides around
//! `tracejit_kernels::attention::{forward, backward}` (f32; bf16 and f16
//! widened to it and rounded back; f64 in [`super::wide`]). They work on
//! the arguments' [`Storage`] with `tracejit_tensor`'s reference kernels
//! (cast, broadcast, sum): the ops eager tensors would run, without a
//! tensor around them.

use std::borrow::Cow;

use tracejit_kernels::attention::{self, Bias, Mask, Operand, Problem};
use tracejit_kernels::Isa;
use tracejit_tensor::{kernels, DType, ReduceOp, SliceSpec, Storage, StorageElement};
use tracejit_trace::TensorSpec;

/// `q, k, v` of rank ≥ 2, `scale` a scalar and then `extra` operands of
/// rank ≥ 1 (the backward's `out`, `lse`, `dout`), all of one float dtype
/// among `dtypes`; `causal` a bool scalar; then an optional bool mask (the
/// backward kernel has no float one).
fn accepts_with(s: &[TensorSpec], extra: usize, dtypes: &[DType]) -> bool {
    let base = 5 + extra;
    if s.len() != base && s.len() != base + 1 {
        return false;
    }
    let dtype = s[0].dtype();
    let rank2 = |t: &TensorSpec| t.dtype() == dtype && t.dims().len() >= 2;
    dtypes.contains(&dtype)
        && s[..3].iter().all(rank2)
        && s[3].dtype() == dtype
        && s[3].dims().is_empty()
        && s[4].dtype() == DType::Bool
        && s[4].dims().is_empty()
        && s[5..base].iter().all(|t| t.dtype() == dtype && !t.dims().is_empty())
        && s[base..].iter().all(|m| m.dtype() == DType::Bool)
}

/// The forward kernel's arguments (see [`accepts_with`]): f32, bf16 and
/// f16 (through the f32 kernel, each result rounded), f64 (its own tiled
/// kernel, [`super::wide`]); a float mask (added to the scores) of `q`'s
/// dtype on the f32 kernel only.
pub(super) fn forward_accepts(s: &[TensorSpec]) -> bool {
    if let Some(bias) = s.get(5).filter(|m| m.dtype() != DType::Bool) {
        let low = [DType::F32, DType::BF16, DType::F16];
        return s.len() == 6 && bias.dtype() == s[0].dtype() && accepts_with(&s[..5], 0, &low);
    }
    accepts_with(s, 0, &[DType::F32, DType::BF16, DType::F16, DType::F64])
}

/// The backward kernel's arguments (see [`accepts_with`]): f32, bf16 and
/// f16 (through the f32 kernel), f64 (its own, [`super::wide`]).
pub(super) fn backward_accepts(s: &[TensorSpec]) -> bool {
    accepts_with(s, 3, &[DType::F32, DType::BF16, DType::F16, DType::F64])
}

/// `run` on `inputs` with its 16-bit float operands widened to f32, each
/// f32 result rounded back to `low` (how every op computes bf16: in f32,
/// rounded once).
fn widened(inputs: &[Storage], low: DType, run: impl FnOnce(&[Storage]) -> Vec<Storage>) -> Vec<Storage> {
    let wide: Vec<Storage> =
        inputs.iter().map(|s| if s.dtype() == low { kernels::cast(s, DType::F32) } else { s.clone() }).collect();
    run(&wide).into_iter().map(|s| if s.dtype() == DType::F32 { kernels::cast(&s, low) } else { s }).collect()
}

/// The one element of the scalar argument `s` (`what`), as `T`.
pub(super) fn scalar<T: StorageElement>(s: &Storage, what: &str) -> T {
    match s.to_vec::<T>().as_deref() {
        Ok(&[v]) => v,
        _ => panic!(
            "scaled_dot_product_attention: {what} must be a {} scalar, got {}{:?}",
            T::DTYPE,
            s.dtype(),
            s.shape()
        ),
    }
}

/// The sizes of one call, the leading axes broadcast.
pub(super) struct Geometry {
    pub(super) lead: Vec<usize>,
    pub(super) problem: Problem,
}

impl Geometry {
    /// From `(q, k, v, scale, causal)` and the mask, if any.
    pub(super) fn of(a: &[Storage], mask: Option<&Storage>) -> Geometry {
        let (q, k, v, scale, causal) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        let split = |s: &[usize]| (s[..s.len() - 2].to_vec(), s[s.len() - 2], s[s.len() - 1]);
        let ((ql, tq, d), (kl, tk, kd), (vl, vt, dv)) = (split(qs), split(ks), split(vs));
        assert!(d == kd && tk == vt, "scaled_dot_product_attention: q {qs:?}, k {ks:?}, v {vs:?} do not fit");
        let mut lead = broadcast(&broadcast(&ql, &kl), &vl);
        if let Some(m) = mask.map(|m| m.shape()).filter(|m| m.len() > 2) {
            lead = broadcast(&lead, &m[..m.len() - 2]);
        }
        let scale = scalar::<f32>(&kernels::cast(scale, DType::F32), "scale");
        let causal = scalar::<bool>(causal, "causal");
        let batch = lead.iter().product();
        Geometry { lead, problem: Problem { batch, tq, tk, d, dv, scale, causal } }
    }

    /// `lead ++ tail`.
    pub(super) fn shape(&self, tail: &[usize]) -> Vec<usize> {
        self.lead.iter().chain(tail).copied().collect()
    }

    /// The log-sum-exp `[lead.., tq]` computed per problem, in the body's
    /// shape: the scores' leading axes (q's, k's and the mask's) without
    /// the ones only `v` brings, along which every problem's is the same
    /// (the first is kept).
    pub(super) fn lse_as_body(&self, lse: Storage, a: &[Storage], mask: Option<&Storage>) -> Storage {
        let lead = |s: &[usize]| s[..s.len().saturating_sub(2)].to_vec();
        let mut scores = broadcast(&lead(a[0].shape()), &lead(a[1].shape()));
        if let Some(m) = mask.map(|m| m.shape()).filter(|m| m.len() > 2) {
            scores = broadcast(&scores, &m[..m.len() - 2]);
        }
        if scores == self.lead {
            return lse;
        }
        let extra = self.lead.len() - scores.len();
        let specs: Vec<SliceSpec> = (0..=self.lead.len())
            .map(|i| match i.checked_sub(extra).and_then(|j| scores.get(j)) {
                Some(&d) if i < self.lead.len() && d != self.lead[i] => {
                    SliceSpec { start: Some(0), stop: Some(1), step: 1 }
                }
                None if i < extra => SliceSpec { start: Some(0), stop: Some(1), step: 1 },
                _ => SliceSpec::FULL,
            })
            .collect();
        let first = kernels::slice(&lse, &specs);
        let shape: Vec<usize> = scores.iter().copied().chain([self.problem.tq]).collect();
        kernels::reshape(&first.to_standard(), &shape)
    }
}

/// The numpy broadcast of two leading shapes.
fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() < n { 1 } else { s[i + s.len() - n] };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            assert!(
                x == y || x == 1 || y == 1,
                "scaled_dot_product_attention: leading axes {a:?} and {b:?} do not broadcast"
            );
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect()
}

/// `s`'s f32 elements, contiguous (borrowed when they already are),
/// broadcast to `shape` when needed.
fn f32s<'a>(s: &'a Storage, shape: &[usize]) -> Cow<'a, [f32]> {
    if s.shape() != shape {
        let b = kernels::broadcast_to(s, shape);
        return Cow::Owned(b.to_vec::<f32>().expect("the predicate accepted f32 only"));
    }
    match s.array::<f32>().and_then(|a| a.as_slice()) {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(s.to_vec::<f32>().expect("the predicate accepted f32 only")),
    }
}

/// An operand held for one call: `t`'s own buffer read in place when its
/// rows' values are contiguous (a transposed view of a fused projection,
/// say), else a contiguous copy. Copying q, k, v and dout took W10's
/// attention about 1.5 ms per layer and step, on one thread.
struct Held<'a> {
    data: Cow<'a, [f32]>,
    starts: Vec<usize>,
    row_stride: usize,
}

impl<'a> Held<'a> {
    /// `t` as an operand of `shape` (`[lead.., rows, cols]`).
    fn of(t: &'a Storage, shape: &[usize]) -> Held<'a> {
        if let Some(held) = Held::in_place(t, shape) {
            return held;
        }
        let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let batch: usize = shape[..shape.len() - 2].iter().product();
        let starts = (0..batch).map(|b| b * rows * cols).collect();
        Held { data: f32s(t, shape), starts, row_stride: cols }
    }

    /// `t`'s buffer, when `t` has `shape`, no negative stride and its last
    /// axis contiguous: problem starts over the leading axes in row-major
    /// order, the row stride of the second-to-last axis.
    fn in_place(t: &'a Storage, shape: &[usize]) -> Option<Held<'a>> {
        let a = t.array::<f32>()?;
        let r = shape.len();
        if t.shape() != shape || r < 2 || a.is_empty() {
            return None;
        }
        let strides: Vec<usize> = a.strides().iter().map(|&s| usize::try_from(s).ok()).collect::<Option<_>>()?;
        if shape[r - 1] > 1 && strides[r - 1] != 1 {
            return None;
        }
        let extent = shape.iter().zip(&strides).map(|(&n, &s)| (n - 1) * s).sum::<usize>() + 1;
        // SAFETY: every element of the view lies at `Σ index·stride <
        // extent` from its first (strides non-negative), so the range is
        // inside the array's buffer, whose values are all initialized f32;
        // the borrow of `t` keeps the buffer alive.
        let data = unsafe { std::slice::from_raw_parts(a.as_ptr(), extent) };
        let mut starts = vec![0usize];
        for (&n, &s) in shape[..r - 2].iter().zip(&strides) {
            starts = starts.iter().flat_map(|&b| (0..n).map(move |i| b + i * s)).collect();
        }
        Some(Held { data: Cow::Borrowed(data), starts, row_stride: strides[r - 2] })
    }

    fn operand(&self) -> Operand<'_> {
        Operand { data: &self.data, starts: &self.starts, row_stride: self.row_stride }
    }
}

/// The mask's flags and strides: its leading axes broadcast to the call's
/// only when they are not all 1; its own query and key axes kept, with
/// stride 0 where they are 1.
pub(super) fn mask_of<'a>(m: &'a Storage, g: &Geometry) -> (Cow<'a, [bool]>, [usize; 3]) {
    strided_of(m, g)
}

/// A bool mask's flags or a float mask's values (f32), laid out as
/// [`mask_of`] says.
fn strided_of<'a, T: StorageElement>(m: &'a Storage, g: &Geometry) -> (Cow<'a, [T]>, [usize; 3]) {
    let p = &g.problem;
    let mut shape = m.shape().to_vec();
    while shape.len() < 2 {
        shape.insert(0, 1);
    }
    let (mq, mk) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    assert!(
        (mq == 1 || mq == p.tq) && (mk == 1 || mk == p.tk),
        "scaled_dot_product_attention: mask {:?} does not broadcast to [.., {}, {}]",
        m.shape(),
        p.tq,
        p.tk
    );
    let lead_ones = shape[..shape.len() - 2].iter().all(|&d| d == 1);
    let flat = if lead_ones { kernels::reshape(m, &[mq * mk]) } else { kernels::broadcast_to(m, &g.shape(&[mq, mk])) };
    let values: Vec<T> = flat.to_vec::<T>().expect("the predicate accepted the mask's dtype");
    let strides = [if lead_ones { 0 } else { mq * mk }, if mq == 1 { 0 } else { mk }, if mk == 1 { 0 } else { 1 }];
    (Cow::Owned(values), strides)
}

fn storage(v: Vec<f32>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("kernel output size")
}

/// The forward: `(out [.., Tq, dv], lse [.., Tq])`.
pub(super) fn forward(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    match inputs[0].dtype() {
        DType::F32 => forward_with(inputs, isa, attention::forward_strided_biased),
        DType::F64 => super::wide::forward(inputs),
        low => widened(inputs, low, |w| forward_with(w, isa, attention::forward_strided_biased)),
    }
}

/// The forward with `q·kᵀ` and `P·v` on bf16 operands, f32 accumulation
/// (`attention::forward_strided_bf16_biased`): the kernel under mixed
/// precision.
pub(super) fn forward_bf16(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    forward_with(inputs, isa, attention::forward_strided_bf16_biased)
}

/// The kernel crate's forward entry points.
type ForwardFn = fn(
    &Problem,
    Operand<'_>,
    Operand<'_>,
    Operand<'_>,
    Option<&Mask<'_>>,
    Option<&Bias<'_>>,
    &mut [f32],
    &mut [f32],
    Isa,
);

/// The forward through `run`.
fn forward_with(inputs: &[Storage], isa: Isa, run: ForwardFn) -> Vec<Storage> {
    let g = Geometry::of(inputs, inputs.get(5));
    let p = g.problem;
    let q = Held::of(&inputs[0], &g.shape(&[p.tq, p.d]));
    let k = Held::of(&inputs[1], &g.shape(&[p.tk, p.d]));
    let v = Held::of(&inputs[2], &g.shape(&[p.tk, p.dv]));
    let last = inputs.get(5);
    let mask = last.filter(|m| m.dtype() == DType::Bool).map(|m| mask_of(m, &g));
    let mask = mask.as_ref().map(|(data, [b, r, c])| Mask { data, batch_stride: *b, row_stride: *r, col_stride: *c });
    let bias = last.filter(|m| m.dtype() != DType::Bool).map(|m| strided_of::<f32>(m, &g));
    let bias = bias.as_ref().map(|(data, [b, r, c])| Bias { data, batch_stride: *b, row_stride: *r, col_stride: *c });
    let mut out = vec![0.0f32; p.batch * p.tq * p.dv];
    let mut lse = vec![0.0f32; p.batch * p.tq];
    let (q, k, v) = (q.operand(), k.operand(), v.operand());
    run(&p, q, k, v, mask.as_ref(), bias.as_ref(), &mut out, &mut lse, isa);
    let lse = g.lse_as_body(storage(lse, &g.shape(&[p.tq])), inputs, last);
    vec![storage(out, &g.shape(&[p.tq, p.dv])), lse]
}

/// The backward: `(dq, dk, dv)` in the shapes of `q`, `k` and `v` (summed
/// over the leading axes they were broadcast along).
pub(super) fn backward(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    match inputs[0].dtype() {
        DType::F32 => backward_f32(inputs, isa),
        DType::F64 => super::wide::backward(inputs),
        low => widened(inputs, low, |w| backward_f32(w, isa)),
    }
}

/// [`backward`] of f32 operands.
fn backward_f32(inputs: &[Storage], isa: Isa) -> Vec<Storage> {
    let g = Geometry::of(inputs, inputs.get(8));
    let p = g.problem;
    let q = Held::of(&inputs[0], &g.shape(&[p.tq, p.d]));
    let k = Held::of(&inputs[1], &g.shape(&[p.tk, p.d]));
    let v = Held::of(&inputs[2], &g.shape(&[p.tk, p.dv]));
    let out = Held::of(&inputs[5], &g.shape(&[p.tq, p.dv]));
    let lse = f32s(&inputs[6], &g.shape(&[p.tq]));
    let dout = Held::of(&inputs[7], &g.shape(&[p.tq, p.dv]));
    let mask = inputs.get(8).map(|m| mask_of(m, &g));
    let mask = mask.as_ref().map(|(data, [b, r, c])| Mask { data, batch_stride: *b, row_stride: *r, col_stride: *c });
    let (mut dq, mut dk, mut dv) =
        (vec![0.0f32; p.batch * p.tq * p.d], vec![0.0f32; p.batch * p.tk * p.d], vec![0.0f32; p.batch * p.tk * p.dv]);
    let (q, k, v, out, dout) = (q.operand(), k.operand(), v.operand(), out.operand(), dout.operand());
    attention::backward_strided(&p, q, k, v, mask.as_ref(), out, &lse, dout, &mut dq, &mut dk, &mut dv, isa);
    let dq = storage(dq, &g.shape(&[p.tq, p.d]));
    let dk = storage(dk, &g.shape(&[p.tk, p.d]));
    let dv = storage(dv, &g.shape(&[p.tk, p.dv]));
    vec![sum_to(dq, &inputs[0]), sum_to(dk, &inputs[1]), sum_to(dv, &inputs[2])]
}

/// `t` summed down to `like`'s shape (a no-op without broadcasting): the
/// leading axes `like` lacks, then the axes it has of size 1.
pub(super) fn sum_to(t: Storage, like: &Storage) -> Storage {
    if t.shape() == like.shape() {
        return t;
    }
    let extra = t.rank() - like.rank();
    let t = if extra > 0 { kernels::reduce(ReduceOp::Sum, &t, &(0..extra).collect::<Vec<_>>(), false) } else { t };
    let stretched: Vec<usize> = (0..like.rank()).filter(|&i| like.shape()[i] == 1 && t.shape()[i] != 1).collect();
    if stretched.is_empty() {
        t
    } else {
        kernels::reduce(ReduceOp::Sum, &t, &stretched, true)
    }
}
