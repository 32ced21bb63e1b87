//! Parsing one op with its attributes, and a constant's values: the inverse
//! of `printer::write_op` and `printer::constant_values`.
//!
//! Op names come from the same tables the printer uses (`UnaryOp::ALL`,
//! `BinaryOp::ALL`, `ReduceOp::ALL`, `ArgReduceOp::ALL`, `AssignKind::ALL`),
//! so an op added to a family parses without touching this file; a new `Op`
//! variant needs a keyword here, and the round-trip test that prints one node
//! of every op kind fails until it has one.

use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, StorageElement, UnaryOp};

use super::cursor::Cursor;
use super::ParseError;
use crate::graph::{FuncId, VarId};
use crate::{AssignKind, Op, TensorType};

/// What the op text says; ops that need more than the line (a fused body, a
/// kernel's code) are finished by the graph parser.
pub(super) enum ParsedOp {
    /// A complete op.
    Op(Op),
    /// `call @f0 "name"`: the callee is checked once the library is parsed.
    Call { func: FuncId, name: String, column: usize },
    /// `fused[4 nodes]`, `cond`, `while[trips=8]`: the subgraphs follow on
    /// the next lines.
    Nested(Nested),
    /// `kernel["name"]` or `kernel["name"](f32[?])` with its declared input
    /// types; the code comes from a kernel registry.
    Kernel { name: String, inputs: Option<Vec<TensorType>>, column: usize },
}

/// An op whose subgraphs follow its line.
#[derive(Clone, Copy)]
pub(super) enum Nested {
    /// A fused region and the node count it claims.
    Fused(Option<usize>),
    /// A conditional: then and else blocks.
    Cond,
    /// A loop: condition and body blocks, and its static trip count.
    While(Option<usize>, bool),
}

impl Nested {
    /// How many graph blocks follow.
    pub(super) fn blocks(self) -> usize {
        match self {
            Nested::Fused(_) => 1,
            Nested::Cond | Nested::While(..) => 2,
        }
    }
}

/// The names and types of the graph's variables, to check references.
pub(super) struct VarNames<'v>(pub(super) &'v [(String, TensorType)]);

/// Where an op is, for errors: the node being parsed (`%3`) and the column
/// of the op's name.
pub(super) struct NodeName {
    pub(super) name: String,
    pub(super) op_column: usize,
}

/// Parses the op named `name` whose attributes follow at `c`.
pub(super) fn parse_op(
    name: &str,
    c: &mut Cursor<'_>,
    vars: &VarNames<'_>,
    node: &NodeName,
) -> Result<ParsedOp, ParseError> {
    if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == name) {
        return Ok(ParsedOp::Op(Op::Unary(u)));
    }
    if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == name) {
        return Ok(ParsedOp::Op(Op::Binary(b)));
    }
    if let Some(op) = name.strip_prefix("reduce_").and_then(|r| ReduceOp::ALL.into_iter().find(|o| o.name() == r)) {
        c.expect("[")?;
        c.key("axes")?;
        let axes = usizes(c)?;
        c.expect(",")?;
        c.key("keepdims")?;
        let keepdims = c.number("`true` or `false`")?;
        c.expect("]")?;
        return Ok(ParsedOp::Op(Op::Reduce { op, axes, keepdims }));
    }
    if let Some(op) = ArgReduceOp::ALL.into_iter().find(|o| o.name() == name) {
        c.expect("[")?;
        let axis = axis(c)?;
        c.expect(",")?;
        c.key("keepdims")?;
        let keepdims = c.number("`true` or `false`")?;
        c.expect("]")?;
        return Ok(ParsedOp::Op(Op::ArgReduce { op, axis, keepdims }));
    }
    if let Some(op) = indexing_op(name, c)? {
        return Ok(ParsedOp::Op(op));
    }
    if let Some(op) = super::spatial::spatial_op(name, c)? {
        return Ok(ParsedOp::Op(Op::Spatial(op)));
    }
    if let Some(op) = layout_op(name, c)? {
        return Ok(ParsedOp::Op(op));
    }
    if let Some(op) = state_op(name, c, vars)? {
        return Ok(ParsedOp::Op(op));
    }
    if let Some(parsed) = nested_op(name, c, node)? {
        return Ok(parsed);
    }
    let op = match name {
        "parameter" => {
            c.expect("[")?;
            c.key("index")?;
            let index = c.number("a parameter index")?;
            c.expect("]")?;
            Op::Parameter { index }
        }
        "constant" => Op::Constant { value: constant(c, node)? },
        "select" => Op::Select,
        "matmul" => Op::MatMul,
        "cast" => {
            c.expect("[")?;
            c.key("to")?;
            let to = c.dtype()?;
            c.expect("]")?;
            Op::Cast { to }
        }
        "clamp" => {
            c.expect("[")?;
            c.key("min")?;
            let min = float(c, f64_from_text)?;
            c.expect(",")?;
            c.key("max")?;
            let max = float(c, f64_from_text)?;
            c.expect("]")?;
            Op::Clamp { min, max }
        }
        other => {
            return Err(ParseError::UnknownOp { line: c.line(), column: node.op_column, name: other.to_string() });
        }
    };
    Ok(ParsedOp::Op(op))
}

