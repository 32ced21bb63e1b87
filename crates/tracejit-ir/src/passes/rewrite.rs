//! `Rewriter`: the one way passes rebuild a graph. Nodes cannot be removed
//! from a graph's arena, so a pass that drops, merges or replaces nodes walks
//! the old graph in order and builds a compacted new one, deciding for each
//! old node whether to copy it, to map its outputs onto values that already
//! exist in the new graph (an alias), or to emit new nodes in its place.
//!
//! Invariants the rewriter keeps, so passes need not think about them:
//! - the parameters are copied first, in index order, so `params[i]` is a
//!   `Parameter { index: i }` node of the new graph;
//! - an old value's consumers see the new value it was mapped to, and an old
//!   node's control dependents depend on its *stand-ins*: the copy, or, for a
//!   node that disappeared, the nodes that now produce its outputs plus its
//!   own (mapped) control inputs, so ordering constraints survive rewrites;
//! - variables keep their ids (the variable table is copied as is; inlined
//!   bodies add theirs, deduplicated by identity); library functions are
//!   re-added on first use, so functions no call refers to any more vanish.
//!
//! [`Rewriter::inline_body`] copies a nested graph (a callee or a fused
//! region's body) into the new graph; the inliner, the implementation
//! selector and the fusion planner share it. Nodes inlined from a composite
//! (a callee with `implements`) take the source location of the call: its
//! body is tracejit's code, the call is the user's line.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

use cranelift_entity::EntityRef;
use smallvec::SmallVec;
use tracejit_tensor::Storage;

use crate::passes::has_side_effects;
use crate::primitive_ops;
use crate::{infer, ExternalKernel, FuncId, Graph, LibraryFunction, Node, NodeId, Op, OpError, TensorType, ValueId};

/// What to do with a `Call` met while inlining a body.
pub(crate) enum CallAction {
    /// Keep the call (its callee is copied into the new library).
    Keep,
    /// Inline the callee's body.
    Inline,
    /// Replace the call by this native kernel.
    Kernel(Arc<dyn ExternalKernel>),
}

/// Decides what happens to a call: gets the callee and the types of the
/// call's arguments.
pub(crate) type CallPolicy<'p> = &'p mut dyn FnMut(&LibraryFunction, &[TensorType]) -> CallAction;

/// Builds a new graph from an old one; see the module docs.
pub struct Rewriter<'g> {
    old: &'g Graph,
    new: Graph,
    /// Per old node, the new value of each output (`None`: not mapped yet).
    values: Vec<SmallVec<[Option<ValueId>; 1]>>,
    /// Per old node, the new nodes that stand for it in control edges.
    stand_ins: Vec<Option<SmallVec<[NodeId; 2]>>>,
    /// Library functions already added to the new graph, by body pointer.
    funcs: HashMap<*const Graph, FuncId>,
    /// While a composite's body is inlined: the call's location, which its
    /// nodes take.
    attribute_to: Option<&'static Location<'static>>,
}

impl<'g> Rewriter<'g> {
    /// Starts a rebuild of `old`: the new graph has its name, its variables
    /// and (already mapped) its parameters.
    pub fn new(old: &'g Graph) -> Rewriter<'g> {
        let mut new = Graph::new(old.name.clone());
        new.variables = old.variables.clone();
        let mut rw = Rewriter {
            old,
            new,
            values: old.nodes().map(|(_, n)| smallvec::smallvec![None; n.outputs.len()]).collect(),
            stand_ins: vec![None; old.len()],
            funcs: HashMap::new(),
            attribute_to: None,
        };
        for &p in &old.params {
            let ty = old.node(p).outputs[0].clone();
            let v = rw.new.add_param(ty);
            rw.values[p.index()][0] = Some(v);
            rw.stand_ins[p.index()] = Some(smallvec::smallvec![v.node]);
        }
        rw
    }

    /// Adds a parameter after the old graph's (a pass that gives a nested
    /// graph a new input); call it before copying any other node, so that
    /// parameters stay first.
    pub fn add_param(&mut self, ty: TensorType) -> ValueId {
        self.new.add_param(ty)
    }

    /// The graph being rebuilt.
    pub fn old(&self) -> &'g Graph {
        self.old
    }

