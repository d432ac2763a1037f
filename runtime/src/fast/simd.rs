//! The same loop compiled for the widest vectors the CPU has.
//!
//! The crate is compiled for the x86-64 baseline (SSE2: four `f32` or two
//! `f64` per vector). A loop wrapped in [`widest!`] is compiled three times
//! (baseline, AVX2, AVX-512) and each call runs the widest the CPU
//! supports ([`Isa::detect`]). Rust never contracts `a * b + c` into a fused
//! multiply-add, and every variant performs the same IEEE operations in the
//! same order per element, so all three compute the same bits; only the
//! speed differs (`tests/kernels/fast_cpu.rs` checks the bits at every
//! level the CPU has).

/// A vector instruction set a [`widest!`] function runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64).
    Base,
    /// AVX2 (x86-64).
    Avx2,
    /// AVX-512 F and DQ (x86-64).
    Avx512,
}

impl Isa {
    /// The widest set this CPU has (the standard library caches the CPU's
    /// answer, so this is a load and a test).
    #[inline]
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Base
    }

    /// Every set this CPU has, narrowest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Base, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detect()).collect()
    }
}

/// `widest!(pub(crate) fn name = body(a: A, b: B) -> R);` defines
/// `fn name(isa: Isa, a: A, b: B) -> R`, which runs `body` (an
/// `#[inline(always)]` function) compiled for `isa`, or for the baseline
/// where `isa` is wider than the CPU's ([`Isa::detect`]).
macro_rules! widest {
    ($(#[$m:meta])* $vis:vis fn $name:ident = $body:ident ($($a:ident : $t:ty),* $(,)?) -> $r:ty) => {
        $(#[$m])*
        $vis fn $name(isa: $crate::fast::simd::Isa, $($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::fast::simd::Isa;
                #[target_feature(enable = "avx512f,avx512dq")]
                fn avx512($($a: $t),*) -> $r {
                    $body($($a),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($a: $t),*) -> $r {
                    $body($($a),*)
                }
                match isa.min(Isa::detect()) {
                    // SAFETY: the CPU has the features each is compiled for.
                    Isa::Avx512 => return unsafe { avx512($($a),*) },
                    Isa::Avx2 => return unsafe { avx2($($a),*) },
                    Isa::Base => {}
                }
            }
            let _ = isa;
            $body($($a),*)
        }
    };
}
pub(crate) use widest;