/// The layout ops (reshape, transpose, broadcasts, squeezes, joins,
/// slices, `one_hot`), or `None` for another name.
fn layout_op(name: &str, c: &mut Cursor<'_>) -> Result<Option<Op>, ParseError> {
    Ok(Some(match name {
        "reshape" => {
            c.expect("[")?;
            c.key("shape")?;
            let shape = c.list("[", "]", |c| c.number("a dimension (or -1)"))?;
            c.expect("]")?;
            Op::Reshape { shape }
        }
        "transpose" => {
            c.expect("[")?;
            c.key("perm")?;
            let perm = usizes(c)?;
            c.expect("]")?;
            Op::Transpose { perm }
        }
        "broadcast_to" => {
            c.expect("[")?;
            c.key("shape")?;
            let shape = usizes(c)?;
            c.expect("]")?;
            Op::BroadcastTo { shape }
        }
        "squeeze" => {
            c.expect("[")?;
            c.key("axes")?;
            let axes = usizes(c)?;
            c.expect("]")?;
            Op::Squeeze { axes }
        }
        "expand_dims" => Op::ExpandDims { axis: bracketed_axis(c)? },
        "concat" => Op::Concat { axis: bracketed_axis(c)? },
        "stack" => Op::Stack { axis: bracketed_axis(c)? },
        "gather" => Op::Gather { axis: bracketed_axis(c)? },
        "slice" => Op::Slice { specs: c.list("[", "]", slice_spec)? },
        "one_hot" => {
            c.expect("[")?;
            c.key("depth")?;
            let depth = c.number("a depth")?;
            c.expect(",")?;
            c.key("dtype")?;
            let dtype = c.dtype()?;
            c.expect("]")?;
            Op::OneHot { depth, dtype }
        }
        _ => return Ok(None),
    }))
}

/// Variable reads and writes (`[var=v0(, kind=..)(, locked)]`), or `None`
/// for another name.
fn state_op(name: &str, c: &mut Cursor<'_>, vars: &VarNames<'_>) -> Result<Option<Op>, ParseError> {
    Ok(Some(match name {
        "read_variable" => {
            c.expect("[")?;
            let var = variable(c, vars)?;
            let locked = c.eat(",") && {
                c.expect("locked")?;
                true
            };
            c.expect("]")?;
            Op::ReadVariable { var, locked }
        }
        "assign_variable" => {
            c.expect("[")?;
            let var = variable(c, vars)?;
            c.expect(",")?;
            c.key("kind")?;
            let start = c.column();
            let word = c.word("an assignment kind")?;
            let Some(kind) = AssignKind::ALL.into_iter().find(|k| k.name() == word) else {
                let names: Vec<&str> = AssignKind::ALL.iter().map(|k| k.name()).collect();
                return Err(ParseError::Unexpected {
                    line: c.line(),
                    column: start,
                    expected: format!("an assignment kind ({})", names.join(", ")),
                    found: format!("`{word}`"),
                });
            };
            let locked = c.eat(",") && {
                c.expect("locked")?;
                true
            };
            c.expect("]")?;
            Op::AssignVariable { var, kind, locked }
        }
        _ => return Ok(None),
    }))
}

