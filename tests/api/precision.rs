//! Reduced precision: bf16 and f16 tensors eagerly, in the interpreter and
//! in the JIT; `matmul_acc` and `mixed_precision` on the bf16 GEMM, checked
//! against the eager reference (the operands rounded, the product in f32)
//! within the GEMM's summation bound, and that the JIT ran the bf16 GEMM.

use proptest::prelude::*;
use tracejit::autodiff::value_and_grad;
use tracejit::prelude::*;
use tracejit::{bf16, f16};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.cast(DType::F32).to_vec::<f32>().unwrap()
}

/// `x` rounded to bf16 and back: what a bf16 product reads.
fn rounded(x: &Tensor) -> Tensor {
    x.cast(DType::BF16).cast(DType::F32)
}

/// Asserts `got` is `a · b` (f32 operands already rounded to bf16) within
/// the f32 summation bound `1.01 · k · 2⁻²⁴ · Σ|aᵢ||bᵢ|` of each element.
fn assert_product(got: &Tensor, a: &Tensor, b: &Tensor, what: &str) {
    let k = a.shape()[a.rank() - 1] as f64;
    let want = a.cast(DType::F64).matmul(&b.cast(DType::F64)).to_vec::<f64>().unwrap();
    let scale = a.cast(DType::F64).abs().matmul(&b.cast(DType::F64).abs()).to_vec::<f64>().unwrap();
    let g = got.cast(DType::F64).to_vec::<f64>().unwrap();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, ((g, w), s)) in g.iter().zip(&want).zip(&scale).enumerate() {
        let tol = 1.01 * k * 2f64.powi(-24) * s + 1e-30;
        assert!((g - w).abs() <= tol || (g.is_nan() && w.is_nan()), "{what}: element {i}: {g} vs {w} (tol {tol})");
    }
}

#[test]
fn casts_and_arithmetic_agree_eagerly_in_the_interpreter_and_the_jit() {
    let x = Tensor::from_vec(vec![0.1f32, -2.5, 1e-40, f32::NAN, f32::INFINITY, 65520.0, 3.0e38, -0.0], &[8]);
    for low in [DType::BF16, DType::F16] {
        let body = move |x: Tensor| {
            let h = x.cast(low);
            ((&h * &h + 1.0).exp() - &h, h.sum(&[0], false), h.cast(DType::F32))
        };
        let eager = body(x.clone());
        let jit = function(body).call(x.clone()).unwrap();
        let interp = function(body).jit(false).call(x.clone()).unwrap();
        for (a, b, c, what) in [(&eager.0, &jit.0, &interp.0, "exp"), (&eager.1, &jit.1, &interp.1, "sum")] {
            assert_eq!(a.dtype(), low);
            let (a, b, c) = (f32s(a), f32s(b), f32s(c));
            for i in 0..a.len() {
                let same = |p: f32, q: f32| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan());
                assert!(same(a[i], b[i]) && same(a[i], c[i]), "{low} {what}[{i}]: {} {} {}", a[i], b[i], c[i]);
            }
        }
        let back = f32s(&eager.2);
        // Round to nearest even; subnormals kept in bf16; f16 overflows to Inf.
        // 0.1 rounds to 0x3DCD in bf16 and 0x2E66 in f16.
        assert_eq!(
            back[0].to_bits(),
            if low == DType::BF16 { 0x3DCD_0000 } else { f16::from_bits(0x2E66).to_f32().to_bits() }
        );
        assert_eq!(back[5].is_infinite(), low == DType::F16, "65520 in {low}");
        assert!(back[3].is_nan());
        assert_eq!(back[7].to_bits(), (-0.0f32).to_bits());
        assert_eq!(back[2] > 0.0, low == DType::BF16, "1e-40 is a bf16 subnormal, below f16's range");
    }
}

#[test]
fn matmul_acc_on_the_bf16_gemm_matches_the_reference() {
    let f = function(|(a, b): (Tensor, Tensor)| a.matmul_acc(&b, DType::F32));
    for (i, &(m, k, n)) in [(0, 3, 2), (1, 1, 1), (3, 5, 7), (5, 0, 3), (17, 67, 33), (64, 256, 130)].iter().enumerate()
    {
        let a = Tensor::randn(&[m, k], i as u64).cast(DType::BF16);
        let b = Tensor::randn(&[k, n], 100 + i as u64).cast(DType::BF16);
        let got = f.call((a.clone(), b.clone())).unwrap();
        assert_eq!(got.dtype(), DType::F32);
        assert_eq!(got.shape(), [m, n]);
        assert_product(&got, &a.cast(DType::F32), &b.cast(DType::F32), &format!("{m}x{k}x{n}"));
        let eager = a.matmul_acc(&b, DType::F32);
        assert_product(&eager, &a.cast(DType::F32), &b.cast(DType::F32), "eager");
    }
    for cf in f.concrete_functions() {
        let stats = cf.schedule_stats().expect("compiled");
        assert_eq!(stats.bf16_gemms, 1, "{stats}");
        // The widening casts are never run.
        assert_eq!(stats.fallbacks, 0, "{stats}");
    }
}

