//! y = x·Wᵀ for the few rows of a decode step: f32 on CPU with AVX-512 or AVX2+FMA, outside
//! autograd.
//!
//! Why not MKL: at ≤ 64 rows MKL's sgemm copies ("packs") every weight matrix on every call,
//! and a decode step reads every weight of the model once, cold from DRAM. In `perf`, packing
//! was 25% of generation time and the kernel itself 32%. This kernel reads W once, in place,
//! row by row, and keeps xᵀ in cache: for SmolLM2-135M at 32 rows the matmuls of one decode
//! step take ~66 ms instead of ~95 ms (bench/results/grpo.json has the end-to-end effect).
//!
//! Shape of the kernel (the classic outer-product micro-kernel, transposed): a tile of NR rows
//! of W times xᵀ [K, 16·MV] accumulates C[NR, 16·MV] in 24 zmm registers; each k broadcasts one
//! weight per W row and multiplies it into MV vectors of x. Tiles are split across libtorch's
//! OpenMP threads ([`crate::kernels::omp`]). The AVX2 copy is the same kernel on 8-lane ymm vectors with
//! 12 accumulators (16 registers), over groups of ≤ 32 rows.
use tch::{Device, Kind, Tensor};

/// Largest row count routed here (4 vectors of 16 rows).
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
            Isa::Avx512 => gemm(xs, ws, yp, m, n, k),
            _ => {
                // Groups of ≤ 32 rows: 4 ymm vectors of x per group.
                for g in 0..m.div_ceil(32) {
                    let rows = 32.min(m - 32 * g);
                    gemm_avx2(&xs[32 * g * k..(32 * g + rows) * k], ws, yp.add(32 * g * n), rows, n, k);
                }
            }
        }
    }
    Some(y)
}

use crate::kernels::vmath::Isa;

/// A tile: (vectors of x rows MV, w at the tile's first row, k, xᵀ, y at the tile's first
/// column, m, ldy, rows in the tile).
type Tile<'a> = &'a (dyn Fn(usize, *const f32, usize, *const f32, *mut f32, usize, usize, usize) + Sync);

/// y[m, n] = Σ_k x[m, k]·w[n, k], for both kernels: xᵀ zero-padded to whole vectors of
/// `lanes` rows, W cut into tiles of `accs / MV` rows (`accs` accumulator registers), tiles
/// split across the OpenMP team. Caller guarantees the slice sizes and `tile`'s features.
unsafe fn drive(
    x: &[f32],
    w: &[f32],
    y: *mut f32,
    (m, n, k): (usize, usize, usize),
    lanes: usize,
    accs: usize,
    tile: Tile,
) {
    let mv = m.div_ceil(lanes);
    let mp = lanes * mv;
    let mut xt = vec![0f32; k * mp];
    for (i, row) in x.chunks_exact(k).enumerate() {
        for (kk, &v) in row.iter().enumerate() {
            xt[kk * mp + i] = v;
        }
    }
    let nr = accs / mv;
    let tiles = n.div_ceil(nr);
    let threads = (tch::get_num_threads().max(1) as usize).min(tiles);
    let (xt, y) = (xt.as_slice(), y as usize);
    crate::kernels::omp::parallel(threads, &|t, nt| {
        let per = tiles.div_ceil(nt);
        for i in t * per..((t + 1) * per).min(tiles) {
            let n0 = i * nr;
            tile(mv, w.as_ptr().add(n0 * k), k, xt.as_ptr(), (y as *mut f32).add(n0), m, n, nr.min(n - n0));
        }
    });
}

/// AVX-512F: 16-lane vectors, 24 accumulators, ≤ 64 rows.
#[cfg(target_arch = "x86_64")]
unsafe fn gemm(x: &[f32], w: &[f32], y: *mut f32, m: usize, n: usize, k: usize) {
    drive(x, w, y, (m, n, k), 16, 24, &|mv, wp, k, xt, yp, m, ldy, rows| unsafe {
        match mv {
            1 => tile_kernel::<1, 24>(wp, k, xt, yp, m, ldy, rows),
            2 => tile_kernel::<2, 12>(wp, k, xt, yp, m, ldy, rows),
            3 => tile_kernel::<3, 8>(wp, k, xt, yp, m, ldy, rows),
            _ => tile_kernel::<4, 6>(wp, k, xt, yp, m, ldy, rows),
        }
    });
}

