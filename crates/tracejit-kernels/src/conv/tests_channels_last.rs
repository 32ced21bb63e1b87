//! The channels-last forward against the f64 reference (the NCHW one with
//! its operands transposed) on every path this CPU has: the channel-lane
//! kernel's shapes (partial blocks, partial tiles, chunks, strides,
//! dilation, asymmetric padding), maps cut into pixel ranges for the pool,
//! grouped convolutions (through NCHW), non-finite values, the bits at 1-3
//! threads, and a filter packed once against one packed per call.

use super::channels_last::{onto_on, swap_inner, through_nchw};
use super::tests::{assert_close, geo, paths, reference, same_bits_for_threads, Rng};
use super::*;

/// `g`'s forward with channels last on `path`: `x` given NCHW, `y` NCHW.
fn run(path: Path, g: &Conv2dGeometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, relu: bool) -> Vec<f32> {
    run_fused(path, g, x, w, Epilogue::bias_relu(bias, relu))
}

/// [`run`] with any epilogue (a residual given channels last).
fn run_fused(path: Path, g: &Conv2dGeometry, x: &[f32], w: &[f32], epi: Epilogue<'_>) -> Vec<f32> {
    let x_last = swap_inner(x, g.batch, g.in_channels, g.in_h * g.in_w);
    let mut y = vec![f32::NAN; g.y_len()];
    match cvec::pack(path, g, w) {
        Some(filter) => cvec::run(path, g, &x_last, &filter, epi, &mut y, true),
        None => through_nchw(path, g, &x_last, w, epi, &mut y),
    }
    // Back to NCHW, to compare with the reference.
    swap_inner(&y, g.batch, g.out_h() * g.out_w(), g.out_channels)
}

