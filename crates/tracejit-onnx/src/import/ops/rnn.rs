//! The recurrent layers `RNN`, `GRU` and `LSTM` (opset 7 on; `layout`
//! from 14): forward, reverse or bidirectional, the spec's activation
//! functions with their alpha/beta, `clip`, GRU's `linear_before_reset`,
//! LSTM's peepholes and `input_forget`, `sequence_lens` and initial states.
//!
//! Each direction is one `fori_loop` over time (one traced body for any
//! length): the input projections `X·Wᵀ + Wb + Rb` of every step are one
//! matmul before the loop, each step adds `H·Rᵀ` and applies the gates. A
//! step past a sample's `sequence_lens` keeps its states and writes zeros
//! to `Y`, so a reverse pass starts at each sample's last valid step.

use tracejit_tensor::DType;
use tracejit_trace::{fori_loop, Tensor};

use crate::import::node::{Node, OpResult};
use crate::import::ops::elementwise::scalar_like;

/// The attributes the three read (GRU and LSTM add one each).
pub(crate) const RNN_ATTRS: &[&str] =
    &["activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout"];
/// `GRU`'s attributes.
pub(crate) const GRU_ATTRS: &[&str] = &[
    "activation_alpha",
    "activation_beta",
    "activations",
    "clip",
    "direction",
    "hidden_size",
    "layout",
    "linear_before_reset",
];
/// `LSTM`'s attributes.
pub(crate) const LSTM_ATTRS: &[&str] = &[
    "activation_alpha",
    "activation_beta",
    "activations",
    "clip",
    "direction",
    "hidden_size",
    "input_forget",
    "layout",
];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

