//! Modules through the public surface: `#[derive(Module)]` on nested
//! structs, `named_variables` paths and order (field order, depth first) for
//! every supported field type, shared variables and submodules, skipped
//! fields, names and name scopes, custom visitors, and `summary()`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracejit::module::{walk, ModulePath, Segment, Visit, Visitor};
use tracejit::prelude::*;

fn var(shape: &[usize]) -> Variable {
    let n: usize = shape.iter().product();
    Variable::new(Tensor::from_vec((0..n).map(|i| i as f32).collect(), shape))
}

#[derive(Module)]
struct Dense {
    w: Variable,
    b: Variable,
}

impl Dense {
    fn new(i: usize, o: usize) -> Dense {
        Dense { w: var(&[i, o]), b: var(&[o]) }
    }
}

#[derive(Module)]
struct Encoder {
    layers: Vec<Dense>,
}

#[derive(Module)]
struct Model {
    encoder: Encoder,
    head: Dense,
}

fn paths(m: &dyn Module) -> Vec<String> {
    m.named_variables().into_iter().map(|(p, _)| p).collect()
}

#[test]
fn nested_modules_list_variables_in_field_order_depth_first() {
    let m = Model { encoder: Encoder { layers: vec![Dense::new(4, 3), Dense::new(3, 2)] }, head: Dense::new(2, 1) };
    assert_eq!(
        paths(&m),
        [
            "encoder.layers[0].w",
            "encoder.layers[0].b",
            "encoder.layers[1].w",
            "encoder.layers[1].b",
            "head.w",
            "head.b"
        ]
    );
    let named = m.named_variables();
    assert_eq!(named[0].1, m.encoder.layers[0].w);
    assert_eq!(named[5].1, m.head.b);
    let vars = m.variables();
    assert_eq!(vars.len(), 6);
    assert_eq!(vars[4], m.head.w);
    // Deterministic: the same answer every time.
    assert_eq!(paths(&m), paths(&m));
}

#[derive(Module)]
struct Everything {
    plain: Variable,
    list: Vec<Variable>,
    pair: [Dense; 2],
    maybe: Option<Dense>,
    nothing: Option<Variable>,
    boxed: Box<Dense>,
    by_key: BTreeMap<String, Dense>,
    shared: Arc<Dense>,
    dynamic: Box<dyn Module>,
    nested: Vec<Option<Box<Variable>>>,
}

