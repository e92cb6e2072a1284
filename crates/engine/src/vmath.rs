//! Vector primitives of our CPU kernels (decode attention, RMSNorm, the sampler), written as
//! plain loops the compiler vectorises, plus [`avx512`]: the kernels compile their hot loops a
//! second time with AVX-512 enabled and pick that copy at run time (the crate is built for the
//! x86-64 baseline, whose 128-bit vectors leave most of a modern core idle).

/// True when the CPU has AVX-512F and FMA (checked once).
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma"))
}

#[cfg(not(target_arch = "x86_64"))]
pub fn avx512() -> bool {
    false
}

/// Defines `$twin`: `$plain` compiled with AVX-512F and FMA enabled (the plain function again
/// off x86-64). Callers pick it when [`avx512`] is true; `$plain` should be `#[inline(always)]`
/// so its loops are compiled inside the twin.
macro_rules! avx512_twin {
    ($(#[$doc:meta])* fn $twin:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $plain:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,fma")]
        unsafe fn $twin($($arg: $ty),*) $(-> $ret)? {
            $plain($($arg),*)
        }
        $(#[$doc])*
        #[cfg(not(target_arch = "x86_64"))]
        unsafe fn $twin($($arg: $ty),*) $(-> $ret)? {
            $plain($($arg),*)
        }
    };
}
pub(crate) use avx512_twin;

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