/// The ops holding or naming other code (calls, fused regions, `cond`,
/// `while`, kernels), whose bodies the caller parses, or `None` for
/// another name.
fn nested_op(name: &str, c: &mut Cursor<'_>, node: &NodeName) -> Result<Option<ParsedOp>, ParseError> {
    match name {
        "call" => {
            let column = node.op_column;
            c.expect("@")?;
            let func = FuncId::from_u32(entity(c, "f", "a function id such as `f0`")?);
            let name = c.string("the callee's name in quotes")?;
            Ok(Some(ParsedOp::Call { func, name, column }))
        }
        "fused" => {
            let nodes = if c.eat("[") {
                let n = c.number("a node count")?;
                c.expect("nodes")?;
                c.expect("]")?;
                Some(n)
            } else {
                None
            };
            Ok(Some(ParsedOp::Nested(Nested::Fused(nodes))))
        }
        "cond" => Ok(Some(ParsedOp::Nested(Nested::Cond))),
        "while" => {
            let (mut trips, mut cancel) = (None, false);
            if c.eat("[") {
                if c.eat("cancel") {
                    cancel = true;
                } else {
                    c.expect("trips")?;
                    c.expect("=")?;
                    trips = Some(c.number("a trip count")?);
                    if c.eat(",") {
                        c.expect("cancel")?;
                        cancel = true;
                    }
                }
                c.expect("]")?;
            }
            Ok(Some(ParsedOp::Nested(Nested::While(trips, cancel))))
        }
        "kernel" => {
            let column = node.op_column;
            c.expect("[")?;
            let name = c.string("the kernel's name in quotes")?;
            c.expect("]")?;
            let inputs = if c.peek() == Some('(') { Some(c.list("(", ")", |c| c.tensor_type())?) } else { None };
            Ok(Some(ParsedOp::Kernel { name, inputs, column }))
        }
        _ => Ok(None),
    }
}

/// The ops of the third milestone's indexing, window, scan and random
/// families, or `None` for another name.
fn indexing_op(name: &str, c: &mut Cursor<'_>) -> Result<Option<Op>, ParseError> {
    Ok(Some(match name {
        "gather_elements" => Op::GatherElements { axis: bracketed_axis(c)? },
        "scatter_add" => Op::ScatterAdd { axis: bracketed_axis(c)? },
        "cumsum" => Op::Cumsum { axis: bracketed_axis(c)? },
        "dynamic_update_slice" => Op::DynamicUpdateSlice,
        "dynamic_slice" => {
            c.expect("[")?;
            c.key("sizes")?;
            let sizes = usizes(c)?;
            c.expect("]")?;
            Op::DynamicSlice { sizes }
        }
        "pad" => {
            c.expect("[")?;
            c.key("pads")?;
            let pads = c.list("[", "]", |c| {
                c.expect("(")?;
                let lo = c.number("a pad")?;
                c.expect(",")?;
                let hi = c.number("a pad")?;
                c.expect(")")?;
                Ok((lo, hi))
            })?;
            c.expect(",")?;
            c.key("value")?;
            let value = float(c, f64_from_text)?;
            c.expect("]")?;
            Op::Pad { pads, value }
        }
        "top_k" => {
            c.expect("[")?;
            c.key("k")?;
            let k = c.number("k")?;
            c.expect("]")?;
            Op::TopK { k }
        }
        "random_uniform" | "random_normal" => {
            let (first, second) = if name == "random_uniform" { ("low", "high") } else { ("mean", "stddev") };
            c.expect("[")?;
            c.key(first)?;
            let p = float(c, f64_from_text)?;
            c.expect(",")?;
            c.key(second)?;
            let q = float(c, f64_from_text)?;
            c.expect(",")?;
            c.key("dtype")?;
            let dtype = c.dtype()?;
            c.expect(",")?;
            c.key("shape")?;
            let shape = if c.eat("like") { None } else { Some(usizes(c)?) };
            c.expect("]")?;
            let dist = if name == "random_uniform" {
                tracejit_tensor::RandomDist::Uniform { low: p, high: q }
            } else {
                tracejit_tensor::RandomDist::Normal { mean: p, stddev: q }
            };
            Op::Random { dist, dtype, shape }
        }
        _ => return Ok(None),
    }))
}

