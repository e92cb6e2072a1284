//! y = x·Wᵀ for the few rows of a decode step: f32 on CPU with AVX-512 or AVX2+FMA, outside
//! autograd.
//!
//! Why not MKL: at ≤ 64 rows MKL's sgemm copies ("packs") every weight matrix on every call,
//! and a decode step reads every weight of the model once, cold from DRAM. A decode step is
//! bound by that read: SmolLM2-135M's 538 MB of f32 weights take 20 ms at the 26 GB/s a plain
//! libtorch sum reaches on 2 cores (`bench world-speed` measures both: `decode_step_matmuls`).
//!
//! Shape of the kernel (dot products, vectors along k): a tile of NR rows of W, each row read
//! contiguously, times MR rows of x accumulates NR·MR vector sums, which a tree of horizontal
//! adds turns into a block of y. The W tile is read from DRAM once (for the first block of x
//! rows) and from L1 for the others, while the next tile is prefetched, so the read streams at
//! close to the memory's rate; the first kernel here (outer products on a transposed x, W
//! broadcast element by element from NR strided rows) reached half of it. Tiles are split
//! across libtorch's OpenMP threads ([`crate::kernels::omp`]). AVX-512: 4 × 4 tiles of 16
//! lanes, the next tile prefetched during the first block. AVX2: 4 × 3 tiles of 8 lanes (12
//! sums, 3 x vectors and one W vector: the 16 registers), the next tile's prefetches spread
//! over all blocks (on Zen 2, 32 rows: 76 → 61 ms a 135M decode step; 4 × 2 tiles and
//! first-block prefetching gave the 76).
use tch::{Device, Kind, Tensor};

/// Largest row count routed here.
pub const MAX_ROWS: i64 = 64;

/// x [.., K] · w [N, K]ᵀ when the fast path applies (f32 CPU, ≤ 64 rows, AVX-512 or AVX2+FMA,
/// no gradient needed); `None` otherwise, and the caller uses libtorch.
pub fn linear(x: &Tensor, w: &Tensor) -> Option<Tensor> {
    linear_with(crate::kernels::vmath::isa(), x, w)
}

fn linear_with(isa: Isa, x: &Tensor, w: &Tensor) -> Option<Tensor> {
    if !super::f32_cpu(&[x, w]) || w.dim() != 2 {
        return None;
    }
    let k = *x.size().last()?;
    let (n, wk) = (w.size()[0], w.size()[1]);
    let m = x.numel() as i64 / k.max(1);
    if wk != k || k == 0 || n == 0 || m == 0 || m > MAX_ROWS || !w.is_contiguous() || super::needs_grad(&[x, w]) {
        return None;
    }
    if isa == Isa::Baseline {
        return None;
    }
    // Few dispatches: a decode step makes ~200 of these calls.
    let x2 = if x.is_contiguous() { x.shallow_clone() } else { x.contiguous() };
    let mut shape = x.size();
    *shape.last_mut().unwrap() = n;
    let y = Tensor::empty(shape.as_slice(), (Kind::Float, Device::Cpu));
    // SAFETY: x2 [.., k] (m rows), w [n, k] and y [.., n] are contiguous f32 CPU tensors alive
    // for the call; y is written only here, each thread on its own columns.
    unsafe {
        let xs = std::slice::from_raw_parts(x2.data_ptr() as *const f32, (m * k) as usize);
        let ws = std::slice::from_raw_parts(w.data_ptr() as *const f32, (n * k) as usize);
        let (yp, m, n, k) = (y.data_ptr() as *mut f32, m as usize, n as usize, k as usize);
        match isa {
            Isa::Avx512 => drive(xs, ws, yp, (m, n, k), 4, false, &|a| tile_avx512::<4>(a)),
            // 4 × 3 tiles keep 12 sums in flight (FMA latency 5 × 2 pipes on Zen 2); one or
            // two rows (the last samples of a batch) would compute repeated rows there.
            _ => match m {
                1 => drive(xs, ws, yp, (m, n, k), 1, true, &|a| tile_avx2::<1>(a)),
                2 | 4 => drive(xs, ws, yp, (m, n, k), 2, true, &|a| tile_avx2::<2>(a)),
                _ => drive(xs, ws, yp, (m, n, k), 3, true, &|a| tile_avx2::<3>(a)),
            },
        }
    }
    Some(y)
}

use crate::kernels::vmath::Isa;

/// One tile's work: NR rows of W from `w`, MR rows of x from `x` (both row stride k), the
/// block of y at `y` (row stride `ldy`), of which `nw` × `nx` are real (a short tile repeats
/// its last row rather than branching in the inner loop), the prefetch distance to the same
/// place in the next tile (0: none) and the slice of k (`span`) whose lines it prefetches.
struct Tile {
    w: *const f32,
    x: *const f32,
    k: usize,
    y: *mut f32,
    ldy: usize,
    nw: usize,
    nx: usize,
    prefetch: usize,
    span: (usize, usize),
}