impl Kind {
    fn of(op: &str) -> Kind {
        match op {
            "GRU" => Kind::Gru,
            "LSTM" => Kind::Lstm,
            _ => Kind::Rnn,
        }
    }
    /// Gates per hidden unit in W, R and B.
    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }
    /// The default activations of one direction.
    fn defaults(self) -> &'static [&'static str] {
        match self {
            Kind::Rnn => &["Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation function of the spec, with its alpha and beta.
#[derive(Clone)]
struct Act {
    name: String,
    alpha: Option<f64>,
    beta: Option<f64>,
}

impl Act {
    fn apply(&self, x: &Tensor) -> Tensor {
        let (a, b) = (self.alpha, self.beta);
        let s = |v: f64| scalar_like(x, v);
        match self.name.to_ascii_lowercase().as_str() {
            "sigmoid" => x.sigmoid(),
            "tanh" => x.tanh(),
            "relu" => x.relu(),
            "leakyrelu" => Tensor::select(&x.ge(0.0), x, &(x * &s(a.unwrap_or(0.01)))),
            "thresholdedrelu" => Tensor::select(&x.gt(a.unwrap_or(1.0)), x, &s(0.0)),
            "hardsigmoid" => (x * &s(a.unwrap_or(0.2)) + &s(b.unwrap_or(0.5))).clamp(0.0, 1.0),
            "elu" => Tensor::select(&x.ge(0.0), x, &(x.expm1() * &s(a.unwrap_or(1.0)))),
            "softsign" => x / &(x.abs() + &s(1.0)),
            "softplus" => x.softplus(),
            "affine" => x * &s(a.unwrap_or(1.0)) + &s(b.unwrap_or(0.0)),
            _ => (x * &s(b.unwrap_or(1.0))).tanh() * &s(a.unwrap_or(1.0)), // ScaledTanh
        }
    }
}

const KNOWN: &[&str] = &[
    "sigmoid",
    "tanh",
    "relu",
    "leakyrelu",
    "thresholdedrelu",
    "hardsigmoid",
    "elu",
    "softsign",
    "softplus",
    "affine",
    "scaledtanh",
];

/// The directions and each one's activations.
fn activations(n: &Node, kind: Kind, dirs: usize) -> Result<Vec<Vec<Act>>, String> {
    let per = kind.defaults().len();
    let names: Vec<String> = match n.attrs.get("activations") {
        Some(a) => a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect(),
        None => (0..dirs).flat_map(|_| kind.defaults().iter().map(|s| s.to_string())).collect(),
    };
    if names.len() != per * dirs {
        return Err(format!("activations lists {} functions; {} directions need {}", names.len(), dirs, per * dirs));
    }
    if let Some(bad) = names.iter().find(|a| !KNOWN.contains(&a.to_ascii_lowercase().as_str())) {
        return Err(format!("activation '{bad}' is not one of the spec's"));
    }
    let alphas = n.attr_floats("activation_alpha")?.unwrap_or_default();
    let betas = n.attr_floats("activation_beta")?.unwrap_or_default();
    // alpha/beta are listed for the activations that take them, in order.
    let (mut ai, mut bi) = (0, 0);
    let mut acts = Vec::with_capacity(names.len());
    for name in names {
        let l = name.to_ascii_lowercase();
        let takes_alpha =
            matches!(l.as_str(), "leakyrelu" | "thresholdedrelu" | "hardsigmoid" | "elu" | "affine" | "scaledtanh");
        let takes_beta = matches!(l.as_str(), "hardsigmoid" | "affine" | "scaledtanh");
        let alpha = takes_alpha.then(|| alphas.get(ai).map(|&v| v as f64)).flatten();
        let beta = takes_beta.then(|| betas.get(bi).map(|&v| v as f64)).flatten();
        ai += usize::from(takes_alpha && alpha.is_some());
        bi += usize::from(takes_beta && beta.is_some());
        acts.push(Act { name, alpha, beta });
    }
    Ok(acts.chunks(per).map(<[Act]>::to_vec).collect())
}

/// The import-time check of the attribute values.
pub(crate) fn check(n: &Node) -> Result<(), String> {
    let dirs = directions(n)?;
    activations(n, Kind::of(n.op_type), dirs.len())?;
    if n.attr_i("hidden_size", 0)? <= 0 {
        return Err("hidden_size must be given and positive".into());
    }
    match n.attr_i("layout", 0)? {
        0 | 1 => Ok(()),
        l => Err(format!("layout {l} is not 0 or 1")),
    }
}

/// `false` forward, `true` reverse, per direction.
fn directions(n: &Node) -> Result<Vec<bool>, String> {
    match n.attr_s("direction", "forward")?.as_str() {
        "forward" => Ok(vec![false]),
        "reverse" => Ok(vec![true]),
        "bidirectional" => Ok(vec![false, true]),
        d => Err(format!("direction '{d}' is not forward, reverse or bidirectional")),
    }
}

/// One direction's weights and settings.
struct Cell<'a> {
    kind: Kind,
    hidden: usize,
    /// `[gates·H, H]`, transposed for `H·Rᵀ`.
    rt: Tensor,
    /// LSTM's peepholes `[3, 1, H]` (i, o, f).
    peep: Option<Tensor>,
    /// GRU's recurrence bias of the h gate, kept apart under linear_before_reset.
    rbh: Option<Tensor>,
    acts: &'a [Act],
    clip: Option<f64>,
    lbr: bool,
    input_forget: bool,
}

impl Cell<'_> {
    fn clip(&self, x: Tensor) -> Tensor {
        match self.clip {
            Some(c) => x.clamp(-c, c),
            None => x,
        }
    }

    /// Gate `g` of `[B, gates·H]`.
    fn gate(&self, x: &Tensor, g: usize) -> Tensor {
        x.slice_axis(-1, (g * self.hidden) as i64, ((g + 1) * self.hidden) as i64)
    }

    /// One step: `(h, c)` from the step's input projection `xw` `[B, gates·H]`.
    fn step(&self, xw: &Tensor, h: &Tensor, c: &Tensor) -> (Tensor, Tensor) {
        let hr = h.matmul(&self.rt);
        let (f, g) = (&self.acts[0], self.acts.get(1));
        match self.kind {
            Kind::Rnn => (f.apply(&self.clip(xw + &hr)), c.clone()),
            Kind::Gru => {
                let g = g.expect("GRU has two activations");
                let z = f.apply(&self.clip(&self.gate(xw, 0) + &self.gate(&hr, 0)));
                let r = f.apply(&self.clip(&self.gate(xw, 1) + &self.gate(&hr, 1)));
                let hh = if self.lbr {
                    let rh = &self.gate(&hr, 2) + self.rbh.as_ref().expect("kept apart");
                    g.apply(&self.clip(&self.gate(xw, 2) + &(&r * &rh)))
                } else {
                    let rt_h = self.rt.slice_axis(-1, (2 * self.hidden) as i64, (3 * self.hidden) as i64);
                    g.apply(&self.clip(&self.gate(xw, 2) + &(&r * h).matmul(&rt_h)))
                };
                let one = scalar_like(&z, 1.0);
                (&(&(&one - &z) * &hh) + &(&z * h), c.clone())
            }
            Kind::Lstm => {
                let (g, hf) = (g.expect("LSTM has three activations"), &self.acts[2]);
                let all = xw + &hr;
                let peep = |k: i64, state: &Tensor| match &self.peep {
                    Some(p) => p.slice_axis(0, k, k + 1).squeeze(&[0]) * state,
                    None => Tensor::zeros_like(state),
                };
                let i = f.apply(&self.clip(&self.gate(&all, 0) + &peep(0, c)));
                let fg = if self.input_forget {
                    &scalar_like(&i, 1.0) - &i
                } else {
                    f.apply(&self.clip(&self.gate(&all, 2) + &peep(2, c)))
                };
                let cc = g.apply(&self.clip(self.gate(&all, 3)));
                let c_new = &(&fg * c) + &(&i * &cc);
                let o = f.apply(&self.clip(&self.gate(&all, 1) + &peep(1, &c_new)));
                (&o * &hf.apply(&c_new), c_new)
            }
        }
    }
}

/// `RNN`, `GRU` and `LSTM`: `(Y, Y_h[, Y_c])`.
pub(crate) fn recurrent(n: &mut Node) -> OpResult {
    let kind = Kind::of(n.op_type);
    let dirs = directions(n)?;
    let acts = activations(n, kind, dirs.len())?;
    let hidden = n.attr_i("hidden_size", 0)? as usize;
    let batch_first = n.attr_i("layout", 0)? == 1;
    let (x, w, r) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = x.dtype();
    // [T, B, I] (the layout's other order transposed).
    let x = if batch_first { x.transpose(&[1, 0, 2]) } else { x.clone() };
    let (d, gh) = (dirs.len(), kind.gates() * hidden);
    let xs = x.shape().to_vec();
    if xs.len() != 3 || w.shape() != [d, gh, xs[2]] || r.shape() != [d, gh, hidden] {
        return Err(format!(
            "X {:?}, W {:?} and R {:?} do not fit {d} direction(s) of {} gates of {hidden}",
            n.input(0)?.shape(),
            w.shape(),
            r.shape(),
            kind.gates()
        ));
    }
    let (t_len, b) = (xs[0], xs[1]);
    let state = |i: usize, what: &str| -> Result<Tensor, String> {
        match n.opt_input(i) {
            None => Ok(Tensor::zeros(&[d, b, hidden], dtype)),
            Some(s) => {
                let s = if batch_first { s.transpose(&[1, 0, 2]) } else { s.clone() };
                if s.shape() != [d, b, hidden] {
                    return Err(format!("{what} {:?} must be [{d}, {b}, {hidden}] (in layout 0)", s.shape()));
                }
                Ok(s)
            }
        }
    };
    let (h0, c0) = (state(5, "initial_h")?, state(6, "initial_c")?);
    let lens = match n.opt_input(4) {
        None => None,
        Some(l) if l.dtype().is_int() && l.shape() == [b] => Some(l.cast(DType::I64).reshape(&[b as i64, 1])),
        Some(l) => return Err(format!("sequence_lens {} {:?} must be integers of shape [{b}]", l.dtype(), l.shape())),
    };
    let clip = n.has_attr("clip").then(|| n.attr_f("clip", 0.0)).transpose()?.map(f64::from);
    let lbr = kind == Kind::Gru && n.attr_i("linear_before_reset", 0)? != 0;
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &reverse) in dirs.iter().enumerate() {
        let at = |t: &Tensor| t.slice_axis(0, k as i64, k as i64 + 1).squeeze(&[0]);
        let (wk, rk) = (at(w), at(r));
        // Biases: [Wb, Rb] of gates·H each; GRU under linear_before_reset keeps Rb_h apart.
        let bias = n.opt_input(3).map(at);
        let (mut bsum, mut rbh) = (None, None);
        if let Some(bv) = &bias {
            if bv.shape() != [2 * gh] {
                return Err(format!("B {:?} must be [{d}, {}]", n.input(3)?.shape(), 2 * gh));
            }
            let (wb, rb) = (bv.slice_axis(0, 0, gh as i64), bv.slice_axis(0, gh as i64, 2 * gh as i64));
            if lbr {
                let zero_h = Tensor::zeros(&[hidden], dtype);
                let rb_zr = Tensor::concat(&[rb.slice_axis(0, 0, 2 * hidden as i64), zero_h], 0);
                rbh = Some(rb.slice_axis(0, 2 * hidden as i64, 3 * hidden as i64));
                bsum = Some(&wb + &rb_zr);
            } else {
                bsum = Some(&wb + &rb);
            }
        }
        if lbr && rbh.is_none() {
            rbh = Some(Tensor::zeros(&[hidden], dtype));
        }
        let peep = match (kind, n.opt_input(7)) {
            (Kind::Lstm, Some(p)) => Some(at(p).reshape(&[3, 1, hidden as i64])),
            _ => None,
        };
        let cell = Cell {
            kind,
            hidden,
            rt: rk.t(),
            peep,
            rbh,
            acts: &acts[k],
            clip,
            lbr,
            input_forget: kind == Kind::Lstm && n.attr_i("input_forget", 0)? != 0,
        };
        // Every step's input projection at once: [T, B, gates·H].
        let mut xw = x.matmul(&wk.t());
        if let Some(bs) = &bsum {
            xw = &xw + bs;
        }
        let y0 = Tensor::zeros(&[t_len, b, hidden], dtype);
        let init = (at(&h0), at(&c0), y0);
        let (h, c, y) = fori_loop(
            0,
            t_len as i64,
            |i, (h, c, y): (Tensor, Tensor, Tensor)| {
                let t = if reverse { &scalar_like(&i, (t_len - 1) as f64) - &i } else { i };
                let starts = t.reshape(&[1]) * Tensor::from_vec(vec![1i64, 0, 0], &[3]);
                let xt = xw.dynamic_slice(&starts, &[1, b, gh]).squeeze(&[0]);
                let (h_new, c_new) = cell.step(&xt, &h, &c);
                let (h_new, c_new, out) = match &lens {
                    Some(l) => {
                        let valid = t.lt(l);
                        let zero = Tensor::zeros(&[], dtype);
                        (
                            Tensor::select(&valid, &h_new, &h),
                            Tensor::select(&valid, &c_new, &c),
                            Tensor::select(&valid, &h_new, &zero),
                        )
                    }
                    None => (h_new.clone(), c_new, h_new),
                };
                (h_new, c_new, y.dynamic_update_slice(&out.expand_dims(0), &starts))
            },
            init,
        );
        ys.push(y);
        hs.push(h);
        cs.push(c);
    }
    // Y [T, D, B, H], Y_h / Y_c [D, B, H]; layout 1: [B, T, D, H] and [B, D, H].
    let y = Tensor::stack(&ys, 1);
    let (yh, yc) = (Tensor::stack(&hs, 0), Tensor::stack(&cs, 0));
    let mut outs = if batch_first { vec![y.transpose(&[2, 0, 1, 3]), yh.transpose(&[1, 0, 2])] } else { vec![y, yh] };
    if kind == Kind::Lstm {
        outs.push(if batch_first { yc.transpose(&[1, 0, 2]) } else { yc });
    }
    Ok(outs)
}
