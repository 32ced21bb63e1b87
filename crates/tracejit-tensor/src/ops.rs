//! The primitive op families as plain enums. The graph IR wraps these, the
//! reference kernels in `kernels` implement them, and the JIT lowers them, so
//! an op's identity is defined once, here.

// ---------------------------------------------------------------------------
// The op tables.
//
// Each family's facts are declared once, in a `for_each_*_op!` table: the
// variant, its user-facing name (also the `Tensor` method's name), its dtype
// rule and its cost. The enums, `ALL`, `name`, `from_name`, `result_dtype`
// and the cost flags below are generated from the table, and the trace crate
// generates the `Tensor` methods from the same table, so a new row appears
// everywhere at once. What cannot be generated (the element function, the
// JIT lowering, the gradient rule) sits in exhaustive `match`es, so leaving
// a place out is a compile error, never a silent default.
// ---------------------------------------------------------------------------

/// Which dtypes a unary op accepts and what it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// Any numeric dtype, kept (`neg`, `abs`, `floor`).
    Numeric,
    /// Float dtypes only, kept (`exp`, `sinh`): cast integers first.
    Float,
    /// Bool to bool (`logical_not`).
    Logical,
    /// Any numeric dtype to bool (`is_nan`).
    Predicate,
}

/// Which dtypes a binary op accepts and what it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    /// Two numeric operands of one dtype, kept (`add`, `pow`).
    Arithmetic,
    /// Any dtype, bool result (`eq`, `ne`).
    Equality,
    /// Numeric operands, bool result (`lt`).
    Ordering,
    /// Bool operands, bool result (`logical_and`).
    Logical,
    /// Integer or bool operands, kept (`bitwise_and`).
    Bitwise,
}

/// Which dtypes a reduction accepts (the result keeps the dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Any numeric dtype.
    Numeric,
    /// Float dtypes only (`mean`: the result would otherwise be fractional).
    Float,
}

/// What an op costs per element, for planners deciding whether recomputing
/// it is acceptable (fusion never duplicates an expensive producer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cost {
    /// A few instructions.
    Cheap,
    /// A transcendental or a library call.
    Expensive,
}

/// How exactly the JIT reproduces the reference kernel's element function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exactness {
    /// Bit for bit, in every dtype.
    Exact,
    /// f32 is computed by an in-kernel approximation within the ULP bound
    /// documented in `tracejit-jit`; f64 stays exact.
    ApproxF32,
}

/// The unary op table: `Variant method_name: UnaryKind, Cost, Exactness;`,
/// each row with the doc comment of the variant and of the `Tensor` method.
///
/// `for_each_unary_op!(callback)` invokes `callback! { rows }`; this crate
/// generates [`UnaryOp`] from it and the trace crate the `Tensor` methods.
#[macro_export]
macro_rules! for_each_unary_op {
    ($callback:ident) => {
        $callback! {
            /// `-x`.
            Neg neg: Numeric, Cheap, Exact;
            /// `|x|` (integers wrap: `abs(MIN) = MIN`).
            Abs abs: Numeric, Cheap, Exact;
            /// -1, 0 or 1 (NaN stays NaN).
            Sign sign: Numeric, Cheap, Exact;
            /// `e^x`.
            Exp exp: Float, Expensive, ApproxF32;
            /// `e^x - 1`, accurate near 0.
            Expm1 expm1: Float, Expensive, Exact;
            /// Natural logarithm.
            Log log: Float, Expensive, ApproxF32;
            /// `ln(1 + x)`, accurate near 0.
            Log1p log1p: Float, Expensive, Exact;
            /// Square root.
            Sqrt sqrt: Float, Cheap, Exact;
            /// `1 / sqrt(x)`.
            Rsqrt rsqrt: Float, Cheap, Exact;
            /// `x * x`.
            Square square: Numeric, Cheap, Exact;
            /// `1 / x`.
            Reciprocal reciprocal: Float, Cheap, Exact;
            /// Hyperbolic tangent.
            Tanh tanh: Float, Expensive, ApproxF32;
            /// `1 / (1 + e^-x)`.
            Sigmoid sigmoid: Float, Expensive, ApproxF32;
            /// `max(x, 0)` (NaN stays NaN).
            Relu relu: Numeric, Cheap, Exact;
            /// The error function.
            Erf erf: Float, Expensive, ApproxF32;
            /// Sine.
            Sin sin: Float, Expensive, Exact;
            /// Cosine.
            Cos cos: Float, Expensive, Exact;
            /// Hyperbolic sine.
            Sinh sinh: Float, Expensive, Exact;
            /// Hyperbolic cosine.
            Cosh cosh: Float, Expensive, Exact;
            /// Arc tangent, in radians (-pi/2..=pi/2).
            Atan atan: Float, Expensive, Exact;
            /// `ln(1 + e^x)`, computed stably as `max(x, 0) + ln(1 + e^-|x|)`.
            Softplus softplus: Float, Expensive, Exact;
            /// Round toward -inf (identity on integers).
            Floor floor: Numeric, Cheap, Exact;
            /// Round toward +inf (identity on integers).
            Ceil ceil: Numeric, Cheap, Exact;
            /// Round half to even, as numpy (identity on integers).
            Round round: Numeric, Cheap, Exact;
            /// Boolean not.
            LogicalNot logical_not: Logical, Cheap, Exact;
            /// True where NaN.
            IsNan is_nan: Predicate, Cheap, Exact;
            /// True where neither NaN nor infinite.
            IsFinite is_finite: Predicate, Cheap, Exact;
        }
    };
}