/// `[1, 2]`.
fn usizes(c: &mut Cursor<'_>) -> Result<Vec<usize>, ParseError> {
    c.list("[", "]", |c| c.number("a non-negative integer"))
}

/// `axis=N`.
fn axis(c: &mut Cursor<'_>) -> Result<usize, ParseError> {
    c.key("axis")?;
    c.number("an axis")
}

/// `[axis=N]`.
fn bracketed_axis(c: &mut Cursor<'_>) -> Result<usize, ParseError> {
    c.expect("[")?;
    let a = axis(c)?;
    c.expect("]")?;
    Ok(a)
}

/// `f3` or `var2`: the number after `prefix`.
fn entity(c: &mut Cursor<'_>, prefix: &str, what: &str) -> Result<u32, ParseError> {
    let column = c.column();
    let word = c.word(what)?;
    word.strip_prefix(prefix).and_then(|n| n.parse().ok()).ok_or_else(|| ParseError::Unexpected {
        line: c.line(),
        column,
        expected: what.into(),
        found: format!("`{word}`"),
    })
}

/// `var=var0 "w"`; the name must be the declared one.
fn variable(c: &mut Cursor<'_>, vars: &VarNames<'_>) -> Result<VarId, ParseError> {
    c.key("var")?;
    let column = c.column();
    let index = entity(c, "var", "a variable id such as `var0`")?;
    let name = c.string("the variable's name in quotes")?;
    match vars.0.get(index as usize) {
        Some((declared, _)) if *declared == name => Ok(VarId::from_u32(index)),
        Some((declared, _)) => Err(ParseError::Invalid {
            line: c.line(),
            column,
            message: format!("variable var{index} is declared as {declared:?}, not {name:?}"),
        }),
        None => Err(ParseError::Invalid {
            line: c.line(),
            column,
            message: format!("variable var{index} is not declared (a `variable var{index} \"name\": type` line)"),
        }),
    }
}

/// One numpy slice spec: `1:3`, `::-1`, `:`.
fn slice_spec(c: &mut Cursor<'_>) -> Result<SliceSpec, ParseError> {
    let bound = |c: &mut Cursor<'_>| -> Result<Option<i64>, ParseError> {
        match c.peek() {
            Some(ch) if ch == '-' || ch.is_ascii_digit() => c.number("a slice bound").map(Some),
            _ => Ok(None),
        }
    };
    let start = bound(c)?;
    c.expect(":")?;
    let stop = bound(c)?;
    let step = if c.eat(":") { c.number("a slice step")? } else { 1 };
    Ok(SliceSpec { start, stop, step })
}

/// A float attribute or element in the printer's form.
fn float<T>(c: &mut Cursor<'_>, from_text: fn(&str) -> Option<T>) -> Result<T, ParseError> {
    let column = c.column();
    let token = c.atom("a number")?;
    from_text(token).ok_or_else(|| ParseError::Unexpected {
        line: c.line(),
        column,
        expected: "a number (`1.5`, `-0.0`, `1e-5`, `inf`, `NaN`, `NaN(0x7fc00001)`)".into(),
        found: format!("`{token}`"),
    })
}

