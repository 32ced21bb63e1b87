//! Tests of the composites of `tracejit::nn`: every declared composite
//! (`declared`), the native backward of layer norm in depth, and the row
//! kernels on inputs large enough for the pool (`row_kernels`).

mod declared;
mod layer_norm_grad;
mod row_kernels;
