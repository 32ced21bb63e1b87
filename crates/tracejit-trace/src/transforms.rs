//! JAX's differentiation transforms over closures: [`grad`], [`jvp`],
//! [`jacrev`], [`jacfwd`] and [`hessian`], built on [`GradientTape`]s, so
//! they work eagerly, inside traced functions (one trace) and nested in
//! each other and in tapes.
//!
//! - `grad(f)` is one reverse pass.
//! - `jvp(f, x, v)` is forward mode by transposing the VJP, exact because
//!   the VJP is linear in its cotangent: with `g(u) = Jᵀu` (the gradient
//!   of `sum(f(x) · u)`, recorded by an outer tape watching `u`), `J·v` is
//!   the gradient of `sum(g(u) · v)` with respect to `u`. It costs about
//!   two reverse passes and needs every VJP on the path to be
//!   differentiable (all primitives' are; a composite's native backward
//!   kernel is differentiated through its body).
//! - `jacrev(f)` takes one VJP per output element, `jacfwd(f)` one JVP per
//!   input element (a row or column at a time until `vmap` batches them),
//!   so pick the one with the smaller count: `jacrev` for few outputs.
//!   Each runs `f` once per call, so its effects (random draws, state
//!   updates) happen once and every row or column sees the same ones.
//! - `hessian(f)` is `jacrev(grad(f))`.

use crate::tape::GradientTape;
use crate::tensor::Tensor;

/// The gradient of a scalar function: `grad(f)(x)` is `df/dx`, of `x`'s
/// shape and dtype (zeros where `f` does not depend on `x`). `x` must be
/// a float tensor and `f(x)` a float scalar.
///
/// ```
/// use tracejit_trace::{grad, Tensor};
///
/// let df = grad(|x: &Tensor| (x * x * x).sum_all());
/// let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]);
/// assert_eq!(df(&x).to_vec::<f64>()?, [3.0, 12.0]);
/// let d2f = grad(move |x: &Tensor| df(x).sum_all()); // higher order
/// assert_eq!(d2f(&x).to_vec::<f64>()?, [6.0, 12.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn grad<F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static,
{
    move |x: &Tensor| {
        let tape = GradientTape::new();
        tape.watch(x);
        let y = f(x);
        assert!(
            y.tensor_type().rank() == 0,
            "grad: the function must return a scalar, got {}; use jacrev for a vector function",
            y.tensor_type()
        );
        first_gradient(&tape, &y, x, "grad")
    }
}