#[test]
fn matmul_acc_rejects_mixed_or_narrow_dtypes() {
    let a = Tensor::zeros(&[2, 2], DType::BF16);
    let e = std::panic::catch_unwind(|| a.matmul_acc(&Tensor::zeros(&[2, 2], DType::F32), DType::F32)).unwrap_err();
    let msg = e.downcast_ref::<String>().unwrap();
    assert!(msg.contains("different dtypes (bf16 and f32)"), "{msg}");
    let e = std::panic::catch_unwind(|| a.matmul_acc(&a, DType::BF16)).unwrap_err();
    assert!(e.downcast_ref::<String>().unwrap().contains("cannot accumulate bf16 operands in bf16"));
}

fn mlp(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    (x.matmul(w) + b).relu()
}

#[test]
fn mixed_precision_rounds_the_products_operands_only() {
    let f = function(|(x, w, b): (Tensor, Tensor, Tensor)| mlp(&x, &w, &b)).mixed_precision(DType::BF16);
    let (x, w, b) = (Tensor::randn(&[33, 70], 1), Tensor::randn(&[70, 19], 2), Tensor::randn(&[19], 3));
    let got = f.call((x.clone(), w.clone(), b.clone())).unwrap();
    assert_eq!(got.dtype(), DType::F32);
    // The reference: the product of the rounded operands, the rest in f32.
    let product = rounded(&x).matmul(&rounded(&w));
    let want = (&product + &b).relu();
    let (g, w2) = (f32s(&got), f32s(&want));
    let k_bound = 70.0 * 2f32.powi(-24) * 70.0 * 16.0;
    assert!(g.iter().zip(&w2).all(|(a, b)| (a - b).abs() <= k_bound), "{g:?} vs {w2:?}");
    let cf = &f.concrete_functions()[0];
    assert!(cf.stats().changed_by("auto_mixed_precision"), "{}", cf.stats());
    let listing = cf.optimized_graph().to_string();
    assert_eq!(listing.matches("cast[to=bf16]").count(), 2, "{listing}");
    let stats = cf.schedule_stats().unwrap();
    assert_eq!((stats.bf16_gemms, stats.gemms), (1, 1), "{stats}");
    // Without it the same function keeps f32 products.
    let plain = function(|(x, w, b): (Tensor, Tensor, Tensor)| mlp(&x, &w, &b));
    plain.call((x, w, b)).unwrap();
    assert_eq!(plain.concrete_functions()[0].schedule_stats().unwrap().bf16_gemms, 0);
}

