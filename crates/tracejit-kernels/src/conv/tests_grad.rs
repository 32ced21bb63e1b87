//! Gradient tests: `backward_data` and `backward_filter` against the
//! adjoint loops of the forward reference in f64, a finite-difference
//! check, non-finite values, and 1, 2, 3 threads bit for bit.

use super::tests::{assert_close, each_mac, geo, paths, same_bits_for_threads, shapes, Rng};
use super::*;

/// dx, dw, db by the adjoint loops: (values, Σ|terms|) each.
#[allow(clippy::type_complexity)]
fn reference(g: &Conv2dGeometry, x: &[f32], dy: &[f32], w: &[f32]) -> [(Vec<f64>, Vec<f64>); 3] {
    let (mut dx, mut dxm) = (vec![0.0f64; g.x_len()], vec![0.0f64; g.x_len()]);
    let (mut dw, mut dwm) = (vec![0.0f64; g.w_len()], vec![0.0f64; g.w_len()]);
    each_mac(g, |xi, wi, yi| {
        let t = f64::from(dy[yi]) * f64::from(w[wi]);
        dx[xi] += t;
        dxm[xi] += t.abs();
        let t = f64::from(dy[yi]) * f64::from(x[xi]);
        dw[wi] += t;
        dwm[wi] += t.abs();
    });
    let (mut db, mut dbm) = (vec![0.0f64; g.out_channels], vec![0.0f64; g.out_channels]);
    let plane = g.out_h() * g.out_w();
    for (i, v) in dy.iter().enumerate() {
        db[i / plane % g.out_channels] += f64::from(*v);
        dbm[i / plane % g.out_channels] += f64::from(*v).abs();
    }
    [(dx, dxm), (dw, dwm), (db, dbm)]
}

/// Terms per value of the three gradients (loose bounds).
fn terms(g: &Conv2dGeometry) -> [usize; 3] {
    let ocg = g.out_channels / g.groups;
    let per_x = ocg * g.kernel[0] * g.kernel[1];
    [per_x, g.batch * g.out_h() * g.out_w(), g.batch * g.out_h() * g.out_w()]
}

/// Both gradients on every shape and path.
#[test]
fn gradients_match_the_adjoint_loops() {
    let mut rng = Rng(0x9e37_79b9);
    for g in shapes() {
        let (x, dy, w) = (rng.vec(g.x_len()), rng.vec(g.y_len()), rng.vec(g.w_len()));
        let [(dx_want, dxm), (dw_want, dwm), (db_want, dbm)] = reference(&g, &x, &dy, &w);
        let t = terms(&g);
        for path in paths() {
            let mut dx = vec![f32::NAN; g.x_len()];
            backward_data_on(path, &g, &dy, &w, &mut dx);
            assert_close(&format!("dx {path:?} {g:?}"), &dx, &dx_want, &dxm, t[0]);
            let (mut dw, mut db) = (vec![f32::NAN; g.w_len()], vec![f32::NAN; g.out_channels]);
            backward_filter_on(path, &g, &x, &dy, &mut dw, Some(&mut db));
            assert_close(&format!("dw {path:?} {g:?}"), &dw, &dw_want, &dwm, t[1]);
            assert_close(&format!("db {path:?} {g:?}"), &db, &db_want, &dbm, t[2]);
            backward_filter_on(path, &g, &x, &dy, &mut dw, None);
            assert_close(&format!("dw without db {path:?} {g:?}"), &dw, &dw_want, &dwm, t[1]);
        }
    }
}

/// Both vector backward-filter kernels (channel vectors with `dy`
/// transposed, pixel vectors for small filters) on every shape, whichever
/// one the shape would take.
#[test]
fn both_filter_kernels_match_the_adjoint_loops() {
    let mut rng = Rng(0x5eed_f00d);
    let widths: Vec<usize> = paths()
        .into_iter()
        .filter_map(|p| match p {
            Path::W16 => Some(16),
            Path::W8 => Some(8),
            Path::Portable => None,
        })
        .collect();
    for g in shapes() {
        let (x, dy) = (rng.vec(g.x_len()), rng.vec(g.y_len()));
        let [_, (dw_want, dwm), (db_want, dbm)] = reference(&g, &x, &dy, &vec![0.0; g.w_len()]);
        let t = terms(&g);
        for &lanes in &widths {
            for px in [false, true] {
                let (mut dw, mut db) = (vec![f32::NAN; g.w_len()], vec![f32::NAN; g.out_channels]);
                if px {
                    super::filter_px::run(lanes, &shape_of(&g), &x, &dy, &mut dw, Some(&mut db));
                } else {
                    super::filter::run(lanes, &shape_of(&g), &x, &dy, &mut dw, Some(&mut db));
                }
                let what = format!("{lanes} lanes, pixel vectors {px}, {g:?}");
                assert_close(&format!("dw {what}"), &dw, &dw_want, &dwm, t[1]);
                assert_close(&format!("db {what}"), &db, &db_want, &dbm, t[2]);
            }
        }
    }
}

