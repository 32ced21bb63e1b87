//! [`Effects`]: what an op does besides computing its outputs (reads or
//! writes a resource, draws random numbers), which every pass consults
//! before it folds, merges, moves or drops a node.

/// What an op does besides computing its outputs: a set of effect kinds.
/// Effects of nested code (subgraphs, callees) are the union of theirs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Effects {
    reads: bool,
    writes: bool,
    random: bool,
}

impl Effects {
    /// No effect: the op may be folded, merged with an identical one,
    /// reordered or dropped when unused.
    pub const PURE: Effects = Effects { reads: false, writes: false, random: false };
    /// Reads a resource (a variable): ordered after earlier writes of it.
    pub const READS: Effects = Effects { reads: true, writes: false, random: false };
    /// Writes a resource: kept even when nothing reads its outputs.
    pub const WRITES: Effects = Effects { reads: false, writes: true, random: false };
    /// Draws random numbers: two such ops differ even with equal inputs.
    pub const RANDOM: Effects = Effects { reads: false, writes: false, random: true };

    /// Both sets of effects.
    pub fn union(self, other: Effects) -> Effects {
        Effects {
            reads: self.reads || other.reads,
            writes: self.writes || other.writes,
            random: self.random || other.random,
        }
    }

    /// True when there is no effect at all.
    pub fn is_pure(self) -> bool {
        self == Effects::PURE
    }

    /// True when a resource is read.
    pub fn reads(self) -> bool {
        self.reads
    }

    /// True when a resource is written.
    pub fn writes(self) -> bool {
        self.writes
    }

    /// True when random numbers are drawn.
    pub fn is_random(self) -> bool {
        self.random
    }
}
