//! Pooling tests against plain-loop references (exact for the max, f64
//! for the mean), ties, NaN and -inf windows, the 2x2 loops against the
//! general ones bit for bit, and 1, 2, 3 threads bit for bit.

use super::*;

/// A xorshift generator of values in [-1, 1), a few of them repeated so
/// that windows hold ties.
struct Rng(u32);

impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 17;
                self.0 ^= self.0 << 5;
                (self.0 % 16) as f32 / 8.0 - 1.0
                    + if self.0.is_multiple_of(3) { 0.0 } else { (self.0 % 997) as f32 * 1e-4 }
            })
            .collect()
    }
}

/// A geometry from (batch, channels), (h, w), kernel, stride, pad.
fn geo(bc: [usize; 2], hw: [usize; 2], kernel: [usize; 2], stride: [usize; 2], pad: [usize; 4]) -> Pool2dGeometry {
    Pool2dGeometry { batch: bc[0], channels: bc[1], in_h: hw[0], in_w: hw[1], kernel, stride, pad }
}

/// Odd sizes, 1x1 images, windows of 1x1 to 3x3 (and 3x2), strides 1 to
/// 3, asymmetric padding, batch 1 and 3, channels 1, 3, 5, 17, and the
/// 2x2 stride-2 pool on even and odd sizes.
fn shapes() -> Vec<Pool2dGeometry> {
    vec![
        geo([1, 1], [1, 1], [1, 1], [1, 1], [0; 4]),
        geo([3, 3], [1, 1], [2, 2], [1, 1], [1, 1, 0, 0]),
        geo([1, 5], [7, 9], [3, 3], [2, 2], [1, 1, 1, 1]),
        geo([3, 1], [8, 11], [3, 2], [1, 3], [2, 0, 1, 1]),
        geo([1, 17], [6, 6], [2, 2], [2, 2], [0; 4]),
        geo([3, 3], [7, 9], [2, 2], [2, 2], [0; 4]),
        geo([1, 3], [10, 10], [3, 3], [3, 3], [0, 2, 1, 0]),
        geo([2, 2], [5, 12], [2, 3], [1, 1], [1, 2, 1, 0]),
    ]
}

/// The routes to test on `g`: auto, general, and for the 2x2 pool the 2x2
/// loops at every width this CPU has.
fn routes(g: &Pool2dGeometry) -> Vec<Route> {
    let mut r = vec![Route::Auto(Isa::native()), Route::General];
    if g.is_2x2() {
        r.push(Route::Fast(None));
        for isa in [Isa::native().with_avx512(false), Isa::native()] {
            if let Some(w) = isa.width() {
                r.push(Route::Fast(Some(w)));
            }
        }
    }
    r
}

/// Reference max and its row-major position per output (PyTorch's scan).
fn reference_max(g: &Pool2dGeometry, x: &[f32]) -> (Vec<f32>, Vec<usize>) {
    let (mut y, mut at) = (Vec::new(), Vec::new());
    for p in 0..g.batch * g.channels {
        for oh in 0..g.out_h() {
            for ow in 0..g.out_w() {
                let (mut m, mut a) = (f32::NEG_INFINITY, usize::MAX);
                for ih in 0..g.in_h {
                    for iw in 0..g.in_w {
                        let inside = |o: usize, i: usize, ax: usize| {
                            let s = (o * g.stride[ax]) as isize - g.pad[ax] as isize;
                            (i as isize) >= s && (i as isize) < s + g.kernel[ax] as isize
                        };
                        if inside(oh, ih, 0) && inside(ow, iw, 1) {
                            let i = (p * g.in_h + ih) * g.in_w + iw;
                            if a == usize::MAX || x[i] > m || x[i].is_nan() {
                                (m, a) = (x[i], i);
                            }
                        }
                    }
                }
                y.push(m);
                at.push(a);
            }
        }
    }
    (y, at)
}

/// Reference means and their gradient in f64 (`count_include_pad = false`).
fn reference_avg(g: &Pool2dGeometry, x: &[f32], dy: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut dx) = (Vec::new(), vec![0.0f64; x.len()]);
    for p in 0..g.batch * g.channels {
        for oh in 0..g.out_h() {
            for ow in 0..g.out_w() {
                let (rows, cols) = (g.window(0, oh), g.window(1, ow));
                let n = (rows.len() * cols.len()) as f64;
                let mut s = 0.0f64;
                for ih in rows.clone() {
                    for iw in cols.clone() {
                        s += f64::from(x[(p * g.in_h + ih) * g.in_w + iw]);
                        dx[(p * g.in_h + ih) * g.in_w + iw] += f64::from(dy[y.len()]) / n;
                    }
                }
                y.push(s / n);
            }
        }
    }
    (y, dx)
}

/// Asserts equality of bits, NaN matching NaN.
fn same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}[{i}]: {g} vs {w}");
    }
}

