//! Forward tests against a plain-loop f64 reference (the oracle), on every
//! path this CPU has, odd shapes, non-finite values and 1, 2, 3 threads;
//! shared helpers for `tests_grad`.

use super::*;

/// A xorshift generator of values in [-1, 1).
pub(super) struct Rng(pub u32);

impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 % 2000) as f32 / 1000.0 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// A geometry from (batch, in, out, groups), (h, w), kernel, stride,
/// dilation, pad.
#[allow(clippy::too_many_arguments)]
pub(super) fn geo(
    batch: usize,
    cin: usize,
    cout: usize,
    groups: usize,
    hw: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pad: [usize; 4],
) -> Conv2dGeometry {
    Conv2dGeometry {
        batch,
        in_channels: cin,
        in_h: hw[0],
        in_w: hw[1],
        out_channels: cout,
        kernel,
        stride,
        dilation,
        pad,
        groups,
    }
}

/// The shapes every pass is tested on: 1x1 images, 3x5 kernels, strides 2
/// and 3, dilation 2, groups 2 and depthwise, batch 1 and 3, channels 1,
/// 3, 5, 17, asymmetric and large padding, widths that end in partial
/// vectors at 8 and 16 lanes.
pub(super) fn shapes() -> Vec<Conv2dGeometry> {
    vec![
        geo(1, 1, 1, 1, [1, 1], [1, 1], [1, 1], [1, 1], [0; 4]),
        geo(3, 3, 5, 1, [1, 1], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 3, 17, 1, [7, 9], [3, 5], [1, 1], [1, 1], [1, 2, 0, 1]),
        geo(3, 5, 4, 1, [9, 11], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        geo(1, 2, 3, 1, [10, 13], [3, 2], [3, 2], [1, 1], [2, 0, 1, 1]),
        geo(2, 3, 6, 1, [9, 19], [3, 3], [1, 1], [2, 2], [2, 2, 2, 2]),
        geo(1, 4, 6, 2, [6, 17], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(3, 5, 5, 5, [8, 33], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 3, 6, 3, [7, 7], [5, 5], [2, 1], [1, 2], [2, 4, 2, 3]),
        geo(1, 17, 9, 1, [5, 18], [1, 1], [1, 1], [1, 1], [0; 4]),
        geo(2, 1, 16, 1, [12, 12], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
        geo(1, 2, 3, 1, [4, 5], [2, 3], [1, 1], [1, 1], [4, 3, 3, 5]),
        geo(1, 3, 4, 1, [8, 40], [3, 3], [1, 3], [2, 1], [0, 2, 1, 0]),
        // Panels too large for one band: several bands per image.
        geo(1, 64, 3, 1, [16, 64], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 16, 4, 1, [20, 300], [1, 1], [1, 1], [1, 1], [0; 4]),
        // 32 output channels on a 7-wide map: the direct kernel.
        geo(2, 64, 32, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Forward as products (`forward_gemm`): a 7-wide map, an unpadded
        // 1×1 (no im2col), a strided 1×1 in two groups, and a strided 1×1
        // with rows of 36 outputs (a projection of ResNet's).
        geo(2, 64, 64, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 64, 40, 1, [9, 11], [1, 1], [1, 1], [1, 1], [0; 4]),
        geo(2, 128, 64, 2, [13, 13], [1, 1], [2, 2], [1, 1], [0; 4]),
        geo(1, 64, 33, 1, [7, 71], [1, 1], [2, 2], [1, 1], [0; 4]),
    ]
}

/// The forward takes the products where the direct kernel's lanes or
/// threads would idle, and only there (so `shapes` tests both).
#[test]
fn forward_products_where_lanes_idle() {
    let all = shapes();
    let products = &all[all.len() - 4..];
    let map7 = &products[0];
    for path in [Path::W8, Path::W16] {
        for g in products {
            assert!(forward_gemm::prefers(path, g), "{path:?} {g:?}");
        }
        assert!(!forward_gemm::prefers(Path::Portable, map7));
        // ResNet-50's 56×56 3×3 stage stays direct, and so do few channels.
        let wide = geo(1, 64, 64, 1, [56, 56], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
        assert!(!forward_gemm::prefers(path, &wide), "{path:?}");
        assert!(!forward_gemm::prefers(path, &all[2]), "{path:?}");
        // Fewer than 64 output channels on a narrow map stay direct (and
        // off the half-filled channel-lane tiles at 16 lanes): W12's second
        // layer, and the 7-wide map above with 32.
        let w12 = geo(64, 16, 32, 1, [14, 14], [5, 5], [1, 1], [1, 1], [2; 4]);
        assert!(!forward_gemm::prefers(path, &w12) && !forward_gemm::prefers(path, &all[all.len() - 5]), "{path:?}");
        assert!(!cvec::prefers(Path::W16, &w12), "{path:?}");
    }
    // ResNet-50's 14×14 maps: products at 16 lanes, direct at 8.
    let map14 = geo(1, 256, 256, 1, [14, 14], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    assert!(forward_gemm::prefers(Path::W16, &map14) && !forward_gemm::prefers(Path::W8, &map14));
}

/// The paths this CPU can run.
pub(super) fn paths() -> Vec<Path> {
    let mut p = vec![Path::Portable];
    if Isa::native().with_avx512(false).width().is_some() {
        p.push(Path::W8);
    }
    if Isa::native().width() == Some(crate::Width::W16) {
        p.push(Path::W16);
    }
    p
}

/// The input index a tap reads, if inside.
fn at(g: &Conv2dGeometry, oh: usize, ow: usize, r: usize, c: usize) -> Option<(usize, usize)> {
    let ih = (oh * g.stride[0] + r * g.dilation[0]) as isize - g.pad[0] as isize;
    let iw = (ow * g.stride[1] + c * g.dilation[1]) as isize - g.pad[1] as isize;
    (ih >= 0 && iw >= 0 && ih < g.in_h as isize && iw < g.in_w as isize).then_some((ih as usize, iw as usize))
}

/// Calls `f(x index, w index, y index)` for every multiply-add of the
/// convolution inside the input.
pub(super) fn each_mac(g: &Conv2dGeometry, mut f: impl FnMut(usize, usize, usize)) {
    let (icg, ocg) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let (oh_n, ow_n) = (g.out_h(), g.out_w());
    for n in 0..g.batch {
        for o in 0..g.out_channels {
            let grp = o / ocg;
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    for i in 0..icg {
                        for r in 0..g.kernel[0] {
                            for c in 0..g.kernel[1] {
                                if let Some((ih, iw)) = at(g, oh, ow, r, c) {
                                    let xi = ((n * g.in_channels + grp * icg + i) * g.in_h + ih) * g.in_w + iw;
                                    let wi = ((o * icg + i) * g.kernel[0] + r) * g.kernel[1] + c;
                                    let yi = ((n * g.out_channels + o) * oh_n + oh) * ow_n + ow;
                                    f(xi, wi, yi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The reference forward in f64: (values, Σ|terms| per output).
pub(super) fn reference(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0f64; g.y_len()];
    let mut mag = vec![0.0f64; g.y_len()];
    each_mac(g, |xi, wi, yi| {
        let t = f64::from(x[xi]) * f64::from(w[wi]);
        y[yi] += t;
        mag[yi] += t.abs();
    });
    let plane = g.out_h() * g.out_w();
    for (i, v) in y.iter_mut().enumerate() {
        if let Some(b) = bias {
            *v += f64::from(b[i / plane % g.out_channels]);
            mag[i] += f64::from(b[i / plane % g.out_channels]).abs();
        }
        if relu && *v < 0.0 {
            *v = 0.0;
        }
    }
    (y, mag)
}

/// Asserts `got` matches `want` within `terms · 2ε · mag` (NaN where NaN,
/// infinities equal).
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f64], mag: &[f64], terms: usize) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        if w.is_nan() || w.is_infinite() {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}[{i}]: {g} vs {w}");
            continue;
        }
        let tol = 2.0 * (terms as f64 + 2.0) * f64::from(f32::EPSILON) * mag[i] + 1e-30;
        assert!((g - w).abs() <= tol, "{what}[{i}]: {g} vs {w} (tolerance {tol:e})");
    }
}

/// Runs `f` at 1, 2 and 3 threads with every split taken, and asserts the
/// three results are bit-identical.
pub(super) fn same_bits_for_threads(what: &str, f: impl Fn() -> Vec<f32>) {
    let _guard = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    crate::threads::set_gemm_threshold(0);
    let runs: Vec<Vec<u32>> = [1, 2, 3]
        .iter()
        .map(|&n| {
            crate::threads::set_num_threads(n);
            f().iter().map(|v| v.to_bits()).collect()
        })
        .collect();
    crate::threads::set_num_threads(0);
    crate::threads::set_gemm_threshold(crate::threads::DEFAULT_GEMM_THRESHOLD);
    assert!(runs[0] == runs[1] && runs[0] == runs[2], "{what}: results differ between 1, 2 and 3 threads");
}

/// Every shape, path, with and without bias and relu, against the reference.
#[test]
fn forward_matches_the_reference() {
    let mut rng = Rng(0x1234_5678);
    for g in shapes() {
        assert_eq!(g.validate(), Ok(()), "{g:?}");
        let x = rng.vec(g.x_len());
        let w = rng.vec(g.w_len());
        let b = rng.vec(g.out_channels);
        for (bias, relu) in [(None, false), (Some(&b[..]), true), (Some(&b[..]), false)] {
            let (want, mag) = reference(&g, &x, &w, bias, relu);
            for path in paths() {
                let mut y = vec![f32::NAN; g.y_len()];
                forward_on(path, &g, &x, &w, bias, relu, &mut y);
                let taps = g.in_channels / g.groups * g.kernel[0] * g.kernel[1];
                assert_close(&format!("{path:?} {g:?} relu {relu}"), &y, &want, &mag, taps);
            }
        }
    }
}

/// NaN and infinities in `x` reach exactly the outputs whose windows hold
/// them, on every path.
#[test]
fn forward_propagates_nan_and_inf() {
    let mut rng = Rng(0x0bad_cafe);
    for g in [
        geo(1, 2, 3, 1, [9, 20], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 3, 9, 1, [6, 7], [3, 2], [2, 1], [1, 2], [1, 0, 2, 2]),
    ] {
        let mut x = rng.vec(g.x_len());
        x[5] = f32::NAN;
        x[g.x_len() / 2] = f32::INFINITY;
        x[g.x_len() - 3] = f32::NEG_INFINITY;
        let w = rng.vec(g.w_len());
        let (want, mag) = reference(&g, &x, &w, None, false);
        assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_infinite()));
        for path in paths() {
            let mut y = vec![0.0; g.y_len()];
            forward_on(path, &g, &x, &w, None, false, &mut y);
            assert_close(&format!("{path:?} {g:?}"), &y, &want, &mag, 64);
        }
    }
}

/// The vector paths give the same bits for 1, 2 and 3 threads.
#[test]
fn forward_bits_do_not_depend_on_threads() {
    let mut rng = Rng(0x5151_aaaa);
    for g in [
        geo(3, 5, 17, 1, [11, 21], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 4, 8, 2, [29, 17], [3, 5], [1, 2], [2, 1], [2, 2, 1, 0]),
        // One image cut into chunks of bands.
        geo(1, 64, 4, 1, [24, 64], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
    ] {
        let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
        for path in paths() {
            same_bits_for_threads(&format!("{path:?} {g:?}"), || {
                let mut y = vec![0.0; g.y_len()];
                forward_on(path, &g, &x, &w, Some(&b), true, &mut y);
                y
            });
        }
    }
}

/// Output sizes, validation messages and "same" padding.
#[test]
fn geometry_sizes_and_errors() {
    let g = geo(2, 3, 4, 1, [32, 31], [3, 4], [2, 3], [2, 1], [1, 2, 2, 1]);
    assert_eq!((g.out_h(), g.out_w()), ((32 + 3 - 5) / 2 + 1, (31 + 3 - 4) / 3 + 1));
    assert_eq!(g.macs(), 2 * 4 * g.out_h() * g.out_w() * 3 * 12);
    let bad = |f: &dyn Fn(&mut Conv2dGeometry)| {
        let mut b = g;
        f(&mut b);
        b.validate().unwrap_err()
    };
    assert!(bad(&|b| b.stride[1] = 0).contains("stride width is 0"));
    assert!(bad(&|b| b.groups = 2).contains("multiples of groups 2"));
    assert!(bad(&|b| b.in_h = 1).contains("height extent 5 exceeds the padded input height 4"));
    assert_eq!(geo(1, 1, 1, 1, [2, 2], [5, 5], [1, 1], [1, 1], [0; 4]).out_h(), 0);
    for (n, k, s, d) in [(32, 3, 1, 1), (7, 3, 2, 1), (8, 4, 3, 2), (1, 5, 1, 1), (10, 1, 4, 1)] {
        let [b, e] = same_padding(n, k, s, d);
        assert!(e == b || e == b + 1, "{n} {k} {s} {d}");
        assert_eq!(out_size(n, b + e, k, s, d), n.div_ceil(s), "{n} {k} {s} {d}");
    }
}

/// Misuse panics with the function's name and what is wrong.
#[test]
#[should_panic(expected = "conv::forward: y holds 3 values, the geometry needs 4")]
fn forward_panics_on_a_short_output() {
    let g = geo(1, 1, 1, 1, [2, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    forward(&g, &[0.0; 4], &[1.0], None, false, &mut [0.0; 3], Isa::native());
}

/// An invalid geometry panics with validate's message.
#[test]
#[should_panic(expected = "conv::backward_data: conv2d: groups is 0")]
fn backward_data_panics_on_an_invalid_geometry() {
    let g = geo(1, 1, 1, 0, [2, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    backward_data(&g, &[0.0; 4], &[1.0], &mut [0.0; 4], Isa::native());
}
