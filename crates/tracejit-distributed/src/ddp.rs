//! [`average_gradients`]: the data-parallel (DDP) step. Every rank computed
//! gradients on its share of the batch; each gets the mean over ranks.
//!
//! The gradients travel in buckets of at most [`crate::bucket_bytes`]
//! (25 MiB by default; one gradient larger than that is a bucket of its
//! own; the first bucket at most [`FIRST_BUCKET_BYTES`], 1 MiB, as
//! PyTorch's), filled from the last gradient to the first — the order a
//! backward pass produces them, so the first bucket is complete earliest. Each
//! bucket is two nodes: a *start* node that packs the bucket's gradients
//! into one buffer and starts a non-blocking all-reduce
//! (`MPI_Iallreduce`), returning a token (an i64 scalar), and a *wait*
//! node that takes the token, waits (against the timeout) and unpacks the
//! means. Every start is recorded before every wait, so all buckets are in
//! flight together and the sums travel while later buckets are packed; the
//! optimizer's reads depend on the waits' outputs.
//!
//! Inside a compiled step the starts do not wait for their place in
//! program order (after the whole backward, where `average_gradients` is
//! called): a start says `ExternalKernel::starts_early`, and the JIT's
//! `start_early` pass runs it right after the step making its bucket's
//! last gradient. While buckets are in flight the executor polls between
//! steps (`tracejit_ir::progress`; at most every [`POLL_EVERY`]), each poll
//! one `MPI_Test` per bucket, so the sums travel while the rest of the
//! backward computes and the waits find them done or nearly (the
//! profile's `wait_bucket` steps show what remains).
//!
//! Every rank ends the step with bit-identical gradients: an all-reduce
//! gives every rank the same sum (MPICH and Open MPI combine the same
//! partial sums on every rank for their all-reduce algorithms; the
//! distributed tests check it bit for bit), and the division by the world's
//! size is the same on every rank.
//!
//! In a world of one the nodes are still recorded (so a program's graph
//! does not depend on how it was launched); they cost a copy of the
//! gradients and return them unchanged.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use tracejit_ir::{Effects, ExternalKernel, TensorType};
use tracejit_tensor::{DType, Storage};
use tracejit_trace::{call_external, ExternalCall, Tensor};

use crate::collectives::{check_dtype, fail, COLLECTIVE_STREAM, NODE_PREFIX};
use crate::elems::{Elems, Kind};
use crate::transport::{self, Collective, Pending};
use crate::{world, Error, ReduceOp};

/// Buckets started and not yet waited for, by token.
static IN_FLIGHT: LazyLock<Mutex<HashMap<i64, InFlight>>> = LazyLock::new(Default::default);

/// The least time between two progress polls: an `MPI_Test` costs about a
/// microsecond, and a schedule's small steps (views, scalars) take less.
const POLL_EVERY: std::time::Duration = std::time::Duration::from_micros(50);

/// The progress hook ([`tracejit_ir::progress`]): one test of every bucket
/// in flight, unless another thread is polling or the last poll was less
/// than [`POLL_EVERY`] ago.
fn progress() {
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    let Ok(mut last) = LAST.try_lock() else { return };
    if last.is_some_and(|t| t.elapsed() < POLL_EVERY) {
        return;
    }
    *last = Some(std::time::Instant::now());
    if let Ok(mut buckets) = IN_FLIGHT.try_lock() {
        buckets.values_mut().for_each(|b| b.pending.progress());
    }
}
static NEXT_TOKEN: AtomicI64 = AtomicI64::new(1);

/// A started bucket: the collective and what to unpack it into.
struct InFlight {
    pending: Pending,
    types: Vec<(DType, Vec<usize>)>,
}

/// Starts a bucket's all-reduce; returns its token.
struct StartBucket {
    index: usize,
}

/// Waits for a bucket and returns its gradients' means.
struct WaitBucket {
    index: usize,
}

impl fmt::Debug for StartBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StartBucket({})", self.index)
    }
}

impl fmt::Debug for WaitBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WaitBucket({})", self.index)
    }
}

impl ExternalKernel for StartBucket {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        let types: Vec<(DType, Vec<usize>)> = inputs.iter().map(|s| (s.dtype(), s.shape().to_vec())).collect();
        let n: usize = inputs.iter().map(Storage::len).sum();
        let dtype = inputs.first().map_or(DType::F32, Storage::dtype);
        let what = format!("average_gradients bucket {} ({} tensors, {n} {dtype:?})", self.index, inputs.len());
        let c = Collective::AllReduce(ReduceOp::Mean);
        if let Err(e) = check_dtype(c, dtype, &what) {
            fail(e);
        }
        let refs: Vec<&Storage> = inputs.iter().collect();
        let pending = match transport::start(Collective::AllReduce(ReduceOp::Sum), Elems::pack(&refs), what) {
            Ok(p) => p,
            Err(e) => fail(e),
        };
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()).insert(token, InFlight { pending, types });
        tracejit_ir::progress::set_hook(progress);
        tracejit_ir::progress::started();
        vec![Storage::scalar(token)]
    }

    fn effects(&self) -> Effects {
        Effects::WRITES
    }

    fn starts_early(&self) -> bool {
        true
    }
}

