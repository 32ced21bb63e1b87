//! The ONNX form of the third milestone's indexing, window and scan ops:
//! `gather_elements` (GatherElements), `scatter_add` (ScatterElements with
//! `reduction="add"`, the indices expanded to the updates' shape),
//! `dynamic_slice` (per-axis Gathers at starts clamped into `[0, dim - size]`
//! as XLA clamps them), `dynamic_update_slice` (the update gathered to the
//! input's shape, chosen by a window mask with Where), `pad`
//! (Pad, constant mode), `cumsum` (CumSum) and `top_k` (TopK, largest and
//! sorted, whose ties put the lower index first as ours do). Random draws
//! have no ONNX form that gives the same numbers: their export is an error.

use tracejit_ir::TensorType;
use tracejit_tensor::DType;

use crate::body::{attr_int, Body};
use crate::pb::{attribute_proto::AttributeType, AttributeProto};
use crate::tensor_proto::data_type;

/// A string attribute.
fn attr_str(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(value.as_bytes().to_vec()),
        ..AttributeProto::default()
    }
}

/// `v` as i64 (start vectors may be i32).
fn as_i64(b: &mut Body, v: &str, t: &TensorType) -> String {
    if t.dtype == DType::I64 {
        v.to_string()
    } else {
        b.op("Cast", &[v], vec![attr_int("to", data_type(DType::I64) as i64)])
    }
}

/// `x`'s shape: a constant when every dim is known (so runtimes see static
/// slice bounds and fold them), else a `Shape` node.
fn shape_of(b: &mut Body, x: &str, t: &TensorType) -> String {
    match t.shape() {
        Some(dims) => b.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
        None => b.op("Shape", &[x], vec![]),
    }
}

/// The starts clamped into `[0, shape - sizes]`.
fn clamped_starts(b: &mut Body, shape: &str, starts: &str, sizes: &str) -> String {
    let limit = b.op("Sub", &[shape, sizes], vec![]);
    let below = b.op("Min", &[starts, &limit], vec![]);
    let zero = b.ints(&[0]);
    b.op("Max", &[&below, &zero], vec![])
}

pub(crate) fn gather_elements(b: &mut Body, x: &str, idx: &str, axis: usize, out: &str) {
    b.to(out, "GatherElements", &[x, idx], vec![attr_int("axis", axis as i64)]);
}

pub(crate) fn scatter_add(b: &mut Body, ins: &[String], types: &[TensorType], axis: usize, out: &str) {
    let (x, idx, upd) = (ins[0].as_str(), ins[1].as_str(), ins[2].as_str());
    let idx = if types[1].dims == types[2].dims {
        idx.to_string()
    } else {
        let shape = b.op("Shape", &[upd], vec![]);
        b.op("Expand", &[idx, &shape], vec![])
    };
    let attrs = vec![attr_int("axis", axis as i64), attr_str("reduction", "add")];
    b.to(out, "ScatterElements", &[x, &idx, upd], attrs);
}

/// Element `d` of the 1-D `v`, as a scalar.
fn element(b: &mut Body, v: &str, d: usize) -> String {
    let d = b.scalar(DType::I64, d as f64);
    b.op("Gather", &[v, &d], vec![attr_int("axis", 0)])
}

/// The window is read with one Gather per axis at `start + [0, size)`
/// rather than a Slice with computed bounds: the output shape then stays
/// static (tract and other runtimes cannot type a Slice whose ends are data).
pub(crate) fn dynamic_slice(b: &mut Body, ins: &[String], types: &[TensorType], sizes: &[usize], out: &str) {
    let starts = as_i64(b, &ins[1], &types[1]);
    let size_list: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
    let sizes_v = b.ints(&size_list);
    let shape = shape_of(b, &ins[0], &types[0]);
    let at = clamped_starts(b, &shape, &starts, &sizes_v);
    let mut cur = ins[0].clone();
    for (d, &size) in sizes.iter().enumerate() {
        if types[0].dims[d] == Some(size) {
            continue; // the whole axis: the start clamps to 0
        }
        let start = element(b, &at, d);
        let offsets = b.ints(&(0..size as i64).collect::<Vec<_>>());
        let idx = b.op("Add", &[&start, &offsets], vec![]);
        cur = b.op("Gather", &[&cur, &idx], vec![attr_int("axis", d as i64)]);
    }
    b.to(out, "Identity", &[&cur], vec![]);
}