#[test]
fn every_field_type_adds_its_path_segment() {
    let mut by_key = BTreeMap::new();
    by_key.insert("zeta".to_string(), Dense::new(1, 1));
    by_key.insert("alpha".to_string(), Dense::new(1, 1));
    let m = Everything {
        plain: var(&[1]),
        list: vec![var(&[1]), var(&[2])],
        pair: [Dense::new(1, 1), Dense::new(1, 1)],
        maybe: Some(Dense::new(1, 1)),
        nothing: None,
        boxed: Box::new(Dense::new(1, 1)),
        by_key,
        shared: Arc::new(Dense::new(1, 1)),
        dynamic: Box::new(Dense::new(1, 1)),
        nested: vec![None, Some(Box::new(var(&[3])))],
    };
    assert_eq!(
        paths(&m),
        [
            "plain",
            "list[0]",
            "list[1]",
            "pair[0].w",
            "pair[0].b",
            "pair[1].w",
            "pair[1].b",
            "maybe.w",
            "maybe.b",
            "boxed.w",
            "boxed.b",
            r#"by_key["alpha"].w"#,
            r#"by_key["alpha"].b"#,
            r#"by_key["zeta"].w"#,
            r#"by_key["zeta"].b"#,
            "shared.w",
            "shared.b",
            "dynamic.w",
            "dynamic.b",
            "nested[1]",
        ]
    );
    assert_eq!(m.variables().len(), 20);
    let sub: Vec<(String, &str)> = m.named_submodules().into_iter().map(|(p, s)| (p, s.type_name())).collect();
    assert_eq!(
        sub,
        [
            ("pair[0]".to_string(), "Dense"),
            ("pair[1]".to_string(), "Dense"),
            ("maybe".to_string(), "Dense"),
            ("boxed".to_string(), "Dense"),
            (r#"by_key["alpha"]"#.to_string(), "Dense"),
            (r#"by_key["zeta"]"#.to_string(), "Dense"),
            ("shared".to_string(), "Dense"),
            ("dynamic".to_string(), "Dense"),
        ]
    );
    assert_eq!(m.submodules().len(), 8);
}

#[derive(Module)]
struct Siamese {
    left: Dense,
    right: Dense,
    tied: Variable,
    also_tied: Variable,
}

#[test]
fn a_shared_submodule_is_listed_under_both_paths_and_counted_once() {
    let d = Dense::new(2, 2);
    let t = var(&[3]);
    let m = Siamese { left: Dense { w: d.w.clone(), b: d.b.clone() }, right: d, tied: t.clone(), also_tied: t };
    assert_eq!(paths(&m), ["left.w", "left.b", "right.w", "right.b", "tied", "also_tied"]);
    let vars = m.variables();
    assert_eq!(vars.len(), 3, "each variable once");
    assert_eq!(vars, [m.left.w.clone(), m.left.b.clone(), m.tied.clone()], "at its first path");
    let s = m.summary();
    assert_eq!(s.total_parameters, 4 + 2 + 3);
    assert_eq!(s.rows[0].parameters, 9, "the root counts each variable once");
    assert_eq!(s.rows[1].parameters, 6);
    assert_eq!(s.rows[2].parameters, 6);
}

/// Not a module, not a variable: must be skipped.
#[derive(Clone, Copy)]
enum Activation {
    Relu,
}

#[derive(Module)]
struct WithSkips {
    #[module(skip)]
    act: Activation,
    #[module(skip)]
    cache: Variable,
    layer: Dense,
    #[module(skip)]
    _count: usize,
}

#[test]
fn skipped_fields_are_ignored() {
    let m = WithSkips { act: Activation::Relu, cache: var(&[5]), layer: Dense::new(1, 2), _count: 7 };
    assert!(matches!(m.act, Activation::Relu));
    assert_eq!(paths(&m), ["layer.w", "layer.b"]);
    assert!(!m.variables().contains(&m.cache));
}

#[derive(Module)]
struct Tuple(Dense, Variable);

#[derive(Module)]
struct Empty;

#[derive(Module)]
struct Generic<L> {
    layers: Vec<L>,
    #[module(skip)]
    _note: String,
}

#[test]
fn tuple_unit_and_generic_structs_derive() {
    let t = Tuple(Dense::new(1, 1), var(&[1]));
    assert_eq!(paths(&t), ["0.w", "0.b", "1"]);
    assert!(Empty.named_variables().is_empty());
    assert_eq!(Empty.summary().total_parameters, 0);
    let g = Generic { layers: vec![Dense::new(1, 1)], _note: String::new() };
    assert_eq!(paths(&g), ["layers[0].w", "layers[0].b"]);
    assert_eq!(g.type_name(), "Generic");
}

#[test]
fn trainable_variables_leave_out_frozen_ones() {
    let frozen = var(&[2]).with_trainable(false);
    let m = Dense { w: var(&[2, 2]), b: frozen };
    assert_eq!(m.trainable_variables(), std::slice::from_ref(&m.w));
    assert_eq!(m.variables().len(), 2);
    let s = m.summary();
    assert_eq!((s.total_parameters, s.trainable_parameters), (6, 4));
}

#[derive(Module)]
#[module(name = "classifier")]
struct Mlp {
    layers: Vec<Dense>,
    extra: Dense,
}

#[derive(Module)]
struct Named {
    #[module(name)]
    label: String,
    inner: Dense,
}

#[derive(Module)]
struct AutoEncoder {
    encoder: Named,
    decoder: Named,
    mlp: Mlp,
}

#[test]
fn names_default_to_snake_case_and_can_be_given() {
    let d = Dense::new(1, 1);
    assert_eq!(d.name(), "dense");
    assert_eq!(AutoEncoder::type_name_of(), "AutoEncoder");
    let m = Mlp { layers: vec![], extra: Dense::new(1, 1) };
    assert_eq!(m.name(), "classifier");
    let n = Named { label: "encoder".into(), inner: Dense::new(1, 1) };
    assert_eq!(n.name(), "encoder");
    assert_eq!(paths(&n), ["inner.w", "inner.b"], "the name field is not walked");
}

impl AutoEncoder {
    fn type_name_of() -> &'static str {
        let ae = AutoEncoder {
            encoder: Named { label: "enc".into(), inner: Dense::new(1, 1) },
            decoder: Named { label: "dec".into(), inner: Dense::new(1, 1) },
            mlp: Mlp { layers: vec![], extra: Dense::new(1, 1) },
        };
        assert_eq!(ae.name(), "auto_encoder");
        ae.type_name()
    }
}

#[derive(Module)]
struct Stack {
    layers: Vec<Dense>,
    out: Dense,
    scales: Vec<Variable>,
}

#[test]
fn assign_names_uses_name_scopes() {
    let m = Stack { layers: vec![Dense::new(2, 2), Dense::new(2, 2)], out: Dense::new(2, 1), scales: vec![var(&[1])] };
    let named = m.assign_names();
    let names: Vec<String> = m.variables().iter().map(Variable::name).collect();
    assert_eq!(
        names,
        [
            "stack/dense/w",
            "stack/dense/b",
            "stack/dense_1/w",
            "stack/dense_1/b",
            "stack/dense_2/w",
            "stack/dense_2/b",
            "stack/scales/0"
        ]
    );
    assert_eq!(named[2], ("layers[1].w".to_string(), "stack/dense_1/w".to_string()));
    // Idempotent and deterministic.
    m.assign_names();
    assert_eq!(m.layers[1].w.name(), "stack/dense_1/w");

    let mlp = Mlp { layers: vec![Dense::new(1, 1), Dense::new(1, 1)], extra: Dense::new(1, 1) };
    mlp.assign_names();
    assert_eq!(mlp.layers[1].w.name(), "classifier/dense_1/w");
    assert_eq!(mlp.extra.b.name(), "classifier/dense_2/b");

    let ae = AutoEncoder {
        encoder: Named { label: "enc".into(), inner: Dense::new(1, 1) },
        decoder: Named { label: "dec".into(), inner: Dense::new(1, 1) },
        mlp: Mlp { layers: vec![Dense::new(1, 1)], extra: Dense::new(1, 1) },
    };
    ae.assign_names();
    assert_eq!(ae.encoder.inner.w.name(), "auto_encoder/enc/dense/w");
    assert_eq!(ae.decoder.inner.w.name(), "auto_encoder/dec/dense/w");
    assert_eq!(ae.mlp.extra.w.name(), "auto_encoder/classifier/dense_1/w");
}

#[test]
fn a_shared_variable_is_named_after_its_first_path() {
    let d = Dense::new(1, 1);
    let m = Siamese { left: Dense { w: d.w.clone(), b: d.b.clone() }, right: d, tied: var(&[1]), also_tied: var(&[1]) };
    let named = m.assign_names();
    assert_eq!(named.len(), 4);
    assert_eq!(m.right.w.name(), "siamese/dense/w");
}

/// A user's own walk: a state_dict of path → shape, built from the visitor
/// callbacks alone.
#[derive(Default)]
struct StateDict<'m> {
    path: ModulePath<'m>,
    out: Vec<(String, Vec<usize>)>,
    modules: Vec<String>,
    depth: usize,
    max_depth: usize,
}

