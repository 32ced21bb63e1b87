//! Compiled code as relocatable data. A kernel's machine code leaves
//! Cranelift as a [`CodeImage`]: the bytes of the function, the 16-byte
//! vector constants it reads (its own table, addressed through the symbol
//! [`KERNEL_CONSTS`]), and the places where an absolute 8-byte address of a
//! symbol goes, named by the symbol, never by an address of the process that
//! compiled it. So the same image can be written to the compile cache or an
//! artifact and loaded by another process.
//!
//! Every image is [`check`](CodeImage::check)ed against the symbol table of
//! this process before [`crate::loader`] maps it: the relocation kind, its
//! offset within the code, that relocations do not overlap, and that every
//! symbol is one tracejit exports to generated code ([`Symbols`]); anything
//! else is refused. Fresh compiles take the same path (image -> bytes ->
//! parsed image -> check -> load), so the whole test suite runs it.
//!
//! Checks catch corruption and mismatched builds, not an attacker: a cache
//! directory or an artifact is native code and deserves the trust of the
//! binary that runs it.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::helpers::Helper;
use crate::wire::{Reader, WireError, Writer};

/// The symbol generated code reads its vector constants through: the
/// loader resolves it to this image's own constant table.
pub(crate) const KERNEL_CONSTS: &str = "tj_kernel_consts";

/// Most vector constants one kernel's table holds (the math library needs
/// under a hundred; past this, constants stay in registers).
pub(crate) const MAX_CONSTS: usize = 1024;

/// The largest code an image may hold; Cranelift's kernels are a few KiB
/// to a few hundred.
const MAX_CODE: usize = 64 << 20;

/// The one relocation kind generated code uses (`is_pic = false`: an
/// absolute 8-byte address, `movabs` on x86-64, a literal on AArch64).
const KIND_ABS8: u8 = 1;

/// Where the address of `symbol` goes: 8 bytes at `offset` of the code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CodeReloc {
    /// Byte offset into the code.
    pub offset: u32,
    /// The symbol's name ([`Symbols`], or [`KERNEL_CONSTS`]).
    pub symbol: String,
}

/// One kernel's machine code with its constants and relocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CodeImage {
    /// The function's bytes; its entry is offset 0.
    pub code: Vec<u8>,
    /// The alignment the code's constant islands ask of its start.
    pub align: u32,
    /// The kernel's vector constant table, 16 bytes an entry.
    pub consts: Vec<u128>,
    /// Sorted by offset.
    pub relocs: Vec<CodeReloc>,
}

impl CodeImage {
    /// The image in the wire format (see `docs/artifact-format.md`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.align);
        w.bytes(&self.code);
        w.u64(self.consts.len() as u64);
        for c in &self.consts {
            w.raw(&c.to_le_bytes());
        }
        w.u64(self.relocs.len() as u64);
        for r in &self.relocs {
            w.u8(KIND_ABS8);
            w.u32(r.offset);
            w.i64(0);
            w.str(&r.symbol);
        }
        w.finish()
    }

    /// Reads an image written by [`CodeImage::to_bytes`]; structure only
    /// ([`CodeImage::check`] checks it against this process).
    pub fn from_bytes(bytes: &[u8]) -> Result<CodeImage, WireError> {
        let mut r = Reader::new(bytes);
        let align = r.u32("code alignment")?;
        let code = r.bytes("kernel code")?.to_vec();
        let n = r.count(16, "constant count")?;
        let mut consts = Vec::with_capacity(n);
        for _ in 0..n {
            let mut b = [0u8; 16];
            b.copy_from_slice(r.take(16, "constant")?);
            consts.push(u128::from_le_bytes(b));
        }
        let n = r.count(21, "relocation count")?;
        let mut relocs = Vec::with_capacity(n);
        for i in 0..n {
            let kind = r.u8("relocation kind")?;
            if kind != KIND_ABS8 {
                return Err(r.error(&format!("relocation {i}"), format!("unknown kind {kind}")));
            }
            let offset = r.u32("relocation offset")?;
            let addend = r.i64("relocation addend")?;
            if addend != 0 {
                return Err(r.error(&format!("relocation {i}"), format!("addend {addend}, expected 0")));
            }
            let symbol = r.str("relocation symbol")?.to_string();
            relocs.push(CodeReloc { offset, symbol });
        }
        r.finish("code image")?;
        Ok(CodeImage { code, align, consts, relocs })
    }

    /// Checks the image against this process: sizes, alignment, and each
    /// relocation's offset (inside the code, sorted, not overlapping
    /// another) and symbol (one [`Symbols`] knows, or the constant table
    /// when there is one). The error names what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.code.is_empty() || self.code.len() > MAX_CODE {
            return Err(format!("code of {} bytes (expected 1 to {MAX_CODE})", self.code.len()));
        }
        if !self.align.is_power_of_two() || self.align > 4096 {
            return Err(format!("code alignment {} (expected a power of two up to 4096)", self.align));
        }
        if self.consts.len() > MAX_CONSTS {
            return Err(format!("{} vector constants (at most {MAX_CONSTS})", self.consts.len()));
        }
        let symbols = Symbols::get();
        let mut end = 0usize;
        for (i, r) in self.relocs.iter().enumerate() {
            let at = r.offset as usize;
            if at < end {
                return Err(format!("relocation {i} at offset {at} overlaps the one before (ends at {end})"));
            }
            end = at + 8;
            if end > self.code.len() {
                return Err(format!("relocation {i} at offset {at} runs past the code's {} bytes", self.code.len()));
            }
            let known =
                if r.symbol == KERNEL_CONSTS { !self.consts.is_empty() } else { symbols.address(&r.symbol).is_some() };
            if !known {
                return Err(format!("relocation {i} names the unknown symbol `{}`", r.symbol));
            }
        }
        Ok(())
    }
}

