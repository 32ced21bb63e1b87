//! Control flow: `If`, `Loop` and `Scan`.
//!
//! `If` with a predicate known at trace time (a constant, or computed from
//! shapes, as ONNX's function bodies do) evaluates only the taken branch,
//! so the branches may differ in shape; a predicate computed from data
//! becomes one `cond` node, whose branches must agree in dtypes and
//! (known) shapes.
//!
//! `Loop` needs its trip count and initial condition at trace time (so
//! graph inputs feeding them are static) and is unrolled, up to
//! [`MAX_UNROLL`] iterations: each iteration's body is evaluated with its
//! iteration number known, it stops where the body's condition is known
//! false, and scan outputs are the iterations' values stacked. A
//! condition computed from data is refused (the scan outputs would have a
//! data-dependent length).
//!
//! `Scan` (opset 9 on) is one `fori_loop`: its body subgraph is evaluated
//! inside the loop's traced body, once per trace whatever the length, on
//! the carried states and each scan input's slice (scan axes moved to the
//! front, reversed where a direction says so), and each scan output's
//! slice is written into a buffer at the step's index. Values the body
//! reads from the enclosing graph are captured, as `fori_loop` captures.
//!
//! The body is evaluated once before the loop, on the first slices, to
//! learn the scan outputs' shapes (the buffers are carried by the loop)
//! and to report what the body cannot do as an error rather than inside
//! the loop; the dead copy is removed by the graph passes. Scan-8 (its
//! batched form with `sequence_lens`) and empty scans are refused.

use tracejit_tensor::DType;
use tracejit_trace::{cond, fori_loop, Tensor};

use crate::import::node::{normalize_axis, Node, OpResult};
use crate::import::ops::indexing::flip;
use crate::import::program::Program;

/// The attributes `If` reads.
pub(crate) const IF_ATTRS: &[&str] = &["else_branch", "then_branch"];

/// A branch of `If`, prepared (import checked it already).
fn branch(n: &Node, name: &str) -> Result<Program, String> {
    let g =
        n.attrs.get(name).and_then(|a| a.g.as_ref()).ok_or_else(|| format!("the attribute '{name}' is required"))?;
    let p = Program::subgraph(g, n.opsets).map_err(|e| format!("{name}: {e}"))?;
    if !p.inputs.is_empty() || p.outputs.len() != n.num_outputs {
        return Err(format!(
            "{name} must take no inputs and give the node's {} outputs, not {} and {}",
            n.num_outputs,
            p.inputs.len(),
            p.outputs.len()
        ));
    }
    Ok(p)
}

/// `If`.
pub(crate) fn if_(n: &mut Node) -> OpResult {
    let pred = n.input(0)?;
    if pred.dtype() != DType::Bool || pred.len() != 1 {
        return Err(format!("cond must be one bool, got {} {:?}", pred.dtype(), pred.shape()));
    }
    let (then_p, else_p) = (branch(n, "then_branch")?, branch(n, "else_branch")?);
    let run = |p: &Program, name: &str| p.evaluate_with(vec![], &n.captures).map_err(|e| format!("{name}: {e}"));
    if !pred.is_symbolic() {
        let taken = pred.reshape(&[]).to_scalar::<bool>().map_err(|e| e.to_string())?;
        return if taken { run(&then_p, "then_branch") } else { run(&else_p, "else_branch") };
    }
    // A branch's error surfaces as a panic inside `cond`, which the node's
    // evaluation turns into an error naming it.
    let or_panic = |r: Result<Vec<Tensor>, String>| r.unwrap_or_else(|e| panic!("{e}"));
    Ok(cond(&pred.reshape(&[]), || or_panic(run(&then_p, "then_branch")), || or_panic(run(&else_p, "else_branch"))))
}

/// The most iterations a `Loop` is unrolled to.
pub const MAX_UNROLL: usize = 4096;

