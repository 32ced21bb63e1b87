//! The primitive op families as plain enums. The graph IR wraps these, the
//! reference kernels in `kernels` implement them, and the JIT lowers them, so
//! an op's identity is defined once, here.

/// Elementwise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sign,
    Exp,
    Expm1,
    Log,
    Log1p,
    Sqrt,
    Rsqrt,
    Square,
    Reciprocal,
    Tanh,
    Sigmoid,
    Relu,
    Erf,
    Sin,
    Cos,
    Floor,
    Ceil,
    Round,
    LogicalNot,
    IsNan,
    IsFinite,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 23] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Square,
        UnaryOp::Reciprocal,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::LogicalNot,
        UnaryOp::IsNan,
        UnaryOp::IsFinite,
    ];

    /// The numpy/TF name (`exp`, `logical_not`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Square => "square",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::LogicalNot => "logical_not",
            UnaryOp::IsNan => "is_nan",
            UnaryOp::IsFinite => "is_finite",
        }
    }

    /// Which dtypes the op accepts, and what it returns. `None` means the
    /// dtype is rejected. This is the single statement of the unary type rules.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        use crate::DType::*;
        use UnaryOp::*;
        match self {
            // Numeric ops that keep the dtype; ints wrap on overflow (abs(i32::MIN) = i32::MIN).
            Neg | Abs | Sign | Square | Relu if input.is_numeric() => Some(input),
            // Rounding is the identity on integers.
            Floor | Ceil | Round if input.is_numeric() => Some(input),
            // Transcendentals and reciprocals need a float: cast integers first.
            Exp | Expm1 | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Tanh | Sigmoid | Erf | Sin | Cos
                if input.is_float() =>
            {
                Some(input)
            }
            LogicalNot if input == Bool => Some(Bool),
            // Integers are never NaN and always finite.
            IsNan | IsFinite if input.is_numeric() => Some(Bool),
            _ => None,
        }
    }
}

/// Elementwise ops of two operands, with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LogicalAnd,
    LogicalOr,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 16] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Rem,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
    ];

    /// The numpy/TF name (`add`, `logical_and`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Rem => "rem",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::LogicalAnd => "logical_and",
            BinaryOp::LogicalOr => "logical_or",
        }
    }

    /// True for the comparisons, which return bool.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    /// The result dtype for two operands of dtype `input` (both operands must
    /// already have the same dtype: there is no implicit promotion), or `None`
    /// if the op rejects that dtype.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        use crate::DType::*;
        use BinaryOp::*;
        match self {
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Rem if input.is_numeric() => Some(input),
            Eq | Ne => Some(Bool),
            Lt | Le | Gt | Ge if input.is_numeric() => Some(Bool),
            LogicalAnd | LogicalOr if input == Bool => Some(Bool),
            _ => None,
        }
    }
}

/// Reductions over a list of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];

    /// The numpy/TF name (`sum`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }

    /// The result dtype, or `None` if rejected. Mean needs a float (as in
    /// `jnp.mean` the result would otherwise be fractional); bool must be cast.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        match self {
            ReduceOp::Mean if input.is_float() => Some(input),
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod if input.is_numeric() => Some(input),
            _ => None,
        }
    }
}

/// Index-returning reductions along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum ArgReduceOp {
    ArgMax,
    ArgMin,
}

impl ArgReduceOp {
    /// Every variant, for tables and parsers.
    pub const ALL: [ArgReduceOp; 2] = [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin];

    /// `argmax` or `argmin`.
    pub fn name(self) -> &'static str {
        match self {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        }
    }
}

/// One axis of a slice, numpy style: `start:stop:step`, negative indices
/// count from the end, `None` means "from the beginning/to the end" in the
/// direction of `step`. `step` is never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceSpec {
    /// First index (inclusive).
    pub start: Option<i64>,
    /// Last index (exclusive).
    pub stop: Option<i64>,
    /// Stride; negative walks backwards.
    pub step: i64,
}

impl SliceSpec {
    /// The whole axis.
    pub const FULL: SliceSpec = SliceSpec { start: None, stop: None, step: 1 };

    /// `start..stop` with step 1.
    pub fn range(start: i64, stop: i64) -> SliceSpec {
        SliceSpec { start: Some(start), stop: Some(stop), step: 1 }
    }

    /// Resolves against an axis of length `len` into (first index, count, step),
    /// exactly as Python's `slice.indices` does.
    pub fn resolve(&self, len: usize) -> (i64, usize, i64) {
        let len = len as i64;
        let step = self.step;
        assert!(step != 0, "slice: step must not be 0");
        let (lower, upper) = if step > 0 { (0, len) } else { (-1, len - 1) };
        let norm = |v: Option<i64>, default: i64| -> i64 {
            match v {
                None => default,
                Some(v) if v < 0 => (v + len).max(lower),
                Some(v) => v.min(upper),
            }
        };
        let start = norm(self.start, if step > 0 { lower } else { upper });
        let stop = norm(self.stop, if step > 0 { upper } else { lower });
        let count = if step > 0 {
            if stop > start {
                (stop - start + step - 1) / step
            } else {
                0
            }
        } else if start > stop {
            (start - stop + (-step) - 1) / (-step)
        } else {
            0
        };
        (start, count as usize, step)
    }
}
