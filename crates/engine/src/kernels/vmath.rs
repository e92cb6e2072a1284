//! Vector primitives of our CPU kernels (decode attention, RMSNorm, the sampler, AdamW, the LM
//! head), written as plain loops the compiler vectorises, and [`simd_dispatch!`]: a kernel's hot
//! loop compiled twice more, with AVX-512F+VL+FMA and with AVX2+FMA, the copy picked at run time by
//! [`isa`] (the crate is built for the x86-64 baseline, whose 128-bit vectors leave most of a
//! modern core idle). Loops keep explicit 16-lane accumulators, so every copy adds in the same
//! order and gives the same bits.

/// The widest vector extension the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F + VL + FMA: 16 f32 lanes, 32 vector registers (without VL, LLVM keeps values
    /// that start as 128/256-bit zeros in the first 16 and spills accumulators to the stack).
    Avx512,
    /// AVX2 + FMA: 8 f32 lanes (AMD EPYC machines here have no AVX-512).
    Avx2,
    /// The x86-64 baseline (SSE2), or another architecture.
    Baseline,
}

/// This CPU's [`Isa`], probed once. `KNOWRL_ISA=avx2` (or `baseline`) caps it, so the narrower
/// kernels can be tested and timed on a wider CPU (`make test` runs the engine's unit tests a
/// second time under `KNOWRL_ISA=avx2`).
#[cfg(target_arch = "x86_64")]
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let fma = std::is_x86_feature_detected!("fma");
        let found = if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl") && fma {
            Isa::Avx512
        } else if std::is_x86_feature_detected!("avx2") && fma {
            Isa::Avx2
        } else {
            Isa::Baseline
        };
        match (std::env::var("KNOWRL_ISA").as_deref(), found) {
            (Ok("baseline"), _) | (Ok("avx2"), Isa::Baseline) => Isa::Baseline,
            (Ok("avx2"), _) => Isa::Avx2,
            _ => found,
        }
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn isa() -> Isa {
    Isa::Baseline
}

/// Defines `$name`, a safe function with `$plain`'s signature that runs `$plain` compiled for
/// the CPU's [`isa`]: an AVX-512F+FMA copy, an AVX2+FMA copy, or `$plain` itself. `$plain`
/// should be `#[inline(always)]` so its loops are compiled inside each copy.
macro_rules! simd_dispatch {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $plain:ident) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $plain($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $plain($($arg),*)
                }
                match $crate::kernels::vmath::isa() {
                    // SAFETY: isa() found these features on this CPU.
                    $crate::kernels::vmath::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::kernels::vmath::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::kernels::vmath::Isa::Baseline => {}
                }
            }
            $plain($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Σ aᵢbᵢ in 16 independent lanes (one zmm register, or four xmm).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ aᵢ in 16 independent lanes.
#[inline(always)]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = a.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for x in chunks {
        for l in 0..16 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The largest element, in 16 running maxima so the loop vectorises (a `fold(f32::max)` is one
/// dependency chain). NaN-free input assumed (logits).
#[inline(always)]
pub fn max(a: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = a.chunks_exact(16);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
    for c in chunks {
        for l in 0..16 {
            m[l] = m[l].max(c[l]);
        }
    }
    m.iter().fold(tail, |x, &y| x.max(y))
}

/// e^x for x ≤ 0 in f32 (Cephes' expf: x = n·ln2 + r, |r| ≤ ln2/2, a degree-5 polynomial in
/// r, scaled by 2ⁿ through the exponent bits); within 2.5e-7 relative of the exact value on
/// [−87, 0], and 0 below, so a −∞ logit keeps probability 0. Branch-free, so loops over it
/// vectorise; `mul_add` is exactly rounded, so every build gives the same bits.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to the nearest integer
    let xc = x.max(-87.0);
    let n = xc.mul_add(std::f32::consts::LOG2_E, ROUND) - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 0.166_666_65);
    p = p.mul_add(r, 0.5);
    let e = p.mul_add(r * r, r) + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        e * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial exp against f64 over the range the kernels use.
    #[test]
    fn exp_f32_is_within_two_ulp() {
        let mut worst = 0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let exact = (x as f64).exp();
            worst = worst.max(((exp_f32(x) as f64 - exact) / exact).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(-88.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn dot_equals_the_plain_sum() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 / (i as f32 + 1.0)).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }
}