    /// The new graph so far.
    pub fn graph(&self) -> &Graph {
        &self.new
    }

    /// True when the old node's outputs are already mapped (parameters, or
    /// nodes handled earlier).
    pub fn is_mapped(&self, id: NodeId) -> bool {
        self.stand_ins[id.index()].is_some()
    }

    /// The new value standing for old value `v`.
    ///
    /// # Panics
    ///
    /// If `v` was not mapped yet: a pass visited a consumer before its
    /// producer, or dropped a producer that is still used (a bug in the pass).
    pub fn value(&self, v: ValueId) -> ValueId {
        self.values[v.node.index()][v.index as usize]
            .unwrap_or_else(|| panic!("rewriter: value {v} of graph `{}` is used but was never mapped", self.old.name))
    }

    /// The new values of an old node's data inputs.
    pub fn inputs(&self, id: NodeId) -> SmallVec<[ValueId; 2]> {
        self.old.node(id).inputs.iter().map(|&v| self.value(v)).collect()
    }

    /// The new nodes an old node's control inputs stand for (deduplicated).
    pub fn control(&self, id: NodeId) -> SmallVec<[NodeId; 1]> {
        let mut out: SmallVec<[NodeId; 1]> = SmallVec::new();
        for &c in &self.old.node(id).control_inputs {
            let stand_ins = self.stand_ins[c.index()].as_ref().unwrap_or_else(|| {
                panic!("rewriter: control input {c} of graph `{}` is used but was never mapped", self.old.name)
            });
            for &s in stand_ins {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }

    /// The type of a value of the new graph.
    pub fn value_type(&self, v: ValueId) -> &TensorType {
        self.new.value_type(v)
    }

    /// Copies old node `id` unchanged (inputs and control inputs mapped) and
    /// returns the copy. A parameter is already copied: its copy is returned.
    pub fn copy(&mut self, id: NodeId) -> NodeId {
        let node = self.old.node(id);
        if matches!(node.op, Op::Parameter { .. }) {
            return self.value(ValueId::new(id, 0)).node;
        }
        let op = match &node.op {
            Op::Call { func } => Op::Call { func: self.intern_function(self.old.library.get(*func)) },
            // Variables keep their ids: the new graph starts with the old
            // graph's variable table.
            op @ (Op::Parameter { .. }
            | Op::Constant { .. }
            | primitive_ops!()
            | Op::Fused { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. }) => op.clone(),
        };
        let inputs = self.inputs(id);
        // Types can only have become more precise (an inlined call whose
        // arguments were more precise than its callee's parameters): then
        // the node's types are inferred again.
        let same_types =
            node.inputs.iter().zip(&inputs).all(|(o, n)| self.old.value_type(*o) == self.new.value_type(*n));
        let outputs = if same_types { node.outputs.clone() } else { self.infer_or(&op, &inputs, &node.outputs) };
        let new_node = Node { op, inputs, control_inputs: self.control(id), outputs, location: node.location };
        let new_id = self.new.push_node(new_node);
        let outs: SmallVec<[ValueId; 1]> = (0..node.outputs.len()).map(|i| ValueId::new(new_id, i as u32)).collect();
        self.map(id, &outs, &[new_id]);
        new_id
    }

    /// Maps old node `id`'s outputs onto existing new values (the node
    /// disappears). Its control dependents will wait for the producers of
    /// those values and for its own control inputs.
    pub fn alias(&mut self, id: NodeId, outputs: &[ValueId]) {
        let mut stand_ins: SmallVec<[NodeId; 2]> = outputs.iter().map(|v| v.node).collect();
        stand_ins.extend(self.control(id));
        self.map(id, outputs, &stand_ins);
    }

    /// Records that old node `id`'s outputs are `outputs` and that `stand_ins`
    /// stand for it in control edges.
    pub fn map(&mut self, id: NodeId, outputs: &[ValueId], stand_ins: &[NodeId]) {
        let slots = &mut self.values[id.index()];
        assert_eq!(
            slots.len(),
            outputs.len(),
            "rewriter: node {id} has {} outputs, mapped {}",
            slots.len(),
            outputs.len()
        );
        for (slot, &v) in slots.iter_mut().zip(outputs) {
            *slot = Some(v);
        }
        let mut s: SmallVec<[NodeId; 2]> = SmallVec::new();
        for &n in stand_ins {
            if !s.contains(&n) {
                s.push(n);
            }
        }
        self.stand_ins[id.index()] = Some(s);
    }

    /// Like [`Rewriter::map`] for a node only some of whose outputs are
    /// used afterwards (a member of a fused region whose other outputs stay
    /// inside the region); using an unmapped output panics.
    pub fn map_partial(&mut self, id: NodeId, outputs: &[Option<ValueId>], stand_ins: &[NodeId]) {
        let slots = &mut self.values[id.index()];
        assert_eq!(
            slots.len(),
            outputs.len(),
            "rewriter: node {id} has {} outputs, mapped {}",
            slots.len(),
            outputs.len()
        );
        slots.copy_from_slice(outputs);
        self.stand_ins[id.index()] = Some(stand_ins.iter().copied().collect());
    }

    /// Adds a node to the new graph, inferring its output types.
    pub fn emit(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        control: &[NodeId],
        location: Option<&'static Location<'static>>,
    ) -> Result<NodeId, OpError> {
        self.new.add_node(op, inputs, control, location)
    }

    /// The output types `op` would have on these new values, without adding
    /// anything.
    pub fn infer(&self, op: &Op, inputs: &[ValueId]) -> Result<SmallVec<[TensorType; 1]>, OpError> {
        let types: SmallVec<[TensorType; 2]> = inputs.iter().map(|&v| self.new.value_type(v).clone()).collect();
        infer(op, &types, Some(&self.new))
    }

    /// Emits `op` on `inputs` in place of old node `id` if its inferred
    /// output types are exactly `expected` (what the old node's op gives on
    /// its new inputs, so no consumer's type changes), mapping the old node
    /// to it; returns false and adds nothing otherwise.
    pub fn replace_if_types(&mut self, id: NodeId, op: Op, inputs: &[ValueId], expected: &[TensorType]) -> bool {
        match self.infer(&op, inputs) {
            Ok(types) if types[..] == expected[..] => {}
            _ => return false,
        }
        let old = self.old.node(id);
        let control = self.control(id);
        let new_id = self.new.push_node(Node {
            op,
            inputs: inputs.iter().copied().collect(),
            control_inputs: control,
            outputs: expected.iter().cloned().collect(),
            location: old.location,
        });
        let outs: SmallVec<[ValueId; 1]> = (0..expected.len()).map(|i| ValueId::new(new_id, i as u32)).collect();
        self.map(id, &outs, &[new_id]);
        true
    }

    /// Adds a constant to the new graph.
    pub fn constant(&mut self, value: Storage) -> ValueId {
        self.new.add_constant(value)
    }

    /// The id of `f` in the new graph's library, adding it on first use.
    pub(crate) fn intern_function(&mut self, f: &LibraryFunction) -> FuncId {
        let key = Arc::as_ptr(&f.graph);
        if let Some(&id) = self.funcs.get(&key) {
            return id;
        }
        let id = self.new.library.add(f.clone());
        self.funcs.insert(key, id);
        id
    }

    /// Copies `body` into the new graph with its parameters bound to `args`
    /// and returns the values of its outputs plus the nodes that stand for
    /// the whole body in control edges (its side-effecting nodes and the
    /// producers of its outputs).
    ///
    /// Calls inside `body` are kept, inlined (recursively) or replaced by a
    /// kernel as `policy` says; fused regions inside `body` are dissolved
    /// (the caller plans fusion again over the bigger graph). Every copied
    /// node with side effects also waits for `control` (the control inputs
    /// of the node being expanded).
    /// Replaces call node `id` by `body` inlined with the call's inputs and
    /// control inputs; a malformed call is copied unchanged (the verifier
    /// then says why). Returns whether it was inlined.
    pub(crate) fn inline_call(&mut self, id: NodeId, body: &Graph, policy: CallPolicy<'_>) -> bool {
        let args = self.inputs(id);
        let control = self.control(id);
        let call = self.old.node(id);
        let composite = matches!(call.op, Op::Call { func } if self.old.library.get(func).implements().is_some());
        let outer = self.attribute_to;
        if composite && outer.is_none() {
            self.attribute_to = call.location;
        }
        let inlined = self.inline_body(body, &args, &control, policy);
        self.attribute_to = outer;
        match inlined {
            Ok((outs, stand_ins)) => {
                self.map(id, &outs, &stand_ins);
                true
            }
            Err(_) => {
                self.copy(id);
                false
            }
        }
    }

    pub(crate) fn inline_body(
        &mut self,
        body: &Graph,
        args: &[ValueId],
        control: &[NodeId],
        policy: CallPolicy<'_>,
    ) -> Result<(Vec<ValueId>, Vec<NodeId>), OpError> {
        if args.len() != body.params.len() {
            return Err(OpError::new(
                "inline",
                format!("`{}` takes {} arguments, got {}", body.name, body.params.len(), args.len()),
            ));
        }
        let mut values: Vec<SmallVec<[Option<ValueId>; 1]>> =
            body.nodes().map(|(_, n)| smallvec::smallvec![None; n.outputs.len()]).collect();
        let mut stand_ins: Vec<SmallVec<[NodeId; 2]>> = vec![SmallVec::new(); body.len()];
        let mut effects: Vec<NodeId> = Vec::new();
        for (i, &p) in body.params.iter().enumerate() {
            values[p.index()][0] = Some(args[i]);
            stand_ins[p.index()] = smallvec::smallvec![args[i].node];
        }
        let missing = |v: ValueId| OpError::new("inline", format!("value {v} of `{}` is not available", body.name));

        for (id, node) in body.nodes() {
            if matches!(node.op, Op::Parameter { .. }) {
                continue;
            }
            let inputs: Vec<ValueId> = node
                .inputs
                .iter()
                .map(|&v| values[v.node.index()][v.index as usize].ok_or_else(|| missing(v)))
                .collect::<Result<_, _>>()?;
            let mut ctrl: Vec<NodeId> = Vec::new();
            for c in &node.control_inputs {
                for &s in &stand_ins[c.index()] {
                    if !ctrl.contains(&s) {
                        ctrl.push(s);
                    }
                }
            }
            let effectful = has_side_effects(body, &node.op);
            if effectful {
                for &c in control {
                    if !ctrl.contains(&c) {
                        ctrl.push(c);
                    }
                }
            }
            let input_types: Vec<TensorType> = inputs.iter().map(|&v| self.new.value_type(v).clone()).collect();
            // Calls get a policy decision; a fused region is dissolved; every
            // other node is copied with its table references moved over.
            let call = if let Op::Call { func } = &node.op { Some(body.library.get(*func)) } else { None };
            let action = call.map(|f| (f, policy(f, &input_types)));
            let (outs, stands): (Vec<ValueId>, Vec<NodeId>) = match action {
                Some((callee, CallAction::Inline)) => {
                    let outer = self.attribute_to;
                    if callee.implements().is_some() && outer.is_none() {
                        self.attribute_to = node.location;
                    }
                    let callee = callee.graph.clone();
                    let inlined = self.inline_body(&callee, &inputs, &ctrl, policy);
                    self.attribute_to = outer;
                    inlined?
                }
                Some((callee, CallAction::Kernel(kernel))) => {
                    let name = callee.implements().unwrap_or_default().to_string();
                    let op = Op::Kernel { name, kernel, inputs: input_types, outputs: node.outputs.to_vec() };
                    self.push_copy(node, op, &inputs, &ctrl)
                }
                Some((_, CallAction::Keep)) | None => {
                    if let Op::Fused { body: region } = &node.op {
                        let region = region.clone();
                        self.inline_body(&region, &inputs, &ctrl, policy)?
                    } else {
                        let op = self.reintern(body, &node.op);
                        self.push_copy(node, op, &inputs, &ctrl)
                    }
                }
            };
            if effectful {
                effects.extend(stands.iter().copied());
            }
            for (slot, v) in values[id.index()].iter_mut().zip(&outs) {
                *slot = Some(*v);
            }
            stand_ins[id.index()] = stands.into_iter().collect();
        }

        let outputs: Vec<ValueId> = body
            .outputs
            .iter()
            .map(|&v| values[v.node.index()][v.index as usize].ok_or_else(|| missing(v)))
            .collect::<Result<_, _>>()?;
        let mut stands = effects;
        for v in &outputs {
            if !stands.contains(&v.node) {
                stands.push(v.node);
            }
        }
        for &c in control {
            if !stands.contains(&c) {
                stands.push(c);
            }
        }
        Ok((outputs, stands))
    }

    /// The output types of `op` on these new values; `fallback` if inference
    /// rejects them. That happens only when a value became more precise
    /// than the graph was traced for and the precise shapes cannot work (the
    /// program would fail when run); the verifier then reports the node.
    fn infer_or(&self, op: &Op, inputs: &[ValueId], fallback: &[TensorType]) -> SmallVec<[TensorType; 1]> {
        self.infer(op, inputs).unwrap_or_else(|_| fallback.iter().cloned().collect())
    }

    /// Pushes `op` in place of `like` (a node of an inlined body), its types
    /// inferred from the actual arguments; returns its outputs and itself.
    /// `op` of an inlined `body` with its references into the body's tables
    /// (library functions, variables) moved to the new graph's.
    fn reintern(&mut self, body: &Graph, op: &Op) -> Op {
        match op {
            Op::Call { func } => Op::Call { func: self.intern_function(body.library.get(*func)) },
            Op::ReadVariable { var, locked } => {
                Op::ReadVariable { var: self.new.add_variable(body.variables[*var].clone()), locked: *locked }
            }
            Op::AssignVariable { var, kind, locked } => {
                let var = self.new.add_variable(body.variables[*var].clone());
                Op::AssignVariable { var, kind: *kind, locked: *locked }
            }
            // No reference into the body's tables (fused bodies, branches
            // and loop bodies are self-contained graphs).
            Op::Parameter { .. }
            | Op::Constant { .. }
            | primitive_ops!()
            | Op::Fused { .. }
            | Op::Cond { .. }
            | Op::While { .. }
            | Op::Kernel { .. } => op.clone(),
        }
    }

    fn push_copy(&mut self, like: &Node, op: Op, inputs: &[ValueId], ctrl: &[NodeId]) -> (Vec<ValueId>, Vec<NodeId>) {
        // Constants need no inference; a kernel's types are declared.
        let declared = matches!(op, Op::Constant { .. } | Op::Kernel { .. });
        let outputs = if declared { like.outputs.clone() } else { self.infer_or(&op, inputs, &like.outputs) };
        let id = self.new.push_node(Node {
            op,
            inputs: inputs.iter().copied().collect(),
            control_inputs: ctrl.iter().copied().collect(),
            outputs,
            location: self.attribute_to.or(like.location),
        });
        ((0..like.outputs.len()).map(|i| ValueId::new(id, i as u32)).collect(), vec![id])
    }

    /// Finishes the rebuild: maps the graph outputs and returns the new graph.
    pub fn finish(mut self) -> Graph {
        self.new.outputs = self.old.outputs.iter().map(|&v| self.value(v)).collect();
        self.new
    }
}
