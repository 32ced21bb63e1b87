//! [`Isa`]: which vector code a kernel may run, decided by its caller.
//!
//! Kernels never read the environment or a process-wide setting: the JIT
//! builds an `Isa` from its `JitOptions` (`JitOptions::isa`) and passes it
//! down, as Cranelift passes `isa.flags()`, so an executable built with
//! `avx512: false` runs every kernel it calls at 256 bits.
//!
//! `TRACEJIT_ISA=avx2` ([`ENV_VAR`]) holds a whole process to the code an
//! AVX2 machine runs (no AVX-512 of any kind: no 512-bit kernels, no
//! AVX-512 BF16 or VNNI products, no EVEX encodings in the JIT's Cranelift
//! code), so a developer on an AVX-512 CPU tests and measures the paths of
//! an AMD Zen 3 without one. `native` (the default) allows everything the
//! CPU has; `avx512` everything but AMX (the tile products of an Intel
//! Sapphire Rapids or later), the code an AMD Zen 4 runs.
//!
//! AMX is used only where the CPU has it (CPUID) *and* Linux granted the
//! process the tiles' register state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`,
//! asked once per process, see `amx`): without that grant the first tile
//! instruction would kill the process.

/// The environment variable naming the instruction set a process may use:
/// `native` (default), `avx512` (no AMX) or `avx2` (see [`Isa::parse`]).
pub const ENV_VAR: &str = "TRACEJIT_ISA";

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
/// // Without AVX-512 a kernel runs at most 8 lanes wide, and never AMX.
/// assert_ne!(isa.with_avx512(false).width(), Some(Width::W16));
/// assert!(!isa.with_avx512(false).has_amx_bf16());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    avx512: bool,
    /// AMX tile products; only with `avx512` (every AMX CPU has AVX-512,
    /// and the AMX kernels use it for their edges).
    amx: bool,
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
        Isa { avx512: true, amx: true }
    }

    /// The code of a CPU with AVX2 and FMA but no AVX-512 (an AMD Zen 3):
    /// [`Isa::native`] without any 512-bit or AVX-512 instruction.
    pub fn avx2() -> Isa {
        Isa::native().with_avx512(false)
    }

    /// An `Isa` by name, as [`ENV_VAR`] takes it: `native` (everything
    /// this CPU has), `avx512` (everything but AMX: what an AMD Zen 4
    /// runs), `avx2` ([`Isa::avx2`]); case-insensitive.
    ///
    /// ```
    /// use tracejit_kernels::Isa;
    ///
    /// assert_eq!(Isa::parse("AVX2"), Ok(Isa::avx2()));
    /// assert_eq!(Isa::parse("avx512"), Ok(Isa::native().with_amx(false)));
    /// assert!(!Isa::parse("avx512").unwrap().has_amx_bf16());
    /// assert!(Isa::parse("sse9").unwrap_err().contains("native, avx512 or avx2"));
    /// ```
    pub fn parse(name: &str) -> Result<Isa, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Isa::native()),
            "avx512" => Ok(Isa::native().with_amx(false)),
            "avx2" => Ok(Isa::avx2()),
            other => {
                Err(format!("{ENV_VAR}={other:?} is not an instruction set tracejit knows: use native, avx512 or avx2"))
            }
        }
    }

    /// What the environment allows, read once per process: [`ENV_VAR`]
    /// (`TRACEJIT_ISA=avx2`), else `TRACEJIT_JIT_AVX512=0` (the older
    /// spelling of `avx2`), else [`Isa::native`]. An unknown name is
    /// reported once (a `log` warning) and ignored. For callers at the
    /// edge of the system (eager ops, the interpreter) that have no
    /// options of their own to pass down; the JIT passes its
    /// `JitOptions::isa()` instead.
    pub fn from_env() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            if let Ok(name) = std::env::var(ENV_VAR) {
                match Isa::parse(&name) {
                    Ok(isa) => return isa,
                    Err(e) => log::warn!("tracejit: {e}; using the CPU's own"),
                }
            }
            Isa::native().with_avx512(std::env::var("TRACEJIT_JIT_AVX512").map_or(true, |v| v != "0"))
        })
    }

    /// The ISA of the [`crate::Target`] entered on this thread (a traced
    /// function's call enters its own), else [`Isa::from_env`]: what code
    /// at the edge of the system (eager ops, the interpreter, composite
    /// kernels called from either) runs when no caller passed one down.
    pub fn current() -> Isa {
        crate::Target::entered().map_or_else(Isa::from_env, |t| t.isa)
    }

    /// The name of the widest code this `Isa` runs on this CPU: `avx512`,
    /// `avx2` or `portable` (neither: scalar Rust and 128-bit Cranelift
    /// code). AMX, where allowed and present, is in [`Isa::features`].
    pub fn name(self) -> &'static str {
        match self.width() {
            Some(Width::W16) => "avx512",
            Some(Width::W8) => "avx2",
            None => "portable",
        }
    }

    /// The CPU features code built under this `Isa` may use on this CPU,
    /// by their `is_x86_feature_detected!` names, in a fixed order: what
    /// a compiled kernel's or an artifact's key records, so code built for
    /// features a host lacks is never taken for the host's.
    pub fn features(self) -> Vec<&'static str> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let mut out = Vec::new();
            for (name, present) in [
                ("sse4.1", has!("sse4.1")),
                ("sse4.2", has!("sse4.2")),
                ("popcnt", has!("popcnt")),
                ("avx", has!("avx")),
                ("avx2", has!("avx2")),
                ("fma", has!("fma")),
                ("bmi1", has!("bmi1")),
                ("bmi2", has!("bmi2")),
                ("lzcnt", has!("lzcnt")),
                ("f16c", has!("f16c")),
            ] {
                if present {
                    out.push(name);
                }
            }
            if self.avx512 {
                for (name, present) in [
                    ("avx512f", has!("avx512f")),
                    ("avx512bw", has!("avx512bw")),
                    ("avx512dq", has!("avx512dq")),
                    ("avx512vl", has!("avx512vl")),
                    ("avx512vbmi", has!("avx512vbmi")),
                    ("avx512bitalg", has!("avx512bitalg")),
                    ("avx512bf16", has!("avx512bf16")),
                    ("avx512vnni", has!("avx512vnni")),
                ] {
                    if present {
                        out.push(name);
                    }
                }
            }
            if self.amx && self.avx512 && amx::granted() {
                let cpu = amx::cpu();
                for (name, present) in [("amx-bf16", cpu.bf16), ("amx-tile", cpu.tile), ("amx-int8", cpu.int8)] {
                    if present {
                        out.push(name);
                    }
                }
            }
            out
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vec::new()
    }

    /// Allows (or forbids) 512-bit AVX-512 code; the features themselves
    /// are still checked when a kernel runs. Forbidding it forbids AMX too;
    /// allowing it leaves AMX as it was.
    pub fn with_avx512(self, avx512: bool) -> Isa {
        Isa { avx512, amx: self.amx && avx512 }
    }

    /// Allows (or forbids) AMX tile products (bf16 and int8 matrix
    /// products on Intel Sapphire Rapids and later); they need AVX-512
    /// allowed too, so allowing AMX in an `Isa` without AVX-512 changes
    /// nothing. The CPU and the OS are still asked when a kernel runs.
    ///
    /// ```
    /// use tracejit_kernels::Isa;
    ///
    /// assert!(!Isa::native().with_amx(false).has_amx_bf16());
    /// assert_eq!(Isa::avx2().with_amx(true), Isa::avx2());
    /// ```
    pub fn with_amx(self, amx: bool) -> Isa {
        Isa { avx512: self.avx512, amx: amx && self.avx512 }
    }

    /// Whether 512-bit code is allowed (the CPU may still lack it).
    pub fn avx512_allowed(self) -> bool {
        self.avx512
    }

    /// Whether AMX is allowed (the CPU or the OS may still refuse it).
    pub fn amx_allowed(self) -> bool {
        self.amx
    }

    /// Whether AMX bf16 tile products (`tdpbf16ps`) may run: allowed, the
    /// CPU has AMX-TILE and AMX-BF16 (and the AVX-512 the kernels use at
    /// the edges), and Linux granted this process the tile state.
    pub fn has_amx_bf16(self) -> bool {
        self.amx && self.has_avx512_bf16() && {
            let cpu = amx::cpu();
            cpu.tile && cpu.bf16 && amx::granted()
        }
    }

    /// Whether AMX int8 tile products (`tdpbusd`) may run: as
    /// [`Isa::has_amx_bf16`], with AMX-INT8 (and AVX-512 VNNI).
    pub fn has_amx_int8(self) -> bool {
        self.amx && self.has_avx512_vnni() && {
            let cpu = amx::cpu();
            cpu.tile && cpu.int8 && amx::granted()
        }
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

/// AMX detection: the CPU's bits (CPUID; `is_x86_feature_detected!`
/// knows AMX only on nightly Rust) and the OS's grant of the tile data.
mod amx {
    use std::sync::OnceLock;

    /// The CPU's AMX features.
    #[derive(Clone, Copy, Default)]
    pub(super) struct Cpu {
        pub bf16: bool,
        pub tile: bool,
        pub int8: bool,
    }

    /// CPUID leaf 7, sub-leaf 0, EDX bits 22 (AMX-BF16), 24 (AMX-TILE)
    /// and 25 (AMX-INT8), read once.
    pub(super) fn cpu() -> Cpu {
        static CPU: OnceLock<Cpu> = OnceLock::new();
        *CPU.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{__cpuid, __cpuid_count};
                // Leaf 7 exists only when leaf 0 says so.
                if __cpuid(0).eax >= 7 {
                    let edx = __cpuid_count(7, 0).edx;
                    let bit = |b: u32| edx >> b & 1 == 1;
                    return Cpu { bf16: bit(22), tile: bit(24), int8: bit(25) };
                }
            }
            Cpu::default()
        })
    }

    /// Whether the OS lets this process use the tile registers' data,
    /// asked once per process (the grant is the whole process's, for every
    /// thread). Linux enables the tiles' 8 KiB of register state per
    /// process on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
    /// XFEATURE_XTILEDATA)`, Linux 5.16 and later); without it a tile
    /// load raises SIGILL. A refusal (an older kernel, a signal stack too
    /// small for the larger state) means no AMX, logged once. Other
    /// systems: no AMX.
    pub(super) fn granted() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| {
            let cpu = cpu();
            if !cpu.tile {
                return false;
            }
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            {
                const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
                const XFEATURE_XTILEDATA: libc::c_long = 18;
                // SAFETY: a request about this process's own state, with
                // no pointer arguments.
                let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
                if rc == 0 {
                    return true;
                }
                let err = std::io::Error::last_os_error();
                log::debug!("tracejit: the CPU has AMX but Linux refused its tile state ({err}); not using AMX");
                false
            }
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            false
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_the_isa_they_name() {
        assert_eq!(Isa::parse("native"), Ok(Isa::native()));
        assert_eq!(Isa::parse(" AVX512 "), Ok(Isa::native().with_amx(false)));
        assert!(Isa::parse("avx512").unwrap().avx512_allowed() && !Isa::parse("avx512").unwrap().amx_allowed());
        assert_eq!(Isa::parse("avx2"), Ok(Isa::avx2()));
        let err = Isa::parse("avx10").unwrap_err();
        assert!(err.contains("TRACEJIT_ISA") && err.contains("\"avx10\""), "{err}");
    }

    /// An AVX2 `Isa` never lets an AVX-512 or AMX feature into a key, runs
    /// 8-lane code where the CPU has AVX2, and keeps every non-AVX-512
    /// feature of the native one.
    #[test]
    fn avx2_holds_back_every_avx512_feature() {
        let (native, avx2) = (Isa::native().features(), Isa::avx2().features());
        assert!(avx2.iter().all(|f| !f.starts_with("avx512")), "{avx2:?}");
        assert!(!avx2.is_empty() || native.is_empty());
        let kept = native.iter().copied().filter(|f| !f.starts_with("avx512") && !f.starts_with("amx"));
        assert_eq!(avx2, kept.collect::<Vec<_>>());
        assert!(!Isa::avx2().has_avx512_bf16() && !Isa::avx2().has_avx512_vnni());
        assert!(!Isa::avx2().has_amx_bf16() && !Isa::avx2().has_amx_int8() && !Isa::avx2().amx_allowed());
        if avx2.contains(&"avx2") && avx2.contains(&"fma") {
            assert_eq!((Isa::avx2().width(), Isa::avx2().name()), (Some(Width::W8), "avx2"));
        }
    }

    /// AVX-512 without AMX (a Zen 4's code) keeps every AVX-512 feature
    /// and no AMX one; the native `Isa` reports AMX exactly where the CPU
    /// has it and the OS granted it.
    #[test]
    fn avx512_without_amx_keeps_the_rest() {
        let (native, no_amx) = (Isa::native().features(), Isa::native().with_amx(false).features());
        assert!(no_amx.iter().all(|f| !f.starts_with("amx")), "{no_amx:?}");
        assert_eq!(no_amx, native.iter().copied().filter(|f| !f.starts_with("amx")).collect::<Vec<_>>());
        let cpu = amx::cpu();
        let present = cpu.tile && cpu.bf16 && amx::granted() && Isa::native().has_avx512_bf16();
        assert_eq!(Isa::native().has_amx_bf16(), present);
        assert_eq!(native.contains(&"amx-bf16"), cpu.bf16 && cpu.tile && amx::granted());
        assert!(!Isa::native().with_amx(false).has_amx_bf16() && !Isa::native().with_amx(false).has_amx_int8());
        // Forbidding AVX-512 forbids AMX; allowing it again does not bring AMX back.
        assert!(!Isa::native().with_avx512(false).with_avx512(true).amx_allowed());
        assert_eq!(Isa::native().with_avx512(false).with_avx512(true), Isa::native().with_amx(false));
    }
}
