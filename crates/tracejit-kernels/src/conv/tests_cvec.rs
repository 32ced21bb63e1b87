//! The channel-lane forward (`cvec`) against the f64 reference on every
//! vector path this CPU has: partial blocks of channels, maps that end in
//! partial tiles, taps across several chunks, strides, dilation,
//! asymmetric padding, no padding, non-finite values, 1-3 threads; its
//! routing; and misuse.

use super::tests::{assert_close, geo, paths, reference, same_bits_for_threads, Rng};
use super::*;

/// Shapes for the channel-lane kernel, whatever the routing would pick.
fn cvec_shapes() -> Vec<Conv2dGeometry> {
    vec![
        // ResNet-like: 3×3 pad 1 on a 7×7 map (tiles of 6 and 5 pixels).
        geo(1, 32, 64, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Channels that end in a partial block at 16 and 8 lanes, taps over
        // several chunks at both widths (48 · 9 = 432), batch 3.
        geo(3, 48, 70, 1, [5, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Stride 2, asymmetric padding, a 3×5 kernel, 17 channels.
        geo(2, 6, 17, 1, [11, 13], [3, 5], [2, 2], [1, 1], [0, 2, 1, 1]),
        // Dilation 2 and stride (1, 3).
        geo(1, 5, 9, 1, [12, 20], [3, 3], [1, 3], [2, 2], [2, 1, 2, 0]),
        // No padding: 1×1 at stride 2 reads `x` in place, and a 2×2.
        geo(2, 40, 33, 1, [9, 7], [1, 1], [2, 2], [1, 1], [0; 4]),
        geo(1, 3, 5, 1, [6, 6], [2, 2], [1, 1], [1, 1], [0; 4]),
        // One output pixel; one output channel.
        geo(2, 7, 3, 1, [3, 3], [3, 3], [1, 1], [1, 1], [0; 4]),
        geo(1, 4, 1, 1, [5, 4], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Panels of 256 KB: groups of 4 images and 1, padded and not.
        geo(5, 40, 16, 1, [38, 38], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(5, 40, 20, 1, [40, 40], [2, 2], [2, 2], [1, 1], [0; 4]),
    ]
}

/// The vector paths of this CPU.
fn vector_paths() -> Vec<Path> {
    paths().into_iter().filter(|&p| cvec::lanes_of(p).is_some()).collect()
}

/// `y` from the channel-lane kernel on `path`, filter packed first.
fn run(path: Path, g: &Conv2dGeometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, relu: bool) -> Vec<f32> {
    let filter = cvec::pack(path, g, w).expect("one group on a vector path");
    let mut y = vec![f32::NAN; g.y_len()];
    cvec::run(path, g, x, &filter, Epilogue::bias_relu(bias, relu), &mut y, false);
    y
}

#[test]
fn channel_lane_forward_matches_the_reference() {
    let mut rng = Rng(0x2468_ace0);
    for g in cvec_shapes() {
        assert_eq!(g.validate(), Ok(()), "{g:?}");
        let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
        for (bias, relu) in [(None, false), (Some(&b[..]), true), (Some(&b[..]), false)] {
            let (want, mag) = reference(&g, &x, &w, bias, relu);
            for path in vector_paths() {
                let y = run(path, &g, &x, &w, bias, relu);
                let taps = g.in_channels * g.kernel[0] * g.kernel[1];
                assert_close(&format!("{path:?} {g:?} relu {relu}"), &y, &want, &mag, taps);
            }
        }
    }
}

/// NaN and infinities in `x` reach exactly the outputs whose windows hold
/// them (relu keeps NaN), as on the other paths.
#[test]
fn channel_lane_forward_propagates_nan_and_inf() {
    let mut rng = Rng(0x1357_9bdf);
    for g in [
        geo(1, 30, 20, 1, [7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        geo(2, 9, 18, 1, [8, 8], [3, 3], [2, 2], [1, 1], [0; 4]),
    ] {
        let mut x = rng.vec(g.x_len());
        x[5] = f32::NAN;
        x[g.x_len() / 2] = f32::INFINITY;
        x[g.x_len() - 3] = f32::NEG_INFINITY;
        let w = rng.vec(g.w_len());
        for relu in [false, true] {
            let (want, mag) = reference(&g, &x, &w, None, relu);
            assert!(want.iter().any(|v| v.is_nan()));
            for path in vector_paths() {
                let y = run(path, &g, &x, &w, None, relu);
                assert_close(&format!("{path:?} {g:?} relu {relu}"), &y, &want, &mag, 270);
            }
        }
    }
}

#[test]
fn channel_lane_bits_do_not_depend_on_threads() {
    let mut rng = Rng(0x0f0f_1234);
    let g = geo(2, 40, 150, 1, [9, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
    for path in vector_paths() {
        same_bits_for_threads(&format!("{path:?}"), || run(path, &g, &x, &w, Some(&b), true));
    }
}

/// NCHW panels large enough that their padded copy is shared among the
/// pool's threads (two images of 40 planes of 50×44): the reference's
/// values and the same bits at 1-3 threads.
#[test]
fn channel_lane_panels_filled_by_several_threads() {
    let mut rng = Rng(0x0f11_1234);
    let g = geo(2, 40, 24, 1, [48, 42], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
    let (want, mag) = reference(&g, &x, &w, Some(&b), false);
    for path in vector_paths() {
        same_bits_for_threads(&format!("{path:?}"), || {
            let y = run(path, &g, &x, &w, Some(&b), false);
            assert_close(&format!("{path:?} {g:?}"), &y, &want, &mag, 40 * 9);
            y
        });
    }
}

/// The routing the module documents: narrow maps at 16 lanes, every kernel
/// larger than 1×1 at 8; the forward takes the kernel (packing per call)
/// where the map is large enough, with the same bits as a filter packed
/// beforehand.
#[test]
fn forward_takes_the_channel_lanes_where_measured_faster() {
    let resnet = |c: usize, hw: usize, k: usize, s: usize| {
        let p = k / 2;
        geo(1, c, c, 1, [hw, hw], [k, k], [s, s], [1, 1], [p; 4])
    };
    let (s7, s14, s56) = (resnet(512, 7, 3, 1), resnet(256, 14, 3, 1), resnet(64, 56, 3, 1));
    for path in [Path::W16, Path::W8] {
        assert!(cvec::prefers(path, &s7) && cvec::prefers(path, &s14), "{path:?}");
        // Grouped, few taps, few channels, or a panel past the cache: not.
        assert!(!cvec::prefers(path, &geo(1, 64, 64, 2, [7, 7], [3, 3], [1, 1], [1, 1], [1; 4])));
        assert!(!cvec::prefers(path, &geo(1, 16, 64, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1; 4])));
        assert!(!cvec::prefers(path, &geo(1, 64, 4, 1, [7, 7], [3, 3], [1, 1], [1, 1], [1; 4])));
        assert!(!cvec::prefers(path, &geo(1, 256, 512, 1, [56, 56], [1, 1], [2, 2], [1, 1], [0; 4])));
    }
    assert!(!cvec::prefers(Path::Portable, &s7));
    // The 56×56 stage: pixel lanes at 16, channel lanes at 8; 1×1 layers
    // there stay products at both.
    assert!(!cvec::prefers(Path::W16, &s56) && cvec::prefers(Path::W8, &s56));
    let wide_1x1 = geo(1, 64, 256, 1, [56, 56], [1, 1], [1, 1], [1, 1], [0; 4]);
    assert!(!cvec::prefers(Path::W16, &wide_1x1) && !cvec::prefers(Path::W8, &wide_1x1));
    // Packing per call pays from 256 output pixels.
    assert!(
        !cvec::packing_pays(&s14) && cvec::packing_pays(&geo(2, 256, 256, 1, [14, 14], [3, 3], [1, 1], [1, 1], [1; 4]))
    );

    let mut rng = Rng(0x7777_1111);
    let g = geo(1, 32, 64, 1, [16, 16], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w, b) = (rng.vec(g.x_len()), rng.vec(g.w_len()), rng.vec(g.out_channels));
    for path in vector_paths() {
        assert!(cvec::prefers(path, &g) && cvec::packing_pays(&g), "{path:?}");
        let mut y = vec![0.0; g.y_len()];
        forward_on(path, &g, &x, &w, Some(&b), true, &mut y);
        let packed = run(path, &g, &x, &w, Some(&b), true);
        assert!(y.iter().zip(&packed).all(|(a, b)| a.to_bits() == b.to_bits()), "{path:?}");
    }
}

#[test]
fn packed_filters_exist_only_where_the_kernel_runs() {
    let g = geo(1, 8, 16, 1, [5, 5], [3, 3], [1, 1], [1, 1], [1; 4]);
    let w = vec![0.5; g.w_len()];
    assert!(cvec::pack(Path::Portable, &g, &w).is_none());
    let grouped = geo(1, 8, 16, 2, [5, 5], [3, 3], [1, 1], [1, 1], [1; 4]);
    assert!(PackedFilter::new(&grouped, &vec![0.5; grouped.w_len()], Isa::native()).is_none());
    if Isa::native().width().is_some() {
        assert!(PackedFilter::new(&g, &w, Isa::native()).is_some());
    }
}

/// A filter packed for one geometry refuses another's.
#[test]
#[should_panic(expected = "conv2d: a filter packed for 16 output channels of 72 taps run with 8 of 72")]
fn a_filter_of_another_geometry_panics() {
    let g = geo(1, 8, 16, 1, [5, 5], [3, 3], [1, 1], [1, 1], [1; 4]);
    let filter = PackedFilter::new(&g, &vec![0.5; g.w_len()], Isa::native()).expect("a vector path");
    let other = Conv2dGeometry { out_channels: 8, ..g };
    let mut y = vec![0.0; other.y_len()];
    forward_with_filter(&other, &vec![1.0; other.x_len()], &filter, None, false, &mut y, Isa::native());
}
