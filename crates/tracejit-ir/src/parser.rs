//! The parser of the text form: [`Graph::parse`] reads back what a graph's
//! `Display` writes, so `Graph::parse(&format!("{g:#}"))` is structurally
//! equal to `g` ([`Graph::structurally_eq`]) for every graph the verifier
//! accepts. The format is described in the `printer` module; what the parser
//! adds:
//!
//! - Lines are trimmed; blank lines and lines starting with `;` are comments
//!   (filetests keep their directives there), and a `;` after a complete
//!   line starts a comment too (the printer writes source locations there).
//! - Node ids are implicit in arena order: parameters sit at the ids the
//!   `graph` line gives them, every other node line takes the next free id,
//!   and a printed result (`%5 =`) must be that id. A node without outputs
//!   (`assign_variable`) prints no id but still takes one.
//! - Nesting follows indentation only where the text is otherwise ambiguous:
//!   the `variable` lines before a `graph` line and the `function` blocks after
//!   its closing `}` belong to that graph when they have its indentation. A
//!   fused node's body is the graph block on the lines right after it.
//! - Output types are read, not inferred: the parser checks syntax and
//!   references (values defined before use, declared variables, existing
//!   functions); [`crate::verify`] checks the types.
//!
//! What does not survive the text: source locations (`Node::location` holds a
//! `&'static Location`, which only the compiler can make), a variable's value
//! (a parsed graph gets [`ParsedVariable`]s holding zeros), and the native
//! code of an [`Op::Kernel`] (only its name is printed: [`Graph::parse`]
//! rejects kernel nodes, [`Graph::parse_with_kernels`] looks them up in a
//! [`KernelRegistry`]) — but for the IR's own int8 product
//! ([`crate::passes::INT8_KERNEL_NAME`]), which parses anywhere.

mod cursor;
mod ops;
mod spatial;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;
use tracejit_tensor::{DType, Storage};

use crate::graph::FuncId;
use crate::passes::KernelRegistry;
use crate::{FunctionAttrs, Graph, LibraryFunction, Node, NodeId, Op, TensorType, ValueId, VariableResource};
use cursor::Cursor;
use ops::{parse_op, Nested, NodeName, ParsedOp, VarNames};

/// Why a text did not parse. Every variant names the line and the 1-based
/// column where the problem starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A token other than the one the grammar allows here.
    #[error("line {line}, column {column}: expected {expected}, found {found}")]
    Unexpected {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the grammar allows here.
        expected: String,
        /// What the text has (a quoted token, or `end of line`/`end of input`).
        found: String,
    },
    /// An op name that no op has.
    #[error("line {line}, column {column}: unknown op `{name}`")]
    UnknownOp {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The name found.
        name: String,
    },
    /// A constant printed with `...` instead of all its values.
    #[error(
        "line {line}, column {column}: constant {node} is elided (`...`); \
         print the graph with `{{:#}}` to list every value"
    )]
    ElidedConstant {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The node (`%3`).
        node: String,
    },
    /// An `Op::Kernel` node, which holds native code that text cannot carry.
    #[error(
        "line {line}, column {column}: {node} is kernel `{name}`, native code that cannot be parsed \
         without a kernel registry (`Graph::parse_with_kernels`)"
    )]
    KernelNeedsRegistry {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The node (`%3`).
        node: String,
        /// The kernel's composite op name.
        name: String,
    },
    /// The registry has no kernel of that name for those input types.
    #[error("line {line}, column {column}: no kernel `{name}` is registered for inputs ({inputs})")]
    UnknownKernel {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The kernel's composite op name.
        name: String,
        /// The declared input types, comma-separated.
        inputs: String,
    },
    /// Well-formed text that describes no graph: an undefined value, a
    /// wrong result id, a count that does not match.
    #[error("line {line}, column {column}: {message}")]
    Invalid {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
}

