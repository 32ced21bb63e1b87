//! Ownership of generated code. Cranelift frees JIT code only a whole
//! `JITModule` at a time, so every compiled kernel owns its own module: a
//! [`KernelCode`] holds the module and the entry pointer together, frees the
//! module's memory when dropped, and exposes the pointer only through an
//! `unsafe` call that the region launcher wraps in a safe API. The host ISA
//! (`opt_level = "speed"`, detected by `cranelift_native`) is built once, and
//! the codegen `Context` / `FunctionBuilderContext` are reused per thread.

use std::cell::RefCell;
use std::sync::OnceLock;

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;

use crate::analysis::Analysis;
use crate::helpers::Helper;
use crate::kernel::{self, Schedule};
use crate::options::JitOptions;
use crate::JitError;

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
    let isa = isa(opts.avx512)?;
    Ok(isa.isa_flags().iter().any(|f| AVX512_FLAGS.contains(&f.name) && f.as_bool() == Some(true)))
}

thread_local! {
    static CONTEXTS: RefCell<(Context, FunctionBuilderContext)> =
        RefCell::new((Context::new(), FunctionBuilderContext::new()));
}

/// Machine code of one kernel and the module that owns it.
pub(crate) struct KernelCode {
    module: Option<JITModule>,
    entry: *const u8,
}

// SAFETY: after `finalize_definitions` the module is never used again except
// to free it in `drop` (which has exclusive access); the code it owns is
// immutable and the kernel is a pure function of its argument block, so the
// entry pointer may be called from any thread concurrently.
unsafe impl Send for KernelCode {}
// SAFETY: see `Send`.
unsafe impl Sync for KernelCode {}

impl KernelCode {
    /// A hand-written kernel (`crate::native`): a Rust function with the
    /// generated kernels' signature and argument block.
    pub(crate) fn native(entry: *const u8) -> KernelCode {
        KernelCode { module: None, entry }
    }

    /// Runs the kernel on an argument block laid out as `kernel` documents.
    ///
    /// # Safety
    ///
    /// Every pointer in `args` must be valid for the rows, strides and inner
    /// extent it describes, and output buffers must not alias inputs.
    pub(crate) unsafe fn call(&self, args: &[i64]) {
        // SAFETY: `entry` is the finalized address of a function with this
        // signature, alive as long as `self.module`.
        let f: extern "C" fn(*const i64) = unsafe { std::mem::transmute(self.entry) };
        f(args.as_ptr());
    }
}

impl Drop for KernelCode {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the only pointer into this module is `self.entry`, which
            // dies with `self`.
            unsafe { m.free_memory() };
        }
    }
}

/// Compiles the kernel of `an` into a fresh module.
pub(crate) fn compile(an: &Analysis, sch: &Schedule, opts: &JitOptions) -> Result<KernelCode, JitError> {
    let mut jb = JITBuilder::with_isa(isa(opts.avx512)?, cranelift_module::default_libcall_names());
    for h in Helper::ALL {
        jb.symbol(h.name(), h.address());
    }
    for (name, address) in crate::chunks::symbols() {
        jb.symbol(name, address);
    }
    let mut module = JITModule::new(jb);
    let id = CONTEXTS.with(|c| {
        let mut c = c.borrow_mut();
        let (ctx, fctx) = &mut *c;
        let r = kernel::build(an, sch, opts, &mut module, ctx, fctx, "kernel");
        if r.is_err() {
            module.clear_context(ctx);
        }
        r
    });
    let id = id.map_err(|message| JitError::Codegen { key: an.key.to_string(), message })?;
    module.finalize_definitions().map_err(|e| JitError::Codegen { key: an.key.to_string(), message: e.to_string() })?;
    let entry = module.get_finalized_function(id);
    Ok(KernelCode { module: Some(module), entry })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without AVX-512 the Cranelift ISA has every AVX-512 flag off (so
    /// no EVEX encoding can reach a kernel); with it, the host's flags
    /// stand.
    #[test]
    fn an_avx2_target_clears_every_avx512_flag_of_cranelift() {
        let opts = JitOptions { avx512: false, ..JitOptions::default() };
        assert!(!uses_avx512(&opts).unwrap());
        #[cfg(target_arch = "x86_64")]
        {
            let host = std::arch::is_x86_feature_detected!("avx512f");
            assert_eq!(uses_avx512(&JitOptions::default()).unwrap(), host);
        }
    }
}
