//! Loops whose batch rows never meet: found here, and run as one loop
//! per block of rows, each block's whole loop on one thread.
//!
//! Why: a recurrent loop (`h = tanh(x[t] · wx + h · wh + b)`, W8) split
//! step by step across threads pays a fork and a join in every trip (a
//! worker's start, ~1 µs of the caller waiting for the slower half, and
//! the loop's own bookkeeping on the caller alone) for steps of a few
//! µs. When every row of the carried state depends only on the same row
//! of the inputs — products with the state on the left, elementwise
//! math, reductions along other axes — the rows can run as independent
//! loops: one fork and one join per call, and no data crosses cores
//! inside the loop (JAX's W8 runs no faster on two threads than on one:
//! 636 against 590 µs in the README's sitting).
//!
//! The rule, per value, is [`Rows`]: `Free` (the same in every block) or
//! `Axis(a)` (its axis `a` holds the batch's rows, and a block's value is
//! its rows of it). [`rows_of`] gives each op's rule; an op that could mix
//! rows (a reduction over the batch axis, a product with the batch in
//! its depth, a reshape that moves it, variables, calls, native kernels,
//! nested control flow) rejects the split, so a split loop computes every
//! row as the whole loop would. [`trip_costs`] finds products whose
//! blocks could round differently from the whole product; such loops run
//! whole, so that results do not depend on the thread count. [`retype`] then writes
//! the loop's subgraphs for a block of `p` rows: only the batch axes'
//! sizes change (and the shapes written in `broadcast_to` / `reshape`),
//! checked by the IR's verifier.

use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::tensor::SliceSpec;
use tracejit_ir::{Graph, NodeId, Op, TensorType};

use cranelift_entity::EntityRef;

/// Where a value's batch rows lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rows {
    /// The same value in every block (no batch axis).
    Free,
    /// Axis `a` is the batch: a block holds a range of it.
    Axis(usize),
}

/// Every value's [`Rows`] in one graph, and the same for each fused
/// region's body inside it.
#[derive(Clone, Debug)]
pub(crate) struct Annotated {
    /// Per node (by index), per output.
    values: Vec<SmallVec<[Rows; 1]>>,
    /// Fused bodies, by the node that holds them.
    bodies: Vec<(NodeId, Annotated)>,
}

impl Annotated {
    /// The rows of the graph's outputs.
    pub(crate) fn outputs(&self, g: &Graph) -> Vec<Rows> {
        g.outputs.iter().map(|v| self.values[v.node.index()][v.index as usize]).collect()
    }
}

/// Annotates `g` whose params have rows `params` and whose batch has
/// `b` rows; `None` when some op could mix rows, or a type is not fully
/// known.
pub(crate) fn annotate(g: &Graph, params: &[Rows], b: usize) -> Option<Annotated> {
    let mut values: Vec<SmallVec<[Rows; 1]>> = Vec::with_capacity(g.len());
    let mut bodies = Vec::new();
    for (id, node) in g.nodes() {
        debug_assert_eq!(id.index(), values.len(), "nodes in arena order");
        let ins: SmallVec<[(Rows, &TensorType); 3]> =
            node.inputs.iter().map(|v| (values[v.node.index()][v.index as usize], g.value_type(*v))).collect();
        let outs: SmallVec<[Rows; 1]> = match &node.op {
            Op::Parameter { index } => smallvec::smallvec![*params.get(*index)?],
            Op::Fused { body } => {
                let inner: Vec<Rows> = ins.iter().map(|(r, _)| *r).collect();
                let a = annotate(body, &inner, b)?;
                let outs = a.outputs(body).into_iter().collect();
                bodies.push((id, a));
                outs
            }
            op => smallvec::smallvec![rows_of(op, &ins, node.outputs.first()?)?],
        };
        // Every batch axis holds the whole batch; every type is known.
        let fits = node.outputs.len() == outs.len()
            && node.outputs.iter().zip(&outs).all(|(t, r)| {
                t.shape().is_some()
                    && match r {
                        Rows::Free => true,
                        Rows::Axis(a) => t.dims.get(*a) == Some(&Some(b)),
                    }
            });
        if !fits {
            return None;
        }
        values.push(outs);
    }
    Some(Annotated { values, bodies })
}

