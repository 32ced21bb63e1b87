//! The text listing of a graph (its `Display`), one line per node like a
//! jaxpr, and the Graphviz form (`Graph::to_dot`).
//!
//! The listing is deterministic (arena order, library in id order, attributes
//! in key order), so tests can compare it as text, and it is the text form
//! that [`Graph::parse`] reads back:
//!
//! ```text
//! variable var0 "w": f32[3]
//! graph gelu(%0: f32[?, 784]) -> (%7) {
//!   %1 = constant f32[] 0.5
//!   %2 = mul %0, %1 : f32[?, 784]
//!   %3 = reduce_sum[axes=[1], keepdims=false] %2 : f32[?]
//!   %4 = call @f0 "inner" %2 : f32[?, 784]
//!   assign_variable[var=var0 "w", kind=assign_add] %3 ctrl(%2)
//! }
//! function f0 "inner" implements="tracejit.nn.gelu":
//!   graph inner(%0: f32[?, 784]) -> (%1) {
//!     ...
//!   }
//! ```
//!
//! Parameters appear only in the header, with their node ids (a fused body's
//! parameters need not come first in its arena). A node without outputs
//! prints no id; it still takes the next one. Variables are declared before
//! the `graph` line and library functions follow its `}`, at its indentation;
//! a fused region's body is printed under its node, indented.
//!
//! What makes the listing lossless (for the parser):
//! - Floats print in Rust's shortest round-trip form (`0.1`, `1e-5`, `-0.0`,
//!   `inf`, `-inf`); the canonical quiet NaN prints `NaN` and any other NaN
//!   its bits, `NaN(0xffc00000)`, so constants survive bitwise.
//! - Constants with up to [`MAX_CONSTANT_VALUES`] elements print every value;
//!   bigger ones (a captured 784x512 weight) print their first few and `...`,
//!   which the parser rejects. The alternate form `{:#}` prints every value.
//! - A graph name made of letters, digits, `_` and `.` prints bare, any other
//!   quoted.
//! - A kernel node prints its declared input types, `kernel["name"](f32[?])`,
//!   when they differ from the types of its inputs.
//!
//! A node that records the user's source line prints it as a trailing
//! comment, `%2 = mul %0, %1 : f32[3]  ; src/model.rs:12`, which the parser
//! skips (a location cannot be made from text). Printing never panics, even on a graph
//! the verifier rejects (a missing function or variable prints as
//! `<missing>`), because listings are how such graphs get debugged.

use std::fmt::{self, Write as _};

use cranelift_entity::EntityRef;
use tracejit_tensor::{with_array, SliceSpec, Storage};

use crate::primitive_ops;
use crate::{Graph, Node, NodeId, Op, ValueId};

/// Constants with up to this many elements print every value.
pub(crate) const MAX_CONSTANT_VALUES: usize = 64;

/// How many values a bigger constant shows before `...`.
const ELIDED_PREFIX: usize = 8;

/// The listing; `{:#}` prints every value of every constant.
impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        write_graph(&mut s, self, "", f.alternate())?;
        f.write_str(&s)
    }
}

impl Graph {
    /// The graph in Graphviz DOT form: one box per node labelled with its op,
    /// attributes, output types and source line; solid edges for data inputs, dashed ones
    /// for control inputs; parameters drawn as inputs and an extra node per
    /// graph output. Library functions are not expanded.
    pub fn to_dot(&self) -> String {
        let mut s = String::new();
        let _ = write_dot(&mut s, self);
        s
    }
}

/// Writes the listing of `g`, each line prefixed by `indent`; `full`: every
/// constant value.
fn write_graph(s: &mut String, g: &Graph, indent: &str, full: bool) -> fmt::Result {
    let params: Vec<String> = g
        .params
        .iter()
        .map(|&p| match node_of(g, p).and_then(|n| n.outputs.first()) {
            Some(ty) => format!("{}: {ty}", ValueId::from(p)),
            None => format!("{}: <missing>", ValueId::from(p)),
        })
        .collect();
    let outputs: Vec<String> = g.outputs.iter().map(|v| v.to_string()).collect();
    for (id, var) in g.variables.iter() {
        let ty = crate::TensorType::known(var.dtype(), &var.shape());
        writeln!(s, "{indent}variable {id} {:?}: {ty}", var.name())?;
    }
    writeln!(s, "{indent}graph {}({}) -> ({}) {{", graph_name(&g.name), params.join(", "), outputs.join(", "))?;
    for (id, node) in g.nodes() {
        if matches!(node.op, Op::Parameter { .. }) && g.params.get(param_index(node)) == Some(&id) {
            continue;
        }
        write!(s, "{indent}  ")?;
        write_node(s, g, id, node, full)?;
        s.push('\n');
        // Nested code prints inline, under the node that runs it.
        for sub in node.op.subgraphs() {
            write_graph(s, sub, &format!("{indent}    "), full)?;
        }
    }
    writeln!(s, "{indent}}}")?;
    for (fid, func) in g.library.iter() {
        write!(s, "{indent}function {fid} {:?}", func.name)?;
        // Destructured so that a new attribute does not compile until it
        // prints (and `parser::function_block` reads it back).
        let crate::FunctionAttrs { implements } = &func.attrs;
        if let Some(name) = implements {
            write!(s, " implements={name:?}")?;
        }
        s.push_str(":\n");
        write_graph(s, &func.graph, &format!("{indent}  "), full)?;
    }
    Ok(())
}