/// W rows per tile: their four sums of one x row make one 128-bit store (`sum4`).
const NR: usize = 4;

/// y[m, n] = Σ_k x[m, k]·w[n, k]: W in tiles of NR rows split across the OpenMP team, each
/// tile against every block of `mr` x rows in turn. Caller guarantees the slice sizes and
/// `tile`'s CPU features.
unsafe fn drive(
    x: &[f32],
    w: &[f32],
    y: *mut f32,
    (m, n, k): (usize, usize, usize),
    mr: usize,
    spread: bool,
    tile: &(dyn Fn(Tile) + Sync),
) {
    let (tiles, blocks) = (n.div_ceil(NR), m.div_ceil(mr));
    let threads = (tch::get_num_threads().max(1) as usize).min(tiles);
    let y = y as usize;
    crate::kernels::omp::parallel(threads, &|t, nt| {
        let per = tiles.div_ceil(nt);
        let last = ((t + 1) * per).min(tiles);
        for i in t * per..last {
            let n0 = i * NR;
            for m0 in (0..m).step_by(mr) {
                // The next tile comes from DRAM: fetch it meanwhile, spread over this tile's
                // blocks of x rows (a slice of k each) or during the first block only.
                let next = if i + 1 < last { NR * k } else { 0 };
                let (prefetch, span) = match (spread, m0 / mr) {
                    (true, b) => (
                        next,
                        (b * k / blocks / 16 * 16, if b + 1 == blocks { k } else { (b + 1) * k / blocks / 16 * 16 }),
                    ),
                    (false, 0) => (next, (0, k)),
                    (false, _) => (0, (0, 0)),
                };
                tile(Tile {
                    w: w.as_ptr().add(n0 * k),
                    x: x.as_ptr().add(m0 * k),
                    k,
                    y: (y as *mut f32).add(m0 * n + n0),
                    ldy: n,
                    nw: NR.min(n - n0),
                    nx: mr.min(m - m0),
                    prefetch,
                    span,
                });
            }
        }
    });
}

