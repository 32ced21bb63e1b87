//! Axis unification for region analysis ([`crate::analysis`]): every axis
//! of a value is a unit (static size 1) or an axis class, and classes merge
//! through a union-find as broadcasting aligns operands.

/// One axis of a value during unification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ax {
    Unit,
    Class(u32),
}

pub(crate) struct UnionFind {
    pub(crate) parent: Vec<u32>,
}

impl UnionFind {
    pub(crate) fn fresh(&mut self) -> u32 {
        self.parent.push(self.parent.len() as u32);
        self.parent.len() as u32 - 1
    }
    pub(crate) fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let p = self.parent[x as usize];
            self.parent[x as usize] = self.parent[p as usize];
            x = p;
        }
        x
    }
    pub(crate) fn union(&mut self, a: u32, b: u32) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[b as usize] = a;
        }
    }
}

/// Right-aligns `axes` (rank r) to rank `rank`: position j of the result.
pub(crate) fn aligned(axes: &[Ax], rank: usize, j: usize) -> Ax {
    let off = rank - axes.len();
    if j < off {
        Ax::Unit
    } else {
        axes[j - off]
    }
}