/// Central differences of `L = Σ y · r` in f64 agree with the gradients.
#[test]
fn gradients_match_finite_differences() {
    let g = geo(2, 4, 6, 2, [5, 6], [3, 2], [2, 1], [1, 2], [1, 2, 0, 1]);
    let mut rng = Rng(0x7777_1234);
    let (x, w, r) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.y_len()));
    let loss = |x: &[f32], w: &[f32]| {
        let mut y = vec![0.0; g.y_len()];
        forward_on(Path::Portable, &g, x, w, None, false, &mut y);
        y.iter().zip(&r).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
    };
    let (mut dx, mut dw) = (vec![0.0; g.x_len()], vec![0.0; g.w_len()]);
    backward_data(&g, &r, &w, &mut dx, Isa::native());
    backward_filter(&g, &x, &r, &mut dw, None, Isa::native());
    let h = 1.0 / 64.0;
    for (i, want) in dx.iter().enumerate() {
        let (mut p, mut m) = (x.clone(), x.clone());
        p[i] += h;
        m[i] -= h;
        let fd = (loss(&p, &w) - loss(&m, &w)) / (2.0 * f64::from(h));
        assert!((fd - f64::from(*want)).abs() < 1e-3, "dx[{i}]: {fd} vs {want}");
    }
    for (i, want) in dw.iter().enumerate() {
        let (mut p, mut m) = (w.clone(), w.clone());
        p[i] += h;
        m[i] -= h;
        let fd = (loss(&x, &p) - loss(&x, &m)) / (2.0 * f64::from(h));
        assert!((fd - f64::from(*want)).abs() < 1e-3, "dw[{i}]: {fd} vs {want}");
    }
}

/// NaN and infinities in `dy` reach the `dx` values that use them, and
/// those in `x` the `dw` values; a non-finite `dy` makes NaN at least every
/// `dw` the reference makes non-finite (padding is multiplied there, see
/// the module).
#[test]
fn gradients_propagate_nan_and_inf() {
    let mut rng = Rng(0x2222_9999);
    for g in [
        geo(1, 2, 3, 1, [6, 20], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 3, 2, 1, [7, 9], [3, 3], [2, 2], [1, 1], [1, 1, 0, 0]),
    ] {
        let (mut x, mut dy, w) = (rng.vec(g.x_len()), rng.vec(g.y_len()), rng.vec(g.w_len()));
        let (x0, dy0) = (x.clone(), dy.clone());
        dy[3] = f32::NAN;
        dy[g.y_len() - 2] = f32::INFINITY;
        x[g.x_len() / 3] = f32::NEG_INFINITY;
        x[7] = f32::NAN;
        let [(dx_want, dxm), ..] = reference(&g, &x0, &dy, &w);
        let [_, (dw_want, dwm), _] = reference(&g, &x, &dy0, &w);
        let [_, (dw_both, _), _] = reference(&g, &x, &dy, &w);
        assert!(dx_want.iter().any(|v| v.is_nan()) && dw_want.iter().any(|v| v.is_nan()));
        let t = terms(&g);
        for path in paths() {
            let mut dx = vec![0.0; g.x_len()];
            backward_data_on(path, &g, &dy, &w, &mut dx);
            assert_close(&format!("dx {path:?} {g:?}"), &dx, &dx_want, &dxm, t[0]);
            let mut dw = vec![0.0; g.w_len()];
            backward_filter_on(path, &g, &x, &dy0, &mut dw, None);
            assert_close(&format!("dw {path:?} {g:?}"), &dw, &dw_want, &dwm, t[1]);
            backward_filter_on(path, &g, &x, &dy, &mut dw, None);
            for (got, want) in dw.iter().zip(&dw_both) {
                assert!(want.is_finite() || !got.is_finite(), "dw {path:?} {g:?}: {got} vs {want}");
            }
        }
    }
}