impl ExternalKernel for WaitBucket {
    fn run(&self, inputs: &[Storage], _isa: tracejit_kernels::Isa) -> Vec<Storage> {
        let token = inputs[0].to_vec::<i64>().ok().and_then(|v| v.first().copied()).unwrap_or(-1);
        let started = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()).remove(&token);
        let Some(InFlight { pending, types }) = started else {
            panic!("average_gradients: bucket {} was not started (token {token})", self.index)
        };
        tracejit_ir::progress::finished();
        let size = world::current().map_or(1, |w| w.size());
        match pending.wait() {
            Ok(mut sum) => {
                if size > 1 {
                    sum.divide(size);
                }
                sum.unpack(0, &types)
            }
            Err(e) => fail(e),
        }
    }

    fn effects(&self) -> Effects {
        Effects::WRITES
    }
}

/// The most bytes the first bucket (the last gradients) holds, whatever
/// the bucket size: PyTorch DDP's first bucket (1 MiB), so that the first
/// all-reduce starts early in the backward rather than after a whole
/// 25 MiB of gradients (for W10's 6.65 MB of gradients: after its last
/// block's instead of after all of them).
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Which gradients go together: indices into the gradient list, each
/// bucket of one dtype's transport kind and at most `cap` bytes (the first
/// at most [`FIRST_BUCKET_BYTES`]; unless one gradient alone is larger, or
/// its size is unknown), filled from the last gradient backwards.
pub(crate) fn plan_buckets(types: &[TensorType], cap: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let (mut bytes, mut kind) = (0usize, None);
    for i in (0..types.len()).rev() {
        let k = Kind::of(types[i].dtype);
        let b = types[i].num_elements().map(|n| n.saturating_mul(k.size()));
        let cap = if buckets.is_empty() { cap.min(FIRST_BUCKET_BYTES) } else { cap };
        let fits = b.is_some_and(|b| bytes.saturating_add(b) <= cap) && kind == Some(k);
        if !current.is_empty() && !fits {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes = bytes.saturating_add(b.unwrap_or(usize::MAX));
        kind = Some(k);
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// The mean over ranks of each gradient: the DDP step, eagerly or inside a
/// compiled training step (see the module docs for buckets and overlap).
/// Every rank must pass gradients of the same dtypes and shapes in the same
/// order; the results have the inputs' dtypes and shapes. Float dtypes
/// only. A failure panics naming the rank (inside a function, `call`
/// returns it as an `Err`).
///
/// ```
/// use tracejit_distributed::average_gradients;
/// use tracejit_trace::Tensor;
///
/// let grads = vec![Tensor::from_vec(vec![0.5f32, -1.0], &[2]), Tensor::scalar(2.0f32)];
/// let avg = average_gradients(&grads);
/// if tracejit_distributed::init()?.size() == 1 {
///     assert_eq!(avg[0].to_vec::<f32>()?, [0.5, -1.0]); // a world of one changes nothing
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn average_gradients(grads: &[Tensor]) -> Vec<Tensor> {
    let types: Vec<TensorType> = grads.iter().map(Tensor::tensor_type).collect();
    let buckets = plan_buckets(&types, crate::bucket_bytes());
    let tokens: Vec<Tensor> = buckets
        .iter()
        .enumerate()
        .map(|(b, members)| {
            let call = ExternalCall {
                name: format!("{NODE_PREFIX}start_bucket"),
                kernel: Arc::new(StartBucket { index: b }),
                outputs: vec![TensorType::known(DType::I64, &[])],
                stream: Some(COLLECTIVE_STREAM),
                vjp: None,
            };
            let args: Vec<&Tensor> = members.iter().map(|&i| &grads[i]).collect();
            call_external(&call, &args).remove(0)
        })
        .collect();
    let mut out: Vec<Option<Tensor>> = vec![None; grads.len()];
    for (b, (members, token)) in buckets.iter().zip(&tokens).enumerate() {
        let call = ExternalCall {
            name: format!("{NODE_PREFIX}wait_bucket"),
            kernel: Arc::new(WaitBucket { index: b }),
            outputs: members.iter().map(|&i| types[i].clone()).collect(),
            stream: Some(COLLECTIVE_STREAM),
            vjp: None,
        };
        for (&i, t) in members.iter().zip(call_external(&call, &[token])) {
            out[i] = Some(t);
        }
    }
    out.into_iter().map(|t| t.expect("every gradient is in one bucket")).collect()
}

/// [`average_gradients`] returning its failure instead of panicking.
pub fn try_average_gradients(grads: &[Tensor]) -> Result<Vec<Tensor>, Error> {
    crate::collectives::catching(|| average_gradients(grads))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(n: usize) -> TensorType {
        TensorType::known(DType::F32, &[n])
    }

    #[test]
    fn buckets_fill_backwards_up_to_the_cap_and_split_on_kind() {
        let types = [f32s(10), f32s(10), f32s(30), TensorType::known(DType::F64, &[2]), f32s(5)];
        // 40 f32 bytes, 40, 120, 16 (f64), 20; cap 80 bytes.
        assert_eq!(plan_buckets(&types, 80), vec![vec![4], vec![3], vec![2], vec![1, 0]]);
        assert_eq!(plan_buckets(&types[..2], 1 << 20), vec![vec![1, 0]]);
        assert!(plan_buckets(&[], 80).is_empty());
        // The first bucket stops at 1 MiB, the next ones at the cap.
        let mib = || TensorType::known(DType::F32, &[1 << 18]);
        assert_eq!(plan_buckets(&[mib(), mib(), mib(), mib()], 25 << 20), vec![vec![3], vec![2, 1, 0]]);
        // A gradient of unknown size travels alone.
        let unknown = TensorType::from_spec(DType::F32, &[-1, 3]);
        assert_eq!(plan_buckets(&[f32s(1), unknown, f32s(1)], 1 << 20), vec![vec![2], vec![1], vec![0]]);
    }
}