/// The binary op table: `Variant method_name: BinaryKind, Cost;`, each row
/// with the doc comment of the variant and of the `Tensor` method.
#[macro_export]
macro_rules! for_each_binary_op {
    ($callback:ident) => {
        $callback! {
            /// `self + other`, broadcasting.
            Add add: Arithmetic, Cheap;
            /// `self - other`, broadcasting.
            Sub sub: Arithmetic, Cheap;
            /// `self * other`, broadcasting.
            Mul mul: Arithmetic, Cheap;
            /// `self / other`; integers truncate toward zero, division by zero gives 0.
            Div div: Arithmetic, Cheap;
            /// `self ^ other`.
            Pow pow: Arithmetic, Expensive;
            /// Elementwise maximum (NaN propagates).
            Maximum maximum: Arithmetic, Cheap;
            /// Elementwise minimum (NaN propagates).
            Minimum minimum: Arithmetic, Cheap;
            /// Remainder with the sign of the divisor (Python's `%`).
            Rem rem: Arithmetic, Cheap;
            /// `self == other` as bool.
            Eq eq: Equality, Cheap;
            /// `self != other` as bool.
            Ne ne: Equality, Cheap;
            /// `self < other` as bool.
            Lt lt: Ordering, Cheap;
            /// `self <= other` as bool.
            Le le: Ordering, Cheap;
            /// `self > other` as bool.
            Gt gt: Ordering, Cheap;
            /// `self >= other` as bool.
            Ge ge: Ordering, Cheap;
            /// Boolean and.
            LogicalAnd logical_and: Logical, Cheap;
            /// Boolean or.
            LogicalOr logical_or: Logical, Cheap;
            /// Bitwise and of integers (two's complement), or of bools.
            BitwiseAnd bitwise_and: Bitwise, Cheap;
            /// Bitwise or of integers (two's complement), or of bools.
            BitwiseOr bitwise_or: Bitwise, Cheap;
            /// Bitwise exclusive or of integers (two's complement), or of bools.
            BitwiseXor bitwise_xor: Bitwise, Cheap;
        }
    };
}

/// The reduction table: `Variant name, all_name: ReduceKind;` (`all_name` is
/// the `Tensor` method reducing every axis).
#[macro_export]
macro_rules! for_each_reduce_op {
    ($callback:ident) => {
        $callback! {
            /// Sum over `axes`.
            Sum sum, sum_all: Numeric;
            /// Mean over `axes` (float tensors).
            Mean mean, mean_all: Float;
            /// Maximum over `axes` (NaN propagates).
            Max max, max_all: Numeric;
            /// Minimum over `axes` (NaN propagates).
            Min min, min_all: Numeric;
            /// Product over `axes`.
            Prod prod, prod_all: Numeric;
        }
    };
}

/// Generates an op enum with `ALL`, `name` and `from_name` from a table.
macro_rules! op_enum {
    ($(#[$meta:meta])* $enum:ident { $($(#[$doc:meta])* $v:ident $name:ident),* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $enum {
            $($(#[$doc])* $v,)*
        }

        impl $enum {
            /// How many there are.
            pub const COUNT: usize = [$(stringify!($v)),*].len();

            /// Every op of the family, in table order.
            pub const ALL: [$enum; Self::COUNT] = [$($enum::$v),*];

            /// The numpy/TF name (`exp`, `logical_and`, `sum`), which is also
            /// the `Tensor` method's name.
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$v => stringify!($name),)*
                }
            }

            /// The op called `name` (the inverse of [`Self::name`]).
            pub fn from_name(name: &str) -> Option<$enum> {
                Self::ALL.into_iter().find(|op| op.name() == name)
            }
        }
    };
}