/// Both gradients give the same bits for 1, 2 and 3 threads.
#[test]
fn gradient_bits_do_not_depend_on_threads() {
    let mut rng = Rng(0x3141_5926);
    for g in [
        geo(3, 6, 34, 2, [13, 17], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 5, 7, 1, [15, 19], [3, 5], [2, 3], [1, 1], [1, 2, 1, 2]),
        geo(1, 3, 40, 1, [20, 20], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
        geo(3, 1, 16, 1, [28, 28], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
    ] {
        let (x, dy, w) = (rng.vec(g.x_len()), rng.vec(g.y_len()), rng.vec(g.w_len()));
        for path in paths() {
            same_bits_for_threads(&format!("dx {path:?} {g:?}"), || {
                let mut dx = vec![0.0; g.x_len()];
                backward_data_on(path, &g, &dy, &w, &mut dx);
                dx
            });
            same_bits_for_threads(&format!("dw {path:?} {g:?}"), || {
                let (mut dw, mut db) = (vec![0.0; g.w_len()], vec![0.0; g.out_channels]);
                backward_filter_on(path, &g, &x, &dy, &mut dw, Some(&mut db));
                dw.extend(db);
                dw
            });
        }
    }
}

/// An empty batch: `dw` and `db` are zeros, `y` and `dx` empty.
#[test]
fn an_empty_batch_gives_zero_filter_gradients() {
    let g = geo(0, 3, 4, 1, [5, 6], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    for path in paths() {
        let (mut dw, mut db) = (vec![f32::NAN; g.w_len()], vec![f32::NAN; 4]);
        backward_filter_on(path, &g, &[], &[], &mut dw, Some(&mut db));
        assert!(dw.iter().chain(&db).all(|&v| v == 0.0), "{path:?}");
        forward_on(path, &g, &[], &vec![1.0; g.w_len()], None, true, &mut []);
        backward_data_on(path, &g, &[], &vec![1.0; g.w_len()], &mut []);
    }
}

/// Stride-1 backward-data through the channel-lane kernel (the transposed
/// convolution's geometry taking it, packing per call), against the
/// adjoint loops: W12's second layer (8 lanes only: 16 output channels),
/// a 3×3 on a narrow map (both widths), dilation with asymmetric padding
/// (8 lanes only: 40 output channels, under a 16-lane block of 64);
/// a forward padded past its kernel's extent keeps the direct kernel.
#[test]
fn backward_data_takes_the_channel_lanes_where_it_pays() {
    let mut rng = Rng(0x4242_1717);
    let cases = [
        (geo(2, 16, 32, 1, [14, 14], [5, 5], [1, 1], [1, 1], [2; 4]), [true, false]),
        (geo(1, 64, 64, 1, [16, 16], [3, 3], [1, 1], [1, 1], [1; 4]), [true, true]),
        (geo(3, 40, 32, 1, [9, 12], [3, 3], [1, 1], [2, 2], [1, 2, 3, 0]), [true, false]),
    ];
    for (g, [w8, w16]) in cases {
        let t = transposed(&g).expect("stride 1, pads within the extent");
        assert!(cvec::packing_pays(&t), "{g:?}");
        assert_eq!((cvec::prefers(Path::W8, &t), cvec::prefers(Path::W16, &t)), (w8, w16), "{g:?}");
        let (x, dy, w) = (rng.vec(g.x_len()), rng.vec(g.y_len()), rng.vec(g.w_len()));
        let [(want, mag), _, _] = reference(&g, &x, &dy, &w);
        for path in paths() {
            let mut dx = vec![f32::NAN; g.x_len()];
            backward_data_on(path, &g, &dy, &w, &mut dx);
            assert_close(&format!("dx {path:?} {g:?}"), &dx, &want, &mag, terms(&g)[0]);
        }
    }
    assert!(transposed(&geo(1, 4, 4, 1, [6, 6], [3, 3], [1, 1], [1, 1], [3, 1, 1, 1])).is_none());
    assert!(transposed(&geo(1, 4, 4, 1, [6, 6], [3, 3], [2, 2], [1, 1], [1; 4])).is_none());
}