/// The functions generated code may call, by name: the element helpers,
/// the chunk functions this CPU has, and Cranelift's library calls (a CPU
/// without SSE4.1 or FMA rounds and fuses through them).
pub(crate) struct Symbols {
    by_name: HashMap<&'static str, usize>,
}

impl Symbols {
    /// The table of this process (built once).
    pub fn get() -> &'static Symbols {
        static TABLE: OnceLock<Symbols> = OnceLock::new();
        TABLE.get_or_init(|| {
            let mut by_name = HashMap::new();
            for h in Helper::ALL {
                by_name.insert(h.name(), h.address() as usize);
            }
            for (name, address) in crate::chunks::symbols() {
                by_name.insert(name, address as usize);
            }
            for (name, address) in libcalls::table() {
                by_name.insert(name, address);
            }
            Symbols { by_name }
        })
    }

    /// The address of `name` in this process.
    pub fn address(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// Cranelift's library calls that kernels may need, as Rust functions with
/// the C ABI; named as Cranelift prints them (`CeilF32`).
pub(crate) mod libcalls {
    extern "C" fn ceil_f32(x: f32) -> f32 {
        x.ceil()
    }
    extern "C" fn ceil_f64(x: f64) -> f64 {
        x.ceil()
    }
    extern "C" fn floor_f32(x: f32) -> f32 {
        x.floor()
    }
    extern "C" fn floor_f64(x: f64) -> f64 {
        x.floor()
    }
    extern "C" fn trunc_f32(x: f32) -> f32 {
        x.trunc()
    }
    extern "C" fn trunc_f64(x: f64) -> f64 {
        x.trunc()
    }
    extern "C" fn nearest_f32(x: f32) -> f32 {
        x.round_ties_even()
    }
    extern "C" fn nearest_f64(x: f64) -> f64 {
        x.round_ties_even()
    }
    extern "C" fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    extern "C" fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }

    /// (Cranelift's name, address).
    pub(super) fn table() -> [(&'static str, usize); 10] {
        [
            ("CeilF32", ceil_f32 as *const () as usize),
            ("CeilF64", ceil_f64 as *const () as usize),
            ("FloorF32", floor_f32 as *const () as usize),
            ("FloorF64", floor_f64 as *const () as usize),
            ("TruncF32", trunc_f32 as *const () as usize),
            ("TruncF64", trunc_f64 as *const () as usize),
            ("NearestF32", nearest_f32 as *const () as usize),
            ("NearestF64", nearest_f64 as *const () as usize),
            ("FmaF32", fma_f32 as *const () as usize),
            ("FmaF64", fma_f64 as *const () as usize),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> CodeImage {
        CodeImage {
            code: vec![0x90; 32],
            align: 16,
            consts: vec![7, 1 << 100],
            relocs: vec![
                CodeReloc { offset: 2, symbol: Helper::UnaryF32.name().to_string() },
                CodeReloc { offset: 12, symbol: KERNEL_CONSTS.to_string() },
            ],
        }
    }

    #[test]
    fn images_round_trip_through_bytes() {
        let im = image();
        im.check().unwrap();
        assert_eq!(CodeImage::from_bytes(&im.to_bytes()).unwrap(), im);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = image().to_bytes();
        for cut in 0..bytes.len() {
            assert!(CodeImage::from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(CodeImage::from_bytes(&longer).unwrap_err().to_string().contains("unexpected bytes"));
    }

    #[test]
    fn bad_relocations_are_refused_by_name() {
        let mut im = image();
        im.relocs[1].symbol = "system".into();
        assert_eq!(im.check().unwrap_err(), "relocation 1 names the unknown symbol `system`");
        let mut im = image();
        im.relocs[1].offset = 28;
        assert!(im.check().unwrap_err().contains("runs past the code's 32 bytes"));
        let mut im = image();
        im.relocs[1].offset = 5;
        assert!(im.check().unwrap_err().contains("overlaps"));
        let mut im = image();
        im.consts.clear();
        assert!(im.check().unwrap_err().contains("`tj_kernel_consts`"));
        let mut bytes = image().to_bytes();
        let kind_at = bytes.len() - (1 + 4 + 8 + 8 + KERNEL_CONSTS.len());
        bytes[kind_at] = 2;
        assert!(CodeImage::from_bytes(&bytes).unwrap_err().to_string().contains("unknown kind 2"));
    }
}
