//! Output verification: every mode's result is compared with the eager result
//! before it is timed, and a mismatch fails the run instead of printing a
//! (fast, wrong) number.
//!
//! An element passes when `|got - want| <= rtol * |want| + atol * scale`,
//! where `scale` is the largest magnitude in that output of the eager result
//! (so `atol` is relative to the output's size, and values near zero — after a
//! relu, a softmax's small probabilities — are judged against the output they
//! belong to, not against themselves). NaN must meet NaN; an infinity must
//! meet the same infinity; shapes and dtypes must agree exactly. A
//! tolerance with a `row_cosine` judges vectors instead (embeddings): each
//! row along the last axis must point where eager's points.

use std::fmt;

use tracejit::{DType, Tensor};

/// How close a result must be to the eager one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative to the element's own eager value.
    pub rtol: f64,
    /// Relative to the largest magnitude in the eager output.
    pub atol: f64,
    /// Absolute, per element: the most one element may legitimately move
    /// whatever the output's scale (AdamW's first step is `lr·g/(|g| +
    /// eps)`, so a gradient within rounding of 0 may flip its sign: `2·lr`
    /// in the updated parameter, however small the parameters are).
    pub abs: f64,
    /// When above 0, elements are not compared one by one: every row
    /// (along the last axis) must have at least this cosine similarity
    /// with the eager row (the measure an embedding's user relies on).
    pub row_cosine: f64,
}

impl Tolerance {
    /// Chains of exact ops (add, mul, matmul, relu): only rounding order and
    /// FMA contraction may differ.
    pub const EXACT_CHAIN: Tolerance = Tolerance { rtol: 1e-5, atol: 1e-6, abs: 0.0, row_cosine: 0.0 };
    /// Transcendental-heavy code (tanh, exp, rsqrt, sigmoid), where the JIT
    /// may use polynomial approximations.
    pub const TRANSCENDENTAL: Tolerance = Tolerance { rtol: 1e-4, atol: 1e-5, abs: 0.0, row_cosine: 0.0 };
    /// Products in bf16 (8 significant bits) against the f32 result: errors
    /// up to a few 2⁻⁸ of the output's largest value; JAX's bf16 errors on
    /// these workloads are 4.5e-3 to 1.0e-2.
    pub const BF16: Tolerance = Tolerance { rtol: 0.0, atol: 3e-2, abs: 0.0, row_cosine: 0.0 };
    /// Reduced-precision embeddings (W15's bf16 and int8 modes): each
    /// output row within cosine similarity 0.99 of the f32 row, the bar
    /// the MiniLM issue sets (per-row int8 activations move single
    /// elements of a unit vector by up to ~1e-2 while the direction stays
    /// within ~0.998).
    pub const EMBEDDINGS: Tolerance = Tolerance { rtol: 0.0, atol: 0.0, abs: 0.0, row_cosine: 0.99 };
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.row_cosine > 0.0 {
            return write!(f, "cosine similarity >= {} per row", self.row_cosine);
        }
        write!(f, "rtol {:e}, atol {:e} of the output's max |value|", self.rtol, self.atol)?;
        if self.abs > 0.0 {
            write!(f, ", plus {:e} absolute", self.abs)?;
        }
        Ok(())
    }
}

/// One output's values, flattened, with its shape and dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputValues {
    /// Shape of the output.
    pub shape: Vec<usize>,
    /// Element type of the output.
    pub dtype: DType,
    /// The elements as f64, row-major.
    pub values: Vec<f64>,
}

impl OutputValues {
    /// Reads an eager tensor of any dtype. `Err` if the
    /// tensor is symbolic.
    pub fn from_tensor(t: &Tensor) -> Result<OutputValues, String> {
        let values: Vec<f64> = match t.dtype() {
            DType::F32 => t.to_vec::<f32>().map(|v| v.into_iter().map(f64::from).collect()),
            DType::F64 => t.to_vec::<f64>(),
            DType::I32 => t.to_vec::<i32>().map(|v| v.into_iter().map(f64::from).collect()),
            DType::I64 => t.to_vec::<i64>().map(|v| v.into_iter().map(|x| x as f64).collect()),
            DType::Bool => t.to_vec::<bool>().map(|v| v.into_iter().map(|x| if x { 1.0 } else { 0.0 }).collect()),
            DType::BF16 | DType::F16 => t.cast(DType::F64).to_vec::<f64>(),
            // Every value but u64's past 2^53 is exact in f64.
            DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32 | DType::U64 => {
                t.cast(DType::F64).to_vec::<f64>()
            }
        }
        .map_err(|e| format!("cannot read an output: {e}"))?;
        Ok(OutputValues { shape: t.shape().to_vec(), dtype: t.dtype(), values })
    }

