//! Shared helpers: type shorthands, a `Mutex<Storage>` variable resource,
//! small graph builders, and the text-form round-trip assertion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracejit_ir::tensor::{DType, Storage};
use tracejit_ir::{Graph, NodeId, Op, TensorType, ValueId, VariableResource};

/// A type from TF-style dims (`-1` is unknown).
pub fn ty(dtype: DType, dims: &[i64]) -> TensorType {
    TensorType::from_spec(dtype, dims)
}

/// `f32` type shorthand.
pub fn f32t(dims: &[i64]) -> TensorType {
    ty(DType::F32, dims)
}

/// A deterministic f32 tensor with values in about [-3, 3].
pub fn f32s(shape: &[usize], seed: u64) -> Storage {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
        })
        .collect();
    Storage::from_vec(data, shape).unwrap()
}

/// An i64 tensor from values.
pub fn i64s(data: Vec<i64>, shape: &[usize]) -> Storage {
    Storage::from_vec(data, shape).unwrap()
}

/// Adds a node, panicking with the error if inference rejects it.
pub fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    ValueId::from(g.add_node(op, inputs, &[], None).unwrap_or_else(|e| panic!("{e}")))
}

/// Adds a node with control inputs.
pub fn node_ctrl(g: &mut Graph, op: Op, inputs: &[ValueId], ctrl: &[NodeId]) -> NodeId {
    g.add_node(op, inputs, ctrl, None).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that `g` survives its text form: `Graph::parse` of the alternate
/// listing (every constant value) is structurally equal to `g` and prints the
/// same, and so does the plain listing when no constant is elided.
pub fn assert_round_trip(g: &Graph) {
    let full = format!("{g:#}");
    let back = Graph::parse(&full).unwrap_or_else(|e| panic!("the listing does not parse: {e}\n{full}"));
    if let Some(diff) = g.structural_diff(&back) {
        panic!("the parsed graph differs: {diff}\n--- printed\n{full}--- parsed\n{back:#}");
    }
    assert_eq!(format!("{back:#}"), full, "the parsed graph prints differently");
    let plain = g.to_string();
    if !plain.contains("...") {
        let back = Graph::parse(&plain).unwrap_or_else(|e| panic!("the listing does not parse: {e}\n{plain}"));
        assert!(back.structurally_eq(g), "{plain}");
    }
}

/// A variable backed by a mutex, as the trace crate's `Variable` is.
#[derive(Debug)]
pub struct TestVar {
    name: String,
    id: u64,
    dtype: DType,
    shape: Vec<usize>,
    value: Mutex<Storage>,
}

impl TestVar {
    /// A new variable holding `value`.
    pub fn new(name: &str, value: Storage) -> Arc<TestVar> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(TestVar {
            name: name.to_string(),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            dtype: value.dtype(),
            shape: value.shape().to_vec(),
            value: Mutex::new(value),
        })
    }
}

impl VariableResource for TestVar {
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
        self.value.lock().unwrap().clone()
    }
    fn write(&self, value: Storage) {
        assert_eq!(value.dtype(), self.dtype);
        assert_eq!(value.shape(), &self.shape[..]);
        *self.value.lock().unwrap() = value;
    }
    fn id(&self) -> u64 {
        self.id
    }
}