/// The gradient of `target` with respect to `x` from `tape`, dense.
fn first_gradient(tape: &GradientTape, target: &Tensor, x: &Tensor, what: &str) -> Tensor {
    match tape.gradient(target, &[x]) {
        Ok(mut g) => g.remove(0).unwrap_or_else(|| Tensor::zeros_like(x)),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// `f(x)` and the Jacobian-vector product `J·v` (forward mode): `v` has
/// `x`'s shape, the product `f(x)`'s.
///
/// ```
/// use tracejit_trace::{jvp, Tensor};
///
/// let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]);
/// let v = Tensor::from_vec(vec![1.0f64, 0.0], &[2]);
/// let (y, y_dot) = jvp(|x: &Tensor| x * x, &x, &v);
/// assert_eq!((y.to_vec::<f64>()?, y_dot.to_vec::<f64>()?), (vec![1.0, 4.0], vec![2.0, 0.0]));
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn jvp(f: impl Fn(&Tensor) -> Tensor, x: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
    assert!(
        v.dtype() == x.dtype() && v.dims() == x.dims(),
        "jvp: the tangent is {}, the primal {}; they must have one type",
        v.tensor_type(),
        x.tensor_type()
    );
    let t = Transposed::new(f, x, false, "jvp");
    let jv = first_gradient(&t.outer, &(&t.jt_u * v).sum_all(), &t.u, "jvp");
    (t.y, jv)
}

/// One run of `f` at `x` set up for forward mode by transposition:
/// `jt_u = Jᵀu` for a watched `u`, so `J·v` is the gradient of
/// `sum(jt_u · v)` with respect to `u` (one reverse pass per tangent `v`,
/// however many tangents, with `f` and its effects run once).
struct Transposed {
    y: Tensor,
    u: Tensor,
    jt_u: Tensor,
    /// The tape watching `u` (persistent when several tangents are asked).
    outer: GradientTape,
}

impl Transposed {
    fn new(f: impl Fn(&Tensor) -> Tensor, x: &Tensor, persistent: bool, what: &str) -> Transposed {
        let outer = if persistent { GradientTape::persistent() } else { GradientTape::new() };
        let inner = GradientTape::new();
        inner.watch(x);
        let y = f(x);
        assert!(y.dtype().is_float(), "{what}: the function returns {}, not a float tensor", y.tensor_type());
        // The cotangent the transposition differentiates against: its value
        // does not matter (Jᵀu is linear in u), zeros are cheapest.
        let u = Tensor::zeros_like(&y);
        outer.watch(&u);
        let jt_u = first_gradient(&inner, &(&y * &u).sum_all(), x, what);
        Transposed { y, u, jt_u, outer }
    }
}

/// The Jacobian by reverse mode: `jacrev(f)(x)` has shape `f(x)`'s dims
/// followed by `x`'s, one VJP per output element.
///
/// ```
/// use tracejit_trace::{jacrev, Tensor};
///
/// let j = jacrev(|x: &Tensor| x * x)(&Tensor::from_vec(vec![1.0f64, 3.0], &[2]));
/// assert_eq!((j.shape(), j.to_vec::<f64>()?), (&[2usize, 2][..], vec![2.0, 0.0, 0.0, 6.0]));
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn jacrev<F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static,
{
    move |x: &Tensor| {
        let tape = GradientTape::persistent();
        tape.watch(x);
        let y = f(x);
        let (n, out_dims) = known_dims(&y, "jacrev", "output");
        let flat = y.reshape(&[n as i64]);
        let rows: Vec<Tensor> = (0..n)
            .map(|i| first_gradient(&tape, &flat.slice_axis(0, i as i64, i as i64 + 1).sum_all(), x, "jacrev"))
            .collect();
        jacobian(rows, &out_dims, x)
    }
}

/// The Jacobian by forward mode: `jacfwd(f)(x)` has shape `f(x)`'s dims
/// followed by `x`'s, one JVP per input element.
///
/// ```
/// use tracejit_trace::{jacfwd, Tensor};
///
/// let j = jacfwd(|x: &Tensor| x.sum_all() * x)(&Tensor::from_vec(vec![1.0f64, 2.0], &[2]));
/// assert_eq!(j.to_vec::<f64>()?, [4.0, 1.0, 2.0, 5.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn jacfwd<F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static,
{
    move |x: &Tensor| {
        let (n, in_dims) = known_dims(x, "jacfwd", "input");
        // `f` runs once (its draws and state updates happen once per call,
        // as in jvp and jacrev); column j is the JVP along the j-th basis
        // vector, the gradient of `(Jᵀu)[j]` with respect to `u`.
        let t = Transposed::new(&f, x, true, "jacfwd");
        let out_dims = known_dims(&t.y, "jacfwd", "output").1;
        let flat = t.jt_u.reshape(&[n as i64]);
        let columns: Vec<Tensor> = (0..n)
            .map(|j| {
                let entry = flat.slice_axis(0, j as i64, j as i64 + 1).sum_all();
                first_gradient(&t.outer, &entry, &t.u, "jacfwd")
            })
            .collect();
        // Columns stacked last: [out.., n], then the input's dims.
        let shape: Vec<i64> = out_dims.iter().chain(&in_dims).map(|&d| d as i64).collect();
        if columns.is_empty() {
            return Tensor::zeros(&shape.iter().map(|&d| d as usize).collect::<Vec<_>>(), x.dtype());
        }
        Tensor::stack(&columns, -1).reshape(&shape)
    }
}

/// The Hessian of a scalar function, `jacrev(grad(f))`: shape `x`'s dims
/// twice.
///
/// ```
/// use tracejit_trace::{hessian, Tensor};
///
/// let h = hessian(|x: &Tensor| (x * x).sum_all() * 0.5)(&Tensor::from_vec(vec![1.0f64, 2.0], &[2]));
/// assert_eq!(h.to_vec::<f64>()?, [1.0, 0.0, 0.0, 1.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
pub fn hessian<F>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static
where
    F: Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static,
{
    jacrev(grad(f))
}

/// `t`'s element count and dims, which must be known (a Jacobian's shape
/// is static).
fn known_dims(t: &Tensor, what: &str, side: &str) -> (usize, Vec<usize>) {
    let dims: Option<Vec<usize>> = t.dims().into_iter().collect();
    let dims = dims.unwrap_or_else(|| {
        panic!("{what}: the {side} is {} with unknown dims; a Jacobian needs them known", t.tensor_type())
    });
    (dims.iter().product(), dims)
}

/// Rows (each of `x`'s shape) stacked into `[out.., in..]`.
fn jacobian(rows: Vec<Tensor>, out_dims: &[usize], x: &Tensor) -> Tensor {
    let in_dims = known_dims(x, "jacrev", "input").1;
    let shape: Vec<usize> = out_dims.iter().chain(&in_dims).copied().collect();
    if rows.is_empty() {
        return Tensor::zeros(&shape, x.dtype());
    }
    Tensor::stack(&rows, 0).reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
}