    /// Reads every tensor of a flattened result.
    pub fn from_tensors(ts: &[Tensor]) -> Result<Vec<OutputValues>, String> {
        ts.iter().map(OutputValues::from_tensor).collect()
    }
}

/// How far a result was from the eager one (it passed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Agreement {
    /// Largest `|got - want|` over all elements.
    pub max_abs_err: f64,
    /// Largest `|got - want| / |want|` over elements whose `want` is not 0.
    pub max_rel_err: f64,
    /// Largest over the outputs of `max |got - want| / max |want|`: the
    /// error figure of the reduced-precision modes.
    pub max_scaled_err: f64,
    /// The least cosine similarity of a row with eager's, when the
    /// tolerance compares rows (else 0).
    pub min_row_cosine: f64,
}

/// Why a result was rejected.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// What differs, with the worst element and the tolerance.
    pub message: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Mismatch {}

fn fail(message: String) -> Result<Agreement, Mismatch> {
    Err(Mismatch { message })
}

/// Compares `got` with the eager result `want`, output by output.
pub fn check_outputs(want: &[OutputValues], got: &[OutputValues], tol: Tolerance) -> Result<Agreement, Mismatch> {
    if want.len() != got.len() {
        return fail(format!("{} outputs, the eager result has {}", got.len(), want.len()));
    }
    let mut agreement = Agreement::default();
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        if w.dtype != g.dtype {
            return fail(format!("output {k}: dtype {} where eager gives {}", g.dtype, w.dtype));
        }
        if w.shape != g.shape || w.values.len() != g.values.len() {
            return fail(format!("output {k}: shape {:?} where eager gives {:?}", g.shape, w.shape));
        }
        let scale = w.values.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
        if tol.row_cosine > 0.0 {
            let cosine = check_rows(k, w, g, tol)?;
            agreement.min_row_cosine = if k == 0 { cosine } else { agreement.min_row_cosine.min(cosine) };
        }
        for (i, (&a, &b)) in w.values.iter().zip(&g.values).enumerate() {
            if a.is_nan() || b.is_nan() {
                if a.is_nan() && b.is_nan() {
                    continue;
                }
                return fail(format!("output {k}, element {i}: {b} where eager gives {a}"));
            }
            if a.is_infinite() || b.is_infinite() {
                if a == b {
                    continue;
                }
                return fail(format!("output {k}, element {i}: {b} where eager gives {a}"));
            }
            let err = (a - b).abs();
            let allowed = tol.rtol * a.abs() + tol.atol * scale + tol.abs;
            if err > allowed && tol.row_cosine <= 0.0 {
                return fail(format!(
                    "output {k}, element {i}: {b} where eager gives {a} (|error| {err:.3e} > allowed {allowed:.3e}; \
                     tolerance {tol})"
                ));
            }
            agreement.max_abs_err = agreement.max_abs_err.max(err);
            if scale > 0.0 {
                agreement.max_scaled_err = agreement.max_scaled_err.max(err / scale);
            }
            if a != 0.0 {
                agreement.max_rel_err = agreement.max_rel_err.max(err / a.abs());
            }
        }
    }
    Ok(agreement)
}