macro_rules! define_unary_op {
    ($($(#[$doc:meta])* $v:ident $name:ident: $kind:ident, $cost:ident, $exact:ident;)*) => {
        op_enum! {
            /// Elementwise ops of one operand (the table is [`for_each_unary_op!`]).
            UnaryOp { $($(#[$doc])* $v $name),* }
        }

        impl UnaryOp {
            /// The op's dtype rule.
            pub fn kind(self) -> UnaryKind {
                match self {
                    $(UnaryOp::$v => UnaryKind::$kind,)*
                }
            }

            /// The op's per-element cost.
            pub fn cost(self) -> Cost {
                match self {
                    $(UnaryOp::$v => Cost::$cost,)*
                }
            }

            /// How exactly the JIT reproduces the reference kernel.
            pub fn exactness(self) -> Exactness {
                match self {
                    $(UnaryOp::$v => Exactness::$exact,)*
                }
            }
        }
    };
}

macro_rules! define_binary_op {
    ($($(#[$doc:meta])* $v:ident $name:ident: $kind:ident, $cost:ident;)*) => {
        op_enum! {
            /// Elementwise ops of two operands, with numpy broadcasting (the
            /// table is [`for_each_binary_op!`]).
            BinaryOp { $($(#[$doc])* $v $name),* }
        }

        impl BinaryOp {
            /// The op's dtype rule.
            pub fn kind(self) -> BinaryKind {
                match self {
                    $(BinaryOp::$v => BinaryKind::$kind,)*
                }
            }

            /// The op's per-element cost.
            pub fn cost(self) -> Cost {
                match self {
                    $(BinaryOp::$v => Cost::$cost,)*
                }
            }
        }
    };
}

macro_rules! define_reduce_op {
    ($($(#[$doc:meta])* $v:ident $name:ident, $all:ident: $kind:ident;)*) => {
        op_enum! {
            /// Reductions over a list of axes (the table is [`for_each_reduce_op!`]).
            ReduceOp { $($(#[$doc])* $v $name),* }
        }

        impl ReduceOp {
            /// The op's dtype rule.
            pub fn kind(self) -> ReduceKind {
                match self {
                    $(ReduceOp::$v => ReduceKind::$kind,)*
                }
            }
        }
    };
}

for_each_unary_op!(define_unary_op);
for_each_binary_op!(define_binary_op);
for_each_reduce_op!(define_reduce_op);

impl UnaryOp {
    /// Which dtypes the op accepts, and what it returns. `None` means the
    /// dtype is rejected. Derived from [`UnaryOp::kind`]: integers wrap on
    /// overflow (`abs(i32::MIN) = i32::MIN`), rounding is the identity on
    /// integers, transcendentals need a float (cast integers first), and
    /// integers are never NaN and always finite.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        match self.kind() {
            UnaryKind::Numeric => input.is_numeric().then_some(input),
            UnaryKind::Float => input.is_float().then_some(input),
            UnaryKind::Logical => (input == crate::DType::Bool).then_some(crate::DType::Bool),
            UnaryKind::Predicate => input.is_numeric().then_some(crate::DType::Bool),
        }
    }

    /// True when the op's cost makes recomputing it unacceptable.
    pub fn is_expensive(self) -> bool {
        self.cost() == Cost::Expensive
    }
}

impl BinaryOp {
    /// True for the comparisons, which return bool.
    pub fn is_comparison(self) -> bool {
        match self.kind() {
            BinaryKind::Equality | BinaryKind::Ordering => true,
            BinaryKind::Arithmetic | BinaryKind::Logical | BinaryKind::Bitwise => false,
        }
    }

    /// The result dtype for two operands of dtype `input` (both operands must
    /// already have the same dtype: there is no implicit promotion), or `None`
    /// if the op rejects that dtype.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        use crate::DType::Bool;
        match self.kind() {
            BinaryKind::Arithmetic => input.is_numeric().then_some(input),
            BinaryKind::Equality => Some(Bool),
            BinaryKind::Ordering => input.is_numeric().then_some(Bool),
            BinaryKind::Logical => (input == Bool).then_some(Bool),
            BinaryKind::Bitwise => (input.is_int() || input == Bool).then_some(input),
        }
    }

    /// True when the op's cost makes recomputing it unacceptable.
    pub fn is_expensive(self) -> bool {
        self.cost() == Cost::Expensive
    }
}

impl ReduceOp {
    /// The result dtype, or `None` if rejected. Mean needs a float (as in
    /// `jnp.mean` the result would otherwise be fractional); bool must be cast.
    pub fn result_dtype(self, input: crate::DType) -> Option<crate::DType> {
        match self.kind() {
            ReduceKind::Numeric => input.is_numeric().then_some(input),
            ReduceKind::Float => input.is_float().then_some(input),
        }
    }
}

/// The distribution of a random draw (`Op::Random`): what each element's
/// Philox bits become.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RandomDist {
    /// Uniform in `[low, high)`: `low + (high - low) * u`, computed in the
    /// element type from `u` uniform in `[0, 1)`.
    Uniform {
        /// The lower bound.
        low: f64,
        /// The upper bound (excluded, up to the element type's rounding).
        high: f64,
    },
    /// Normal: `mean + stddev * z`, `z` a standard normal (Box-Muller).
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        stddev: f64,
    },
}

impl RandomDist {
    /// `random_uniform` or `random_normal`.
    pub fn name(self) -> &'static str {
        match self {
            RandomDist::Uniform { .. } => "random_uniform",
            RandomDist::Normal { .. } => "random_normal",
        }
    }

    /// The two parameters (low and high, or mean and stddev).
    pub fn params(self) -> (f64, f64) {
        match self {
            RandomDist::Uniform { low, high } => (low, high),
            RandomDist::Normal { mean, stddev } => (mean, stddev),
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