/// `Loop`: the final loop-carried values, then the scan outputs.
pub(crate) fn loop_(n: &mut Node) -> OpResult {
    let g = n.attrs.get("body").and_then(|a| a.g.as_ref()).ok_or("the attribute 'body' is required")?;
    let body = Program::subgraph(g, n.opsets).map_err(|e| format!("body: {e}"))?;
    let trips = match n.opt_input(0) {
        Some(_) => Some(n.known_scalar(0)?.max(0.0) as u64),
        None => None,
    };
    let mut go = match n.opt_input(1) {
        Some(c) if c.dtype() == DType::Bool && c.len() == 1 && !c.is_symbolic() => {
            c.reshape(&[]).to_scalar::<bool>().map_err(|e| e.to_string())?
        }
        Some(c) => return Err(format!("cond must be one bool known at trace time, got {} {:?}", c.dtype(), c.shape())),
        None => true,
    };
    let mut carried: Vec<Tensor> = (2..n.inputs.len()).map(|i| n.input(i).cloned()).collect::<Result<_, _>>()?;
    let nv = carried.len();
    if body.inputs.len() != nv + 2 || body.outputs.len() < nv + 1 {
        return Err(format!(
            "{nv} loop-carried values do not fit a body of {} inputs and {} outputs",
            body.inputs.len(),
            body.outputs.len()
        ));
    }
    let limit = trips.unwrap_or(u64::MAX).min(MAX_UNROLL as u64 + 1);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); body.outputs.len() - nv - 1];
    let mut i = 0u64;
    while go && i < limit {
        if i == MAX_UNROLL as u64 {
            return Err(format!("Loop runs more than {MAX_UNROLL} iterations, the most the importer unrolls"));
        }
        let mut args = vec![Tensor::scalar(i as i64), Tensor::scalar(true)];
        args.extend(carried.iter().cloned());
        let outs = body.evaluate_with(args, &n.captures).map_err(|e| format!("body: {e}"))?;
        let c = &outs[0];
        if c.is_symbolic() || c.dtype() != DType::Bool || c.len() != 1 {
            return Err("the body's condition must be one bool known at trace time (not computed from data)".into());
        }
        go = c.reshape(&[]).to_scalar::<bool>().map_err(|e| e.to_string())?;
        carried = outs[1..=nv].to_vec();
        for (scan, y) in scans.iter_mut().zip(&outs[nv + 1..]) {
            scan.push(y.clone());
        }
        i += 1;
    }
    let mut outs = carried;
    for scan in scans {
        if scan.is_empty() {
            return Err("a Loop of zero iterations with scan outputs is not supported (their shape is unknown)".into());
        }
        outs.push(Tensor::stack(&scan, 0));
    }
    Ok(outs)
}

/// The attributes `Scan` reads.
pub(crate) const SCAN_ATTRS: &[&str] = &[
    "body",
    "num_scan_inputs",
    "scan_input_axes",
    "scan_input_directions",
    "scan_output_axes",
    "scan_output_directions",
];

/// The import-time check: an opset with Scan's unbatched form, and a
/// positive number of scan inputs.
pub(crate) fn check_scan(n: &Node) -> Result<(), String> {
    if n.opset < 9 {
        return Err("Scan before opset 9 (batched, with sequence_lens) is not supported".into());
    }
    if !n.has_attr("body") {
        return Err("the attribute 'body' is required".into());
    }
    match n.attr_i("num_scan_inputs", 0)? {
        m if m > 0 => Ok(()),
        m => Err(format!("num_scan_inputs {m} must be positive")),
    }
}

/// `axes` (one per tensor, default 0) and `directions` (0 forward, 1
/// reverse) of `count` tensors.
fn per_tensor(n: &Node, name: &str, count: usize) -> Result<Vec<i64>, String> {
    match n.attr_ints(name)? {
        None => Ok(vec![0; count]),
        Some(v) if v.len() == count => Ok(v),
        Some(v) => Err(format!("{name} has {} entries for {count} tensors", v.len())),
    }
}

/// `t` with axis `from` moved to the front (`to_front`) or the front axis
/// moved to `from`.
fn move_axis(t: &Tensor, axis: usize, to_front: bool) -> Tensor {
    let r = t.rank();
    let mut rest: Vec<i64> = (0..r as i64).filter(|&a| a != if to_front { axis as i64 } else { 0 }).collect();
    let perm: Vec<i64> = if to_front {
        std::iter::once(axis as i64).chain(rest).collect()
    } else {
        rest.insert(axis, 0);
        rest
    };
    if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        t.clone()
    } else {
        t.transpose(&perm)
    }
}

