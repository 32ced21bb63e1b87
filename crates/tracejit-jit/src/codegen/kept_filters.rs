//! `kept_filters`: a convolution whose weights are a variable's value or a
//! constant keeps its packed filter across calls ([`crate::spatial`]):
//! where the kernels' channel-lane forward is the faster one, its packing
//! of the weights is made once per version of them, not once per call (a
//! ResNet-50 at batch 1 would otherwise pack its 94 MB of weights in every
//! call, longer than the convolutions of its 7×7 stage take).
//!
//! Runs after `bf16_products`, before any pass that records step indices.

use std::collections::HashMap;
use std::sync::Arc;

use tracejit_ir::passes::PassResult;
use tracejit_ir::tensor::SpatialOp;

use super::bf16_products::source;
use super::{CodegenContext, SchedulePass};
use crate::gemm_bf16::RhsSource;
use crate::schedule::{Schedule, StepKind};
use crate::spatial::KeptFilter;

/// Gives convolutions by a variable's value or a constant a kept filter.
pub(crate) struct KeptFilters;

impl SchedulePass for KeptFilters {
    fn name(&self) -> &'static str {
        "kept_filters"
    }

    fn run(&self, s: &mut Schedule, _cx: &CodegenContext<'_>) -> PassResult {
        let producer: HashMap<usize, usize> =
            s.steps.iter().enumerate().flat_map(|(i, st)| st.outputs.iter().map(move |&o| (o, i))).collect();
        let mut changed = 0;
        for i in 0..s.steps.len() {
            let StepKind::Spatial(op @ (SpatialOp::Conv2d { .. } | SpatialOp::Conv2dNhwc { .. }), None) =
                &s.steps[i].kind
            else {
                continue;
            };
            if source(s, &producer, s.steps[i].inputs[1]) == RhsSource::Weight {
                let op = *op;
                s.steps[i].kind = StepKind::Spatial(op, Some(Arc::new(KeptFilter::default())));
                changed += 1;
            }
        }
        PassResult::count(changed, "convolutions keeping their packed filters")
    }
}
