//! Which instruction set the CPU codecs use, chosen at run time (docs/decisions/0006).
//!
//! Every codec kernel has a scalar reference and, where it pays, a version for a wider
//! instruction set that gives the same bytes. A [`Level`] names the one to run; a level above
//! [`Level::SCALAR`] exists only where the CPU was seen to support it, so a kernel that is handed
//! one may call `#[target_feature]` code for it. [`Level::best`] is what the codecs use;
//! `KVHOARD_SIMD=scalar` in the environment makes it the scalar reference (to measure or to rule
//! the vector code out). Tests run every level [`Level::supported`] lists against the scalar one.

use std::sync::OnceLock;

/// An instruction set the kernels can run on. Only this module makes one (after detection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Level {
    kind: Kind,
}

/// What a [`Level`] is, for dispatching on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kind {
    /// Portable Rust, the reference every other kind must equal.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C (an x86-64-v3 CPU: Haswell, Zen and later).
    Avx2,
}

impl Level {
    /// The scalar reference, on every CPU.
    pub const SCALAR: Level = Level { kind: Kind::Scalar };

    /// What this level is.
    #[inline]
    pub fn kind(self) -> Kind {
        self.kind
    }

    /// Its name in test output and logs.
    pub fn name(self) -> &'static str {
        match self.kind {
            Kind::Scalar => "scalar",
            Kind::Avx2 => "avx2",
        }
    }

    /// The fastest level this CPU supports, unless `KVHOARD_SIMD=scalar` asks for the reference.
    /// Detected once.
    #[inline]
    pub fn best() -> Level {
        static BEST: OnceLock<Level> = OnceLock::new();
        *BEST.get_or_init(|| {
            if std::env::var_os("KVHOARD_SIMD").is_some_and(|v| v == "scalar") {
                return Level::SCALAR;
            }
            Level::supported().into_iter().last().unwrap_or(Level::SCALAR)
        })
    }

    /// Every level this CPU supports, the scalar reference first.
    pub fn supported() -> Vec<Level> {
        let mut levels = vec![Level::SCALAR];
        if avx2_detected() {
            levels.push(Level { kind: Kind::Avx2 });
        }
        levels
    }

    /// Every level the kernels have, supported here or not (for tests to say what they skipped).
    #[cfg(test)]
    pub fn all_names() -> &'static [&'static str] {
        &["scalar", "avx2"]
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

/// Test helpers: every supported level, with a line on stderr saying which ran and which the host
/// lacks (skipped, not passed).
#[cfg(test)]
pub(crate) mod testing {
    use super::Level;

    /// The levels to compare with the scalar reference in test `what`, announced on stderr.
    pub fn levels(what: &str) -> Vec<Level> {
        let supported = Level::supported();
        let ran: Vec<&str> = supported.iter().map(|l| l.name()).collect();
        let skipped: Vec<&str> = Level::all_names().iter().copied().filter(|n| !ran.contains(n)).collect();
        eprintln!(
            "{what}: paths exercised: {}; skipped (not on this CPU): {}",
            ran.join(", "),
            if skipped.is_empty() { "none".to_string() } else { skipped.join(", ") }
        );
        supported
    }
}