/// On an AVX2 machine (a Zen 3; here `Target::avx2()`) the bf16 products
/// of a compiled function run on the f32 FMA kernel over operands widened
/// at packing, in `vdpbf16ps`'s order: the results have the bits of the
/// AVX-512 BF16 machine's (AMX, which sums in another order, held off),
/// and the function ran its products on the bf16 GEMM.
#[test]
fn bf16_products_keep_their_bits_on_an_avx2_machine() {
    use tracejit::Target;
    let mlp_fn = |name: &str, target: Target| {
        function(|(x, w, b): (Tensor, Tensor, Tensor)| mlp(&x, &w, &b))
            .name(name)
            .mixed_precision(DType::BF16)
            .target(target)
    };
    let avx512 = Target::host().with_isa(Target::host().isa.with_amx(false));
    for (m, k, n, seed) in [(33, 70, 19, 1), (130, 301, 70, 4), (1, 2, 200, 7)] {
        let args = (Tensor::randn(&[m, k], seed), Tensor::randn(&[k, n], seed + 1), Tensor::randn(&[n], seed + 2));
        let (zen3, host) = (mlp_fn("zen3", Target::avx2()), mlp_fn("host", avx512));
        let (a, b) = (zen3.call(args.clone()).unwrap(), host.call(args.clone()).unwrap());
        let bits = |t: &Tensor| f32s(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{m}x{k}x{n}");
        for f in [&zen3, &host] {
            let cf = &f.concrete_functions()[0];
            assert_eq!(cf.jit_error(), None);
            assert_eq!(cf.schedule_stats().unwrap().bf16_gemms, 1, "{}", cf.schedule_stats().unwrap());
        }
        // And within the bound of the rounded operands' product (two f32
        // sums of the same exact products differ by at most 2·γ_k·Σ|aᵢbᵢ|,
        // γ_k = 1.01·k·2⁻²⁴; the bias's addition rounds each by half an ulp
        // more, and relu is 1-Lipschitz).
        let (xr, wr) = (rounded(&args.0), rounded(&args.1));
        let want = f32s(&(&xr.matmul(&wr) + &args.2).relu());
        let size = xr.abs().cast(DType::F64).matmul(&wr.abs().cast(DType::F64)).to_vec::<f64>().unwrap();
        let gamma = 1.01 * k as f64 * 2f64.powi(-24);
        for (i, (g, w)) in f32s(&a).iter().zip(&want).enumerate() {
            let tol = 2.0 * gamma * size[i] + 2f64.powi(-23) * f64::from(g.abs().max(w.abs()));
            assert!(f64::from(g - w).abs() <= tol, "{m}x{k}x{n} [{i}]: {g} vs {w}");
        }
    }
}

type Qkv = (Tensor, Tensor, Tensor);

/// Whether this CPU multiplies bf16 natively (AVX-512 BF16).
fn native_bf16() -> bool {
    // The instruction set the process may use (`TRACEJIT_ISA=avx2` holds
    // it to AVX2 on an AVX-512 machine), not merely what the CPU has.
    tracejit_jit::JitOptions::global().isa().has_avx512_bf16()
}

/// Causal attention, compiled with or without mixed precision.
fn attention_fn(lowp: bool) -> Function<Qkv, Tensor> {
    let f = function(|(q, k, v): Qkv| tracejit::nn::scaled_dot_product_attention(&q, &k, &v, None, true, None));
    if lowp {
        f.mixed_precision(DType::BF16)
    } else {
        f
    }
}

/// Under mixed precision attention's forward kernel takes its bf16 form
/// (where the CPU has AVX-512 BF16): the pass reports it, the rounding
/// shows, and on random inputs the results stay within bf16's error of
/// the f32 kernel's.
#[test]
fn mixed_precision_runs_attention_with_bf16_products() {
    let (lowp, plain) = (attention_fn(true), attention_fn(false));
    // Zero queries weigh every visible key alike; a value between two
    // bf16 values comes out rounded from the bf16 products only.
    let v = Tensor::full(&[2, 3, 37, 16], 1.0 + 2f64.powi(-10), DType::F32);
    let (q, k) = (Tensor::zeros(&[2, 3, 37, 16], DType::F32), Tensor::randn(&[2, 3, 37, 16], 2));
    let got = f32s(&lowp.call((q.clone(), k.clone(), v.clone())).unwrap());
    let want = f32s(&plain.call((q, k, v)).unwrap());
    let cf = &lowp.concrete_functions()[0];
    assert!(cf.stats().to_string().contains("1 kernel with bf16 products"), "{}", cf.stats());
    assert!(want.iter().all(|&x| (x - (1.0 + 2f32.powi(-10))).abs() < 1e-6), "f32: {:?}", &want[..3]);
    if native_bf16() {
        assert!(got.iter().all(|&x| (x - 1.0).abs() < 1e-6), "bf16 products: {:?}", &got[..3]);
    } else {
        assert_eq!(got, want, "without AVX-512 BF16 the kernel keeps f32 products");
    }
    // Random inputs, scores of a few units: within ~2⁻⁷ of |v|'s scale.
    let (q, k, v) =
        (Tensor::randn(&[2, 3, 37, 16], 4), Tensor::randn(&[2, 3, 37, 16], 5), Tensor::randn(&[2, 3, 37, 16], 6));
    let got = f32s(&lowp.call((q.clone(), k.clone(), v.clone())).unwrap());
    let want = f32s(&plain.call((q, k, v)).unwrap());
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 0.05, "largest difference from f32 attention {worst}");
}