impl<'m> Visitor<'m> for StateDict<'m> {
    fn enter(&mut self, segment: Segment<'m>) {
        self.path.push(segment);
    }
    fn exit(&mut self, segment: Segment<'m>) {
        assert_eq!(self.path.pop(), Some(segment), "enter and exit match");
    }
    fn enter_module(&mut self, module: &'m dyn Module) {
        self.modules.push(format!("{}@{}", module.type_name(), self.path));
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
    }
    fn exit_module(&mut self, _module: &'m dyn Module) {
        self.depth -= 1;
    }
    fn variable(&mut self, variable: &'m Variable) {
        self.out.push((self.path.to_string(), variable.shape().to_vec()));
    }
}

#[test]
fn custom_visitors_see_paths_modules_and_variables() {
    let m = Model { encoder: Encoder { layers: vec![Dense::new(4, 3)] }, head: Dense::new(3, 1) };
    let mut sd = StateDict::default();
    walk(&m, &mut sd);
    assert_eq!(
        sd.out,
        [
            ("encoder.layers[0].w".to_string(), vec![4, 3]),
            ("encoder.layers[0].b".to_string(), vec![3]),
            ("head.w".to_string(), vec![3, 1]),
            ("head.b".to_string(), vec![1]),
        ]
    );
    assert_eq!(sd.modules, ["Model@", "Encoder@encoder", "Dense@encoder.layers[0]", "Dense@head"]);
    assert_eq!((sd.depth, sd.max_depth), (0, 3));
    assert!(sd.path.is_empty());
    // `Visit::visit` on a derived module is the same walk.
    let mut again = StateDict::default();
    m.visit(&mut again);
    assert_eq!(again.out, sd.out);
}

/// A module written by hand rather than derived.
struct Manual {
    scale: Variable,
    inner: Dense,
}

