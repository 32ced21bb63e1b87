//! The op table: every ONNX op type the importer maps, with its handler,
//! the attributes the handler reads (any other is refused at import), the
//! input positions that must be known at trace time (so a graph input
//! feeding one becomes a static input), and ops known to be missing with
//! the reason (the primitive or dtype they need). An op may also check
//! its attribute values at import (`check`), so a value it cannot honour
//! is refused before any input is seen.
//!
//! Handlers live in one file per family: `elementwise`, `reduce`,
//! `shape`, `indexing`, `nn` (dense layers and normalizations),
//! `einsum`, `attention`, `flex_attention` (domain `ai.onnx.preview`),
//! `linear_attention`, `rnn` (RNN, GRU, LSTM), `rotary`, `control` (`If`, `Loop`, `Scan`), `state` (caches
//! and recurrent state),
//! `signal` (windows, DFT, STFT), `resize`, `loss`, `conv` (convolutions and pools;
//! `conv3d`, `conv_transpose3d`, `pool_nd` and `window_nd` take 3-D and
//! dilated windows) and `quant`
//! (quantization).

pub(crate) mod attention;
pub(crate) mod control;
pub(crate) mod conv;
pub(crate) mod conv3d;
pub(crate) mod conv_transpose3d;
pub(crate) mod einsum;
pub(crate) mod elementwise;
pub(crate) mod flex_attention;
pub(crate) mod indexing;
pub(crate) mod linear_attention;
pub(crate) mod loss;
pub(crate) mod nn;
pub(crate) mod pool_nd;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod rnn;
pub(crate) mod rotary;
pub(crate) mod shape;
pub(crate) mod signal;
pub(crate) mod state;
pub(crate) mod window_nd;

use super::node::{Node, OpResult};

/// An op handler.
pub(crate) type Handler = fn(&mut Node) -> OpResult;

/// An import-time check of a node's attribute values (the node has no
/// inputs yet): `Err` is the reason it is refused.
pub(crate) type Check = fn(&Node) -> std::result::Result<(), String>;

/// One row of the table.
pub(crate) struct OpDef {
    /// The ONNX op type.
    pub name: &'static str,
    /// Maps a node onto tensor ops.
    pub handler: Handler,
    /// The attributes the handler reads.
    pub attrs: &'static [&'static str],
    /// Input positions whose values must be known at trace time.
    pub statics: &'static [usize],
    /// The op reads only its input's shape (`Shape`, `Size`).
    pub shape_only: bool,
    /// `Some(reason)`: the op is known and refused for that reason.
    pub refuse: Option<&'static str>,
    /// Checks the attribute values at import.
    pub check: Option<Check>,
    /// The op's domain: `""` for the default one.
    pub domain: &'static str,
    /// The version of `domain` the op is read at (another domain's only).
    pub domain_version: i64,
    /// The attributes that may hold a subgraph (checked at import).
    pub subgraphs: &'static [&'static str],
}

const fn op(name: &'static str, handler: Handler, attrs: &'static [&'static str]) -> OpDef {
    OpDef {
        name,
        handler,
        attrs,
        statics: &[],
        shape_only: false,
        refuse: None,
        check: None,
        domain: "",
        domain_version: 0,
        subgraphs: &[],
    }
}

const fn with_statics(
    name: &'static str,
    handler: Handler,
    attrs: &'static [&'static str],
    statics: &'static [usize],
) -> OpDef {
    OpDef {
        name,
        handler,
        attrs,
        statics,
        shape_only: false,
        refuse: None,
        check: None,
        domain: "",
        domain_version: 0,
        subgraphs: &[],
    }
}