/// The rows of a one-output op's result from its inputs' (with their
/// types), `None` when the op could mix rows.
fn rows_of(op: &Op, ins: &[(Rows, &TensorType)], out: &TensorType) -> Option<Rows> {
    let axis = |k: usize| match ins.get(k) {
        Some((Rows::Axis(a), _)) => Some(*a),
        _ => None,
    };
    // Side effects and opaque code would run once per block.
    let opaque = matches!(
        op,
        Op::Call { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. }
            | Op::Kernel { .. }
            // A block would draw its own numbers: not those of the whole.
            | Op::Random { .. }
    );
    if opaque {
        return None;
    }
    if ins.iter().all(|(r, _)| *r == Rows::Free) {
        return Some(Rows::Free);
    }
    // Every op is listed: a new op is a compile error until its rule is
    // written here.
    match op {
        Op::Parameter { .. } | Op::Fused { .. } => None,
        Op::Constant { .. } => Some(Rows::Free),
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Clamp { .. } => elementwise(ins, out),
        Op::Reduce { axes, keepdims, .. } => {
            let a = axis(0)?;
            (!axes.contains(&a))
                .then(|| Rows::Axis(if *keepdims { a } else { a - axes.iter().filter(|&&x| x < a).count() }))
        }
        Op::ArgReduce { axis: r, keepdims, .. } => {
            let a = axis(0)?;
            (a != *r).then_some(Rows::Axis(if *keepdims || a < *r { a } else { a - 1 }))
        }
        Op::MatMul => {
            let (ra, rb) = (ins[0].1.rank(), ins[1].1.rank());
            match (ins[0].0, ins[1].0) {
                // The batch among `a`'s rows (or its stacked matrices) and
                // `b` shared: each row of the result reads its own row.
                (Rows::Axis(i), Rows::Free) if rb == 2 && ra >= 2 && i <= ra - 2 => Some(Rows::Axis(i)),
                (Rows::Free, Rows::Axis(1)) if ra == 2 && rb == 2 => Some(Rows::Axis(1)),
                _ => None,
            }
        }
        Op::Transpose { perm } => perm.iter().position(|&p| Some(p) == axis(0)).map(Rows::Axis),
        Op::Gather { axis: g } => {
            let index_rank = ins[1].1.rank();
            match (ins[0].0, ins[1].0) {
                (Rows::Axis(a), Rows::Free) if a < *g => Some(Rows::Axis(a)),
                (Rows::Axis(a), Rows::Free) if a > *g => Some(Rows::Axis(a - 1 + index_rank)),
                (Rows::Free, Rows::Axis(j)) => Some(Rows::Axis(g + j)),
                _ => None,
            }
        }
        Op::ExpandDims { axis: e } => axis(0).map(|a| Rows::Axis(if a >= *e { a + 1 } else { a })),
        Op::Squeeze { axes } => {
            let a = axis(0)?;
            (!axes.contains(&a)).then(|| Rows::Axis(a - axes.iter().filter(|&&x| x < a).count()))
        }
        Op::BroadcastTo { shape } => axis(0).map(|a| Rows::Axis(a + shape.len() - ins[0].1.rank())),
        // Only a reshape within each row: the batch stays axis 0.
        Op::Reshape { .. } => {
            (axis(0) == Some(0) && out.dims.first() == ins[0].1.dims.first()).then_some(Rows::Axis(0))
        }
        Op::Concat { axis: c } => {
            let a = axis(0)?;
            (a != *c && ins.iter().all(|(r, _)| *r == Rows::Axis(a))).then_some(Rows::Axis(a))
        }
        Op::Stack { axis: s } => {
            let a = axis(0)?;
            ins.iter().all(|(r, _)| *r == Rows::Axis(a)).then_some(Rows::Axis(if a >= *s { a + 1 } else { a }))
        }
        Op::Slice { specs } => {
            let a = axis(0)?;
            specs.get(a).is_none_or(|s| *s == SliceSpec::FULL).then_some(Rows::Axis(a))
        }
        Op::OneHot { .. } => axis(0).map(Rows::Axis),
        Op::Pad { pads, .. } => {
            let a = axis(0)?;
            (pads.get(a) == Some(&(0, 0))).then_some(Rows::Axis(a))
        }
        Op::Cumsum { axis: c } => {
            let a = axis(0)?;
            (a != *c).then_some(Rows::Axis(a))
        }
        // Indexing by values and windows by starts may reach other rows.
        Op::GatherElements { .. }
        | Op::ScatterAdd { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::TopK { .. }
        | Op::Spatial(_)
        | Op::Random { .. } => None,
        Op::Call { .. }
        | Op::Cond { .. }
        | Op::While { .. }
        | Op::ReadVariable { .. }
        | Op::AssignVariable { .. }
        | Op::Kernel { .. } => None,
    }
}

/// numpy broadcasting: batched inputs meet at one axis of the result,
/// where every other input has size 1 or no axis.
fn elementwise(ins: &[(Rows, &TensorType)], out: &TensorType) -> Option<Rows> {
    let r = out.rank();
    let mut at: Option<usize> = None;
    for (rows, t) in ins {
        if let Rows::Axis(a) = rows {
            let o = a + r.checked_sub(t.rank())?;
            if at.is_some_and(|x| x != o) {
                return None;
            }
            at = Some(o);
        }
    }
    let Some(o) = at else { return Some(Rows::Free) };
    let free_fits = ins.iter().filter(|(rows, _)| *rows == Rows::Free).all(|(_, t)| {
        let shift = r - t.rank();
        o < shift || t.dims[o - shift] == Some(1)
    });
    free_fits.then_some(Rows::Axis(o))
}

/// `g` (annotated as `a`) for a block of `p` rows: every batch axis of
/// size `p`, and the shapes written into its ops to match; `None` if the
/// result does not verify.
pub(crate) fn retype(g: &Graph, a: &Annotated, p: usize) -> Option<Graph> {
    let mut out = g.clone();
    let ids: Vec<NodeId> = g.nodes().map(|(id, _)| id).collect();
    for id in ids {
        let rows = &a.values[id.index()];
        let node = out.node_mut(id);
        for (t, r) in node.outputs.iter_mut().zip(rows) {
            if let Rows::Axis(x) = r {
                t.dims[*x] = Some(p);
            }
        }
        // The ops that write a size of their output into their attributes,
        // and regions, whose bodies are typed too.
        if let (Op::BroadcastTo { shape }, Some(Rows::Axis(x))) = (&mut node.op, rows.first()) {
            shape[*x] = p;
        } else if let (Op::Reshape { shape }, Some(Rows::Axis(0))) = (&mut node.op, rows.first()) {
            shape[0] = p as i64;
        } else if let Op::Fused { body } = &mut node.op {
            let inner = &a.bodies.iter().find(|(n, _)| *n == id)?.1;
            *body = Arc::new(retype(body, inner, p)?);
        }
    }
    tracejit_ir::verify(&out).ok()?;
    Some(out)
}

/// Least rows in a block: fewer make the blocks' products slow.
pub(crate) const MIN_ROWS: usize = 8;

/// How a `while` node's state splits into blocks of rows.
#[derive(Clone, Debug)]
pub(crate) struct LoopRows {
    /// The batch's rows.
    pub b: usize,
    /// Per input of the node (carried first).
    pub inputs: Vec<Rows>,
    /// The condition's and the body's annotations.
    pub parts: [Annotated; 2],
}

/// The split of a loop with subgraphs `parts` (condition, body) and
/// `carried` carried values, when one exists: a batch size among the
/// carried values' dims and a [`Rows`] per input such that the condition
/// is the same for every block, the body maps each carried value's rows
/// to the same rows, and at least one carried value has a batch axis.
/// Inputs nothing reads are `Free`; the first assignment found in a fixed
/// order wins (any that passes the rules computes the same rows).
pub(crate) fn plan_loop(parts: &[Arc<Graph>; 2], carried: usize) -> Option<LoopRows> {
    let [cond, body] = parts;
    let types = body.param_types();
    if cond.param_types() != types || carried > types.len() || carried == 0 {
        return None;
    }
    let used = |k: usize| {
        let read = |g: &Graph| {
            let p = g.params[k];
            g.nodes().any(|(_, n)| n.inputs.iter().any(|v| v.node == p)) || g.outputs.iter().any(|v| v.node == p)
        };
        read(cond) || read(body)
    };
    let used: Vec<bool> = (0..types.len()).map(used).collect();
    let mut sizes: Vec<usize> =
        types[..carried].iter().filter_map(|t| t.shape()).flatten().filter(|&d| d >= 2 * MIN_ROWS).collect();
    sizes.sort_unstable_by(|x, y| y.cmp(x));
    sizes.dedup();
    // Bounds the search (each candidate is one walk of both graphs).
    const MAX_TRIES: usize = 256;
    let mut tries = 0;
    for b in sizes {
        let choices: Vec<Vec<Rows>> = types
            .iter()
            .zip(&used)
            .map(|(t, &u)| {
                let mut c = vec![Rows::Free];
                if u {
                    let dims = t.shape().unwrap_or_default();
                    c.extend(dims.iter().enumerate().filter(|(_, &d)| d == b).map(|(a, _)| Rows::Axis(a)));
                }
                c
            })
            .collect();
        let mut pick = vec![0usize; choices.len()];
        loop {
            let rows: Vec<Rows> = pick.iter().zip(&choices).map(|(&i, c)| c[i]).collect();
            if rows[..carried].iter().any(|r| *r != Rows::Free) {
                tries += 1;
                if tries > MAX_TRIES {
                    return None;
                }
                if let Some(found) = check(cond, body, &rows, carried, b) {
                    return Some(LoopRows { b, inputs: rows, parts: found });
                }
            }
            // The next assignment, as an odometer.
            let mut k = 0;
            while k < pick.len() {
                pick[k] += 1;
                if pick[k] < choices[k].len() {
                    break;
                }
                pick[k] = 0;
                k += 1;
            }
            if k == pick.len() {
                break;
            }
        }
    }
    None
}

/// Both subgraphs annotated for `rows`, when the condition comes out the
/// same for every block and the body returns each carried value's rows
/// where they came in.
fn check(cond: &Graph, body: &Graph, rows: &[Rows], carried: usize, b: usize) -> Option<[Annotated; 2]> {
    let c = annotate(cond, rows, b)?;
    if c.outputs(cond).iter().any(|r| *r != Rows::Free) {
        return None;
    }
    let a = annotate(body, rows, b)?;
    (a.outputs(body) == rows[..carried]).then_some([c, a])
}

/// Most elements of an operand that every block's product reads whole in
/// each trip (the `wh` of `h · wh`): 1 MiB of f32, which then stays in
/// each core's L2 instead of streaming from memory once per block.
pub(crate) const SHARED_MAX: usize = 1 << 18;

/// The deepest product whose blocks of rows have the bits of the whole
/// (the `gemm` crate sums over up to 512 of the depth in one block on
/// both of its paths).
const SAME_BITS_DEPTH: usize = 512;

/// What one trip of a loop body costs, split by who pays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TripCosts {
    /// Multiply-adds and elements computed on batch rows (products count
    /// `m·k·n`, everything else its output's elements): shared out
    /// among the blocks.
    pub rows: usize,
    /// The same for values without a batch axis: every block repeats it.
    pub repeated: usize,
    /// Elements of the largest operand a product shares across blocks.
    pub shared: usize,
    /// Whether every product on batch rows computes a block's rows with
    /// the bits of one call for all rows: a depth of 4 to 512, at least 4
    /// outputs across (see [`crate::threads::GemmBlocks`]) and the batch
    /// on the rows (or columns) of a matrix, not among stacked matrices,
    /// so that results do not depend on the thread count — given blocks
    /// of at least [`exact_rows`] rows.
    pub exact: bool,
    /// The fewest outputs across (per batch row) of a product on batch
    /// rows; `usize::MAX` without one.
    pub across: usize,
}