impl Module for Manual {
    fn type_name(&self) -> &'static str {
        "Manual"
    }
    fn name(&self) -> String {
        "by_hand".into()
    }
    fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        visitor.enter(Segment::Field("scale"));
        self.scale.visit(visitor);
        visitor.exit(Segment::Field("scale"));
        visitor.enter(Segment::Field("inner"));
        self.inner.visit(visitor);
        visitor.exit(Segment::Field("inner"));
    }
}

impl Visit for Manual {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor)
    }
}

#[derive(Module)]
struct HoldsManual {
    parts: Vec<Manual>,
}

#[test]
fn hand_written_modules_nest_in_derived_ones() {
    let m = HoldsManual { parts: vec![Manual { scale: var(&[1]), inner: Dense::new(1, 1) }] };
    assert_eq!(paths(&m), ["parts[0].scale", "parts[0].inner.w", "parts[0].inner.b"]);
    m.assign_names();
    assert_eq!(m.parts[0].inner.w.name(), "holds_manual/by_hand/dense/w");
}

#[test]
fn summary_lists_submodules_with_type_params_and_bytes() {
    let m = Model { encoder: Encoder { layers: vec![Dense::new(4, 3), Dense::new(3, 2)] }, head: Dense::new(2, 1) };
    let frozen = Variable::new(Tensor::zeros(&[5], DType::F64)).with_trainable(false);
    let m2 = Everything {
        plain: frozen,
        list: vec![Variable::new(Tensor::from_vec(vec![true, false], &[2]))],
        pair: [Dense::new(1, 1), Dense::new(1, 1)],
        maybe: None,
        nothing: None,
        boxed: Box::new(Dense::new(1, 1)),
        by_key: BTreeMap::new(),
        shared: Arc::new(Dense::new(1, 1)),
        dynamic: Box::new(Empty),
        nested: vec![],
    };
    let s = m.summary();
    let rows: Vec<(&str, &str, &str, usize, usize, usize)> = s
        .rows
        .iter()
        .map(|r| (r.path.as_str(), r.scope.as_str(), r.type_name, r.depth, r.parameters, r.bytes))
        .collect();
    assert_eq!(
        rows,
        [
            ("", "model", "Model", 0, 12 + 3 + 6 + 2 + 2 + 1, 4 * 26),
            ("encoder", "model/encoder", "Encoder", 1, 23, 92),
            ("encoder.layers[0]", "model/encoder/dense", "Dense", 2, 15, 60),
            ("encoder.layers[1]", "model/encoder/dense_1", "Dense", 2, 8, 32),
            ("head", "model/dense", "Dense", 1, 3, 12),
        ]
    );
    assert_eq!((s.total_parameters, s.trainable_parameters, s.total_bytes), (26, 26, 104));
    let text = s.to_string();
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 7);
    for word in ["path", "name", "type", "params", "bytes"] {
        assert!(lines[0].contains(word), "{text}");
    }
    assert!(lines[1].starts_with("(root)") && lines[1].contains("Model") && lines[1].trim_end().ends_with("104"));
    assert!(
        lines[3].contains("encoder.layers[0]") && lines[3].contains("model/encoder/dense") && lines[3].contains("15")
    );
    assert_eq!(lines[6], "total: 26 parameters (26 trainable), 104 bytes");

    // Mixed dtypes: f64 and bool bytes, frozen variables.
    let s2 = m2.summary();
    assert_eq!(s2.total_parameters, 5 + 2 + 4 * 2);
    assert_eq!(s2.trainable_parameters, 2 + 4 * 2);
    assert_eq!(s2.total_bytes, 5 * 8 + 2 + 4 * 2 * 4);
    assert!(s2.rows.iter().any(|r| r.path == "dynamic" && r.type_name == "Empty" && r.parameters == 0));
}

#[test]
fn modules_drive_compiled_functions() {
    let layer = Dense {
        w: Variable::new(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])),
        b: Variable::new(Tensor::from_vec(vec![0.5f32, -0.5], &[2])),
    };
    let w = layer.w.clone();
    let b = layer.b.clone();
    let f = function(move |x: Tensor| x.matmul(&w.read()) + b.read());
    let x = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2]);
    assert_eq!(f.call(x.clone()).unwrap().to_vec::<f32>().unwrap(), vec![4.5, 5.5]);
    for (_, v) in layer.named_variables() {
        v.assign(&Tensor::zeros(v.shape(), v.dtype()));
    }
    assert_eq!(
        f.call(x).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0],
        "the compiled function reads the variables"
    );
    assert_eq!(f.tracing_count(), 1);
}
