//! [`JitOptions`]: every knob of the code generator, read from the
//! environment once and passed down (Cranelift takes its knobs from
//! `isa.flags()` the same way), and [`KernelKey`], the kernel cache's key:
//! a kernel's structure as words, plus the options it was built with.
//!
//! Nothing below this module reads the environment, so two kernels built
//! with different options are two cache entries, and a test can ask for
//! the in-line code on a CPU that would stage (see `TRACEJIT_JIT_STAGE`).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use tracejit_ir::tensor::Storage;
use tracejit_ir::Op;
use tracejit_kernels::{Isa, Target};

/// How kernels are generated.
///
/// ```
/// use tracejit_jit::JitOptions;
///
/// // The environment's options (`TRACEJIT_JIT_*`), read once per process.
/// let opts = JitOptions::global();
/// // In-line transcendentals even where vector chunk functions exist.
/// let inline = JitOptions { stage: false, ..opts };
/// assert!(!inline.stage);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JitOptions {
    /// Vector loop unroll factor (1, 2, 4 or 8); `None` picks one per kernel
    /// (2 for kernels with in-line transcendentals, 4 otherwise).
    /// Environment: `TRACEJIT_JIT_UNROLL`.
    pub unroll: Option<u8>,
    /// Compute f32 `exp`/`tanh`/`sigmoid` of a region in vector chunk
    /// functions where the CPU has AVX2 and FMA or AVX-512F (on by default).
    /// Environment: `TRACEJIT_JIT_STAGE=0` turns it off.
    pub stage: bool,
    /// What the code runs on and with ([`Target`]): its ISA decides the
    /// code — AVX-512 (512-bit chunk functions and hand-written kernels,
    /// 16-lane `gemm` kernels, EVEX encodings in the Cranelift code) where
    /// allowed and present, else 256-bit AVX2 code, which computes the same
    /// bits but for the row softmax's sum order; bf16 products on AMX tiles
    /// where allowed, granted and present, else `vdpbf16ps`, within the
    /// same error bound — and its thread count and thresholds decide how an
    /// executable splits work (never its results). Environment:
    /// `TRACEJIT_ISA=avx2` (or `TRACEJIT_JIT_AVX512=0`) holds the process
    /// to what an AVX2 machine runs, `TRACEJIT_ISA=avx512` to what an AMD
    /// Zen 4 runs (no AMX).
    pub target: Target,
    /// Print each kernel's Cranelift IR and machine code to stderr when it
    /// is compiled. Environment: `TRACEJIT_JIT_DUMP` (any value).
    pub dump: bool,
}

impl Default for JitOptions {
    /// The built-in defaults, ignoring the environment.
    fn default() -> JitOptions {
        JitOptions { unroll: None, stage: true, target: Target::for_isa(Isa::native()), dump: false }
    }
}

impl JitOptions {
    /// The options the environment asks for (unset variables keep the
    /// defaults; an unroll factor other than 1, 2, 4 or 8 is ignored).
    pub fn from_env() -> JitOptions {
        let unroll = std::env::var("TRACEJIT_JIT_UNROLL").ok().and_then(|v| v.parse::<u8>().ok());
        JitOptions {
            unroll: unroll.filter(|u| [1, 2, 4, 8].contains(u)),
            stage: std::env::var("TRACEJIT_JIT_STAGE").map_or(true, |v| v != "0"),
            target: Target::host(),
            dump: std::env::var_os("TRACEJIT_JIT_DUMP").is_some(),
        }
    }

    /// [`JitOptions::from_env`], read once per process: what `compile_region`
    /// and `Executable::new` use.
    pub fn global() -> JitOptions {
        static OPTS: OnceLock<JitOptions> = OnceLock::new();
        *OPTS.get_or_init(JitOptions::from_env)
    }

    /// [`JitOptions::global`] for the target entered on this thread
    /// ([`Target::current`]): what code compiled now, outside any
    /// executable, is built for — a traced function's call, an artifact
    /// loaded under `Target::enter`.
    pub fn current() -> JitOptions {
        JitOptions::global().for_target(Target::current())
    }

    /// The vector code these options let kernels run (the chunk functions,
    /// the row softmax, GEMM micro-kernels, composite kernels): passed down
    /// to every kernel, which never reads a process-wide setting.
    pub fn isa(&self) -> Isa {
        self.target.isa
    }

    /// These options for `target` (its ISA, threads and thresholds).
    ///
    /// ```
    /// use tracejit_jit::{JitOptions, Target};
    ///
    /// let zen3 = JitOptions::global().for_target(Target::avx2());
    /// assert!(!zen3.avx512());
    /// ```
    pub fn for_target(self, target: Target) -> JitOptions {
        JitOptions { target, ..self }
    }

    /// Whether 512-bit AVX-512 code is allowed (the CPU may still lack it).
    pub fn avx512(&self) -> bool {
        self.target.isa.avx512_allowed()
    }

