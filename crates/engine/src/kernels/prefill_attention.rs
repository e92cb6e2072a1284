//! Attention of many queries per row outside autograd: the observation feeds of a rollout
//! (each row's new tokens against its cache row) and scoring without a gradient (π_old,
//! evaluation, BRIDGE's candidate passages).
//!
//! Why: libtorch's CPU flash attention runs each (row, head, 32- or 64-query block) as MKL
//! sgemm calls of keys × 32 × 64, which on AMD CPUs run at ~40 GFLOP/s (MKL packs both
//! operands on every call; `MKL_VERBOSE` counted ~1 M such calls in a 2-step Knowledgeable-R1
//! run). Here a task is a block of queries of one head: with the keys transposed once per call,
//! the scores S = Q·Kᵀ and the output O = P·V come from one register-tiled product
//! (6 queries × 16 lanes, AVX2 + FMA), the scores softmaxed whole in between (a block holds
//! every key it sees, so there is no online rescaling). Keys past the last one a block sees (a
//! causal feed's upper triangle) are not computed. Same mathematics as SDPA with a boolean mask
//! (scale 1/√d); tested against it.
use tch::{Device, Kind, Tensor};

/// Queries per task: a block's scores (QB × keys f32) stay in L2.
const QB: usize = 24;
/// Rows of the register tile, and its width in f32 lanes (two AVX2 vectors).
const MR: usize = 6;
const NC: usize = 16;

/// softmax(q·kᵀ/√d, masked)·v for q [b, nh, t, d], k and v [b, nkv, keys, d] (any strides, d
/// contiguous; query head h reads kv head h / (nh / nkv)) and mask [b, 1, t, keys] (true: the
/// query sees the key). Returns [b, t, nh·d], heads concatenated as o_proj takes them. `None`
/// where the kernel does not apply (not f32 on CPU, autograd on, no AVX2, d not a multiple of
/// 16, other shapes): the caller runs SDPA. A query that sees no key gets zeros (the callers'
/// masks let every query see at least itself).
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Option<Tensor> {
    if crate::kernels::vmath::isa() == crate::kernels::vmath::Isa::Baseline {
        return None;
    }
    if !super::f32_cpu(&[q, k, v]) || super::needs_grad(&[q, k, v]) || mask.kind() != Kind::Bool {
        return None;
    }
    let (b, nh, t, d) = q.size4().ok()?;
    let (kb, nkv, keys, kd) = k.size4().ok()?;
    let unit = |x: &Tensor| x.stride()[3] == 1;
    if kb != b || kd != d || v.size() != k.size() || nkv == 0 || nh % nkv != 0 || !unit(q) || !unit(k) || !unit(v) {
        return None;
    }
    if mask.size() != [b, 1, t, keys] || t == 0 || keys == 0 || d == 0 || d % NC as i64 != 0 {
        return None;
    }
    let mask = mask.contiguous();
    // Kᵀ of every (row, kv head), keys padded with zeros to whole tiles: [b, nkv, d, padded].
    let padded = (keys as usize).div_ceil(NC) * NC;
    let kt = Tensor::zeros([b, nkv, d, padded as i64], (Kind::Float, Device::Cpu));
    kt.narrow(3, 0, keys).copy_(&k.transpose(2, 3));
    let out = Tensor::empty([b, t, nh * d], (Kind::Float, Device::Cpu));
    let [b, nh, t, d, nkv, keys] = [b, nh, t, d, nkv, keys].map(|x| x as usize);
    let st = |x: &Tensor| -> [usize; 3] { std::array::from_fn(|i| x.stride()[i] as usize) };
    let (qs, vs) = (st(q), st(v));
    let blocks = t.div_ceil(QB);
    let tasks = b * nh * blocks;
    let threads = (tch::get_num_threads().max(1) as usize).min(tasks);
    let scale = 1.0 / (d as f32).sqrt();
    // Addresses as integers so the closure is Sync; each task writes its own (row, head, block).
    let ptr = |x: &Tensor| x.data_ptr() as usize;
    let (qp, kp, vp, mp, op) = (ptr(q), ptr(&kt), ptr(v), ptr(&mask), ptr(&out));
    crate::kernels::omp::parallel(threads, &|th, nt| {
        let mut scores = vec![0f32; QB * padded];
        let per = tasks.div_ceil(nt);
        for task in th * per..((th + 1) * per).min(tasks) {
            let (row, h, blk) = (task / (nh * blocks), task / blocks % nh, task % blocks);
            let (i0, i1) = (blk * QB, ((blk + 1) * QB).min(t));
            let g = h / (nh / nkv);
            // SAFETY: every offset below stays inside the tensors whose sizes and strides were
            // checked above; `out` rows i0..i1 of head h are written by this task only.
            unsafe {
                let mask = std::slice::from_raw_parts((mp as *const bool).add(row * t * keys), t * keys);
                // Keys any query of the block sees (the rest are not computed), in whole tiles.
                let seen = (i0..i1)
                    .map(|i| mask[i * keys..(i + 1) * keys].iter().rposition(|&m| m).map_or(0, |j| j + 1))
                    .max()
                    .unwrap_or(0);
                let width = seen.div_ceil(NC) * NC;
                let panel =
                    std::slice::from_raw_parts((kp as *const f32).add((row * nkv + g) * d * padded), d * padded);
                let qh = (qp as *const f32).add(row * qs[0] + h * qs[1] + i0 * qs[2]);
                let rows = i1 - i0;
                product(qh, qs[2], panel, padded, d, (scores.as_mut_ptr(), width), rows, width);
                for i in 0..rows {
                    let m = &mask[(i0 + i) * keys..(i0 + i) * keys + seen];
                    softmax(&mut scores[i * width..i * width + seen], m, scale);
                }
                let vh = (vp as *const f32).add(row * vs[0] + g * vs[1]);
                let oh = (op as *mut f32).add((row * t + i0) * nh * d + h * d);
                let values = std::slice::from_raw_parts(vh, if seen == 0 { 0 } else { (seen - 1) * vs[2] + d });
                product(scores.as_ptr(), width, values, vs[2], seen, (oh, nh * d), rows, d);
            }
        }
    });
    Some(out)
}

