//! Every main public item has a runnable rustdoc example (rustdoc's own
//! `missing_doc_code_examples` lint is nightly-only): this reads each
//! item's doc comment in the source and checks it holds a code block. The
//! examples themselves run as doc tests.

/// (source file from the workspace root, the line that starts the item).
const ITEMS: &[(&str, &str)] = &[
    ("crates/tracejit-trace/src/function.rs", "pub fn function<"),
    ("crates/tracejit-trace/src/tensor.rs", "pub struct Tensor {"),
    ("crates/tracejit-trace/src/variable.rs", "pub struct Variable {"),
    ("crates/tracejit-trace/src/variable.rs", "pub fn remember<"),
    ("crates/tracejit-trace/src/tape.rs", "pub struct GradientTape {"),
    ("crates/tracejit-trace/src/tape.rs", "pub fn value_and_grad("),
    ("crates/tracejit-trace/src/tape.rs", "pub fn register_gradient<"),
    ("crates/tracejit-trace/src/custom.rs", "pub fn custom_gradient<"),
    ("crates/tracejit-trace/src/custom.rs", "pub fn custom_gradient_n<"),
    ("crates/tracejit-trace/src/control.rs", "pub fn cond<"),
    ("crates/tracejit-trace/src/control.rs", "pub fn while_loop<"),
    ("crates/tracejit-trace/src/control.rs", "pub fn fori_loop<"),
    ("crates/tracejit-trace/src/function/retrace.rs", "pub enum RetracePolicy {"),
    ("crates/tracejit-optim/src/adam.rs", "pub struct Adam {"),
    ("crates/tracejit-optim/src/sgd.rs", "pub struct Sgd {"),
    ("crates/tracejit-module/src/checkpoint.rs", "pub fn save<"),
    ("crates/tracejit-onnx/src/lib.rs", "pub fn save("),
    ("crates/tracejit-nn/src/conv.rs", "pub fn conv2d("),
    ("crates/tracejit-nn/src/conv.rs", "pub struct Conv2dOptions {"),
    ("crates/tracejit-nn/src/conv.rs", "pub fn max_pool2d("),
    ("crates/tracejit-nn/src/conv.rs", "pub fn avg_pool2d("),
    ("crates/tracejit-nn/src/batch_norm.rs", "pub fn batch_norm("),
    ("crates/tracejit-trace/src/spatial.rs", "pub fn spatial("),
    ("crates/tracejit-trace/src/ops.rs", "pub fn matmul_acc("),
    ("crates/tracejit-trace/src/function/builder.rs", "pub fn mixed_precision("),
    ("crates/tracejit-trace/src/quantize.rs", "pub fn dynamic("),
    ("crates/tracejit-trace/src/vmap.rs", "pub fn vmap<"),
    ("crates/tracejit-trace/src/vmap.rs", "pub fn vmap_axes<"),
    ("crates/tracejit-trace/src/remat.rs", "pub fn checkpoint<"),
    ("crates/tracejit-trace/src/remat.rs", "pub fn checkpoint_with<"),
    ("crates/tracejit-ir/src/batching/mod.rs", "pub fn batch_graph("),
];

/// The doc comment lines directly above the line starting with `item`
/// (attributes between them skipped).
fn doc_of(source: &str, item: &str) -> Option<Vec<String>> {
    let lines: Vec<&str> = source.lines().collect();
    let at = lines.iter().position(|l| l.trim_start().starts_with(item))?;
    let mut doc = Vec::new();
    for line in lines[..at].iter().rev().map(|l| l.trim_start()) {
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.to_string());
        } else if !line.starts_with("#[") {
            break;
        }
    }
    doc.reverse();
    Some(doc)
}

#[test]
fn every_main_item_has_an_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut missing = Vec::new();
    for (file, item) in ITEMS {
        let source = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        match doc_of(&source, item) {
            None => missing.push(format!("{file}: no item `{item}`")),
            Some(doc) if !doc.iter().any(|l| l.trim_start().starts_with("```")) => {
                missing.push(format!("{file}: `{item}` has no example in its docs"))
            }
            Some(_) => {}
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