#[test]
fn mixed_precision_training_keeps_f32_variables_and_gradients() {
    let w = Variable::new(Tensor::randn(&[40, 8], 5) * 0.2);
    let x = Tensor::randn(&[16, 40], 6);
    let step = {
        let w = w.clone();
        move |x: Tensor| {
            let (loss, g) =
                value_and_grad(std::slice::from_ref(&w), || x.matmul(&w.read()).tanh().square().mean_all()).unwrap();
            w.assign_sub(&(&g[0] * 0.1));
            (loss, g[0].clone())
        }
    };
    let w0 = w.value();
    let f = function(step.clone()).mixed_precision(DType::BF16);
    let (loss, grad) = f.call(x.clone()).unwrap();
    assert_eq!((loss.dtype(), grad.dtype(), w.dtype()), (DType::F32, DType::F32, DType::F32));
    let stats = f.concrete_functions()[0].schedule_stats().unwrap();
    // The forward product and the weight gradient's.
    assert_eq!(stats.bf16_gemms, 2, "{stats}");
    // Against f32: within bf16's rounding of the operands.
    w.assign(&w0);
    let (loss32, grad32) = function(step).call(x).unwrap();
    let (g, g32) = (f32s(&grad), f32s(&grad32));
    let scale = g32.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(g.iter().zip(&g32).all(|(a, b)| (a - b).abs() <= 2e-2 * scale), "{g:?} vs {g32:?}");
    assert!((f32s(&loss)[0] - f32s(&loss32)[0]).abs() <= 1e-2 * f32s(&loss32)[0].abs());
}

#[test]
fn a_packed_weight_follows_its_variable() {
    let w = Variable::new(Tensor::randn(&[24, 10], 7));
    let f = {
        let w = w.clone();
        function(move |x: Tensor| x.matmul(&w.read())).mixed_precision(DType::BF16)
    };
    let bump = {
        let w = w.clone();
        function(move |d: Tensor| {
            w.assign_add(&d);
            d
        })
    };
    let x = Tensor::randn(&[9, 24], 8);
    for round in 0..3 {
        let got = f.call(x.clone()).unwrap();
        assert_product(&got, &rounded(&x), &rounded(&w.value()), &format!("round {round}"));
        // A new value (assigned eagerly, and by a compiled update that
        // could write in place) must never meet the packing of the old one.
        if round == 0 {
            w.assign(&Tensor::randn(&[24, 10], 9));
        } else {
            bump.call(Tensor::ones(&[24, 10], DType::F32)).unwrap();
        }
    }
    assert_eq!(f.concrete_functions()[0].schedule_stats().unwrap().bf16_gemms, 1);
}

/// A weight passed as an argument: its packing is reused while the same
/// tensor comes back, and a new tensor (or the old one again, or a
/// transposed view) always gets its own product — never a packing of
/// another value.
#[test]
fn a_weight_argument_is_never_multiplied_by_another_values_packing() {
    let f = function(|(x, w): (Tensor, Tensor)| x.matmul(&w)).mixed_precision(DType::BF16);
    let g = function(|(x, w): (Tensor, Tensor)| x.matmul(&w.transpose(&[1, 0]))).mixed_precision(DType::BF16);
    let x = Tensor::randn(&[9, 24], 10);
    let ws: Vec<Tensor> = (0..3).map(|s| Tensor::randn(&[24, 10], 11 + s)).collect();
    for (round, i) in [0, 0, 1, 1, 2, 0, 2, 2].into_iter().enumerate() {
        let got = f.call((x.clone(), ws[i].clone())).unwrap();
        assert_product(&got, &rounded(&x), &rounded(&ws[i]), &format!("round {round}, weight {i}"));
        let wt = ws[i].transpose(&[1, 0]);
        let got = g.call((x.clone(), wt.clone())).unwrap();
        assert_product(&got, &rounded(&x), &rounded(&ws[i]), &format!("transposed, round {round}, weight {i}"));
    }
    assert_eq!(f.concrete_functions()[0].schedule_stats().unwrap().bf16_gemms, 1);
    assert_eq!(g.concrete_functions()[0].schedule_stats().unwrap().bf16_gemms, 1);
}

#[test]
fn batched_and_transposed_operands_take_the_bf16_path_or_its_equivalent() {
    // A stack of matrices times one matrix, a transposed weight, and a
    // batched rhs (the widened fallback): all equal the rounded product.
    let f = function(|(x, w, y): (Tensor, Tensor, Tensor)| {
        (x.matmul(&w), x.matmul(&w.transpose(&[1, 0]).transpose(&[1, 0])), x.matmul(&y))
    })
    .mixed_precision(DType::BF16);
    let (x, w, y) = (Tensor::randn(&[2, 3, 5, 12], 1), Tensor::randn(&[12, 7], 2), Tensor::randn(&[2, 3, 12, 4], 3));
    let (a, b, c) = f.call((x.clone(), w.clone(), y.clone())).unwrap();
    assert_product(&a, &rounded(&x), &rounded(&w), "stacked");
    assert_product(&b, &rounded(&x), &rounded(&w), "transposed twice");
    assert_product(&c, &rounded(&x), &rounded(&y), "batched");
}