fn shapes() -> Vec<Conv2dGeometry> {
    vec![
        // 3×3 pad 1 on a 7×7 map; channels ending in partial blocks at
        // both widths; taps over several chunks; batch 3.
        geo(1, 32, 64, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(3, 48, 70, 1, [5, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Padded copies whose pixels are a cache line wider than their 32
        // or 64 channels (the level-1 sets), two images a group, stride 2.
        geo(2, 64, 40, 1, [6, 5], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        // Stride 2, asymmetric padding, a 3×5 kernel, 17 channels; dilation.
        geo(2, 6, 17, 1, [11, 13], [3, 5], [2, 2], [1, 1], [0, 2, 1, 1]),
        geo(1, 5, 9, 1, [12, 20], [3, 3], [1, 3], [2, 2], [2, 1, 2, 0]),
        // No padding (x read in place): 1×1 at stride 2, a 2×2; three
        // input channels (an image's first layer).
        geo(2, 40, 33, 1, [9, 7], [1, 1], [2, 2], [1, 1], [0; 4]),
        geo(1, 3, 5, 1, [6, 6], [2, 2], [1, 1], [1, 1], [0; 4]),
        geo(1, 3, 16, 1, [15, 15], [7, 7], [2, 2], [1, 1], [3, 3, 3, 3]),
        // One output pixel; one output channel; one input channel.
        geo(2, 7, 3, 1, [3, 3], [3, 3], [1, 1], [1, 1], [0; 4]),
        geo(1, 4, 1, 1, [5, 4], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 1, 8, 1, [4, 5], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Maps cut into several pixel ranges (a 40×40 map of 16 channels:
        // one block, four ranges per image), padded and not.
        geo(2, 24, 16, 1, [40, 40], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 20, 24, 1, [45, 41], [1, 1], [1, 1], [1, 1], [0; 4]),
        // Grouped and depthwise: through NCHW.
        geo(2, 8, 12, 4, [6, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 6, 6, 6, [5, 5], [3, 3], [2, 2], [1, 1], [1, 0, 1, 0]),
    ]
}

#[test]
fn channels_last_forward_matches_the_reference() {
    let mut rng = Rng(0x5eed_c1a5);
    for g in shapes() {
        assert_eq!(g.validate(), Ok(()), "{g:?}");
        let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
        for (bias, relu) in [(None, false), (Some(&b[..]), true), (Some(&b[..]), false)] {
            let (want, mag) = reference(&g, &x, &w, bias, relu);
            let taps = g.in_channels / g.groups * g.kernel[0] * g.kernel[1];
            for path in paths() {
                let y = run(path, &g, &x, &w, bias, relu);
                assert_close(&format!("{path:?} {g:?} relu {relu}"), &y, &want, &mag, taps);
            }
        }
    }
}

/// The public entry point: packed per call or beforehand, the same bits;
/// NaN and infinities in `x` reach exactly the outputs whose windows hold
/// them (relu keeps NaN).
#[test]
fn channels_last_entry_points_agree_and_propagate_nan() {
    let mut rng = Rng(0x0dd_5eed);
    for g in [
        geo(1, 30, 20, 1, [7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 9, 18, 1, [8, 8], [3, 3], [2, 2], [1, 1], [0; 4]),
        geo(2, 32, 20, 1, [5, 6], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
    ] {
        let mut x = rng.vec(g.x_len());
        x[5] = f32::NAN;
        x[g.x_len() / 2] = f32::INFINITY;
        x[g.x_len() - 3] = f32::NEG_INFINITY;
        let (w, b) = (rng.vec(g.w_len()), rng.vec(g.out_channels));
        for relu in [false, true] {
            let (want, mag) = reference(&g, &x, &w, Some(&b), relu);
            assert!(want.iter().any(|v| v.is_nan()));
            for path in paths() {
                let y = run(path, &g, &x, &w, Some(&b), relu);
                assert_close(&format!("{path:?} {g:?} relu {relu}"), &y, &want, &mag, 270);
            }
            let isa = Isa::native();
            let x_last = swap_inner(&x, g.batch, g.in_channels, g.in_h * g.in_w);
            let mut per_call = vec![0.0; g.y_len()];
            forward_channels_last(&g, &x_last, &w, Some(&b), relu, &mut per_call, isa);
            if let Some(filter) = PackedFilter::new(&g, &w, isa) {
                let mut packed = vec![0.0; g.y_len()];
                forward_channels_last_with_filter(&g, &x_last, &filter, Some(&b), relu, &mut packed, isa);
                assert!(per_call.iter().zip(&packed).all(|(a, b)| a.to_bits() == b.to_bits()), "{g:?}");
            }
        }
    }
}

/// Relu of a NaN stays NaN in the vector stores, as in the scalar ones,
/// and of a negative sum is +0.
#[test]
fn channels_last_relu_keeps_nan() {
    let g = geo(1, 1, 16, 1, [1, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    let (x, w) = ([f32::NAN, -2.0], [1.0f32; 16]);
    for path in paths() {
        let y = run(path, &g, &x, &w, None, true);
        for o in 0..16 {
            assert!(y[o * 2].is_nan(), "{path:?} channel {o}");
            assert_eq!(y[o * 2 + 1].to_bits(), 0.0f32.to_bits(), "{path:?} channel {o}");
        }
    }
}

#[test]
fn channels_last_bits_do_not_depend_on_threads() {
    let mut rng = Rng(0x0f0f_4321);
    // One block of 16 channels on a 32×32 map: several pixel ranges.
    let g = geo(2, 40, 16, 1, [32, 32], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
    for path in paths() {
        same_bits_for_threads(&format!("{path:?}"), || run(path, &g, &x, &w, Some(&b), true));
    }
}

/// Panels large enough that their padded copy is shared among the pool's
/// threads (three images of 57×43×32 values: several row ranges): the
/// reference's values and the same bits at 1-3 threads.
#[test]
fn channels_last_panels_filled_by_several_threads() {
    let mut rng = Rng(0x0f11_9a4e);
    let g = geo(3, 32, 16, 1, [56, 40], [3, 3], [1, 1], [1, 1], [1, 2, 0, 1]);
    let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
    let (want, mag) = reference(&g, &x, &w, Some(&b), true);
    for path in paths() {
        same_bits_for_threads(&format!("{path:?}"), || {
            let y = run(path, &g, &x, &w, Some(&b), true);
            assert_close(&format!("{path:?} {g:?}"), &y, &want, &mag, 32 * 9);
            y
        });
    }
}

#[test]
#[should_panic(expected = "conv::forward: y holds 10 values, the geometry needs 12")]
fn channels_last_forward_panics_on_a_short_output() {
    let g = geo(1, 2, 3, 1, [2, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    let mut y = vec![0.0; 10];
    forward_channels_last(&g, &[0.0; 8], &[0.0; 6], None, false, &mut y, Isa::native());
}

/// Every combination of scale, bias, residual and relu on every path:
/// the fused stores give what the epilogue's steps give applied one after
/// another to the same kernel's plain sums (the sums are the same tiles'),
/// bit for bit up to the sign of a zero; NaN and infinities in the scale
/// and the residual reach their outputs. The NCHW fallback (several
/// groups) and partial blocks take the scalar steps.
#[test]
fn channels_last_epilogue_is_its_steps_in_order() {
    let mut rng = Rng(0xe91_1095);
    for g in [
        geo(2, 24, 70, 1, [5, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(1, 16, 64, 1, [40, 40], [1, 1], [1, 1], [1, 1], [0; 4]),
        geo(2, 8, 12, 4, [6, 7], [3, 3], [2, 2], [1, 1], [1, 0, 1, 0]),
    ] {
        let (x, w) = (rng.vec(g.x_len()), rng.vec(g.w_len()));
        let (mut scale, bias, mut residual) = (rng.vec(g.out_channels), rng.vec(g.out_channels), rng.vec(g.y_len()));
        scale[1] = f32::INFINITY;
        residual[3] = f32::NAN;
        residual[g.y_len() - 2] = f32::NEG_INFINITY;
        for mask in 0..16 {
            let epi = Epilogue {
                scale: (mask & 1 != 0).then_some(&scale[..]),
                bias: (mask & 2 != 0).then_some(&bias[..]),
                residual: (mask & 4 != 0).then_some(&residual[..]),
                relu: mask & 8 != 0,
            };
            for path in paths() {
                // `run_fused` gives NCHW; the residual is channels last.
                let plane = g.out_h() * g.out_w();
                let last = |y: Vec<f32>| swap_inner(&y, g.batch, g.out_channels, plane);
                let plain = last(run_fused(path, &g, &x, &w, Epilogue::default()));
                let fused = last(run_fused(path, &g, &x, &w, epi));
                for (i, (&p, &f)) in plain.iter().zip(&fused).enumerate() {
                    let want = epi.apply(i % g.out_channels, p, epi.residual.map(|r| r[i]));
                    assert!(want == f || (want.is_nan() && f.is_nan()), "{path:?} {g:?} {mask}: [{i}] {f} vs {want}");
                }
                // The residual in `y` on entry: the same values, from
                // `y`'s own buffer (with and without a filter packed
                // beforehand).
                if let Some(r) = epi.residual {
                    let x_last = swap_inner(&x, g.batch, g.in_channels, g.in_h * g.in_w);
                    let own = Epilogue { residual: None, ..epi };
                    let packed = cvec::pack(path, &g, &w);
                    for filter in [None, packed.as_ref()] {
                        let mut y = r.to_vec();
                        onto_on(path, &g, &x_last, &w, filter, own, &mut y);
                        for (i, (&o, &f)) in y.iter().zip(&fused).enumerate() {
                            let same = o.to_bits() == f.to_bits() || (o.is_nan() && f.is_nan());
                            assert!(same, "{path:?} {g:?} {mask} onto y: [{i}] {o} vs {f}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "takes its residual from y, not the epilogue")]
fn channels_last_onto_refuses_a_second_residual() {
    let g = geo(1, 2, 3, 1, [2, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    let (mut y, r) = (vec![0.0; 12], vec![0.0; 12]);
    let epi = Epilogue { residual: Some(&r), ..Epilogue::default() };
    forward_channels_last_onto(&g, &[0.0; 8], &[0.0; 6], None, epi, &mut y, Isa::native());
}

#[test]
#[should_panic(expected = "conv::forward: residual holds 11 values, the geometry needs 12")]
fn channels_last_forward_panics_on_a_short_residual() {
    let g = geo(1, 2, 3, 1, [2, 2], [1, 1], [1, 1], [1, 1], [0; 4]);
    let (mut y, r) = (vec![0.0; 12], vec![0.0; 11]);
    let epi = Epilogue { residual: Some(&r), ..Epilogue::default() };
    forward_channels_last_fused(&g, &[0.0; 8], &[0.0; 6], None, epi, &mut y, Isa::native());
}
