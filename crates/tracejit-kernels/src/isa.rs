//! [`Isa`]: which vector code a kernel may run, decided by its caller.
//!
//! Kernels never read the environment or a process-wide setting: the JIT
//! builds an `Isa` from its `JitOptions` (`JitOptions::isa`) and passes it
//! down, as Cranelift passes `isa.flags()`, so an executable built with
//! `avx512: false` runs every kernel it calls at 256 bits.

/// The vector widths of the hand-written kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    /// AVX-512F, 16 f32 lanes.
    W16,
    /// AVX2 + FMA, 8 f32 lanes.
    W8,
}

/// What a kernel may use: the CPU's features, narrowed by the caller.
///
/// ```
/// use tracejit_kernels::{Isa, Width};
///
/// let isa = Isa::native();
/// // Without AVX-512 a kernel runs at most 8 lanes wide.
/// assert_ne!(isa.with_avx512(false).width(), Some(Width::W16));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    avx512: bool,
}

impl Default for Isa {
    /// [`Isa::native`].
    fn default() -> Isa {
        Isa::native()
    }
}

impl Isa {
    /// Everything this CPU has.
    pub fn native() -> Isa {
        Isa { avx512: true }
    }

    /// What the environment allows, read once per process: [`Isa::native`]
    /// unless `TRACEJIT_JIT_AVX512=0` forbids 512-bit code. For callers at
    /// the edge of the system (eager ops, the interpreter) that have no
    /// options of their own to pass down; the JIT passes its
    /// `JitOptions::isa()` instead.
    pub fn from_env() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| Isa::native().with_avx512(std::env::var("TRACEJIT_JIT_AVX512").map_or(true, |v| v != "0")))
    }

    /// Allows (or forbids) 512-bit AVX-512 code; the features themselves
    /// are still checked when a kernel runs.
    pub fn with_avx512(self, avx512: bool) -> Isa {
        Isa { avx512 }
    }

    /// Whether 512-bit code is allowed (the CPU may still lack it).
    pub fn avx512_allowed(self) -> bool {
        self.avx512
    }

    /// Whether 512-bit bf16 dot products (`vdpbf16ps`, AVX-512 BF16) may
    /// run: allowed and present.
    pub fn has_avx512_bf16(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            self.avx512 && has!("avx512f") && has!("avx512bw") && has!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Whether 512-bit int8 dot products (`vpdpbusd`, AVX-512 VNNI) may
    /// run: allowed and present.
    pub fn has_avx512_vnni(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            self.avx512 && has!("avx512f") && has!("avx512bw") && has!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The widest vector code allowed on this CPU, if any: 16 lanes with
    /// AVX-512F (when allowed), else 8 with AVX2 and FMA.
    pub fn width(self) -> Option<Width> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if self.avx512 && has!("avx512f") {
                return Some(Width::W16);
            }
            if has!("avx2") && has!("fma") {
                return Some(Width::W8);
            }
        }
        None
    }
}
