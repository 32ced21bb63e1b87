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
//! an AMD Zen 3 without one. `native` (the default) and `avx512` allow
//! everything the CPU has.

/// The environment variable naming the instruction set a process may use:
/// `native` (default), `avx512` or `avx2` (see [`Isa::parse`]).
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

    /// The code of a CPU with AVX2 and FMA but no AVX-512 (an AMD Zen 3):
    /// [`Isa::native`] without any 512-bit or AVX-512 instruction.
    pub fn avx2() -> Isa {
        Isa::native().with_avx512(false)
    }

    /// An `Isa` by name, as [`ENV_VAR`] takes it: `native` or `avx512`
    /// (everything this CPU has), `avx2` ([`Isa::avx2`]); case-insensitive.
    ///
    /// ```
    /// use tracejit_kernels::Isa;
    ///
    /// assert_eq!(Isa::parse("AVX2"), Ok(Isa::avx2()));
    /// assert!(Isa::parse("sse9").unwrap_err().contains("native, avx512 or avx2"));
    /// ```
    pub fn parse(name: &str) -> Result<Isa, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "native" | "avx512" => Ok(Isa::native()),
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

    /// The name of the widest code this `Isa` runs on this CPU: `avx512`,
    /// `avx2` or `portable` (neither: scalar Rust and 128-bit Cranelift
    /// code).
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
            out
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vec::new()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_the_isa_they_name() {
        assert_eq!(Isa::parse("native"), Ok(Isa::native()));
        assert_eq!(Isa::parse(" AVX512 "), Ok(Isa::native()));
        assert_eq!(Isa::parse("avx2"), Ok(Isa::avx2()));
        let err = Isa::parse("avx10").unwrap_err();
        assert!(err.contains("TRACEJIT_ISA") && err.contains("\"avx10\""), "{err}");
    }

    /// An AVX2 `Isa` never lets an AVX-512 feature into a key, runs
    /// 8-lane code where the CPU has AVX2, and keeps every non-AVX-512
    /// feature of the native one.
    #[test]
    fn avx2_holds_back_every_avx512_feature() {
        let (native, avx2) = (Isa::native().features(), Isa::avx2().features());
        assert!(avx2.iter().all(|f| !f.starts_with("avx512")), "{avx2:?}");
        assert!(!avx2.is_empty() || native.is_empty());
        assert_eq!(avx2, native.iter().copied().filter(|f| !f.starts_with("avx512")).collect::<Vec<_>>());
        assert!(!Isa::avx2().has_avx512_bf16() && !Isa::avx2().has_avx512_vnni());
        if avx2.contains(&"avx2") && avx2.contains(&"fma") {
            assert_eq!((Isa::avx2().width(), Isa::avx2().name()), (Some(Width::W8), "avx2"));
        }
    }
}