    /// The part of these options a kernel's code depends on: the thread
    /// count and thresholds only split work, so kernels compiled under
    /// options that differ in them alone are one cache entry.
    pub(crate) fn code_key(&self) -> JitOptions {
        JitOptions { target: Target::for_isa(self.target.isa), ..*self }
    }
}

/// A kernel's structure as a sequence of words (variant tags, dtypes, axis
/// positions, constants' bits; every list preceded by its length, so the
/// encoding is unambiguous), hashed once.
#[derive(Clone, Default)]
pub(crate) struct KernelKey {
    words: Vec<u64>,
}

impl KernelKey {
    /// The words, in order.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Appends one word.
    pub fn word(&mut self, w: u64) {
        self.words.push(w);
    }

    /// Appends a list: its length, then its words.
    pub fn list(&mut self, ws: impl IntoIterator<Item = u64>) {
        let at = self.words.len();
        self.words.push(0);
        self.words.extend(ws);
        self.words[at] = (self.words.len() - at - 1) as u64;
    }

    /// Appends a list of optional positions (`None` as `u64::MAX`).
    pub fn positions(&mut self, ps: &[Option<usize>]) {
        self.list(ps.iter().map(|p| p.map_or(u64::MAX, |p| p as u64)));
    }

    /// Appends the tag of an op's variant (the op table's `tag`); the
    /// lowering adds the attributes the code depends on (which unary or
    /// binary op, which reduction), and leaves out the ones it does not
    /// (shapes and axes, which the domain's positions stand for).
    pub fn op(&mut self, op: &Op) {
        self.word(op.tag());
    }

    /// Appends every element's bits, as a list.
    pub fn elements(&mut self, value: &Storage) {
        self.list(element_bits(value));
    }

    fn digest(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.words.hash(&mut h);
        h.finish()
    }
}

impl PartialEq for KernelKey {
    fn eq(&self, other: &KernelKey) -> bool {
        self.words == other.words
    }
}

impl Eq for KernelKey {}

impl Hash for KernelKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

impl fmt::Display for KernelKey {
    /// A short name for messages and dumps: `k` and the digest.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{:016x}", self.digest())
    }
}

impl fmt::Debug for KernelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({} words)", self.words.len())
    }
}

/// Every element's bits, zero-extended, in memory order.
fn element_bits(value: &Storage) -> Vec<u64> {
    match value {
        Storage::F32(a) => a.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F64(a) => a.iter().map(|x| x.to_bits()).collect(),
        Storage::I32(a) => a.iter().map(|&x| u64::from(x as u32)).collect(),
        Storage::I64(a) => a.iter().map(|&x| x as u64).collect(),
        Storage::Bool(a) => a.iter().map(|&x| u64::from(x)).collect(),
        Storage::BF16(a) => a.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::F16(a) => a.iter().map(|x| u64::from(x.to_bits())).collect(),
        Storage::I8(a) => a.iter().map(|&x| u64::from(x as u8)).collect(),
        Storage::U8(a) => a.iter().map(|&x| u64::from(x)).collect(),
        Storage::I16(a) => a.iter().map(|&x| u64::from(x as u16)).collect(),
        Storage::U16(a) => a.iter().map(|&x| u64::from(x)).collect(),
        Storage::U32(a) => a.iter().map(|&x| u64::from(x)).collect(),
        Storage::U64(a) => a.iter().copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_unambiguous() {
        let mut a = KernelKey::default();
        a.list([1]);
        a.list([]);
        let mut b = KernelKey::default();
        b.list([]);
        b.list([1]);
        assert_ne!(a, b);
        assert_ne!(a.to_string(), b.to_string());
        let mut c = KernelKey::default();
        c.positions(&[None, Some(2)]);
        let mut d = KernelKey::default();
        d.positions(&[None, Some(2)]);
        assert_eq!(c, d);
    }

    /// The target's ISA reaches the kernels' `Isa`, AMX never without
    /// AVX-512; the threads and thresholds are not part of the code's key.
    #[test]
    fn the_targets_isa_reaches_the_kernels() {
        let native = Isa::native();
        let d = JitOptions::default();
        assert_eq!(d.isa().has_amx_bf16(), native.has_amx_bf16());
        assert!(!d.for_target(Target::for_isa(native.with_amx(false))).isa().has_amx_bf16());
        assert!(d.for_target(Target::for_isa(native.with_amx(false))).isa().avx512_allowed());
        assert!(!d.for_target(Target::avx2()).isa().amx_allowed());
        let split = d.for_target(Target::for_isa(native).with_threads(3).with_split_threshold(9));
        assert_ne!(split, d);
        assert_eq!(split.code_key(), d.code_key());
        assert_ne!(d.for_target(Target::avx2()).code_key(), d.code_key());
    }

    #[test]
    fn defaults_ignore_the_environment() {
        assert_eq!(
            JitOptions::default(),
            JitOptions { unroll: None, stage: true, target: Target::for_isa(Isa::native()), dump: false }
        );
    }
}