fn param_index(node: &Node) -> usize {
    let Op::Parameter { index } = node.op else { return usize::MAX };
    index
}

/// One line, without indentation or newline: `%2 = mul %0, %1 : f32[?, 784]`.
fn write_node(s: &mut String, g: &Graph, id: NodeId, node: &Node, full: bool) -> fmt::Result {
    let results: Vec<String> = (0..node.outputs.len()).map(|i| ValueId::new(id, i as u32).to_string()).collect();
    if !results.is_empty() {
        write!(s, "{} = ", results.join(", "))?;
    }
    write_op(s, g, &node.op)?;
    if let Op::Constant { value } = &node.op {
        // The type is part of the op text; the inputs are empty.
        write!(s, " {}", crate::TensorType::known(value.dtype(), value.shape()))?;
        write!(s, " {}", constant_values(value, if full { usize::MAX } else { MAX_CONSTANT_VALUES }))?;
    } else {
        if let Op::Kernel { inputs: declared, .. } = &node.op {
            // The declared types are only printed when the inputs do not
            // already say them (a kernel selected for `f32[?]` fed `f32[3]`).
            let actual: Vec<Option<&crate::TensorType>> =
                node.inputs.iter().map(|v| node_of(g, v.node).and_then(|n| n.outputs.get(v.index as usize))).collect();
            if declared.len() != actual.len() || declared.iter().zip(&actual).any(|(d, a)| Some(d) != *a) {
                let types: Vec<String> = declared.iter().map(|t| t.to_string()).collect();
                write!(s, "({})", types.join(", "))?;
            }
        }
        let inputs: Vec<String> = node.inputs.iter().map(|v| v.to_string()).collect();
        if !inputs.is_empty() {
            write!(s, " {}", inputs.join(", "))?;
        }
        if !node.outputs.is_empty() {
            let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
            write!(s, " : {}", types.join(", "))?;
        }
    }
    if !node.control_inputs.is_empty() {
        let ctrl: Vec<String> = node.control_inputs.iter().map(|&c| ValueId::from(c).to_string()).collect();
        write!(s, " ctrl({})", ctrl.join(", "))?;
    }
    if let Some(loc) = node.location {
        write!(s, "  ; {}:{}", loc.file(), loc.line())?;
    }
    Ok(())
}

/// The op's name as listed: reductions read `reduce_sum` so they stand out
/// from elementwise ops (errors use the short `sum`).
fn listing_name(op: &Op) -> String {
    if let Op::Reduce { op, .. } = op {
        return format!("reduce_{}", op.name());
    }
    op.name().to_string()
}

/// A spatial op's attributes, without brackets (the parser's
/// `parser/spatial.rs` reads them back).
fn spatial_attrs(op: &tracejit_tensor::SpatialOp) -> String {
    use tracejit_tensor::SpatialOp as S;
    let conv = |c: &tracejit_tensor::Conv2dAttrs| {
        format!("stride={:?}, dilation={:?}, pads={:?}, groups={}", c.stride, c.dilation, c.pad, c.groups)
    };
    let pool =
        |p: &tracejit_tensor::Pool2dAttrs| format!("kernel={:?}, stride={:?}, pads={:?}", p.kernel, p.stride, p.pad);
    match op {
        S::Conv2d { conv: c, bias, relu } => format!("{}, bias={bias}, relu={relu}", conv(c)),
        // The epilogue's scale and residual only when there (the parser
        // takes them as false when left out).
        S::Conv2dNhwc { conv: c, scale, bias, residual, relu } => {
            let scale = if *scale { "scale=true, " } else { "" };
            let residual = if *residual { ", residual=true" } else { "" };
            format!("{}, {scale}bias={bias}{residual}, relu={relu}", conv(c))
        }
        S::Conv2dBackwardData { conv: c, input_hw } => format!("{}, input_hw={input_hw:?}", conv(c)),
        S::Conv2dBackwardFilter { conv: c, kernel, bias } => format!("{}, kernel={kernel:?}, bias={bias}", conv(c)),
        S::MaxPool2d { pool: p }
        | S::MaxPool2dNhwc { pool: p }
        | S::MaxPool2dBackward { pool: p }
        | S::AvgPool2d { pool: p } => pool(p),
        S::AvgPool2dBackward { pool: p, input_hw } => format!("{}, input_hw={input_hw:?}", pool(p)),
    }
}