/// Asserts closeness to an f64 reference (a few roundings of values ~1).
fn close(what: &str, got: &[f32], want: &[f64]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

/// Every pass and route against the references.
#[test]
fn pools_match_the_references() {
    let mut rng = Rng(0x1357_9bdf);
    for g in shapes() {
        assert_eq!(g.validate(), Ok(()), "{g:?}");
        let (x, dy) = (rng.vec(g.x_len()), rng.vec(g.y_len()));
        let (want_max, at) = reference_max(&g, &x);
        let mut want_dx = vec![0.0f64; x.len()];
        for (a, d) in at.iter().zip(&dy) {
            want_dx[*a] += f64::from(*d);
        }
        let (want_avg, want_avg_dx) = reference_avg(&g, &x, &dy);
        for route in routes(&g) {
            let what = format!("{route:?} {g:?}");
            let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; x.len()]);
            max_forward_on(route, &g, &x, &mut y);
            same(&format!("max {what}"), &y, &want_max);
            max_backward_on(route, &g, &x, &dy, &mut dx);
            close(&format!("max dx {what}"), &dx, &want_dx);
            avg_forward_on(route, &g, &x, &mut y);
            close(&format!("avg {what}"), &y, &want_avg);
            avg_backward_on(route, &g, &dy, &mut dx);
            close(&format!("avg dx {what}"), &dx, &want_avg_dx);
        }
    }
}

/// Ties go to the first maximum in row-major order, a window of -inf to
/// its first value, a window with NaN to its last NaN (PyTorch's scan);
/// padding never wins and NaN propagates.
#[test]
fn max_routes_ties_nan_and_infinities() {
    for route in routes(&geo([1, 1], [2, 8], [2, 2], [2, 2], [0; 4])) {
        let g = geo([1, 1], [2, 8], [2, 2], [2, 2], [0; 4]);
        let (inf, nan) = (f32::NEG_INFINITY, f32::NAN);
        #[rustfmt::skip]
        let x = [
            1.0, 3.0,   inf, inf,   nan, 5.0,   2.0, -0.0,
            3.0, 3.0,   inf, inf,   7.0, nan,   0.0, 2.0,
        ];
        let mut y = [0.0; 4];
        max_forward_on(route, &g, &x, &mut y);
        assert_eq!((y[0], y[1], y[3]), (3.0, inf, 2.0), "{route:?}");
        assert!(y[2].is_nan(), "{route:?}");
        let mut dx = [9.0; 16];
        max_backward_on(route, &g, &x, &[1.0, 2.0, 3.0, 4.0], &mut dx);
        #[rustfmt::skip]
        let want = [
            0.0, 1.0,   2.0, 0.0,   0.0, 0.0,   4.0, 0.0,
            0.0, 0.0,   0.0, 0.0,   0.0, 3.0,   0.0, 0.0,
        ];
        assert_eq!(dx, want, "{route:?}");
        // A window half in the padding: the values inside win, even -inf.
        let g = geo([1, 1], [1, 2], [2, 2], [1, 1], [1, 1, 0, 0]);
        let route = if matches!(route, Route::Fast(_)) { Route::Auto(Isa::native()) } else { route };
        let mut y = [0.0; 2];
        max_forward_on(route, &g, &[-5.0, inf], &mut y);
        assert_eq!(y, [-5.0, -5.0]);
        let mut dx = [0.0; 2];
        max_backward_on(route, &g, &[inf, inf], &[1.0, 2.0], &mut dx);
        assert_eq!(dx, [3.0, 0.0]);
    }
}

/// The 2x2 loops give the general loops' bits, NaN, infinities and signed
/// zeros included.
#[test]
fn the_2x2_loops_give_the_general_bits() {
    let mut rng = Rng(0x2468_ace0);
    for hw in [[2, 2], [6, 10], [7, 9], [33, 17]] {
        let g = geo([2, 3], hw, [2, 2], [2, 2], [0; 4]);
        let (mut x, dy) = (rng.vec(g.x_len()), rng.vec(g.y_len()));
        for (i, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0].into_iter().enumerate() {
            x[(i * 7) % g.x_len()] = v;
        }
        let run = |route| {
            let (mut y, mut dx) = (vec![0.0; g.y_len()], vec![0.0; g.x_len()]);
            let mut out = Vec::new();
            max_forward_on(route, &g, &x, &mut y);
            out.extend(&y);
            max_backward_on(route, &g, &x, &dy, &mut dx);
            out.extend(&dx);
            avg_forward_on(route, &g, &x, &mut y);
            out.extend(&y);
            avg_backward_on(route, &g, &dy, &mut dx);
            out.extend(&dx);
            out
        };
        let general = run(Route::General);
        for route in routes(&g) {
            same(&format!("{route:?} {hw:?}"), &run(route), &general);
        }
    }
}