#[test]
fn low_precision_variables_checkpoint_as_safetensors_bf16_and_f16() {
    #[derive(Module)]
    struct Half {
        a: Variable,
        b: Variable,
    }
    let src = Tensor::from_vec(vec![0.1f32, -3.0, 65504.0, f32::NAN, 1e-6], &[5]);
    let m = Half { a: Variable::new(src.cast(DType::BF16)), b: Variable::new(src.cast(DType::F16)) };
    let path = std::env::temp_dir().join(format!("tracejit-half-{}.safetensors", std::process::id()));
    tracejit::checkpoint::save(&m, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header = String::from_utf8_lossy(&bytes[8..bytes.len().min(400)]);
    assert!(header.contains("\"BF16\"") && header.contains("\"F16\""), "{header}");
    let fresh =
        Half { a: Variable::new(Tensor::zeros(&[5], DType::BF16)), b: Variable::new(Tensor::zeros(&[5], DType::F16)) };
    tracejit::checkpoint::restore(&fresh, &path).unwrap();
    let bits = |v: &Variable| -> Vec<u16> {
        match v.dtype() {
            DType::BF16 => v.value().to_vec::<bf16>().unwrap().iter().map(|x| x.to_bits()).collect(),
            _ => v.value().to_vec::<f16>().unwrap().iter().map(|x| x.to_bits()).collect(),
        }
    };
    assert_eq!(bits(&fresh.a), bits(&m.a));
    assert_eq!(bits(&fresh.b), bits(&m.b));
    std::fs::remove_file(&path).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Odd sizes, NaN and Inf: the compiled bf16 product equals the
    /// reference within the summation bound (NaN where it has NaN).
    #[test]
    fn bf16_products_of_any_size(m in 0usize..9, k in 0usize..40, n in 0usize..70, seed in 0u64..1000, special in 0usize..4) {
        let mut av = Tensor::randn(&[m, k], seed).to_vec::<f32>().unwrap();
        let len = av.len();
        if special < 2 && len > 0 {
            av[seed as usize % len] = if special == 0 { f32::NAN } else { f32::INFINITY };
        }
        let a = Tensor::from_vec(av, &[m, k]);
        let b = Tensor::randn(&[k, n], seed + 1);
        let f = function(|(a, b): (Tensor, Tensor)| a.matmul(&b)).mixed_precision(DType::BF16);
        let got = f.call((a.clone(), b.clone())).unwrap();
        let want = rounded(&a).cast(DType::F64).matmul(&rounded(&b).cast(DType::F64));
        let scale = rounded(&a).cast(DType::F64).abs().matmul(&rounded(&b).cast(DType::F64).abs());
        let (g, w, s) = (f32s(&got), want.to_vec::<f64>().unwrap(), scale.to_vec::<f64>().unwrap());
        for i in 0..g.len() {
            let (g, w) = (g[i] as f64, w[i]);
            let ok = if w.is_nan() { g.is_nan() } else if w.is_infinite() { g == w || g.is_nan() } else {
                (g - w).abs() <= 1.01 * k as f64 * 2f64.powi(-24) * s[i] + 1e-30
            };
            prop_assert!(ok, "{}x{}x{} [{}]: {} vs {}", m, k, n, i, g, w);
        }
    }
}

/// The README's "Reduced precision" example, as written there.
#[test]
fn the_readme_example_runs() -> tracejit::Result<()> {
    let a = Tensor::randn(&[64, 256], 0).cast(DType::BF16);
    let b = Tensor::randn(&[256, 32], 1).cast(DType::BF16);
    let c = a.matmul_acc(&b, DType::F32);
    let w = Variable::new(Tensor::randn(&[256, 10], 2));
    let f = {
        let w = w.clone();
        function(move |x: Tensor| x.matmul(&w.read()).relu())
    }
    .mixed_precision(DType::BF16);
    let y = f.call(Tensor::randn(&[64, 256], 3))?;
    let cf = f.get_concrete_function(Tensor::randn(&[64, 256], 3))?;
    let q = tracejit::quantize::dynamic(&cf)?;
    let y8 = q.call_flat(&[Tensor::randn(&[64, 256], 3)])?;
    assert_eq!((c.dtype(), y.dtype(), y8[0].dtype()), (DType::F32, DType::F32, DType::F32));
    let (y, y8) = (f32s(&y), f32s(&y8[0]));
    let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(y.iter().zip(&y8).all(|(a, b)| (a - b).abs() <= 3e-2 * scale));
    Ok(())
}
