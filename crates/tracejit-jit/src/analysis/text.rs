//! The text form of a lowered region program ([`super::Analysis`]): what
//! the code generator emits for a region, one line per load, node and
//! output, so a lowering change shows as a text diff (the lowering
//! filetests in `tests/lowering/` pin it, as the IR's filetests pin the
//! passes).
//!
//! ```text
//! kernel row (rank 2, split 1, 2 passes)
//!   load0 = param 0 : f32 axes [0, 1] inner
//!   n0 = load0 : f32 varying
//!   n1 = reduce_max n0 : f32 stage 1
//!   ...
//!   out0 = n5 : f32 axes [0, 1]
//!   size0 = param 0 axis 0
//!   size1 = param 0 axis 1
//! ```

use std::fmt;

use cranelift_entity::EntityRef;

use super::{Analysis, KernelKind, LOp, LoadSource, Scalar};

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::F32(v) => write!(f, "{v:?}f32"),
            Scalar::F64(v) => write!(f, "{v:?}f64"),
            Scalar::I32(v) => write!(f, "{v}i32"),
            Scalar::I64(v) => write!(f, "{v}i64"),
            Scalar::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for LOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LOp::Load(l) => write!(f, "load{}", l.index()),
            LOp::Const(s) => write!(f, "const {s}"),
            LOp::Unary(u) => f.write_str(u.name()),
            LOp::Binary(b) => f.write_str(b.name()),
            LOp::Select => f.write_str("select"),
            LOp::Cast => f.write_str("cast"),
            LOp::Clamp(lo, hi) => write!(f, "clamp[{lo}, {hi}]"),
            LOp::Reduce(r) => f.write_str(r.name()),
        }
    }
}

/// `[0, -, 2]`: domain positions, `-` for a unit axis.
fn axes(a: &[Option<usize>]) -> String {
    let items: Vec<String> = a.iter().map(|p| p.map_or("-".to_string(), |p| p.to_string())).collect();
    format!("[{}]", items.join(", "))
}

impl fmt::Display for Analysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            KernelKind::Elementwise => "elementwise",
            KernelKind::Row => "row",
            KernelKind::Column => "column",
        };
        let passes = if self.passes == 1 { "1 pass".to_string() } else { format!("{} passes", self.passes) };
        writeln!(f, "kernel {kind} (rank {}, split {}, {passes})", self.rank, self.split)?;
        for (id, load) in self.loads.iter() {
            let source = match &load.source {
                LoadSource::Param(p) => format!("param {p}"),
                LoadSource::Const(c) => format!("const {}{:?}", c.dtype(), c.shape()),
            };
            let inner = if load.contig { " inner" } else { "" };
            writeln!(f, "  load{} = {source} : {} axes {}{inner}", id.index(), load.dtype, axes(&load.axes))?;
        }
        for (id, node) in self.nodes.iter() {
            let args: Vec<String> = node.inputs.iter().map(|i| format!("n{}", i.index())).collect();
            let args = if args.is_empty() { String::new() } else { format!(" {}", args.join(", ")) };
            let varying = if node.varying { " varying" } else { "" };
            let stage = if node.stage > 0 { format!(" stage {}", node.stage) } else { String::new() };
            writeln!(f, "  n{} = {}{args} : {}{varying}{stage}", id.index(), node.op, node.dtype)?;
        }
        for (k, out) in self.outputs.iter().enumerate() {
            let kept = if out.kept { " kept" } else { "" };
            writeln!(f, "  out{k} = n{} : {} axes {}{kept}", out.node.index(), out.dtype, axes(&out.axes))?;
        }
        for (p, sources) in self.size_sources.iter().enumerate() {
            let mut from: Vec<String> = sources.iter().map(|s| format!("param {} axis {}", s.param, s.axis)).collect();
            if let Some(s) = self.static_sizes[p] {
                from.push(format!("static {s}"));
            }
            writeln!(f, "  size{p} = {}", from.join(" | "))?;
        }
        Ok(())
    }
}