/// The general max's vector steps (the row-wide selects and the stride-2
/// phases, at each width this CPU has) give the scalar loops' bits, NaN,
/// infinities and signed zeros included, on rows wide enough for whole
/// vector blocks and with odd ends: ResNet's 3x3 stride-2 stem pool among
/// them.
#[test]
fn the_general_max_vector_steps_give_the_scalar_bits() {
    let mut rng = Rng(0x0bad_cafe);
    for g in [
        geo([1, 3], [15, 112], [3, 3], [2, 2], [1; 4]),
        geo([2, 2], [9, 71], [3, 3], [2, 2], [1, 0, 1, 1]),
        geo([1, 2], [8, 67], [2, 3], [1, 1], [0, 2, 1, 0]),
        geo([1, 2], [7, 50], [3, 4], [3, 3], [2, 1, 0, 3]),
        geo([1, 1], [5, 5], [3, 3], [2, 2], [1; 4]),
        // Strides longer than the row: phases of one value or none.
        geo([1, 2], [4, 1], [2, 1], [1, 3], [0; 4]),
        geo([1, 2], [3, 2], [1, 2], [2, 2], [0; 4]),
    ] {
        let mut x = rng.vec(g.x_len());
        for (i, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0].into_iter().enumerate() {
            for j in (i * 13..x.len()).step_by(97) {
                x[j] = v;
            }
        }
        let run = |route| {
            let mut y = vec![f32::NAN; g.y_len()];
            max_forward_on(route, &g, &x, &mut y);
            y
        };
        let general = run(Route::General);
        same(&format!("reference {g:?}"), &general, &reference_max(&g, &x).0);
        for isa in [Isa::native().with_avx512(false), Isa::native()] {
            if isa.width().is_some() {
                same(&format!("{isa:?} {g:?}"), &run(Route::Auto(isa)), &general);
            }
        }
    }
}

/// Every pass gives the same bits for 1, 2 and 3 threads.
#[test]
fn pool_bits_do_not_depend_on_threads() {
    let mut rng = Rng(0x0f0f_1234);
    for g in [geo([3, 5], [12, 14], [2, 2], [2, 2], [0; 4]), geo([2, 17], [9, 13], [3, 3], [2, 1], [1, 1, 1, 2])] {
        let (x, dy) = (rng.vec(g.x_len()), rng.vec(g.y_len()));
        let _guard = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        crate::threads::set_split_threshold(1);
        let runs: Vec<Vec<u32>> = [1, 2, 3]
            .iter()
            .map(|&n| {
                crate::threads::set_num_threads(n);
                let (mut y, mut dx) = (vec![0.0; g.y_len()], vec![0.0; g.x_len()]);
                let mut out = Vec::new();
                max_forward(&g, &x, &mut y, Isa::native());
                out.extend(&y);
                max_backward(&g, &x, &dy, &mut dx, Isa::native());
                out.extend(&dx);
                avg_forward(&g, &x, &mut y, Isa::native());
                out.extend(&y);
                avg_backward(&g, &dy, &mut dx, Isa::native());
                out.extend(&dx);
                out.iter().map(|v: &f32| v.to_bits()).collect()
            })
            .collect();
        crate::threads::set_num_threads(0);
        crate::threads::set_split_threshold(crate::threads::DEFAULT_SPLIT_THRESHOLD);
        assert!(runs[0] == runs[1] && runs[0] == runs[2], "{g:?}: results differ between 1, 2 and 3 threads");
    }
}

/// Output sizes and validation messages.
#[test]
fn geometry_sizes_and_errors() {
    let g = geo([2, 3], [32, 31], [3, 2], [2, 3], [1, 1, 2, 0]);
    assert_eq!((g.out_h(), g.out_w()), ((32 + 3 - 3) / 2 + 1, (31 + 1 - 2) / 3 + 1));
    let bad = |f: &dyn Fn(&mut Pool2dGeometry)| {
        let mut b = g;
        f(&mut b);
        b.validate().unwrap_err()
    };
    assert!(bad(&|b| b.stride[0] = 0).contains("stride height is 0"));
    assert!(bad(&|b| b.pad[1] = 2).contains("pad left 2 must be smaller than the kernel's 2"));
    assert!(bad(&|b| (b.in_h, b.pad) = (1, [0; 4])).contains("kernel height 3 exceeds the padded input height 1"));
}

/// Misuse panics with the function's name and what is wrong.
#[test]
#[should_panic(expected = "pool2d::avg_backward: dx holds 5 values, the geometry needs 4")]
fn avg_backward_panics_on_a_wrong_length() {
    let g = geo([1, 1], [2, 2], [2, 2], [2, 2], [0; 4]);
    avg_backward(&g, &[1.0], &mut [0.0; 5], Isa::native());
}
