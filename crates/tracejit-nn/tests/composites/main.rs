//! Tests of the composites of `tracejit::nn`: every declared composite
//! (`declared`), and the native backward of layer norm in depth.

mod declared;
mod layer_norm_grad;