/// C[rows, cols] = A[rows, kk]·B[kk, cols]: A row i at a + i·lda, B row p at b[p·ldb..], C row i
/// at c.0 + i·c.1; cols a multiple of 16. In 6 × 16 register tiles (12 sums, two B vectors, one
/// broadcast A value: 15 of AVX2's 16 registers); a short last tile repeats its last A row and
/// stores only its real rows.
///
/// # Safety
/// The CPU has AVX2 and FMA; the pointers cover the ranges named.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    a: *const f32,
    lda: usize,
    b: &[f32],
    ldb: usize,
    kk: usize,
    c: (*mut f32, usize),
    rows: usize,
    cols: usize,
) {
    for i in (0..rows).step_by(MR) {
        let ar: [*const f32; MR] = std::array::from_fn(|r| a.add((i + r).min(rows - 1) * lda));
        for j in (0..cols).step_by(NC) {
            tile(&ar, b.as_ptr().add(j), ldb, kk, c.0.add(i * c.1 + j), c.1, (rows - i).min(MR));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(a: &[*const f32; MR], b: *const f32, ldb: usize, kk: usize, c: *mut f32, ldc: usize, real: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kk {
        let (b0, b1) = (_mm256_loadu_ps(b.add(p * ldb)), _mm256_loadu_ps(b.add(p * ldb + 8)));
        for r in 0..MR {
            let x = _mm256_broadcast_ss(&*a[r].add(p));
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        if r < real {
            _mm256_storeu_ps(c.add(r * ldc), row[0]);
            _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile(_: &[*const f32; MR], _: *const f32, _: usize, _: usize, _: *mut f32, _: usize, _: usize) {
    unreachable!("prefill_attention: x86-64 only")
}

/// s ← softmax(scale·s) over the keys the mask lets in (0 elsewhere); all zeros when it lets
/// in none.
#[inline(always)]
fn softmax_plain(s: &mut [f32], mask: &[bool], scale: f32) {
    for (x, &m) in s.iter_mut().zip(mask) {
        *x = if m { *x * scale } else { f32::NEG_INFINITY };
    }
    let max = crate::kernels::vmath::max(s);
    if max == f32::NEG_INFINITY {
        s.iter_mut().for_each(|x| *x = 0.0);
        return;
    }
    // exp(−∞) = 0: masked keys drop out without a branch, so this loop vectorises.
    s.iter_mut().for_each(|x| *x = crate::kernels::vmath::exp_f32(*x - max));
    let inv = 1.0 / crate::kernels::vmath::sum(s);
    s.iter_mut().for_each(|x| *x *= inv);
}

crate::kernels::vmath::simd_dispatch!(fn softmax(s: &mut [f32], mask: &[bool], scale: f32) = softmax_plain);

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: (Kind, Device) = (Kind::Float, Device::Cpu);

    fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
        let (b, nh, t, d) = q.size4().unwrap();
        Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, true).transpose(1, 2).reshape([
            b,
            t,
            nh * d,
        ])
    }

    /// Causal masks with right padding, left padding and random holes; more queries than a
    /// block, fewer keys than a tile, GQA and plain heads, strided q (the model's transposed
    /// view) and strided k/v (a cache's front rows).
    #[test]
    fn equals_sdpa_with_a_boolean_mask() {
        if crate::kernels::vmath::isa() == crate::kernels::vmath::Isa::Baseline {
            assert!(attend(
                &Tensor::zeros([1, 1, 1, 16], OPTS),
                &Tensor::zeros([1, 1, 1, 16], OPTS),
                &Tensor::zeros([1, 1, 1, 16], OPTS),
                &Tensor::ones([1, 1, 1, 1], (Kind::Bool, Device::Cpu))
            )
            .is_none());
            return;
        }
        tch::manual_seed(1);
        for &(b, nh, nkv, t, past, d) in
            &[(2i64, 9i64, 3i64, 50i64, 30i64, 64i64), (3, 4, 4, 7, 0, 16), (1, 6, 2, 3, 2, 32), (2, 2, 1, 30, 100, 16)]
        {
            let keys = past + t;
            let q = Tensor::randn([b, t, nh, d], OPTS).transpose(1, 2);
            let cache = Tensor::randn([b, nkv, keys + 5, d], OPTS);
            let (k, v) = (cache.narrow(2, 0, keys), (&cache * 0.5 + 1.0).narrow(2, 0, keys));
            let causal = Tensor::ones([t, keys], (Kind::Bool, Device::Cpu)).tril(past);
            let holes = Tensor::rand([b, 1, t, keys], OPTS).gt(0.2);
            let diag = Tensor::zeros([t, keys], (Kind::Bool, Device::Cpu));
            diag.narrow(1, past, t).copy_(&Tensor::eye(t, (Kind::Bool, Device::Cpu)));
            for mask in [
                causal.view([1, 1, t, keys]).expand([b, 1, t, keys], false).contiguous(),
                causal.logical_and(&holes).logical_or(&diag),
            ] {
                let y = tch::no_grad(|| attend(&q, &k, &v, &mask)).expect("kernel applies");
                let r = sdpa(&q, &k, &v, &mask);
                let err = (&y - &r).abs().max().double_value(&[]);
                assert!(err < 1e-5, "b={b} nh={nh} nkv={nkv} t={t} past={past} d={d}: max error {err}");
            }
        }
    }

    #[test]
    fn leaves_autograd_and_other_kinds_to_sdpa() {
        let q = Tensor::randn([1, 2, 3, 16], OPTS).set_requires_grad(true);
        let k = Tensor::randn([1, 2, 3, 16], OPTS);
        let mask = Tensor::ones([1, 1, 3, 3], (Kind::Bool, Device::Cpu));
        assert!(attend(&q, &k, &k, &mask).is_none(), "grad mode on and q trainable");
        let q = q.detach();
        assert!(attend(&q.to_kind(Kind::Double), &k.to_kind(Kind::Double), &k.to_kind(Kind::Double), &mask).is_none());
        assert!(attend(&q, &k, &k, &mask.to_kind(Kind::Float)).is_none(), "float mask");
        assert!(attend(&q, &Tensor::randn([1, 2, 3, 4], OPTS), &k, &mask).is_none(), "head sizes differ");
        let odd = Tensor::randn([1, 2, 3, 24], OPTS);
        assert!(attend(&odd, &odd, &odd, &mask).is_none(), "head size not a multiple of 16");
    }
}
