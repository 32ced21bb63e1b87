//! A kernel's own table of 16-byte vector constants, which its code reads
//! from memory ([`crate::clif_ops::Emit::kmem`]) through the relocated
//! symbol [`crate::code_image::KERNEL_CONSTS`].
//!
//! Why memory: Cranelift hoists every loop-invariant value, so a
//! polynomial's dozen splatted coefficients all compete for the 16 xmm
//! registers and the loop spills and reloads them (and shuffles registers on
//! the back edge). A coefficient loaded from the table at its use instead
//! becomes a memory operand of the instruction that uses it
//! (`vfmadd213ps (%rax), ...`): no register, no spill.
//!
//! Why per kernel: the table travels with the code ([`crate::code_image`]),
//! so a kernel compiled in one process and loaded in another finds its
//! constants at the same offsets; a process-wide table's order would depend
//! on which kernels compiled first.

use std::collections::HashMap;

use cranelift_codegen::cursor::{Cursor, FuncCursor};
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};

use crate::clif_ops::Emit;
use crate::code_image::MAX_CONSTS;

/// The patterns one kernel reads, in table order.
#[derive(Default, Debug)]
pub(crate) struct ConstTable {
    patterns: Vec<u128>,
    index: HashMap<u128, usize>,
}

impl ConstTable {
    /// The index of the entry holding `pattern`, added if new; `None` when
    /// the table is full (callers keep the constant in a register then).
    pub fn intern(&mut self, pattern: u128) -> Option<usize> {
        if let Some(&i) = self.index.get(&pattern) {
            return Some(i);
        }
        if self.patterns.len() == MAX_CONSTS {
            return None;
        }
        self.patterns.push(pattern);
        self.index.insert(pattern, self.patterns.len() - 1);
        Some(self.patterns.len() - 1)
    }

    /// The entries, in order.
    pub fn into_patterns(self) -> Vec<u128> {
        self.patterns
    }
}

impl Emit<'_, '_> {
    /// The address of the constant table, computed once in the entry block.
    fn table_base(&mut self) -> Value {
        if let Some(v) = self.consts_base {
            return v;
        }
        let gv = self.consts_symbol;
        let mut pos = FuncCursor::new(self.b.func).at_inst(self.entry_term);
        let v = pos.ins().symbol_value(types::I64, gv);
        self.consts_base = Some(v);
        v
    }

    /// A constant like [`Emit::kraw`], but a vector one is loaded from the
    /// kernel's constant table at the point of use (see
    /// [`crate::const_table`]), so that it costs no register across a loop.
    /// For the many coefficients of the math approximations.
    pub fn kmem(&mut self, ty: Type, bits: u64) -> Value {
        if !ty.is_vector() {
            return self.kraw(ty, bits);
        }
        let Some(entry) = self.table.intern(splat(ty.lane_bits(), bits)) else {
            return self.kraw(ty, bits);
        };
        let mut base = self.table_base();
        let mut flags = MemFlagsData::new().with_notrap().with_readonly().with_aligned();
        if let Some(i) = self.loop_index {
            // Inside a loop: a movable (pure) load is placed right before
            // its first use, where it folds into that instruction, but a
            // loop-invariant one would be hoisted out of the loop again. An
            // address that depends on the index (`i >> 63` is 0, the index
            // is never negative) keeps it in.
            let zero = self.b.ins().ushr_imm_s(i, 63);
            base = self.b.ins().iadd(base, zero);
            flags = flags.with_can_move();
        }
        self.b.ins().load(ty, flags, base, (entry * 16) as i32)
    }
}

/// The 128-bit splat of a lane of `lane_bits` bits holding `bits`.
pub(crate) fn splat(lane_bits: u32, bits: u64) -> u128 {
    let lane = if lane_bits >= 64 { u128::from(bits) } else { u128::from(bits & ((1u64 << lane_bits) - 1)) };
    (0..128 / lane_bits).fold(0u128, |acc, k| acc | (lane << (k * lane_bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splats_and_interns() {
        assert_eq!(splat(32, 0x3f80_0000), 0x3f80_0000_3f80_0000_3f80_0000_3f80_0000);
        assert_eq!(splat(64, 7), (7u128 << 64) | 7);
        let mut t = ConstTable::default();
        let p = splat(32, 0x1234_5678);
        assert_eq!(t.intern(p), Some(0));
        assert_eq!(t.intern(7), Some(1));
        assert_eq!(t.intern(p), Some(0));
        for k in 2..MAX_CONSTS {
            assert_eq!(t.intern(k as u128 + 100), Some(k));
        }
        assert_eq!(t.intern(1), None);
        assert_eq!(t.into_patterns().len(), MAX_CONSTS);
    }
}