/// Checks each row of output `k` (along its last axis) for cosine
/// similarity at least `tol.row_cosine` with eager's row; returns the
/// least. A row of zeros must stay zeros (its direction is undefined).
fn check_rows(k: usize, w: &OutputValues, g: &OutputValues, tol: Tolerance) -> Result<f64, Mismatch> {
    let width = w.shape.last().copied().unwrap_or(1).max(1);
    let mut least = 1.0f64;
    for (r, (wr, gr)) in w.values.chunks(width).zip(g.values.chunks(width)).enumerate() {
        let dot: f64 = wr.iter().zip(gr).map(|(a, b)| a * b).sum();
        let (nw, ng) = (wr.iter().map(|a| a * a).sum::<f64>().sqrt(), gr.iter().map(|b| b * b).sum::<f64>().sqrt());
        let cosine = if nw == 0.0 && ng == 0.0 { 1.0 } else { dot / (nw * ng) };
        if cosine.is_nan() || cosine < tol.row_cosine {
            return Err(Mismatch {
                message: format!(
                    "output {k}, row {r}: cosine similarity {cosine:.6} with eager's row (tolerance {tol})"
                ),
            });
        }
        least = least.min(cosine);
    }
    Ok(least)
}

/// Reads `got` and compares it with `want` (see [`check_outputs`]).
pub fn check_tensors(want: &[OutputValues], got: &[Tensor], tol: Tolerance) -> Result<Agreement, Mismatch> {
    let got = OutputValues::from_tensors(got).map_err(|message| Mismatch { message })?;
    check_outputs(want, &got, tol)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(values: &[f64]) -> OutputValues {
        OutputValues { shape: vec![values.len()], dtype: DType::F32, values: values.to_vec() }
    }

    #[test]
    fn equal_results_pass_with_zero_error() {
        let a = [out(&[1.0, -2.0, 0.0])];
        assert_eq!(check_outputs(&a, &a, Tolerance::EXACT_CHAIN).unwrap(), Agreement::default());
    }

    #[test]
    fn small_errors_pass_large_ones_fail() {
        let want = [out(&[1.0, 10.0])];
        let ok = [out(&[1.0 + 1e-6, 10.0])];
        assert!(check_outputs(&want, &ok, Tolerance::EXACT_CHAIN).is_ok());
        let bad = [out(&[1.001, 10.0])];
        let err = check_outputs(&want, &bad, Tolerance::EXACT_CHAIN).unwrap_err();
        assert!(err.message.contains("element 0"), "{err}");
    }

    #[test]
    fn row_cosine_judges_directions_not_elements() {
        let want = [OutputValues { shape: vec![2, 2], dtype: DType::F32, values: vec![1.0, 0.0, 0.0, 1.0] }];
        let close = [OutputValues { shape: vec![2, 2], dtype: DType::F32, values: vec![0.99, 0.1, 0.0, 2.0] }];
        let a = check_outputs(&want, &close, Tolerance::EMBEDDINGS).unwrap();
        assert!(a.min_row_cosine > 0.99 && a.min_row_cosine < 1.0, "{a:?}");
        let turned = [OutputValues { shape: vec![2, 2], dtype: DType::F32, values: vec![1.0, 0.0, 0.3, 1.0] }];
        let err = check_outputs(&want, &turned, Tolerance::EMBEDDINGS).unwrap_err();
        assert!(err.message.contains("row 1") && err.message.contains("cosine"), "{err}");
        let nan = [OutputValues { shape: vec![2, 2], dtype: DType::F32, values: vec![1.0, 0.0, f64::NAN, 1.0] }];
        assert!(check_outputs(&want, &nan, Tolerance::EMBEDDINGS).is_err());
    }

    #[test]
    fn nan_shape_and_count_mismatches_fail() {
        let want = [out(&[1.0, 2.0])];
        assert!(check_outputs(&want, &[out(&[1.0, f64::NAN])], Tolerance::TRANSCENDENTAL).is_err());
        assert!(check_outputs(&[out(&[f64::NAN])], &[out(&[f64::NAN])], Tolerance::TRANSCENDENTAL).is_ok());
        assert!(check_outputs(&want, &[out(&[1.0, 2.0, 3.0])], Tolerance::TRANSCENDENTAL).is_err());
        assert!(check_outputs(&want, &[], Tolerance::TRANSCENDENTAL).is_err());
        let mut wrong_dtype = out(&[1.0, 2.0]);
        wrong_dtype.dtype = DType::F64;
        assert!(check_outputs(&want, &[wrong_dtype], Tolerance::TRANSCENDENTAL).is_err());
    }
}
