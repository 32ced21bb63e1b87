//! `Einsum` (opset 12): the equation parsed into labels per axis (`...`
//! as labels of its own, aligned from the right and broadcast as numpy
//! broadcasts; the implicit output is the ellipsis, then the letters
//! that occur once, in alphabetical order), then lowered onto tensor ops:
//! a repeated label within one operand takes the diagonal (a select and a
//! sum, so off-diagonal NaN or Inf cannot leak into it), labels no other
//! operand or the output needs are summed out first, and operands are
//! contracted left to right, each pair as one batched `matmul` (shared
//! labels still needed later are the batch, the others the contraction).

use std::collections::HashMap;

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{Node, OpResult};

/// A label: a letter's code, or `ELLIPSIS + k` for the k-th ellipsis axis
/// counted from the left of the widest ellipsis.
type Label = u32;
const ELLIPSIS: Label = 1000;

/// An operand with the label of each axis.
struct Operand {
    t: Tensor,
    labels: Vec<Label>,
}

impl Operand {
    fn size(&self, l: Label) -> usize {
        self.labels.iter().position(|&x| x == l).map_or(1, |a| self.t.shape()[a])
    }
}

/// The import-time check: the equation is given, and holds only letters,
/// `...`, `,`, `->` and spaces.
pub(crate) fn check(n: &Node) -> Result<(), String> {
    if !n.has_attr("equation") {
        return Err("the attribute 'equation' is required".into());
    }
    let eq = n.attr_s("equation", "")?;
    match eq.chars().find(|c| !(c.is_ascii_alphabetic() || " .,->".contains(*c))) {
        Some(c) => Err(format!("equation '{eq}' has '{c}'")),
        None => Ok(()),
    }
}

/// `Einsum`.
pub(crate) fn einsum(n: &mut Node) -> OpResult {
    let eq = n.attr_s("equation", "")?;
    let inputs: Vec<Tensor> = (0..n.inputs.len()).map(|i| n.input(i).cloned()).collect::<Result<_, _>>()?;
    if inputs.is_empty() {
        return Err("Einsum needs at least one input".into());
    }
    let ranks: Vec<usize> = inputs.iter().map(Tensor::rank).collect();
    let (terms, output) = parse(&eq, &ranks)?;
    let mut ops = Vec::with_capacity(inputs.len());
    for (t, labels) in inputs.into_iter().zip(terms) {
        ops.push(diagonals(Operand { t, labels })?);
    }
    check_sizes(&ops)?;
    // Contract left to right; before each step, sum out what nothing later needs.
    let mut rest = ops.into_iter();
    let mut acc = rest.next().ok_or("Einsum needs at least one input")?;
    let others: Vec<Operand> = rest.collect();
    for (i, b) in others.iter().enumerate() {
        let mut keep: Vec<Label> = output.clone();
        keep.extend(others[i..].iter().flat_map(|o| o.labels.iter().copied()));
        acc = sum_out(acc, &keep);
        let mut keep_b = output.clone();
        keep_b.extend(acc.labels.iter().copied());
        keep_b.extend(others[i + 1..].iter().flat_map(|o| o.labels.iter().copied()));
        let b = sum_out(Operand { t: b.t.clone(), labels: b.labels.clone() }, &keep_b);
        let mut later = output.clone();
        later.extend(others[i + 1..].iter().flat_map(|o| o.labels.iter().copied()));
        acc = contract(acc, b, &later);
    }
    let acc = sum_out(acc, &output);
    let perm: Vec<i64> = output
        .iter()
        .map(|l| acc.labels.iter().position(|x| x == l).map(|a| a as i64))
        .collect::<Option<_>>()
        .ok_or("an output label is in no input")?;
    let y = if perm.iter().enumerate().all(|(i, &a)| a == i as i64) { acc.t } else { acc.t.transpose(&perm) };
    Ok(vec![y])
}

/// One term's labels: letters, and `...` standing for `ell` axes (the
/// last `ell` of the widest ellipsis `max_ell`).
fn term_labels(term: &str, ell: Option<(usize, usize)>, what: &str) -> Result<Vec<Label>, String> {
    let (before, after) = match term.split_once("...") {
        Some((b, a)) => (b, Some(a)),
        None => (term, None),
    };
    let letters = |s: &str| -> Result<Vec<Label>, String> {
        s.chars()
            .map(|c| if c.is_ascii_alphabetic() { Ok(c as Label) } else { Err(format!("{what} '{term}' has '{c}'")) })
            .collect()
    };
    let mut labels = letters(before)?;
    if let Some(after) = after {
        let (ell, max_ell) = ell.unwrap_or((0, 0));
        labels.extend((max_ell - ell..max_ell).map(|k| ELLIPSIS + k as Label));
        labels.extend(letters(after)?);
    }
    Ok(labels)
}