/// Parses what `printer::f32_text` writes.
pub(crate) fn f32_from_text(s: &str) -> Option<f32> {
    match nan_bits(s) {
        Some(hex) => u32::from_str_radix(hex, 16).ok().map(f32::from_bits).filter(|x| x.is_nan()),
        None => s.parse().ok(),
    }
}

/// Parses what `printer::f64_text` writes.
pub(crate) fn f64_from_text(s: &str) -> Option<f64> {
    match nan_bits(s) {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(f64::from_bits).filter(|x| x.is_nan()),
        None => s.parse().ok(),
    }
}

/// The hex digits of `NaN(0x...)`.
fn nan_bits(s: &str) -> Option<&str> {
    s.strip_prefix("NaN(0x").and_then(|h| h.strip_suffix(')'))
}

/// `f32[2] [1.0, 2.5]` or `f32[] 0.5`: the type, then every value.
fn constant(c: &mut Cursor<'_>, node: &NodeName) -> Result<Storage, ParseError> {
    let column = c.column();
    let ty = c.tensor_type()?;
    let Some(shape) = ty.shape() else {
        return Err(ParseError::Invalid {
            line: c.line(),
            column,
            message: format!("a constant's type must be fully known, not {ty}"),
        });
    };
    match ty.dtype {
        DType::F32 => values(c, node, &shape, f32_from_text),
        DType::F64 => values(c, node, &shape, f64_from_text),
        DType::I32 => values(c, node, &shape, |s| s.parse::<i32>().ok()),
        DType::I64 => values(c, node, &shape, |s| s.parse::<i64>().ok()),
        DType::Bool => values(c, node, &shape, |s| s.parse::<bool>().ok()),
        // Printed as their exact f32 widening, so the round trip is exact.
        DType::BF16 => values(c, node, &shape, |s| f32_from_text(s).map(tracejit_tensor::bf16::from_f32)),
        DType::F16 => values(c, node, &shape, |s| f32_from_text(s).map(tracejit_tensor::f16::from_f32)),
        DType::I8 => values(c, node, &shape, |s| s.parse::<i8>().ok()),
        DType::U8 => values(c, node, &shape, |s| s.parse::<u8>().ok()),
        DType::I16 => values(c, node, &shape, |s| s.parse::<i16>().ok()),
        DType::U16 => values(c, node, &shape, |s| s.parse::<u16>().ok()),
        DType::U32 => values(c, node, &shape, |s| s.parse::<u32>().ok()),
        DType::U64 => values(c, node, &shape, |s| s.parse::<u64>().ok()),
    }
}

/// The values of a constant of `shape`: one bare value for a scalar, else a
/// flat row-major list. `...` (an elided listing) is an error.
fn values<T: StorageElement>(
    c: &mut Cursor<'_>,
    node: &NodeName,
    shape: &[usize],
    from_text: fn(&str) -> Option<T>,
) -> Result<Storage, ParseError> {
    let mut elided = false;
    let mut one = |c: &mut Cursor<'_>| -> Result<Option<T>, ParseError> {
        if c.eat("...") {
            elided = true;
            return Ok(None);
        }
        let column = c.column();
        let token = c.atom("a value")?;
        match from_text(token) {
            Some(v) => Ok(Some(v)),
            None => Err(ParseError::Unexpected {
                line: c.line(),
                column,
                expected: format!("a value of the constant's dtype ({})", T::DTYPE),
                found: format!("`{token}`"),
            }),
        }
    };
    let column = c.column();
    let data: Vec<Option<T>> = if shape.is_empty() { vec![one(c)?] } else { c.list("[", "]", &mut one)? };
    if elided {
        return Err(ParseError::ElidedConstant { line: c.line(), column, node: node.name.clone() });
    }
    let n: usize = shape.iter().product();
    if data.len() != n {
        return Err(ParseError::Invalid {
            line: c.line(),
            column,
            message: format!("a constant of shape {shape:?} needs {n} value(s), found {}", data.len()),
        });
    }
    Ok(Storage::from_vec(data.into_iter().flatten().collect(), shape).expect("length checked above"))
}
