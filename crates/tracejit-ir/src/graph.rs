//! The graph: an arena of nodes addressed by typed ids, the function library
//! that `Call` nodes refer to, and the variables that stateful nodes use.
//!
//! Invariants (checked by the verifier): every input of a node refers to an
//! earlier node (the arena order is a topological order), every node's output
//! types are what shape inference gives for its op and inputs, `params[i]` is
//! a `Parameter { index: i }` node.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use cranelift_entity::{entity_impl, PrimaryMap};
use smallvec::SmallVec;
use tracejit_tensor::{DType, Storage};

use crate::{infer, Op, OpError, TensorType};

/// A node of a graph.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);
entity_impl!(NodeId, "n");

/// A function in a [`FunctionLibrary`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncId(u32);
entity_impl!(FuncId, "f");

/// A variable used by a graph's stateful nodes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(u32);
entity_impl!(VarId, "var");

/// One output of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    /// The producing node.
    pub node: NodeId,
    /// Which of its outputs.
    pub index: u32,
}

impl ValueId {
    /// Output `index` of `node`.
    pub fn new(node: NodeId, index: u32) -> ValueId {
        ValueId { node, index }
    }
}

impl From<NodeId> for ValueId {
    fn from(node: NodeId) -> ValueId {
        ValueId { node, index: 0 }
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index == 0 {
            write!(f, "%{}", self.node.as_u32())
        } else {
            write!(f, "%{}.{}", self.node.as_u32(), self.index)
        }
    }
}

/// A node: an op, its data inputs, its control inputs (nodes that must run
/// before it), and the type of each output.
#[derive(Clone, Debug)]
pub struct Node {
    /// What it computes.
    pub op: Op,
    /// Data inputs.
    pub inputs: SmallVec<[ValueId; 2]>,
    /// Nodes that must run first (automatic control dependencies).
    pub control_inputs: SmallVec<[NodeId; 1]>,
    /// The type of each output.
    pub outputs: SmallVec<[TensorType; 1]>,
    /// The user's source line that created the node, when known.
    pub location: Option<&'static Location<'static>>,
}

/// A shared, mutable tensor that graphs read and write by reference. The
/// trace crate's `Variable` implements it; the IR only needs these methods.
pub trait VariableResource: Send + Sync + fmt::Debug {
    /// The variable's name, for listings and errors.
    fn name(&self) -> String;
    /// Fixed at creation.
    fn dtype(&self) -> DType;
    /// Fixed at creation.
    fn shape(&self) -> Vec<usize>;
    /// The current value (an O(1) snapshot).
    fn read(&self) -> Storage;
    /// Replaces the value (same dtype and shape, checked by the caller).
    fn write(&self, value: Storage);
    /// [`VariableResource::write`] that hands back the value it replaced,
    /// so an executor can reuse its buffer once nothing else holds it (a
    /// training step then writes each variable into the buffer it held the
    /// step before instead of allocating).
    fn replace(&self, value: Storage) -> Storage {
        let old = self.read();
        self.write(value);
        old
    }
    /// Replaces the value by `f(current)` atomically with respect to other
    /// updates, so concurrent `assign_add`s never lose an increment.
    fn update(&self, f: &mut dyn FnMut(&Storage) -> Storage) {
        let new = f(&self.read());
        self.write(new);
    }
    /// Changes the value through `f`, atomically as [`VariableResource::update`];
    /// `f` may write into the value's buffer when nothing else holds it (a
    /// sparse update of a few rows of a large table). The default hands `f`
    /// a handle that shares the buffer, so a write copies it first.
    fn update_in_place(&self, f: &mut dyn FnMut(&mut Storage)) {
        self.update(&mut |cur| {
            let mut v = cur.clone();
            f(&mut v);
            v
        });
    }
    /// True for a random generator's state: inside `vmap`, a write of it
    /// that is the same for every example (a draw's advance) happens once
    /// per call; other variables may not be written there.
    fn is_random_state(&self) -> bool {
        false
    }
    /// A stable identity, so two handles to one variable compare equal.
    fn id(&self) -> u64;
    /// The lock that serializes locked updates of the variable
    /// ([`crate::locks`]); `None`: its updates are not locked.
    fn update_lock(&self) -> Option<&crate::locks::UpdateLock> {
        None
    }
}

/// The attributes of a library function, one typed field per known
/// attribute, so a misspelt name is a compile error rather than a silent
/// miss. The printer, the parser and structural equality destructure this
/// struct, so a new field does not compile until each of them handles it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FunctionAttrs {
    /// The composite op the function implements (`org.semantic.opname`,
    /// printed `implements="tracejit.nn.gelu"`): the implementation selector
    /// may replace a call of it by a registered kernel, and the inliner keeps
    /// such calls until the selector has run.
    pub implements: Option<String>,
}

impl FunctionAttrs {
    /// Attributes of a function that implements the composite op `name`.
    pub fn implementing(name: impl Into<String>) -> FunctionAttrs {
        FunctionAttrs { implements: Some(name.into()) }
    }
}

/// A function of a library: a graph plus attributes.
#[derive(Clone, Debug)]
pub struct LibraryFunction {
    /// Name for listings.
    pub name: String,
    /// Attributes; `implements` names a composite op.
    pub attrs: FunctionAttrs,
    /// The body.
    pub graph: Arc<Graph>,
}