/// Per axis, the positions `p` of `x` inside the window (`0 <= p - start <
/// size`) and the update's index read there (`p - start` clamped); the
/// update gathered to `x`'s shape is chosen where every axis is inside.
pub(crate) fn dynamic_update_slice(b: &mut Body, ins: &[String], types: &[TensorType], out: &str) {
    let (x, upd) = (ins[0].as_str(), ins[1].as_str());
    let rank = types[0].rank();
    if rank == 0 {
        b.to(out, "Identity", &[upd], vec![]);
        return;
    }
    if types[1].num_elements() == Some(0) {
        b.to(out, "Identity", &[x], vec![]);
        return;
    }
    let starts = as_i64(b, &ins[2], &types[2]);
    let sizes = shape_of(b, upd, &types[1]);
    let shape = shape_of(b, x, &types[0]);
    let at = clamped_starts(b, &shape, &starts, &sizes);
    let (zero, one) = (b.scalar(DType::I64, 0.0), b.scalar(DType::I64, 1.0));
    let mut cur = upd.to_string();
    let mut mask: Option<String> = None;
    for d in 0..rank {
        let positions = match types[0].dims[d] {
            Some(n) => b.ints(&(0..n as i64).collect::<Vec<_>>()),
            None => {
                let n = element(b, &shape, d);
                b.op("Range", &[&zero, &n, &one], vec![])
            }
        };
        let start = element(b, &at, d);
        let size = element(b, &sizes, d);
        let rel = b.op("Sub", &[&positions, &start], vec![]);
        let lo = b.op("GreaterOrEqual", &[&rel, &zero], vec![]);
        let hi = b.op("Less", &[&rel, &size], vec![]);
        let inside = b.op("And", &[&lo, &hi], vec![]);
        let mut axis_shape = vec![1i64; rank];
        axis_shape[d] = -1;
        let axis_shape = b.ints(&axis_shape);
        let inside = b.op("Reshape", &[&inside, &axis_shape], vec![]);
        mask = Some(match mask {
            Some(m) => b.op("And", &[&m, &inside], vec![]),
            None => inside,
        });
        let last = b.op("Sub", &[&size, &one], vec![]);
        let idx = b.op("Min", &[&rel, &last], vec![]);
        let idx = b.op("Max", &[&idx, &zero], vec![]);
        cur = b.op("Gather", &[&cur, &idx], vec![attr_int("axis", d as i64)]);
    }
    let mask = mask.expect("rank > 0");
    b.to(out, "Where", &[&mask, &cur, x], vec![]);
}

pub(crate) fn pad(b: &mut Body, x: &str, dtype: DType, pads: &[(usize, usize)], value: f64, out: &str) {
    let all: Vec<i64> = pads.iter().map(|p| p.0 as i64).chain(pads.iter().map(|p| p.1 as i64)).collect();
    let all = b.ints(&all);
    let value = b.scalar(dtype, value);
    b.to(out, "Pad", &[x, &all, &value], vec![]);
}

pub(crate) fn cumsum(b: &mut Body, x: &str, axis: usize, out: &str) {
    let axis = b.scalar(DType::I64, axis as f64);
    b.to(out, "CumSum", &[x, &axis], vec![]);
}

/// TopK of `x` along the last axis, writing the values and the indices.
pub(crate) fn top_k(b: &mut Body, x: &str, k: usize, outs: [&str; 2]) {
    let k = b.ints(&[k as i64]);
    let attrs = vec![attr_int("axis", -1), attr_int("largest", 1), attr_int("sorted", 1)];
    b.node_to(&outs, "TopK", &[x, &k], attrs);
}