/// The op with its attributes: `reduce_sum[axes=[1], keepdims=false]`,
/// `call @f0 "inner"`.
fn write_op(s: &mut String, g: &Graph, op: &Op) -> fmt::Result {
    s.push_str(&listing_name(op));
    let var = |v: crate::VarId| match g.variables.get(v) {
        Some(r) => format!("{v} {:?}", r.name()),
        None => format!("{v} <missing>"),
    };
    match op {
        Op::Parameter { index } => write!(s, "[index={index}]"),
        Op::Constant { .. } | Op::Unary(_) | Op::Binary(_) | Op::Select | Op::MatMul => Ok(()),
        Op::Cast { to } => write!(s, "[to={to}]"),
        Op::Clamp { min, max } => write!(s, "[min={}, max={}]", f64_text(*min), f64_text(*max)),
        Op::Reduce { axes, keepdims, .. } => write!(s, "[axes={axes:?}, keepdims={keepdims}]"),
        Op::ArgReduce { axis, keepdims, .. } => write!(s, "[axis={axis}, keepdims={keepdims}]"),
        Op::Reshape { shape } => write!(s, "[shape={shape:?}]"),
        Op::Transpose { perm } => write!(s, "[perm={perm:?}]"),
        Op::BroadcastTo { shape } => write!(s, "[shape={shape:?}]"),
        Op::ExpandDims { axis } => write!(s, "[axis={axis}]"),
        Op::Squeeze { axes } => write!(s, "[axes={axes:?}]"),
        Op::Concat { axis } | Op::Stack { axis } | Op::Gather { axis } => write!(s, "[axis={axis}]"),
        Op::Slice { specs } => {
            let specs: Vec<String> = specs.iter().map(slice_spec_text).collect();
            write!(s, "[{}]", specs.join(", "))
        }
        Op::OneHot { depth, dtype } => write!(s, "[depth={depth}, dtype={dtype}]"),
        Op::GatherElements { axis } | Op::ScatterAdd { axis } | Op::Cumsum { axis } => write!(s, "[axis={axis}]"),
        Op::DynamicSlice { sizes } => write!(s, "[sizes={sizes:?}]"),
        Op::DynamicUpdateSlice => Ok(()),
        Op::Pad { pads, value } => {
            let pads: Vec<String> = pads.iter().map(|(lo, hi)| format!("({lo}, {hi})")).collect();
            write!(s, "[pads=[{}], value={}]", pads.join(", "), f64_text(*value))
        }
        Op::TopK { k } => write!(s, "[k={k}]"),
        Op::Spatial(sp) => write!(s, "[{}]", spatial_attrs(sp)),
        Op::Random { dist, dtype, shape } => {
            let (p, q) = dist.params();
            let names = match dist {
                tracejit_tensor::RandomDist::Uniform { .. } => ("low", "high"),
                tracejit_tensor::RandomDist::Normal { .. } => ("mean", "stddev"),
            };
            write!(s, "[{}={}, {}={}, dtype={dtype}", names.0, f64_text(p), names.1, f64_text(q))?;
            match shape {
                Some(shape) => write!(s, ", shape={shape:?}]"),
                None => write!(s, ", shape=like]"),
            }
        }
        Op::Call { func } => {
            if func.index() < g.library.len() {
                write!(s, " @{func} {:?}", g.library.get(*func).name)
            } else {
                write!(s, " @{func} <missing>")
            }
        }
        Op::Fused { body } => write!(s, "[{} nodes]", body.len()),
        Op::Cond { .. } => Ok(()),
        Op::While { trip_count, cancel, .. } => {
            let mut attrs: Vec<String> = trip_count.iter().map(|n| format!("trips={n}")).collect();
            if cancel.is_some() {
                attrs.push("cancel".to_string());
            }
            if attrs.is_empty() {
                Ok(())
            } else {
                write!(s, "[{}]", attrs.join(", "))
            }
        }
        Op::Kernel { name, .. } => write!(s, "[{name:?}]"),
        Op::ReadVariable { var: v, locked } => {
            write!(s, "[var={}{}]", var(*v), if *locked { ", locked" } else { "" })
        }
        Op::AssignVariable { var: v, kind, locked } => {
            write!(s, "[var={}, kind={}{}]", var(*v), kind.name(), if *locked { ", locked" } else { "" })
        }
    }
}