impl LibraryFunction {
    /// The `implements` attribute, if any.
    pub fn implements(&self) -> Option<&str> {
        self.attrs.implements.as_deref()
    }
}

/// The functions a graph's `Call` nodes refer to.
#[derive(Clone, Debug, Default)]
pub struct FunctionLibrary {
    funcs: PrimaryMap<FuncId, LibraryFunction>,
}

impl FunctionLibrary {
    /// Adds a function and returns its id.
    pub fn add(&mut self, f: LibraryFunction) -> FuncId {
        self.funcs.push(f)
    }

    /// The function with id `id`.
    pub fn get(&self, id: FuncId) -> &LibraryFunction {
        &self.funcs[id]
    }

    /// The function with id `id`, or `None` when there is none.
    pub fn try_get(&self, id: FuncId) -> Option<&LibraryFunction> {
        self.funcs.get(id)
    }

    /// All functions with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (FuncId, &LibraryFunction)> {
        self.funcs.iter()
    }

    /// All functions with their ids, to change (a rewrite of every graph
    /// of a program, such as rebinding its variables).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (FuncId, &mut LibraryFunction)> {
        self.funcs.iter_mut()
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.funcs.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.funcs.is_empty()
    }
}

/// A dataflow graph in topological arena order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Name for listings (the traced function's name).
    pub name: String,
    nodes: PrimaryMap<NodeId, Node>,
    /// The `Parameter` nodes, in input order.
    pub params: Vec<NodeId>,
    /// The results, in order.
    pub outputs: Vec<ValueId>,
    /// Functions called by `Call` nodes.
    pub library: FunctionLibrary,
    /// Variables used by stateful nodes.
    pub variables: PrimaryMap<VarId, Arc<dyn VariableResource>>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Graph::default() }
    }

    /// Adds a parameter of type `ty` as the next input.
    pub fn add_param(&mut self, ty: TensorType) -> ValueId {
        let index = self.params.len();
        let id = self.nodes.push(Node {
            op: Op::Parameter { index },
            inputs: SmallVec::new(),
            control_inputs: SmallVec::new(),
            outputs: smallvec::smallvec![ty],
            location: None,
        });
        self.params.push(id);
        ValueId::new(id, 0)
    }

    /// Adds a node after inferring its output types; the error names the op
    /// and the input types it could not accept.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        control_inputs: &[NodeId],
        location: Option<&'static Location<'static>>,
    ) -> Result<NodeId, OpError> {
        let input_types: SmallVec<[TensorType; 2]> = inputs.iter().map(|v| self.value_type(*v).clone()).collect();
        let outputs = infer(&op, &input_types, Some(self))?;
        Ok(self.push_node(Node {
            op,
            inputs: inputs.iter().copied().collect(),
            control_inputs: control_inputs.iter().copied().collect(),
            outputs,
            location,
        }))
    }

    /// Adds a node whose output types the caller already knows (passes that
    /// rebuild graphs). The verifier re-checks them.
    pub fn push_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node)
    }

    /// Adds a constant node.
    pub fn add_constant(&mut self, value: Storage) -> ValueId {
        let ty = TensorType::known(value.dtype(), value.shape());
        ValueId::new(
            self.nodes.push(Node {
                op: Op::Constant { value },
                inputs: SmallVec::new(),
                control_inputs: SmallVec::new(),
                outputs: smallvec::smallvec![ty],
                location: None,
            }),
            0,
        )
    }

    /// Registers a variable; the same variable (by `id()`) is registered once.
    pub fn add_variable(&mut self, var: Arc<dyn VariableResource>) -> VarId {
        if let Some((id, _)) = self.variables.iter().find(|(_, v)| v.id() == var.id()) {
            return id;
        }
        self.variables.push(var)
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// Mutable access to a node (passes).
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id]
    }

    /// All nodes in topological (arena) order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes.iter()
    }

    /// How deeply control flow and calls nest in the graph: 0 for a graph
    /// with no subgraph, 1 + the deepest subgraph's otherwise (fused
    /// regions and library functions count as levels). Passes and
    /// executors recurse once per level.
    pub fn nesting_depth(&self) -> usize {
        let callees = self.library.iter().map(|(_, f)| f.graph.nesting_depth() + 1);
        let subgraphs = self.nodes().flat_map(|(_, n)| n.op.subgraphs().iter().map(|g| g.nesting_depth() + 1));
        callees.chain(subgraphs).max().unwrap_or(0)
    }

    /// The effects of running the whole graph: the union of its nodes'.
    pub fn effects(&self) -> crate::Effects {
        self.nodes().fold(crate::Effects::PURE, |e, (_, n)| e.union(n.op.effects(&self.library)))
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The type of a value.
    pub fn value_type(&self, v: ValueId) -> &TensorType {
        &self.nodes[v.node].outputs[v.index as usize]
    }

    /// The types of the graph's inputs.
    pub fn param_types(&self) -> Vec<TensorType> {
        self.params.iter().map(|&p| self.nodes[p].outputs[0].clone()).collect()
    }

    /// The types of the graph's outputs.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs.iter().map(|&v| self.value_type(v).clone()).collect()
    }
}