impl Graph {
    /// Parses the text form that `Display` prints (see the `printer` and
    /// `parser` module docs). Kernel nodes are an error: use
    /// [`Graph::parse_with_kernels`] for graphs that hold them.
    ///
    /// ```
    /// use tracejit_ir::Graph;
    ///
    /// let text = "\
    /// graph axpy(%0: f32[?, 3], %1: f32[3]) -> (%3) {
    ///   %2 = constant f32[] 2.0
    ///   %3 = mul %0, %2 : f32[?, 3]
    /// }
    /// ";
    /// let g = Graph::parse(text)?;
    /// tracejit_ir::verify(&g)?;
    /// assert_eq!(g.to_string(), text);
    /// assert!(Graph::parse(&g.to_string())?.structurally_eq(&g));
    ///
    /// let err = Graph::parse("graph g() -> () {\n  %0 = frobnicate\n}\n").unwrap_err();
    /// assert_eq!(err.to_string(), "line 2, column 8: unknown op `frobnicate`");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse(text: &str) -> Result<Graph, ParseError> {
        Parser::new(text, None).parse_all()
    }

    /// Like [`Graph::parse`], but an `Op::Kernel` node gets its code from
    /// `kernels` (looked up by name and declared input types).
    pub fn parse_with_kernels(text: &str, kernels: &dyn KernelRegistry) -> Result<Graph, ParseError> {
        Parser::new(text, Some(kernels)).parse_all()
    }
}

/// A variable of a parsed graph: the name, dtype and shape the text
/// declares, and a value that starts as zeros (the text does not carry
/// values), so the graph can still be interpreted.
pub struct ParsedVariable {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    id: u64,
    /// Zeros, made on first use: a declaration costs nothing until the
    /// graph runs (a listing declaring `f32[100000, 100000]` would
    /// otherwise allocate 40 GB to parse).
    value: Mutex<Option<Storage>>,
}

impl ParsedVariable {
    /// A variable named `name` of `dtype` and `shape`, holding zeros.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Arc<ParsedVariable> {
        // Ids start high so they never equal a trace crate variable's id by
        // accident when graphs are mixed in tests.
        static NEXT: AtomicU64 = AtomicU64::new(1 << 48);
        Arc::new(ParsedVariable {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            value: Mutex::new(None),
        })
    }

    /// The value, made (zeros) on first use. Panics, naming the variable,
    /// when its zeros cannot be allocated.
    fn with_value<T>(&self, f: impl FnOnce(&mut Storage) -> T) -> T {
        let mut guard = self.value.lock().unwrap_or_else(|e| e.into_inner());
        let value = guard.get_or_insert_with(|| {
            if let Err(e) = tracejit_tensor::check_allocation(self.dtype, &self.shape) {
                panic!("variable {:?} (a stand-in of a parsed graph): {e}", self.name);
            }
            Storage::full(&self.shape, self.dtype, 0.0)
        });
        f(value)
    }
}

impl fmt::Debug for ParsedVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParsedVariable({:?}: {}{:?})", self.name, self.dtype, self.shape)
    }
}

impl VariableResource for ParsedVariable {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    fn read(&self) -> Storage {
        self.with_value(|v| v.clone())
    }
    fn write(&self, value: Storage) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
    }
    fn update(&self, f: &mut dyn FnMut(&Storage) -> Storage) {
        self.with_value(|v| *v = f(v));
    }
    fn id(&self) -> u64 {
        self.id
    }
}

/// One non-comment line.
#[derive(Clone, Copy)]
struct Line<'a> {
    /// 1-based.
    number: usize,
    /// Leading spaces.
    indent: usize,
    /// The whole line, indentation included (for columns).
    text: &'a str,
}

impl Line<'_> {
    fn content(&self) -> &str {
        self.text.trim()
    }

    fn cursor(&self) -> Cursor<'_> {
        Cursor::new(self.text, self.number, self.text.len() - self.text.trim_start().len())
    }
}

struct Parser<'a> {
    lines: Vec<Line<'a>>,
    next: usize,
    kernels: Option<&'a dyn KernelRegistry>,
}