/// AVX2+FMA: 8-lane vectors, 12 accumulators (of 16 ymm registers), ≤ 32 rows.
#[cfg(target_arch = "x86_64")]
unsafe fn gemm_avx2(x: &[f32], w: &[f32], y: *mut f32, m: usize, n: usize, k: usize) {
    drive(x, w, y, (m, n, k), 8, 12, &|mv, wp, k, xt, yp, m, ldy, rows| unsafe {
        match mv {
            1 => tile_kernel_avx2::<1, 12>(wp, k, xt, yp, m, ldy, rows),
            2 => tile_kernel_avx2::<2, 6>(wp, k, xt, yp, m, ldy, rows),
            3 => tile_kernel_avx2::<3, 4>(wp, k, xt, yp, m, ldy, rows),
            _ => tile_kernel_avx2::<4, 3>(wp, k, xt, yp, m, ldy, rows),
        }
    });
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn gemm(_: &[f32], _: &[f32], _: *mut f32, _: usize, _: usize, _: usize) {
    unreachable!("small_gemm: x86-64 only")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn gemm_avx2(_: &[f32], _: &[f32], _: *mut f32, _: usize, _: usize, _: usize) {
    unreachable!("small_gemm: x86-64 only")
}

/// [`tile_kernel`] on 8-lane ymm vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_kernel_avx2<const MV: usize, const NR: usize>(
    w: *const f32,
    k: usize,
    xt: *const f32,
    y: *mut f32,
    m: usize,
    ldy: usize,
    rows: usize,
) {
    use std::arch::x86_64::*;
    let mp = 8 * MV;
    let mut acc = [[_mm256_setzero_ps(); MV]; NR];
    let wr: [*const f32; NR] = std::array::from_fn(|r| w.add(r.min(rows - 1) * k));
    for kk in 0..k {
        let xv: [__m256; MV] = std::array::from_fn(|j| _mm256_loadu_ps(xt.add(kk * mp + 8 * j)));
        for r in 0..NR {
            let b = _mm256_set1_ps(*wr[r].add(kk));
            for j in 0..MV {
                acc[r][j] = _mm256_fmadd_ps(b, xv[j], acc[r][j]);
            }
        }
    }
    let mut tmp = [[0f32; 32]; NR];
    for (t, a) in tmp.iter_mut().zip(&acc).take(rows) {
        for (j, v) in a.iter().enumerate() {
            _mm256_storeu_ps(t.as_mut_ptr().add(8 * j), *v);
        }
    }
    write_transposed(&tmp, y, m, ldy, rows);
}

/// Writes a tile's columns (`cols[r][i]` = y[i, r], r < rows, i < m) into y (row stride `ldy`).
#[cfg(target_arch = "x86_64")]
unsafe fn write_transposed<const L: usize>(cols: &[[f32; L]], y: *mut f32, m: usize, ldy: usize, rows: usize) {
    for i in 0..m {
        let out = y.add(i * ldy);
        for (r, t) in cols.iter().enumerate().take(rows) {
            *out.add(r) = t[i];
        }
    }
}

/// One tile: y[i, r] (row stride `ldy`) = Σ_k w[r, k]·xᵀ[k, i] for r < rows, i < m.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_kernel<const MV: usize, const NR: usize>(
    w: *const f32,
    k: usize,
    xt: *const f32,
    y: *mut f32,
    m: usize,
    ldy: usize,
    rows: usize,
) {
    use std::arch::x86_64::*;
    let mp = 16 * MV;
    let mut acc = [[_mm512_setzero_ps(); MV]; NR];
    // A short last tile repeats its last row instead of branching in the inner loop.
    let wr: [*const f32; NR] = std::array::from_fn(|r| w.add(r.min(rows - 1) * k));
    for kk in 0..k {
        let xv: [__m512; MV] = std::array::from_fn(|j| _mm512_loadu_ps(xt.add(kk * mp + 16 * j)));
        for r in 0..NR {
            let b = _mm512_set1_ps(*wr[r].add(kk));
            for j in 0..MV {
                acc[r][j] = _mm512_fmadd_ps(b, xv[j], acc[r][j]);
            }
        }
    }
    // acc[r] holds column r of this tile's y block; write it row by row.
    let mut tmp = [[0f32; 64]; NR];
    for (t, a) in tmp.iter_mut().zip(&acc).take(rows) {
        for (j, v) in a.iter().enumerate() {
            _mm512_storeu_ps(t.as_mut_ptr().add(16 * j), *v);
        }
    }
    write_transposed(&tmp, y, m, ldy, rows);
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

    /// Every row-count class (1–4 vectors, partial vectors, two AVX2 row groups), short last
    /// tiles, odd K; for each kernel the CPU has.
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
            for m in [1i64, 5, 8, 9, 16, 17, 31, 32, 33, 48, 63, 64] {
                for (n, k) in [(1i64, 1i64), (7, 3), (25, 64), (100, 17), (13, 576)] {
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