/// The most outputs of a product that the `gemm` crate may compute on its
/// "horizontal" path (each output summed in vector lanes, then across
/// them), which rounds differently from its other paths; a block of rows
/// must make a larger product than this for its bits to be the whole's.
const HORIZONTAL_MAX: usize = 256;

/// The least rows of a block for a loop body of [`TripCosts`] `c` to keep
/// the whole loop's bits: every product on the rows then has more than
/// [`HORIZONTAL_MAX`] outputs in the block as in the whole.
pub(crate) fn exact_rows(c: &TripCosts) -> usize {
    (HORIZONTAL_MAX / c.across.max(1) + 1).max(MIN_ROWS)
}

/// [`TripCosts`] of `g` annotated as `a`.
pub(crate) fn trip_costs(g: &Graph, a: &Annotated) -> TripCosts {
    let mut c = TripCosts { exact: true, across: usize::MAX, ..TripCosts::default() };
    for (id, n) in g.nodes() {
        let rows = &a.values[id.index()];
        let out: usize = n.outputs.iter().filter_map(|t| t.shape()).map(|s| s.iter().product::<usize>()).sum();
        let work = match &n.op {
            Op::MatMul => {
                let k = g.value_type(n.inputs[0]).dims.last().copied().flatten().unwrap_or(1);
                if let Some(Rows::Axis(x)) = rows.first() {
                    let dims = n.outputs[0].shape().unwrap_or_default();
                    // The outputs across a block's rows (or down its columns).
                    let r = dims.len();
                    let across = if *x + 1 == r { dims[r - 2] } else { dims[r - 1] };
                    // A block of stacked matrices is a strided view the
                    // product runs matrix by matrix (the whole: one call).
                    let on_matrix = *x + 2 >= r;
                    c.exact &= (4..=SAME_BITS_DEPTH).contains(&k) && across >= 4 && on_matrix;
                    c.across = c.across.min(across);
                    // The operand without the batch is read whole by every block.
                    let free = n.inputs.iter().find(|v| a.values[v.node.index()][v.index as usize] == Rows::Free);
                    let size = free.and_then(|v| g.value_type(*v).shape()).map_or(0, |s| s.iter().product());
                    c.shared = c.shared.max(size);
                }
                out.saturating_mul(k)
            }
            Op::Fused { body } => {
                if let Some((_, inner)) = a.bodies.iter().find(|(n, _)| *n == id) {
                    let t = trip_costs(body, inner);
                    c.rows = c.rows.saturating_add(t.rows);
                    c.repeated = c.repeated.saturating_add(t.repeated);
                    c.shared = c.shared.max(t.shared);
                    c.exact &= t.exact;
                    c.across = c.across.min(t.across);
                }
                continue;
            }
            // Views and copies of what is already there, and inputs.
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Transpose { .. }
            | Op::Gather { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::ExpandDims { .. }
            | Op::BroadcastTo { .. } => 0,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::OneHot { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::GatherElements { .. }
            | Op::ScatterAdd { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::Spatial(_)
            | Op::Random { .. }
            | Op::Call { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. }
            | Op::Kernel { .. } => out,
        };
        if rows.iter().all(|r| *r == Rows::Free) {
            c.repeated = c.repeated.saturating_add(work);
        } else {
            c.rows = c.rows.saturating_add(work);
        }
    }
    c
}
