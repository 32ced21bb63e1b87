//! Which recorded values a gradient can flow from into its sources: the
//! backward pass computes cotangents only for those.
//!
//! A tape records every op with a watched input, and an op's rule gives a
//! cotangent to each of its inputs. Followed blindly, `x · w` with only
//! `w` watched would also compute `g · wᵀ` for the batch `x` (a product as
//! large as the one asked for, 25.7 M multiply-adds in W6's first layer),
//! and carry cotangents on through whatever computed `x`. Eagerly that is
//! real work; PyTorch's autograd skips inputs that need no gradient, and a
//! traced graph drops them as dead code. Here a value is *relevant* when
//! it is a source or an output of a recorded op with a relevant input (or
//! relevant variable read); the backward pass asks each rule only for its
//! relevant inputs ([`tracejit_ir::autodiff::vjp_wanted`]) and drops the
//! rest.

use std::collections::HashSet;

use super::{Entry, Recorded};
use crate::Tensor;

/// The tape ids of the values relevant to `sources` (see the module),
/// in one forward pass over `entries` (recorded in execution order).
pub(super) fn relevant(entries: &[Entry], sources: &[Vec<Tensor>]) -> HashSet<u64> {
    let mut ids: HashSet<u64> = sources.iter().flatten().map(Tensor::tape_id).collect();
    for entry in entries {
        let reads = match &entry.what {
            Recorded::Graph(_, vars) => vars.iter().map(|(_, t)| t.tape_id()).collect(),
            Recorded::Control(_, vars) => vars.iter().map(|(_, t)| t.tape_id()).collect(),
            _ => Vec::new(),
        };
        let live = entry.inputs.iter().map(Tensor::tape_id).chain(reads).any(|id| ids.contains(&id));
        if live {
            ids.extend(entry.outputs.iter().map(Tensor::tape_id));
        }
    }
    ids
}
