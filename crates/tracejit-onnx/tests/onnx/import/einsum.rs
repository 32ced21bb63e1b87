//! `Einsum` against a brute-force f64 sum over every assignment of the
//! labels, on random equations: one to three operands, repeated labels
//! (diagonals), labels summed inside one operand or across operands,
//! batch labels, `...` of different widths broadcasting (size-1 axes),
//! explicit and implicit outputs, spaces in the equation, NaN and
//! infinities in the operands (which make exactly the outputs they reach
//! non-finite). Each run asserts that the JIT ran.

use proptest::prelude::*;
use tracejit_onnx::import_bytes;
use tracejit_trace::{DType, Tensor};

use super::builder::*;

/// A tiny deterministic generator for the equation's shape.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A label of the reference: a letter, or ellipsis axis k.
#[derive(Clone, Copy, PartialEq, Debug)]
enum L {
    Letter(char),
    Ell(usize),
}

struct Case {
    equation: String,
    /// Each operand's labels (ellipsis expanded) and shape.
    operands: Vec<(Vec<L>, Vec<usize>)>,
    output: Vec<L>,
    /// The labels in use and their sizes.
    sizes: Vec<(L, usize)>,
}

fn make_case(seed: u64) -> Case {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let letters: Vec<(char, usize)> = "abcde".chars().map(|c| (c, 1 + r.below(3))).collect();
    let ell_sizes: Vec<usize> = (0..r.below(3)).map(|_| 1 + r.below(3)).collect();
    let size_of = |l: L| match l {
        L::Letter(c) => letters.iter().find(|x| x.0 == c).unwrap().1,
        L::Ell(k) => ell_sizes[k],
    };
    let n_ops = 1 + r.below(3);
    let (mut terms, mut operands) = (Vec::new(), Vec::new());
    for _ in 0..n_ops {
        let n_letters = r.below(4);
        let mut labels: Vec<L> = (0..n_letters).map(|_| L::Letter(letters[r.below(5)].0)).collect();
        let mut term: String = labels.iter().map(|l| if let L::Letter(c) = l { *c } else { '?' }).collect();
        let mut broadcast_ones = Vec::new();
        if !ell_sizes.is_empty() && r.below(2) == 0 {
            let width = r.below(ell_sizes.len() + 1);
            let at = r.below(labels.len() + 1);
            let ell: Vec<L> = (ell_sizes.len() - width..ell_sizes.len()).map(L::Ell).collect();
            broadcast_ones = ell.iter().map(|_| r.below(3) == 0).collect();
            labels.splice(at..at, ell);
            term.insert_str(at, "...");
        }
        let mut ell_seen = 0;
        let shape: Vec<usize> = labels
            .iter()
            .map(|&l| match l {
                L::Ell(_) => {
                    ell_seen += 1;
                    if broadcast_ones[ell_seen - 1] {
                        1
                    } else {
                        size_of(l)
                    }
                }
                L::Letter(_) => size_of(l),
            })
            .collect();
        terms.push(term);
        operands.push((labels, shape));
    }
    let used: Vec<L> = operands.iter().flat_map(|o| o.0.iter().copied()).collect();
    let any_ell = used.iter().any(|l| matches!(l, L::Ell(_)));
    let width =
        used.iter().filter_map(|l| if let L::Ell(k) = l { Some(ell_sizes.len() - k) } else { None }).max().unwrap_or(0);
    let ell_out: Vec<L> = (ell_sizes.len() - width..ell_sizes.len()).map(L::Ell).collect();
    let mut letters_used: Vec<char> =
        used.iter().filter_map(|l| if let L::Letter(c) = l { Some(*c) } else { None }).collect();
    letters_used.sort_unstable();
    letters_used.dedup();
    let (equation, output) = if r.below(3) == 0 {
        // Implicit: the ellipsis, then the letters that occur once.
        let once: Vec<L> = letters_used
            .iter()
            .filter(|&&c| used.iter().filter(|&&l| l == L::Letter(c)).count() == 1)
            .map(|&c| L::Letter(c))
            .collect();
        (terms.join(", "), [ell_out, once].concat())
    } else {
        let mut out: Vec<L> = letters_used.iter().filter(|_| r.below(2) == 0).map(|&c| L::Letter(c)).collect();
        // Shuffle, then place the ellipsis (required in the output when used).
        for i in (1..out.len()).rev() {
            out.swap(i, r.below(i + 1));
        }
        let mut text: String = out.iter().map(|l| if let L::Letter(c) = l { *c } else { '?' }).collect();
        if any_ell {
            let at = r.below(out.len() + 1);
            out.splice(at..at, ell_out);
            text.insert_str(at, "...");
        }
        (format!("{} -> {text}", terms.join(",")), out)
    };
    // The labels in use, each at its largest size (size-1 axes broadcast).
    let mut sizes: Vec<(L, usize)> = Vec::new();
    for (ls, shape) in &operands {
        for (&l, &d) in ls.iter().zip(shape) {
            match sizes.iter_mut().find(|x| x.0 == l) {
                Some(x) => x.1 = x.1.max(d),
                None => sizes.push((l, d)),
            }
        }
    }
    Case { equation, operands, output, sizes }
}