/// AVX-512F: NR × MR sums of 16-lane products (k's tail through a masked load).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,fma")]
unsafe fn tile_avx512<const MR: usize>(t: Tile) {
    use std::arch::x86_64::*;
    let wr: [*const f32; NR] = std::array::from_fn(|r| t.w.add(r.min(t.nw - 1) * t.k));
    let xr: [*const f32; MR] = std::array::from_fn(|i| t.x.add(i.min(t.nx - 1) * t.k));
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    let full = t.k / 16 * 16;
    for kk in (0..full).step_by(16) {
        let wv: [__m512; NR] = std::array::from_fn(|r| _mm512_loadu_ps(wr[r].add(kk)));
        if t.prefetch > 0 && kk >= t.span.0 && kk < t.span.1 {
            // One cache line per W row per step (wrapping: a hint past the end never faults).
            for p in wr {
                _mm_prefetch(p.wrapping_add(kk + t.prefetch) as *const i8, _MM_HINT_T0);
            }
        }
        for i in 0..MR {
            let xv = _mm512_loadu_ps(xr[i].add(kk));
            for r in 0..NR {
                acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
    }
    if full < t.k {
        let mask = ((1u32 << (t.k - full)) - 1) as __mmask16;
        let wv: [__m512; NR] = std::array::from_fn(|r| _mm512_maskz_loadu_ps(mask, wr[r].add(full)));
        for i in 0..MR {
            let xv = _mm512_maskz_loadu_ps(mask, xr[i].add(full));
            for r in 0..NR {
                acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
    }
    // 16 lanes → 8, then the same tree as AVX2's.
    let half = |v: __m512| {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        _mm256_add_ps(_mm512_castps512_ps256(v), hi)
    };
    // A constant trip count keeps `acc` in registers (a runtime one spills it to the stack).
    for i in 0..MR {
        if i < t.nx {
            store(sum4(acc.map(|row| half(row[i]))), t.y.add(i * t.ldy), t.nw);
        }
    }
}

/// AVX2+FMA: NR × MR sums of 8-lane products (k's tail through a masked load).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MR: usize>(t: Tile) {
    use std::arch::x86_64::*;
    let wr: [*const f32; NR] = std::array::from_fn(|r| t.w.add(r.min(t.nw - 1) * t.k));
    let xr: [*const f32; MR] = std::array::from_fn(|i| t.x.add(i.min(t.nx - 1) * t.k));
    let mut acc = [[_mm256_setzero_ps(); MR]; NR];
    let mut step = |kk: usize, load: &dyn Fn(*const f32) -> __m256| {
        let xv: [__m256; MR] = std::array::from_fn(|i| load(xr[i].add(kk)));
        for r in 0..NR {
            let wv = load(wr[r].add(kk));
            for i in 0..MR {
                acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
            }
        }
    };
    let full = t.k / 8 * 8;
    for kk in (0..full).step_by(8) {
        if t.prefetch > 0 && kk % 16 == 0 && kk >= t.span.0 && kk < t.span.1 {
            for p in wr {
                _mm_prefetch(p.wrapping_add(kk + t.prefetch) as *const i8, _MM_HINT_T0);
            }
        }
        step(kk, &|p| _mm256_loadu_ps(p));
    }
    if full < t.k {
        let left = _mm256_set1_epi32((t.k - full) as i32);
        let mask = _mm256_cmpgt_epi32(left, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        step(full, &|p| _mm256_maskload_ps(p, mask));
    }
    for i in 0..MR {
        if i < t.nx {
            store(sum4(acc.map(|row| row[i])), t.y.add(i * t.ldy), t.nw);
        }
    }
}

/// The four horizontal sums of `v` as one vector [Σv₀, Σv₁, Σv₂, Σv₃]: two levels of pairwise
/// adds within 128-bit lanes, then the halves added (9 instructions for 4 sums, not 4 × 6).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum4(v: [std::arch::x86_64::__m256; 4]) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
    let q = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1))
}

/// The first `n` (≤ 4) lanes of `v` to `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store(v: std::arch::x86_64::__m128, y: *mut f32, n: usize) {
    if n == 4 {
        std::arch::x86_64::_mm_storeu_ps(y, v);
    } else {
        let mut lanes = [0f32; 4];
        std::arch::x86_64::_mm_storeu_ps(lanes.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), y, n);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_avx512<const MR: usize>(_: Tile) {
    unreachable!("small_gemm: x86-64 only")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_avx2<const MR: usize>(_: Tile) {
    unreachable!("small_gemm: x86-64 only")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &Tensor, w: &Tensor) -> Tensor {
        x.to_kind(Kind::Double).matmul(&w.to_kind(Kind::Double).tr()).to_kind(Kind::Float)
    }

    /// The kernels this CPU can run: AVX2 everywhere here, AVX-512 too on the Intel machines.
    fn kernels() -> Vec<Isa> {
        match crate::kernels::vmath::isa() {
            Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2],
            Isa::Avx2 => vec![Isa::Avx2],
            Isa::Baseline => vec![],
        }
    }

    /// Row counts around every block of x rows (whole, partial, one row), short last W tiles,
    /// K with and without a tail; for each kernel the CPU has.
    #[test]
    fn equals_matmul_for_every_shape_class() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::env::var("KNOWRL_ISA").as_deref() != Ok("baseline")
        {
            assert!(!kernels().is_empty(), "an AVX2 CPU must test a kernel");
        }
        tch::manual_seed(0);
        for isa in kernels() {
            for m in [1i64, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33, 48, 63, 64] {
                for (n, k) in [(1i64, 1i64), (7, 3), (25, 64), (100, 17), (13, 576), (6, 24)] {
                    let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
                    let w = Tensor::randn([n, k], (Kind::Float, Device::Cpu));
                    let y = linear_with(isa, &x, &w).expect("fast path applies");
                    let r = reference(&x, &w);
                    let err = (&y - &r).abs().max().double_value(&[]);
                    let scale = r.abs().max().double_value(&[]).max(1.0);
                    assert!(err <= 1e-5 * scale * (k as f64).sqrt(), "{isa:?} m={m} n={n} k={k}: max error {err}");
                }
            }
        }
        // Leading batch dimensions are kept; a strided x is read correctly.
        let x = Tensor::randn([2, 3, 40], (Kind::Float, Device::Cpu)).transpose(0, 1);
        let w = Tensor::randn([9, 40], (Kind::Float, Device::Cpu));
        let y = linear(&x, &w).unwrap();
        assert_eq!(y.size(), vec![3, 2, 9]);
        assert!(y.allclose(&x.matmul(&w.tr()), 1e-5, 1e-5, false));
    }

    /// Where autograd needs the product, or the shape is not a decode step's, libtorch runs it.
    #[test]
    fn leaves_autograd_and_large_batches_to_libtorch() {
        let w = Tensor::randn([8, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let x = Tensor::randn([4, 16], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w).is_none(), "grad mode on and w trainable");
        let x_grad = Tensor::randn([4, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        assert!(linear(&x_grad, &w.detach()).is_none(), "x needs grad");
        assert!(linear(&Tensor::randn([65, 16], (Kind::Float, Device::Cpu)), &w.detach()).is_none());
        assert!(linear(&x.to_kind(Kind::Double), &w.detach().to_kind(Kind::Double)).is_none());
        let strided = Tensor::randn([16, 8], (Kind::Float, Device::Cpu)).tr();
        assert!(linear(&x, &strided).is_none(), "non-contiguous weight");
        let under_no_grad = tch::no_grad(|| linear(&x, &w));
        assert_eq!(under_no_grad.is_some(), crate::kernels::vmath::isa() != Isa::Baseline);
    }
}