/// Slice `i` (a traced i64 scalar) of `t` along its front axis.
fn slice_at(t: &Tensor, i: &Tensor) -> Tensor {
    let mut unit = vec![0i64; t.rank()];
    unit[0] = 1;
    let starts = i.reshape(&[1]) * Tensor::from_vec(unit, &[t.rank()]);
    let mut sizes = t.shape().to_vec();
    sizes[0] = 1;
    t.dynamic_slice(&starts, &sizes).squeeze(&[0])
}

/// `Scan`: the final states, then the scan outputs.
pub(crate) fn scan(n: &mut Node) -> OpResult {
    let g = n.attrs.get("body").and_then(|a| a.g.as_ref()).ok_or("the attribute 'body' is required")?;
    let body = Program::subgraph(g, n.opsets).map_err(|e| format!("body: {e}"))?;
    let m = n.attr_i("num_scan_inputs", 0)? as usize;
    let all: Vec<Tensor> = (0..n.inputs.len()).map(|i| n.input(i).cloned()).collect::<Result<_, _>>()?;
    if all.len() < m || body.inputs.len() != all.len() || body.outputs.len() < all.len() - m {
        return Err(format!(
            "{} inputs with {m} scan inputs do not fit a body of {} inputs and {} outputs",
            all.len(),
            body.inputs.len(),
            body.outputs.len()
        ));
    }
    let states = all[..all.len() - m].to_vec();
    let k = body.outputs.len() - states.len();
    let (in_axes, in_dirs) = (per_tensor(n, "scan_input_axes", m)?, per_tensor(n, "scan_input_directions", m)?);
    let (out_axes, out_dirs) = (per_tensor(n, "scan_output_axes", k)?, per_tensor(n, "scan_output_directions", k)?);
    let mut xs = Vec::with_capacity(m);
    for (j, x) in all[states.len()..].iter().enumerate() {
        let front = move_axis(x, normalize_axis(in_axes[j], x.rank())?, true);
        xs.push(if in_dirs[j] == 1 { flip(&front, 0) } else { front });
    }
    let len = xs[0].shape().first().copied().unwrap_or(0);
    if xs.iter().any(|x| x.shape().first() != Some(&len)) || len == 0 {
        let lens: Vec<Option<usize>> = xs.iter().map(|x| x.shape().first().copied()).collect();
        return Err(format!("the scan inputs must share one non-zero length along their scan axes, got {lens:?}"));
    }
    let run = |states: &[Tensor], i: &Tensor| -> Result<Vec<Tensor>, String> {
        let mut args = states.to_vec();
        args.extend(xs.iter().map(|x| slice_at(x, i)));
        body.evaluate_with(args, &n.captures).map_err(|e| format!("body: {e}"))
    };
    // The first step, outside the loop: errors and the outputs' shapes.
    let first = run(&states, &Tensor::scalar(0i64))?;
    for (s, f) in states.iter().zip(&first) {
        if s.shape() != f.shape() || s.dtype() != f.dtype() {
            return Err(format!(
                "the body turns a state {} {:?} into {} {:?}",
                s.dtype(),
                s.shape(),
                f.dtype(),
                f.shape()
            ));
        }
    }
    let buffers: Vec<Tensor> =
        first[states.len()..].iter().map(|y| Tensor::zeros(&[&[len][..], y.shape()].concat(), y.dtype())).collect();
    let nstate = states.len();
    let (states, buffers) = fori_loop(
        0,
        len as i64,
        |i, (states, buffers): (Vec<Tensor>, Vec<Tensor>)| {
            // The first step succeeded on the same shapes, so this does too.
            let outs = run(&states, &i).unwrap_or_else(|e| panic!("{e}"));
            let written = buffers
                .iter()
                .zip(&outs[nstate..])
                .map(|(buf, y)| {
                    let mut unit = vec![0i64; buf.rank()];
                    unit[0] = 1;
                    let starts = i.reshape(&[1]) * Tensor::from_vec(unit, &[buf.rank()]);
                    buf.dynamic_update_slice(&y.expand_dims(0), &starts)
                })
                .collect();
            (outs[..nstate].to_vec(), written)
        },
        (states, buffers),
    );
    let mut outs = states;
    for (j, y) in buffers.into_iter().enumerate() {
        let y = if out_dirs[j] == 1 { flip(&y, 0) } else { y };
        outs.push(move_axis(&y, normalize_axis(out_axes[j], y.rank())?, false));
    }
    Ok(outs)
}