/// Every label's value in turn; for each, the operands' product added to
/// its output element. Bound: an output is a sum of S products of P
/// factors, so its error is at most (S + P + 2)·ε·Σ|products|.
fn reference(c: &Case, values: &[Vec<f32>]) -> (Vec<f64>, Vec<f64>) {
    let labels: Vec<(L, usize)> = c.sizes.clone();
    let out_len: usize = c.output.iter().map(|&l| labels.iter().find(|x| x.0 == l).unwrap().1).product();
    let (mut sum, mut mag, mut terms) = (vec![0.0f64; out_len], vec![0.0f64; out_len], 0usize);
    let total: usize = labels.iter().map(|x| x.1).product();
    for mut code in 0..total {
        let mut value = Vec::with_capacity(labels.len());
        for &(l, s) in &labels {
            value.push((l, code % s));
            code /= s;
        }
        let idx = |l: L| value.iter().find(|x| x.0 == l).unwrap().1;
        let mut prod = 1.0f64;
        for ((ls, shape), v) in c.operands.iter().zip(values) {
            let flat = ls.iter().zip(shape).fold(0, |f, (&l, &d)| f * d + if d == 1 { 0 } else { idx(l) });
            prod *= v[flat] as f64;
        }
        let o = c.output.iter().fold(0, |f, &l| f * labels.iter().find(|x| x.0 == l).unwrap().1 + idx(l));
        sum[o] += prod;
        mag[o] += prod.abs();
        terms += usize::from(o == 0);
    }
    // Every label not in the output was enumerated in full: S = terms per output.
    let bound = mag.iter().map(|m| (terms + c.operands.len() + 2) as f64 * f32::EPSILON as f64 * m + 1e-30).collect();
    (sum, bound)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn einsum_matches_a_brute_force_sum(seed in 0u64..1_000_000, specials: bool) {
        let c = make_case(seed);
        let tensors: Vec<Tensor> = c.operands.iter().enumerate().map(|(i, (_, s))| floats(s, seed + i as u64, specials)).collect();
        let names: Vec<String> = (0..tensors.len()).map(|i| format!("x{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let out_dims: Vec<Option<i64>> = c.output.iter().map(|_| None).collect();
        let bytes = model(
            vec![node("Einsum", "einsum", &name_refs, &["y"], vec![attr_s("equation", &c.equation)])],
            tensors.iter().zip(&names).map(|(t, n)| fixed(n, DType::F32, t.shape())).collect(),
            vec![value("y", elem(DType::F32), &out_dims)],
            vec![],
            12,
        );
        let model = import_bytes(&bytes).map_err(|e| TestCaseError::fail(format!("{}: {e}", c.equation)))?;
        let y = model.run(&tensors).map_err(|e| TestCaseError::fail(format!("{}: {e}", c.equation)))?.remove(0);
        let cf = &model.function().concrete_functions()[0];
        prop_assert_eq!(cf.executor_kind(), "jit", "{:?}", cf.jit_error());
        let want_shape: Vec<usize> = c.output.iter().map(|&l| c.sizes.iter().find(|x| x.0 == l).unwrap().1).collect();
        prop_assert_eq!(y.shape(), &want_shape[..], "{}", c.equation);
        let values: Vec<Vec<f32>> = tensors.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
        let (want, bound) = reference(&c, &values);
        for (i, (g, (w, b))) in y.to_vec::<f32>().unwrap().iter().zip(want.iter().zip(&bound)).enumerate() {
            let g = *g as f64;
            // Summing a label out before multiplying (as any einsum may)
            // can turn Inf·0 into NaN or the other way round, so only
            // finiteness must agree where a NaN or Inf took part.
            let ok = if w.is_finite() { (g - w).abs() <= *b } else { !g.is_finite() };
            prop_assert!(ok, "{}: y[{i}] = {g}, want {w} (bound {b})", c.equation);
        }
    }
}

#[test]
fn a_bad_equation_is_refused() {
    let run = |eq: &str, shapes: &[&[usize]]| {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let bytes = model(
            vec![node("Einsum", "einsum", &refs, &["y"], vec![attr_s("equation", eq)])],
            shapes.iter().zip(&names).map(|(s, n)| fixed(n, DType::F32, s)).collect(),
            vec![value("y", elem(DType::F32), &[])],
            vec![],
            12,
        );
        let inputs: Vec<Tensor> = shapes.iter().map(|s| Tensor::ones(s, DType::F32)).collect();
        import_bytes(&bytes).and_then(|m| m.run(&inputs)).map(|_| ()).unwrap_err().to_string()
    };
    for (eq, shapes, what) in [
        ("ij->k", &[&[2usize, 3][..]][..], "names one no input has"),
        ("ij,jk->ik", &[&[2, 3][..]][..], "2 input terms for 1 inputs"),
        ("ijk->i", &[&[2, 3][..]][..], "does not fit input 0 of rank 2"),
        ("ij,jk->ik", &[&[2, 3][..], &[4, 2][..]][..], "sizes 3 and 4"),
        ("i1->i", &[&[2, 3][..]][..], "has '1'"),
    ] {
        let m = run(eq, shapes);
        assert!(m.contains("Einsum") && m.contains("'einsum'") && m.contains(what), "{eq}: {m} should say {what}");
    }
}
