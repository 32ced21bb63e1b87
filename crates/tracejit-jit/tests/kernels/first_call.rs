//! Preparing a first call before it is made: the heap a first call's
//! buffers take, and convolution filters packed before the first call (what a
//! loaded artifact does in its load), against the interpreter and against
//! the filter packed by a second call.

use crate::common::*;
use tracejit_ir::tensor::{Conv2dAttrs, DType, SpatialOp, Storage};
use tracejit_ir::{Graph, Op};
use tracejit_jit::Executable;

/// `conv2d(x, w) + bias, relu` on `[1, 32, 7, 7]` by 64 filters of 3×3,
/// padded by 1 (ResNet's 7×7 stage in small), its weights a constant or,
/// with `weights_as_argument`, the graph's second argument.
fn conv_graph(weights_as_argument: bool) -> (Graph, Vec<Storage>) {
    let mut g = Graph::new("conv");
    let x = param(&mut g, DType::F32, &[1, 32, 7, 7]);
    let wv = data(DType::F32, &[64, 32, 3, 3], 2, false);
    let bv = data(DType::F32, &[64], 3, false);
    let w = if weights_as_argument { param(&mut g, DType::F32, &[64, 32, 3, 3]) } else { g.add_constant(wv.clone()) };
    let b = g.add_constant(bv);
    let conv = Conv2dAttrs { pad: [1; 4], ..Conv2dAttrs::DEFAULT };
    let y = node(&mut g, Op::Spatial(SpatialOp::Conv2d { conv, bias: true, relu: true }), &[x, w, b]);
    g.outputs.push(y);
    let mut args = vec![data(DType::F32, &[1, 32, 7, 7], 1, false)];
    if weights_as_argument {
        args.push(wv);
    }
    (g, args)
}

fn kept(exe: &Executable, args: &[Storage]) -> bool {
    let profile = exe.profile(args, 1).unwrap();
    profile.steps.iter().any(|s| s.what.contains("filter kept"))
}

/// `x·x`, then `(x·x)·x`, then that times `x` again, on `[n, n]`; the
/// graph (its output not set) and the last product.
fn chain(n: usize) -> (Graph, tracejit_ir::ValueId) {
    let mut g = Graph::new("chain");
    let x = param(&mut g, DType::F32, &[n, n]);
    let a = node(&mut g, Op::MatMul, &[x, x]);
    let b = node(&mut g, Op::MatMul, &[a, x]);
    let c = node(&mut g, Op::MatMul, &[b, x]);
    (g, c)
}

fn bits(s: &Storage) -> Vec<u32> {
    s.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_prepacked_filter_serves_the_first_call() {
    let (g, args) = conv_graph(false);
    let want = tracejit_ir::interpret(&g, &args).unwrap();
    // Packed by the second call, as a traced function packs it.
    let later = Executable::new(&g).unwrap();
    let _ = later.run(&args).unwrap();
    let second = later.run(&args).unwrap();
    assert!(kept(&later, &args), "the second call keeps the filter");

    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.prepack_filters(), 1, "the constant filter is packed before any call");
    assert!(kept(&exe, &args), "the first call found the packed filter");
    let first = exe.run(&args).unwrap();
    // The same kernel on the same packing: the same bits.
    assert_eq!(bits(&first[0]), bits(&second[0]));
    // |error| <= 2 · taps · ε · Σ|terms|, with |x|, |w| <= 1 and the bias.
    let taps = 32.0 * 9.0;
    close_abs(&first[0], &want[0], 2.0 * taps * f64::from(f32::EPSILON) * (taps + 1.0)).unwrap();
}

#[test]
fn a_filter_that_is_an_argument_is_left_to_the_call() {
    let (g, args) = conv_graph(true);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.prepack_filters(), 0);
    let got = exe.run(&args).unwrap();
    close_abs(&got[0], &tracejit_ir::interpret(&g, &args).unwrap()[0], 1e-3).unwrap();
}

/// In [`chain`], the third product takes the first one's buffer, freed by the second (the parameter is
/// the caller's), so the first call takes two buffers from the heap; a
/// product of another size takes a third.
#[test]
fn the_first_call_takes_a_buffer_per_size_not_reused() {
    let n = 96;
    let (mut g, c) = chain(n);
    g.outputs.push(c);
    let exe = Executable::new(&g).unwrap();
    assert_eq!(exe.first_call_bytes(), 2 * n * n * 4, "{}", exe.schedule_listing());

    // A [n, 1] product of the last result: a size no freed buffer has.
    let mut g2 = g.clone();
    let v = param(&mut g2, DType::F32, &[n, 1]);
    let d = node(&mut g2, Op::MatMul, &[c, v]);
    g2.outputs = vec![d];
    let exe = Executable::new(&g2).unwrap();
    assert_eq!(exe.first_call_bytes(), 2 * n * n * 4 + n * 4, "{}", exe.schedule_listing());
}

/// `release_buffers` empties the pool (the kept buffer of the chain's
/// dying intermediate) and the next call refills it, with the same bits.
#[test]
fn released_buffers_are_allocated_anew() {
    let n = 64;
    let (mut g, c) = chain(n);
    g.outputs.push(c);
    let exe = Executable::new(&g).unwrap();
    let args = [data(DType::F32, &[n, n], 5, false)];
    let want = bits(&exe.run(&args).unwrap()[0]);
    assert!(exe.release_buffers() >= n * n * 4, "the pool kept the dying product's buffer");
    assert_eq!(exe.release_buffers(), 0, "nothing is left to release");
    assert_eq!(bits(&exe.run(&args).unwrap()[0]), want);
    assert!(exe.release_buffers() >= n * n * 4, "the call kept it again");
}