/// The labels of each input and of the output.
fn parse(eq: &str, ranks: &[usize]) -> Result<(Vec<Vec<Label>>, Vec<Label>), String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!("equation '{eq}' has {} input terms for {} inputs", terms.len(), ranks.len()));
    }
    // Each term's ellipsis width: its rank minus its letters.
    let mut ells = Vec::with_capacity(terms.len());
    for (i, (term, &rank)) in terms.iter().zip(ranks).enumerate() {
        let dots = term.matches("...").count();
        let letters = term.chars().filter(|c| *c != '.').count();
        if dots > 1 || term.replace("...", "").contains('.') {
            return Err(format!("input term {i} '{term}' has a '.' outside one '...'"));
        }
        if letters > rank || (dots == 0 && letters != rank) {
            return Err(format!("input term {i} '{term}' does not fit input {i} of rank {rank}"));
        }
        ells.push(if dots == 1 { Some(rank - letters) } else { None });
    }
    let max_ell = ells.iter().flatten().copied().max().unwrap_or(0);
    let terms: Vec<Vec<Label>> = terms
        .iter()
        .zip(&ells)
        .enumerate()
        .map(|(i, (t, e))| term_labels(t, e.map(|e| (e, max_ell)), &format!("input term {i}")))
        .collect::<Result<_, _>>()?;
    let output = match rhs {
        Some(r) => {
            let out = term_labels(r, Some((max_ell, max_ell)), "the output term")?;
            for (i, l) in out.iter().enumerate() {
                if out[..i].contains(l) || !terms.iter().any(|t| t.contains(l)) {
                    return Err(format!("output term '{r}' repeats a label or names one no input has"));
                }
            }
            out
        }
        None => {
            // numpy's implicit output: the ellipsis, then the letters that
            // occur once, alphabetically.
            let mut count: HashMap<Label, usize> = HashMap::new();
            terms.iter().flatten().for_each(|&l| *count.entry(l).or_default() += 1);
            let mut out: Vec<Label> = (0..max_ell as Label).map(|k| ELLIPSIS + k).collect();
            let mut once: Vec<Label> =
                count.iter().filter(|&(&l, &c)| l < ELLIPSIS && c == 1).map(|(&l, _)| l).collect();
            once.sort_unstable();
            out.extend(once);
            out
        }
    };
    Ok((terms, output))
}

/// A label repeated within the operand takes the diagonal of its axes.
fn diagonals(mut op: Operand) -> Result<Operand, String> {
    while let Some((a, b)) = repeated(&op.labels) {
        let s = op.t.shape();
        if s[a] != s[b] {
            return Err(format!("a repeated label spans axes of sizes {} and {}", s[a], s[b]));
        }
        let len = s[a];
        let mut ia = vec![1i64; s.len()];
        ia[a] = len as i64;
        let mut ib = vec![1i64; s.len()];
        ib[b] = len as i64;
        let i = Tensor::arange(0.0, len as f64, 1.0, DType::I64);
        let eye = i.reshape(&ia).eq(i.reshape(&ib));
        let zero = Tensor::zeros(&[], op.t.dtype());
        op.t = Tensor::select(&eye, &op.t, &zero).sum(&[b as i64], false);
        op.labels.remove(b);
    }
    Ok(op)
}

fn repeated(labels: &[Label]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|b| labels[..b].iter().position(|&l| l == labels[b]).map(|a| (a, b)))
}

/// A label's sizes across operands agree or are 1 (broadcast).
fn check_sizes(ops: &[Operand]) -> Result<(), String> {
    let mut sizes: HashMap<Label, usize> = HashMap::new();
    for op in ops {
        for (&l, &d) in op.labels.iter().zip(op.t.shape()) {
            let s = sizes.entry(l).or_insert(d);
            if *s != d && *s != 1 && d != 1 {
                return Err(format!("a label spans axes of sizes {s} and {d}"));
            }
            *s = (*s).max(d);
        }
    }
    Ok(())
}

/// Sums the axes whose labels are not in `keep`.
fn sum_out(op: Operand, keep: &[Label]) -> Operand {
    let axes: Vec<i64> = (0..op.labels.len()).filter(|&a| !keep.contains(&op.labels[a])).map(|a| a as i64).collect();
    if axes.is_empty() {
        return op;
    }
    let labels = op.labels.iter().copied().filter(|l| keep.contains(l)).collect();
    Operand { t: op.t.sum(&axes, false), labels }
}

/// `a` and `b` contracted as one batched matmul: shared labels in `later`
/// (the output or a later operand) are the batch, other shared labels are
/// summed; each side's own labels stay.
fn contract(a: Operand, b: Operand, later: &[Label]) -> Operand {
    let shared: Vec<Label> = a.labels.iter().copied().filter(|l| b.labels.contains(l)).collect();
    let batch: Vec<Label> = shared.iter().copied().filter(|l| later.contains(l)).collect();
    let summed: Vec<Label> = shared.iter().copied().filter(|l| !later.contains(l)).collect();
    let a_own: Vec<Label> = a.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let b_own: Vec<Label> = b.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let k: usize = summed.iter().map(|&l| a.size(l).max(b.size(l))).product();
    let m: usize = a_own.iter().map(|&l| a.size(l)).product();
    let nn: usize = b_own.iter().map(|&l| b.size(l)).product();
    // Summed labels of size 1 on one side are broadcast to the other's.
    let arrange = |op: &Operand, order: Vec<Label>, tail: [usize; 2]| -> Tensor {
        let perm: Vec<i64> = order.iter().map(|l| op.labels.iter().position(|x| x == l).unwrap_or(0) as i64).collect();
        let t = op.t.transpose(&perm);
        let full: Vec<usize> =
            order.iter().map(|&l| if summed.contains(&l) { a.size(l).max(b.size(l)) } else { op.size(l) }).collect();
        let t = if full.as_slice() != t.shape() { t.broadcast_to(&full) } else { t };
        let mut shape: Vec<i64> = batch.iter().map(|&l| op.size(l) as i64).collect();
        shape.extend(tail.map(|d| d as i64));
        t.reshape(&shape)
    };
    let at = arrange(&a, [&batch[..], &a_own, &summed].concat(), [m, k]);
    let bt = arrange(&b, [&batch[..], &summed, &b_own].concat(), [k, nn]);
    let c = at.matmul(&bt);
    let mut shape: Vec<i64> = batch.iter().map(|&l| a.size(l).max(b.size(l)) as i64).collect();
    shape.extend(a_own.iter().map(|&l| a.size(l) as i64));
    shape.extend(b_own.iter().map(|&l| b.size(l) as i64));
    Operand { t: c.reshape(&shape), labels: [batch, a_own, b_own].concat() }
}