/// A `call` whose callee is checked once the graph's library is parsed.
struct PendingCall {
    line: usize,
    column: usize,
    func: FuncId,
    name: String,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str, kernels: Option<&'a dyn KernelRegistry>) -> Parser<'a> {
        let lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with(';'))
            .map(|(i, text)| Line { number: i + 1, indent: text.len() - text.trim_start_matches(' ').len(), text })
            .collect();
        Parser { lines, next: 0, kernels }
    }

    fn peek(&self) -> Option<&Line<'a>> {
        self.lines.get(self.next)
    }

    /// The next line, or an error saying what should have come.
    fn next_line(&mut self, expected: &str) -> Result<&Line<'a>, ParseError> {
        match self.lines.get(self.next) {
            Some(_) => {
                self.next += 1;
                Ok(&self.lines[self.next - 1])
            }
            None => Err(ParseError::Unexpected {
                line: self.lines.last().map_or(1, |l| l.number + 1),
                column: 1,
                expected: expected.into(),
                found: "end of input".into(),
            }),
        }
    }

    fn parse_all(mut self) -> Result<Graph, ParseError> {
        let g = self.graph_block()?;
        match self.peek() {
            None => Ok(g),
            Some(line) => Err(line.cursor().unexpected("end of input (one graph per text)")),
        }
    }

    /// `variable` lines, the `graph` line, node lines, `}`, then `function`
    /// blocks, all at the indentation of the first line.
    fn graph_block(&mut self) -> Result<Graph, ParseError> {
        let indent = self.peek().map_or(0, |l| l.indent);
        let mut vars: Vec<(String, TensorType)> = Vec::new();
        while let Some(line) = self.peek().filter(|l| l.indent == indent && l.content().starts_with("variable ")) {
            let mut c = line.cursor();
            c.expect("variable")?;
            let column = c.column();
            let id = c.word("a variable id such as `var0`")?;
            if id != format!("var{}", vars.len()) {
                return Err(ParseError::Unexpected {
                    line: c.line(),
                    column,
                    expected: format!("`var{}` (variables are declared in id order)", vars.len()),
                    found: format!("`{id}`"),
                });
            }
            let name = c.string("the variable's name in quotes")?;
            c.expect(":")?;
            let column = c.column();
            let ty = c.tensor_type()?;
            match ty.shape() {
                None => {
                    return Err(ParseError::Invalid {
                        line: c.line(),
                        column,
                        message: format!("a variable's shape must be known, not {ty}"),
                    })
                }
                Some(shape) if tracejit_tensor::byte_size(ty.dtype, &shape).is_none() => {
                    return Err(ParseError::Invalid {
                        line: c.line(),
                        column,
                        message: format!("variable {id} of type {ty} would need more bytes than the address space"),
                    })
                }
                Some(_) => {}
            }
            c.expect_end()?;
            vars.push((name, ty));
            self.next += 1;
        }

        let header = self.next_line("a `graph` line")?;
        let header_number = header.number;
        let mut c = header.cursor();
        c.expect("graph")?;
        let name = graph_name(&mut c)?;
        let params = c.list("(", ")", |c| {
            let column = c.column();
            let (node, index) = c.value_id()?;
            if index != 0 {
                return Err(c.invalid(format!("parameter %{node}.{index}: a parameter is a node's output 0")));
            }
            c.expect(":")?;
            Ok((node, c.tensor_type()?, column))
        })?;
        c.expect("->")?;
        let outputs = c.list("(", ")", |c| {
            let column = c.column();
            Ok((c.value_id()?, column))
        })?;
        c.expect("{")?;
        c.expect_end()?;

        let mut g = Graph::new(name);
        for (name, ty) in &vars {
            let shape = ty.shape().expect("checked above");
            g.add_variable(ParsedVariable::new(name.clone(), ty.dtype, &shape));
        }
        let param_at: BTreeMap<u32, usize> = params.iter().enumerate().map(|(i, (id, _, _))| (*id, i)).collect();
        if param_at.len() != params.len() {
            return Err(ParseError::Invalid {
                line: header_number,
                column: 1,
                message: "a parameter is listed twice".into(),
            });
        }
        let mut calls = Vec::new();
        let ops_vars = VarNames(&vars);
        loop {
            self.fill_params(&mut g, &params, &param_at);
            let line = *self.next_line("a node line or `}`")?;
            if line.content() == "}" {
                break;
            }
            let number = line.number;
            let nested = self.node_line(&mut g, line, &ops_vars, &mut calls)?;
            if let Some((id, kind, column)) = nested {
                let mut blocks = Vec::with_capacity(kind.blocks());
                for _ in 0..kind.blocks() {
                    blocks.push(Arc::new(self.graph_block()?));
                }
                let [first, ..] = blocks.as_slice() else { unreachable!("every nested op has a block") };
                g.node_mut(id).op = match kind {
                    Nested::Fused(nodes) => {
                        if nodes.is_some_and(|n| n != first.len()) {
                            return Err(ParseError::Invalid {
                                line: number,
                                column,
                                message: format!(
                                    "the region says {} nodes, its body has {}",
                                    nodes.unwrap_or(0),
                                    first.len()
                                ),
                            });
                        }
                        Op::Fused { body: first.clone() }
                    }
                    Nested::Cond => Op::Cond { branches: [blocks[0].clone(), blocks[1].clone()] },
                    Nested::While(trip_count, cancel) => Op::While {
                        parts: [blocks[0].clone(), blocks[1].clone()],
                        trip_count,
                        // A token cannot be written down: a fresh one.
                        cancel: cancel.then(crate::control::CancelToken::new),
                    },
                };
            }
        }
        for &(id, _, column) in &params {
            if id as usize >= g.len() {
                return Err(ParseError::Invalid {
                    line: header_number,
                    column,
                    message: format!("parameter %{id} leaves a gap: the graph has {} node(s)", g.len()),
                });
            }
        }
        g.params = params.iter().map(|(id, _, _)| NodeId::from_u32(*id)).collect();
        for ((node, index), column) in outputs {
            g.outputs.push(self.value(&g, node, index, g.len(), header_number, column)?);
        }

        while self.peek().is_some_and(|l| l.indent == indent && l.content().starts_with("function ")) {
            self.function_block(&mut g, indent)?;
        }
        for call in calls {
            let message = if call.func.as_u32() as usize >= g.library.len() {
                format!("function {} {:?} is not in the graph's library", call.func, call.name)
            } else if g.library.get(call.func).name != call.name {
                format!("function {} is named {:?}, not {:?}", call.func, g.library.get(call.func).name, call.name)
            } else {
                continue;
            };
            return Err(ParseError::Invalid { line: call.line, column: call.column, message });
        }
        Ok(g)
    }

    /// Pushes the parameter nodes whose ids come next.
    fn fill_params(&self, g: &mut Graph, params: &[(u32, TensorType, usize)], param_at: &BTreeMap<u32, usize>) {
        while let Some(&i) = param_at.get(&(g.len() as u32)) {
            g.push_node(Node {
                op: Op::Parameter { index: i },
                inputs: SmallVec::new(),
                control_inputs: SmallVec::new(),
                outputs: smallvec::smallvec![params[i].1.clone()],
                location: None,
            });
        }
    }

    /// A reference to output `index` of node `node`, which must exist and be
    /// below `limit`.
    fn value(
        &self,
        g: &Graph,
        node: u32,
        index: u32,
        limit: usize,
        line: usize,
        column: usize,
    ) -> Result<ValueId, ParseError> {
        let v = ValueId::new(NodeId::from_u32(node), index);
        if node as usize >= limit {
            return Err(ParseError::Invalid { line, column, message: format!("{v} is not defined before this use") });
        }
        let n = g.node(v.node).outputs.len();
        if index as usize >= n {
            return Err(ParseError::Invalid { line, column, message: format!("{v}: %{node} has {n} output(s)") });
        }
        Ok(v)
    }

    /// One node line; for a fused node, returns its id, the node count it
    /// claims and the op's column, so the caller parses the body.
    fn node_line(
        &mut self,
        g: &mut Graph,
        line: Line<'_>,
        vars: &VarNames<'_>,
        calls: &mut Vec<PendingCall>,
    ) -> Result<Option<(NodeId, Nested, usize)>, ParseError> {
        let id = g.len() as u32;
        let mut c = line.cursor();
        let mut results = 0usize;
        if c.peek() == Some('%') {
            loop {
                let column = c.column();
                let (node, index) = c.value_id()?;
                if (node, index) != (id, results as u32) {
                    return Err(ParseError::Unexpected {
                        line: line.number,
                        column,
                        expected: format!("`{}`", ValueId::new(NodeId::from_u32(id), results as u32)),
                        found: format!("`{}`", ValueId::new(NodeId::from_u32(node), index)),
                    });
                }
                results += 1;
                if !c.eat(",") {
                    break;
                }
            }
            c.expect("=")?;
        }
        let op_column = c.column();
        let name = c.word("an op name")?;
        let parsed = parse_op(name, &mut c, vars, &NodeName { name: format!("%{id}"), op_column })?;
        let mut inputs = SmallVec::new();
        let mut outputs = SmallVec::new();
        if let ParsedOp::Op(Op::Constant { value }) = &parsed {
            outputs.push(TensorType::known(value.dtype(), value.shape()));
        } else {
            if c.peek() == Some('%') {
                loop {
                    let column = c.column();
                    let (node, index) = c.value_id()?;
                    inputs.push(self.value(g, node, index, id as usize, line.number, column)?);
                    if !c.eat(",") {
                        break;
                    }
                }
            }
            if c.eat(":") {
                loop {
                    outputs.push(c.tensor_type()?);
                    if !c.eat(",") {
                        break;
                    }
                }
            }
        }
        let mut control_inputs = SmallVec::new();
        if c.eat("ctrl") {
            for (node, index, column) in c.list("(", ")", |c| {
                let column = c.column();
                c.value_id().map(|(n, i)| (n, i, column))
            })? {
                let v = ValueId::new(NodeId::from_u32(node), index);
                if index != 0 || node >= id {
                    return Err(ParseError::Invalid {
                        line: line.number,
                        column,
                        message: format!("control input {v}: control inputs name earlier nodes (`%{node}`)"),
                    });
                }
                control_inputs.push(v.node);
            }
        }
        c.expect_end()?;
        if results != outputs.len() {
            return Err(ParseError::Invalid {
                line: line.number,
                column: 1 + line.text.len() - line.text.trim_start().len(),
                message: format!("{results} result(s) named but {} output type(s) given", outputs.len()),
            });
        }
        let mut fused = None;
        let op = match parsed {
            ParsedOp::Op(op) => op,
            ParsedOp::Call { func, name, column } => {
                calls.push(PendingCall { line: line.number, column, func, name });
                Op::Call { func }
            }
            ParsedOp::Nested(kind) => {
                fused = Some((NodeId::from_u32(id), kind, op_column));
                // A placeholder until the caller has parsed the body.
                Op::Fused { body: Arc::new(Graph::default()) }
            }
            ParsedOp::Kernel { name, inputs: declared, column } => {
                let declared: Vec<TensorType> =
                    declared.unwrap_or_else(|| inputs.iter().map(|v| g.value_type(*v).clone()).collect());
                // The IR's own kernel (the precision pass's int8 product)
                // needs no registry: its code is part of this crate.
                let kernel = if name == crate::passes::INT8_KERNEL_NAME {
                    crate::passes::int8_kernel()
                } else {
                    let Some(registry) = self.kernels else {
                        return Err(ParseError::KernelNeedsRegistry {
                            line: line.number,
                            column,
                            node: format!("%{id}"),
                            name,
                        });
                    };
                    let Some(kernel) = registry.lookup(&name, &declared) else {
                        let inputs: Vec<String> = declared.iter().map(|t| t.to_string()).collect();
                        return Err(ParseError::UnknownKernel {
                            line: line.number,
                            column,
                            name,
                            inputs: inputs.join(", "),
                        });
                    };
                    kernel
                };
                Op::Kernel { name, kernel, inputs: declared, outputs: outputs.to_vec() }
            }
        };
        g.push_node(Node { op, inputs, control_inputs, outputs, location: None });
        Ok(fused)
    }

    /// `function f0 "name" implements="...":` and the function's graph.
    fn function_block(&mut self, g: &mut Graph, indent: usize) -> Result<(), ParseError> {
        let line = self.next_line("a `function` line")?;
        let mut c = line.cursor();
        c.expect("function")?;
        let column = c.column();
        let id = c.word("a function id such as `f0`")?;
        let expected = FuncId::from_u32(g.library.len() as u32);
        if id != expected.to_string() {
            return Err(ParseError::Unexpected {
                line: c.line(),
                column,
                expected: format!("`{expected}` (functions are listed in id order)"),
                found: format!("`{id}`"),
            });
        }
        let name = c.string("the function's name in quotes")?;
        let mut attrs = FunctionAttrs::default();
        while !c.eat(":") {
            let column = c.column();
            let key = c.word("an attribute name or `:`")?;
            c.expect("=")?;
            // One arm per field of `FunctionAttrs` (the printer writes them).
            let FunctionAttrs { implements } = &mut attrs;
            let (slot, value) = match key {
                "implements" => (implements, c.string("the composite op's name in quotes")?),
                other => {
                    return Err(ParseError::Unexpected {
                        line: c.line(),
                        column,
                        expected: "a function attribute (`implements`) or `:`".into(),
                        found: format!("`{other}`"),
                    })
                }
            };
            if slot.replace(value).is_some() {
                return Err(ParseError::Invalid {
                    line: c.line(),
                    column,
                    message: format!("attribute `{key}` is given twice"),
                });
            }
        }
        c.expect_end()?;
        let number = line.number;
        if self.peek().is_none_or(|l| l.indent <= indent) {
            let found = self.peek().map_or("end of input".to_string(), |l| format!("`{}`", l.content()));
            return Err(ParseError::Unexpected {
                line: number + 1,
                column: 1,
                expected: "the function's graph, indented under its `function` line".into(),
                found,
            });
        }
        let graph = self.graph_block()?;
        g.library.add(LibraryFunction { name, attrs, graph: Arc::new(graph) });
        Ok(())
    }
}

/// A graph's name: bare when it is made of name characters, else quoted.
fn graph_name(c: &mut Cursor<'_>) -> Result<String, ParseError> {
    if c.peek() == Some('"') {
        return c.string("the graph's name");
    }
    c.word("the graph's name").map(str::to_string)
}