/// A slice spec as numpy writes it: `1:3`, `::-1`, `:`.
fn slice_spec_text(s: &SliceSpec) -> String {
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    if s.step == 1 {
        format!("{}:{}", opt(s.start), opt(s.stop))
    } else {
        format!("{}:{}:{}", opt(s.start), opt(s.stop), s.step)
    }
}

/// `0.5` for a scalar, `[1, 2, 3]` otherwise (flat, row-major): every value
/// when there are at most `limit`, else the first few and `...`. Floats keep
/// a decimal point.
fn constant_values(value: &Storage, limit: usize) -> String {
    let take = if value.len() <= limit { value.len() } else { ELIDED_PREFIX.min(limit) };
    let mut items: Vec<String> = match value {
        Storage::F32(a) => a.iter().take(take).map(|&x| f32_text(x)).collect(),
        Storage::F64(a) => a.iter().take(take).map(|&x| f64_text(x)).collect(),
        other => with_array!(other, a => a.iter().take(take).map(|x| format!("{x:?}")).collect()),
    };
    if value.rank() == 0 {
        return items.pop().unwrap_or_default();
    }
    if take < value.len() {
        items.push("...".into());
    }
    format!("[{}]", items.join(", "))
}

/// An f32 that parses back to the same bits: the shortest round-trip form,
/// `NaN` for the canonical quiet NaN, `NaN(0x...)` with the bits for others.
pub(crate) fn f32_text(x: f32) -> String {
    if x.is_nan() && x.to_bits() != f32::NAN.to_bits() {
        format!("NaN(0x{:08x})", x.to_bits())
    } else {
        format!("{x:?}")
    }
}

/// The f64 form of [`f32_text`].
pub(crate) fn f64_text(x: f64) -> String {
    if x.is_nan() && x.to_bits() != f64::NAN.to_bits() {
        format!("NaN(0x{:016x})", x.to_bits())
    } else {
        format!("{x:?}")
    }
}

/// A graph name bare when the parser can read it as a word, else quoted.
fn graph_name(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.') {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

/// Writes the DOT form of `g`.
fn write_dot(s: &mut String, g: &Graph) -> fmt::Result {
    writeln!(s, "digraph {} {{", dot_string(&g.name))?;
    writeln!(s, "  rankdir=TB;")?;
    writeln!(s, "  node [shape=box, fontname=\"monospace\"];")?;
    for (id, node) in g.nodes() {
        let mut label = String::new();
        write_op(&mut label, g, &node.op)?;
        if let Op::Constant { value } = &node.op {
            write!(label, " {}", constant_values(value, ELIDED_PREFIX))?;
        }
        let head = match node.outputs.len() {
            0 => String::new(),
            _ => format!("{} = ", ValueId::from(id)),
        };
        let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let mut full = format!("{head}{label}\n{}", types.join(", "));
        if let Some(loc) = node.location {
            write!(full, "\n{}:{}", loc.file(), loc.line())?;
        }
        let style = match node.op {
            Op::Parameter { .. } => ", shape=invhouse, style=filled, fillcolor=\"#cfe2ff\"",
            Op::Constant { .. } => ", style=filled, fillcolor=\"#eeeeee\"",
            Op::ReadVariable { .. } | Op::AssignVariable { .. } => ", style=filled, fillcolor=\"#ffe5b4\"",
            Op::Call { .. } | Op::Kernel { .. } => ", shape=box3d",
            Op::Fused { .. } => ", style=filled, fillcolor=\"#e2d9f3\"",
            Op::Cond { .. } | Op::While { .. } => ", shape=diamond, style=filled, fillcolor=\"#d1e7dd\"",
            primitive_ops!() => "",
        };
        writeln!(s, "  n{} [label={}{style}];", id.index(), dot_string(&full))?;
    }
    for (id, node) in g.nodes() {
        for v in &node.inputs {
            let attrs = if v.index == 0 { String::new() } else { format!(" [taillabel=\"{}\"]", v.index) };
            writeln!(s, "  n{} -> n{}{attrs};", v.node.index(), id.index())?;
        }
        for c in &node.control_inputs {
            writeln!(s, "  n{} -> n{} [style=dashed, color=gray40];", c.index(), id.index())?;
        }
    }
    for (i, v) in g.outputs.iter().enumerate() {
        writeln!(
            s,
            "  out{i} [label=\"output {i}\", shape=house, style=filled, fillcolor=\"#d1e7dd\"];\n  n{} -> out{i};",
            v.node.index()
        )?;
    }
    writeln!(s, "}}")
}

/// A quoted DOT string with `"` and `\` escaped and newlines as `\n`.
fn dot_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The node `id` if it exists.
fn node_of(g: &Graph, id: NodeId) -> Option<&Node> {
    (id.index() < g.len()).then(|| g.node(id))
}
