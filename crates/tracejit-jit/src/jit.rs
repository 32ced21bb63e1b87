//! Compiling kernels and owning their code. Cranelift compiles a kernel to
//! a relocatable [`CodeImage`] (`kernel::build`); every image, fresh or read
//! from the compile cache or an artifact, goes through the same path:
//! bytes -> parsed image -> checked -> mapped by [`crate::loader`]. A
//! [`KernelCode`] holds the mapping and the entry pointer together, unmaps
//! the code when dropped, and exposes the pointer only through an `unsafe`
//! call that the region launcher wraps in a safe API. The host ISA
//! (`opt_level = "speed"`, detected by `cranelift_native`) is built once per
//! `avx512` setting, and the codegen `Context` / `FunctionBuilderContext`
//! are reused per thread.

use std::cell::RefCell;
use std::sync::OnceLock;

use crate::analysis::Analysis;
use crate::code_image::CodeImage;
use crate::kernel::{self, Schedule};
use crate::loader::LoadedCode;
use crate::options::JitOptions;
use crate::JitError;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use cranelift_frontend::FunctionBuilderContext;

/// The host ISA as Cranelift sees it, built once per `avx512` setting:
/// without AVX-512 ([`JitOptions::avx512`] off) every `has_avx512*` flag
/// is cleared, so no EVEX encoding reaches the code and a kernel compiled
/// here runs on an AVX2 machine.
fn isa(avx512: bool) -> Result<OwnedTargetIsa, JitError> {
    static ISAS: [OnceLock<Result<OwnedTargetIsa, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    ISAS[usize::from(avx512)]
        .get_or_init(|| {
            let mut flags = settings::builder();
            flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
            flags.set("use_colocated_libcalls", "false").map_err(|e| e.to_string())?;
            flags.set("is_pic", "false").map_err(|e| e.to_string())?;
            let verify = if cfg!(debug_assertions) { "true" } else { "false" };
            flags.set("enable_verifier", verify).map_err(|e| e.to_string())?;
            let mut builder = cranelift_native::builder().map_err(|e| e.to_string())?;
            if !avx512 && cfg!(target_arch = "x86_64") {
                for flag in AVX512_FLAGS {
                    builder.set(flag, "false").map_err(|e| format!("{flag}: {e}"))?;
                }
            }
            builder.finish(settings::Flags::new(flags)).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(JitError::Host)
}

/// Cranelift's x64 flags for AVX-512 features (`cranelift-codegen`'s
/// `meta/src/isa/x86.rs`).
const AVX512_FLAGS: [&str; 6] =
    ["has_avx512bitalg", "has_avx512dq", "has_avx512vl", "has_avx512vbmi", "has_avx512f", "has_avx512vnni"];

/// Whether the host ISA this process compiles for under `opts` has any
/// AVX-512 flag on (for tests: `TRACEJIT_ISA=avx2` must leave none).
#[cfg(test)]
fn uses_avx512(opts: &JitOptions) -> Result<bool, JitError> {
    let isa = isa(opts.avx512())?;
    Ok(isa.isa_flags().iter().any(|f| AVX512_FLAGS.contains(&f.name) && f.as_bool() == Some(true)))
}

thread_local! {
    static CONTEXTS: RefCell<(Context, FunctionBuilderContext)> =
        RefCell::new((Context::new(), FunctionBuilderContext::new()));
}

/// Machine code of one kernel and the mapping that holds it.
pub(crate) struct KernelCode {
    /// The mapping `entry` points into, held for its drop; `None` for a
    /// hand-written kernel (code of the binary itself).
    _mapped: Option<LoadedCode>,
    entry: *const u8,
    /// A hand-written kernel's plan of slots (`crate::native`), passed
    /// beside the argument block; `None`: the entry takes the block alone.
    plan: Option<Box<[i64]>>,
}

// SAFETY: the code is immutable once mapped, and the kernel is a pure
// function of its argument block, so the entry pointer may be called from
// any thread concurrently; the mapping is only freed by `drop`.
unsafe impl Send for KernelCode {}
// SAFETY: see `Send`.
unsafe impl Sync for KernelCode {}

impl KernelCode {
    /// A hand-written kernel (`crate::native`): a Rust function with the
    /// generated kernels' signature and argument block, or, with a `plan`,
    /// taking the plan's values as a second argument.
    pub(crate) fn native(entry: *const u8, plan: Option<Box<[i64]>>) -> KernelCode {
        KernelCode { _mapped: None, entry, plan }
    }

    /// The code of an image in the wire format: parsed, checked against
    /// this process's symbols and mapped; the error names what is wrong.
    pub(crate) fn load(bytes: &[u8]) -> Result<KernelCode, String> {
        let image = CodeImage::from_bytes(bytes).map_err(|e| e.to_string())?;
        let mapped = crate::loader::load(&image)?;
        let entry = mapped.entry();
        Ok(KernelCode { _mapped: Some(mapped), entry, plan: None })
    }

    /// Runs the kernel on an argument block laid out as `kernel` documents.
    ///
    /// # Safety
    ///
    /// Every pointer in `args` must be valid for the rows, strides and inner
    /// extent it describes, and output buffers must not alias inputs.
    pub(crate) unsafe fn call(&self, args: &[i64]) {
        match &self.plan {
            None => {
                // SAFETY: `entry` is the address of a function with this
                // signature, mapped as long as `self._mapped` (or part of
                // the binary).
                let f: extern "C" fn(*const i64) = unsafe { std::mem::transmute(self.entry) };
                f(args.as_ptr());
            }
            Some(plan) => {
                // SAFETY: a planned kernel is a hand-written function of
                // the binary with this signature (`crate::native`).
                let f: extern "C" fn(*const i64, *const i64) = unsafe { std::mem::transmute(self.entry) };
                f(args.as_ptr(), plan.as_ptr());
            }
        }
    }
}

/// Compiles the kernel of `an` and loads it; also returns the image's
/// bytes (what the compile cache and artifacts store).
pub(crate) fn compile(an: &Analysis, sch: &Schedule, opts: &JitOptions) -> Result<(KernelCode, Vec<u8>), JitError> {
    let isa = isa(opts.avx512())?;
    let image = CONTEXTS.with(|c| {
        let mut c = c.borrow_mut();
        let (ctx, fctx) = &mut *c;
        let r = kernel::build(an, sch, opts, &*isa, ctx, fctx);
        if r.is_err() {
            ctx.clear();
        }
        r
    });
    let codegen = |message: String| JitError::Codegen { key: an.key.to_string(), message };
    let bytes = image.map_err(codegen)?.to_bytes();
    // The same path as code read from disk: parse, check, map.
    let code = KernelCode::load(&bytes).map_err(codegen)?;
    Ok((code, bytes))
}

/// What the code of a kernel compiled under `opts` depends on besides the
/// kernel's structure: Cranelift's target (triple and every ISA and shared
/// flag, which name the CPU features it may use) and the vector code the
/// options let kernels call (the chunk functions' widths). Two processes
/// with equal descriptions compile identical code.
pub(crate) fn target_description(opts: &JitOptions) -> Result<String, JitError> {
    let isa = isa(opts.avx512())?;
    let mut s = format!("{}", isa.triple());
    for f in isa.isa_flags() {
        s.push_str(&format!(" {}={}", f.name, f.value_string()));
    }
    s.push_str(" |");
    for f in isa.flags().iter() {
        s.push_str(&format!(" {}={}", f.name, f.value_string()));
    }
    s.push_str(&format!(" | kernels {:?}", opts.isa().features()));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without AVX-512 the Cranelift ISA has every AVX-512 flag off (so
    /// no EVEX encoding can reach a kernel); with it, the host's flags
    /// stand.
    #[test]
    fn an_avx2_target_clears_every_avx512_flag_of_cranelift() {
        let opts = JitOptions::default().for_target(tracejit_kernels::Target::avx2());
        assert!(!uses_avx512(&opts).unwrap());
        #[cfg(target_arch = "x86_64")]
        {
            let host = std::arch::is_x86_feature_detected!("avx512f");
            assert_eq!(uses_avx512(&JitOptions::default()).unwrap(), host);
        }
    }
}