const fn checked(name: &'static str, handler: Handler, attrs: &'static [&'static str], check: Check) -> OpDef {
    OpDef {
        name,
        handler,
        attrs,
        statics: &[],
        shape_only: false,
        refuse: None,
        check: Some(check),
        domain: "",
        domain_version: 0,
        subgraphs: &[],
    }
}

/// An op that reads only its input's shape.
const fn shape_only(name: &'static str, handler: Handler, attrs: &'static [&'static str]) -> OpDef {
    OpDef { shape_only: true, ..op(name, handler, attrs) }
}

fn refused(_: &mut Node) -> OpResult {
    Err("refused at import".into())
}

const fn missing(name: &'static str, reason: &'static str) -> OpDef {
    OpDef {
        name,
        handler: refused,
        attrs: &[],
        statics: &[],
        shape_only: false,
        refuse: Some(reason),
        check: None,
        domain: "",
        domain_version: 0,
        subgraphs: &[],
    }
}

const REDUCE: &[&str] = &["axes", "keepdims", "noop_with_empty_axes"];
const ARG: &[&str] = &["axis", "keepdims", "select_last_index"];
const CONV: &[&str] = &["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"];
const CONV_T: &[&str] =
    &["auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"];
const POOL: &[&str] = &["auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides", "storage_order"];
const AVG_POOL: &[&str] =
    &["auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"];
const LP_POOL: &[&str] = &["auto_pad", "ceil_mode", "dilations", "kernel_shape", "p", "pads", "strides"];
const BATCH_NORM: &[&str] = &["epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"];
const STASH_NORM: &[&str] = &["axis", "epsilon", "stash_type"];

use conv as c;
use elementwise as e;
use indexing as ix;
use quant as q;
use reduce as r;
use shape as s;

/// The table, by op type.
static OPS: &[OpDef] = &[
    // Elementwise math.
    op("Abs", e::abs, &[]),
    op("Neg", e::neg, &[]),
    op("Sign", e::sign, &[]),
    op("Exp", e::exp, &[]),
    op("Log", e::log, &[]),
    op("Sqrt", e::sqrt, &[]),
    op("Reciprocal", e::reciprocal, &[]),
    op("Tanh", e::tanh, &[]),
    op("Sigmoid", e::sigmoid, &[]),
    op("Relu", e::relu, &[]),
    op("Erf", e::erf, &[]),
    op("Sin", e::sin, &[]),
    op("Cos", e::cos, &[]),
    op("Tan", e::tan, &[]),
    op("Sinh", e::sinh, &[]),
    op("Cosh", e::cosh, &[]),
    op("Atan", e::atan, &[]),
    op("Asin", e::asin, &[]),
    op("Acos", e::acos, &[]),
    op("Asinh", e::asinh, &[]),
    op("Acosh", e::acosh, &[]),
    op("Atanh", e::atanh, &[]),
    op("Floor", e::floor, &[]),
    op("Ceil", e::ceil, &[]),
    op("Round", e::round, &[]),
    op("Not", e::not, &[]),
    op("IsNaN", e::is_nan, &[]),
    op("IsInf", e::is_inf, &["detect_positive", "detect_negative"]),
    op("Softplus", e::softplus, &[]),
    op("Identity", e::identity, &[]),
    op("Add", e::add, &["broadcast", "axis", "consumed_inputs"]),
    op("Sub", e::sub, &["broadcast", "axis", "consumed_inputs"]),
    op("Mul", e::mul, &["broadcast", "axis", "consumed_inputs"]),
    op("Div", e::div, &["broadcast", "axis", "consumed_inputs"]),
    op("Pow", e::pow, &[]),
    op("Mod", e::modulo, &["fmod"]),
    op("Equal", e::equal, &[]),
    op("Less", e::less, &[]),
    op("Greater", e::greater, &[]),
    op("LessOrEqual", e::less_or_equal, &[]),
    op("GreaterOrEqual", e::greater_or_equal, &[]),
    op("And", e::and, &[]),
    op("Or", e::or, &[]),
    op("Xor", e::xor, &[]),
    op("Max", e::max, &[]),
    op("Min", e::min, &[]),
    op("Sum", e::sum, &[]),
    op("Mean", e::mean, &[]),
    op("Where", e::where_, &[]),
    op("Clip", e::clip, &["min", "max"]),
    op("Cast", e::cast, &["to", "saturate", "round_mode"]),
    op("CastLike", e::cast_like, &["saturate", "round_mode"]),
    // Activations.
    op("PRelu", e::prelu, &[]),
    op("LeakyRelu", e::leaky_relu, &["alpha"]),
    op("Elu", e::elu, &["alpha"]),
    op("Celu", e::celu, &["alpha"]),
    op("Selu", e::selu, &["alpha", "gamma"]),
    op("ThresholdedRelu", e::thresholded_relu, &["alpha"]),
    op("HardSigmoid", e::hard_sigmoid, &["alpha", "beta"]),
    op("HardSwish", e::hard_swish, &[]),
    op("Softsign", e::softsign, &[]),
    op("Mish", e::mish, &[]),
    op("Swish", e::swish, &["alpha"]),
    op("Gelu", e::gelu, &["approximate"]),
    op("Shrink", e::shrink, &["bias", "lambd"]),
    // Reductions.
    with_statics("ReduceSum", r::sum, REDUCE, &[1]),
    with_statics("ReduceMean", r::mean, REDUCE, &[1]),
    with_statics("ReduceMax", r::max, REDUCE, &[1]),
    with_statics("ReduceMin", r::min, REDUCE, &[1]),
    with_statics("ReduceProd", r::prod, REDUCE, &[1]),
    with_statics("ReduceL1", r::l1, REDUCE, &[1]),
    with_statics("ReduceL2", r::l2, REDUCE, &[1]),
    with_statics("ReduceSumSquare", r::sum_square, REDUCE, &[1]),
    with_statics("ReduceLogSum", r::log_sum, REDUCE, &[1]),
    with_statics("ReduceLogSumExp", r::log_sum_exp, REDUCE, &[1]),
    op("ArgMax", r::arg_max, ARG),
    op("ArgMin", r::arg_min, ARG),
    // Shapes and movement.
    shape_only("Shape", s::shape, &["start", "end"]),
    shape_only("Size", s::size, &[]),
    with_statics("Reshape", s::reshape, &["allowzero", "shape", "consumed_inputs"], &[1]),
    op("Flatten", s::flatten, &["axis"]),
    with_statics("Squeeze", s::squeeze, &["axes"], &[1]),
    with_statics("Unsqueeze", s::unsqueeze, &["axes"], &[1]),
    op("Transpose", s::transpose, &["perm"]),
    op("Concat", s::concat, &["axis"]),
    with_statics("Split", s::split, &["axis", "split", "num_outputs"], &[1]),
    with_statics("Slice", s::slice, &["starts", "ends", "axes"], &[1, 2, 3, 4]),
    with_statics("Expand", s::expand, &[], &[1]),
    with_statics("Tile", s::tile, &[], &[1]),
    op("Constant", s::constant, &["value", "value_float", "value_floats", "value_int", "value_ints"]),
    with_statics("ConstantOfShape", s::constant_of_shape, &["value"], &[0]),
    with_statics("Range", s::range, &[], &[0, 1, 2]),
    op("EyeLike", s::eye_like, &["dtype", "k"]),
    with_statics("Trilu", s::trilu, &["upper"], &[1]),
    op("DepthToSpace", s::depth_to_space, &["blocksize", "mode"]),
    with_statics("CenterCropPad", s::center_crop_pad, &["axes"], &[1]),
    with_statics("AffineGrid", s::affine_grid, &["align_corners"], &[1]),
    with_statics("Resize", resize::resize, resize::RESIZE_ATTRS, &[1, 2, 3]),
    with_statics("Upsample", resize::resize, &["mode", "scales"], &[1]),
    op("GridSample", resize::grid_sample, resize::GRID_ATTRS),
    with_statics("HannWindow", signal::window, signal::WINDOW_ATTRS, &[0]),
    with_statics("HammingWindow", signal::window, signal::WINDOW_ATTRS, &[0]),
    with_statics("BlackmanWindow", signal::window, signal::WINDOW_ATTRS, &[0]),
    with_statics("DFT", signal::dft, signal::DFT_ATTRS, &[1, 2]),
    with_statics("STFT", signal::stft, signal::STFT_ATTRS, &[1, 3]),
    op("SpaceToDepth", s::space_to_depth, &["blocksize"]),
    // Indexing.
    op("Gather", ix::gather, &["axis"]),
    op("GatherElements", ix::gather_elements, &["axis"]),
    op("GatherND", ix::gather_nd, &["batch_dims"]),
    op("ScatterElements", ix::scatter_elements, &["axis", "reduction"]),
    op("Scatter", ix::scatter_elements, &["axis"]),
    op("ScatterND", ix::scatter_nd, &["reduction"]),
    with_statics("OneHot", ix::one_hot, &["axis"], &[1]),
    with_statics("TopK", ix::top_k, &["axis", "k", "largest", "sorted"], &[1]),
    with_statics("CumSum", ix::cumsum, &["exclusive", "reverse"], &[1]),
    with_statics("CumProd", ix::cumprod, &["exclusive", "reverse"], &[1]),
    op("ReverseSequence", ix::reverse_sequence, &["batch_axis", "time_axis"]),
    with_statics("NonZero", ix::non_zero, &[], &[0]),
    with_statics("Compress", ix::compress, &["axis"], &[1]),
    with_statics("Pad", ix::pad, &["mode", "pads", "paddings", "value"], &[1, 2, 3]),
    // Dense layers, normalizations.
    op("MatMul", nn::matmul, &[]),
    checked("Einsum", einsum::einsum, &["equation"], einsum::check),
    op("Gemm", nn::gemm, &["alpha", "beta", "transA", "transB", "broadcast"]),
    op("Softmax", nn::softmax, &["axis"]),
    op("LogSoftmax", nn::log_softmax, &["axis"]),
    op("Hardmax", nn::hardmax, &["axis"]),
    op("BatchNormalization", nn::batch_norm, BATCH_NORM),
    op("InstanceNormalization", nn::instance_norm, &["epsilon"]),
    op("LayerNormalization", nn::layer_norm, STASH_NORM),
    op("RMSNormalization", nn::rms_norm, STASH_NORM),
    op("GroupNormalization", nn::group_norm, &["epsilon", "num_groups", "stash_type"]),
    op("MeanVarianceNormalization", nn::mvn, &["axes"]),
    op("LpNormalization", nn::lp_norm, &["axis", "p"]),
    op("LRN", nn::lrn, &["alpha", "beta", "bias", "size"]),
    op("NegativeLogLikelihoodLoss", loss::nll_loss, &["ignore_index", "reduction"]),
    op("SoftmaxCrossEntropyLoss", loss::softmax_cross_entropy, &["ignore_index", "reduction"]),
    checked("Attention", attention::attention, attention::ATTRS, attention::check),
    checked("RotaryEmbedding", rotary::rotary_embedding, rotary::ATTRS, rotary::check),
    OpDef {
        domain: "ai.onnx.preview",
        domain_version: 1,
        subgraphs: flex_attention::SUBGRAPHS,
        ..checked("FlexAttention", flex_attention::flex_attention, flex_attention::ATTRS, flex_attention::check)
    },
    checked("RNN", rnn::recurrent, rnn::RNN_ATTRS, rnn::check),
    checked("GRU", rnn::recurrent, rnn::GRU_ATTRS, rnn::check),
    checked("LSTM", rnn::recurrent, rnn::LSTM_ATTRS, rnn::check),
    checked("LinearAttention", linear_attention::linear_attention, linear_attention::ATTRS, linear_attention::check),
    checked("TensorScatter", state::tensor_scatter, state::SCATTER_ATTRS, state::check_scatter),
    checked("CausalConvWithState", state::causal_conv_with_state, state::CONV_ATTRS, state::check_conv),
    with_statics("Dropout", nn::dropout, &["ratio", "seed", "is_test"], &[1, 2]),
    // Convolutions and pools.
    op("Conv", c::conv, CONV),
    op("ConvTranspose", c::conv_transpose, CONV_T),
    op("MaxPool", c::max_pool, POOL),
    op("AveragePool", c::average_pool, AVG_POOL),
    op("LpPool", c::lp_pool, LP_POOL),
    op("GlobalAveragePool", c::global_average_pool, &[]),
    op("GlobalMaxPool", c::global_max_pool, &[]),
    op("GlobalLpPool", c::global_lp_pool, &["p"]),
    // Quantization.
    op("QuantizeLinear", q::quantize_linear, &["axis", "block_size", "output_dtype", "precision", "saturate"]),
    op("DequantizeLinear", q::dequantize_linear, &["axis", "block_size", "output_dtype"]),
    op("DynamicQuantizeLinear", q::dynamic_quantize_linear, &[]),
    op("MatMulInteger", q::matmul_integer, &[]),
    op("QLinearMatMul", q::qlinear_matmul, &[]),
    op("ConvInteger", q::conv_integer, CONV),
    op("QLinearConv", q::qlinear_conv, CONV),
    op("BitShift", q::bit_shift, &["direction"]),
    op("BitwiseNot", q::bitwise_not, &[]),
    op("BitwiseAnd", e::bitwise_and, &[]),
    op("BitwiseOr", e::bitwise_or, &[]),
    op("BitwiseXor", e::bitwise_xor, &[]),
    op("BitCast", q::bit_cast, &["to"]),
    with_statics("Col2Im", c::col2im, &["dilations", "pads", "strides"], &[1, 2]),
    // Known and missing: what each needs.
    OpDef { subgraphs: &["then_branch", "else_branch"], ..op("If", control::if_, control::IF_ATTRS) },
    OpDef { subgraphs: &["body"], ..with_statics("Loop", control::loop_, &["body"], &[0, 1]) },
    OpDef { subgraphs: &["body"], ..checked("Scan", control::scan, control::SCAN_ATTRS, control::check_scan) },
    missing("RandomNormal", "random ops cannot match a reference draw"),
    missing("RandomUniform", "random ops cannot match a reference draw"),
    missing("RandomNormalLike", "random ops cannot match a reference draw"),
    missing("RandomUniformLike", "random ops cannot match a reference draw"),
    missing("Multinomial", "random ops cannot match a reference draw"),
    missing("Bernoulli", "random ops cannot match a reference draw"),
];

/// The table's row for `op_type` of `domain` (`""`: the default domain).
pub(crate) fn lookup(domain: &str, op_type: &str) -> Option<&'static OpDef> {
    OPS.iter().find(|d| d.name == op_type && d.domain == domain)
}

/// Every op type the importer maps (for docs and tests).
pub fn supported_ops() -> Vec<&'static str> {
    OPS.iter().filter(|d| d.refuse.is_none()).map(|d| d.name).collect()
}
