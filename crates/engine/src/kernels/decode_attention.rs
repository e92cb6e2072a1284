//! One decode step's attention (one new token per row) on raw f32 buffers: RoPE on q and k, k
//! and v written into the KV cache, softmax attention over the row's valid cached keys.
//!
//! Why: through libtorch this is ~30 small ops per layer (head views, RoPE's narrow/neg/cat/mul,
//! cache copies, SDPA — which runs one GEMV per row and head — and the transposes back), a
//! fixed cost per op that a 32-row decode step of a small model pays ~900 times. Here it is one
//! pass, split over libtorch's OpenMP team. Same mathematics as the generic path (transformers'
//! rotate_half RoPE, scale 1/√d, the same boolean mask); tested against it.
use tch::{Device, Kind, Tensor};

/// The inputs of one layer's decode step.
pub struct DecodeStep<'a> {
    /// Projections before RoPE: q [n, 1, nh·d], k and v [n, 1, nkv·d].
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// RoPE tables [n, 1, 1, d] at each row's position.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// Cache buffers [b, nkv, capacity, d] (the front rows of a larger buffer are fine); the new
    /// key/value go to slot `pos`, and keys 0..=pos are attended where `mask` [b, 1, 1, pos + 1]
    /// is true.
    pub cache_k: &'a Tensor,
    pub cache_v: &'a Tensor,
    pub pos: i64,
    pub mask: &'a Tensor,
    pub n_heads: i64,
    pub n_kv: i64,
    pub head_dim: i64,
    /// The cache (and mask) row of each of the n query rows, when only some rows run (a packed
    /// decode step: rows that repeat another row are copied, not computed); `None`: n = b and
    /// query row r is cache row r. Cache rows not named are left untouched.
    pub rows: Option<&'a [usize]>,
}

/// Attention output [b, 1, nh·d] (heads concatenated, ready for o_proj), or `None` when the
/// step is not a plain f32 CPU decode step outside autograd (the caller runs libtorch's path).
pub fn attend(s: &DecodeStep) -> Option<Tensor> {
    let (nh, nkv, d) = (s.n_heads, s.n_kv, s.head_dim);
    let all = [s.q, s.k, s.v, s.cos, s.sin, s.cache_k, s.cache_v];
    if !super::f32_cpu(&all) || super::needs_grad(&[s.q, s.k, s.v, s.cache_k]) {
        return None;
    }
    if s.mask.kind() != Kind::Bool || nh % nkv != 0 || d % 2 != 0 {
        return None;
    }
    let (n, b) = (s.q.size()[0], s.cache_k.size()[0]);
    let rows_ok = s.rows.map_or(n == b, |m| m.len() as i64 == n && m.iter().all(|&r| (r as i64) < b));
    let keys = s.pos + 1;
    let (cs, cap) = (s.cache_k.stride(), s.cache_k.size()[2]);
    let shapes_ok = rows_ok
        && s.q.size() == [n, 1, nh * d]
        && s.k.size() == [n, 1, nkv * d]
        && s.v.size() == [n, 1, nkv * d]
        && s.cos.size() == [n, 1, 1, d]
        && s.sin.size() == [n, 1, 1, d]
        && s.cache_k.size() == [b, nkv, cap, d]
        && s.cache_v.size() == s.cache_k.size()
        && s.cache_v.stride() == cs
        && cs[3] == 1
        && cs[2] == d
        && cs[1] == cap * d
        && s.pos < cap
        && s.mask.size() == [b, 1, 1, keys];
    if !shapes_ok {
        return None;
    }
    let (q, k, v) = (s.q.contiguous(), s.k.contiguous(), s.v.contiguous());
    let (cos, sin, mask) = (s.cos.contiguous(), s.sin.contiguous(), s.mask.contiguous());
    let out = Tensor::empty([n, 1, nh * d], (Kind::Float, Device::Cpu));
    let (b, n, nh, nkv, d, keys, row_stride) =
        (b as usize, n as usize, nh as usize, nkv as usize, d as usize, keys as usize, cs[0]);
    let map = s.rows;
    let cache_row = move |r: usize| map.map_or(r, |m| m[r]);
    // SAFETY: every tensor is a live f32/bool CPU tensor of the checked shape; the cache views
    // are written only at slot `pos` of their own rows; each task writes its own output head.
    unsafe {
        let view = |t: &Tensor, n: usize| std::slice::from_raw_parts(t.data_ptr() as *const f32, n);
        let (q, k, v) = (view(&q, n * nh * d), view(&k, n * nkv * d), view(&v, n * nkv * d));
        let (cos, sin) = (view(&cos, n * d), view(&sin, n * d));
        let mask = std::slice::from_raw_parts(mask.data_ptr() as *const bool, b * keys);
        let (ck, cv) = (s.cache_k.data_ptr() as *mut f32, s.cache_v.data_ptr() as *mut f32);
        let slot = |r: usize, h: usize, j: usize| r * row_stride as usize + (h * cap as usize + j) * d;
        // The new keys (rotated) and values into the cache first: every query head reads them.
        for r in 0..n {
            for h in 0..nkv {
                let src = (r * nkv + h) * d;
                let dst = slot(cache_row(r), h, s.pos as usize);
                rope(&k[src..src + d], &cos[r * d..(r + 1) * d], &sin[r * d..(r + 1) * d], ck.add(dst));
                std::ptr::copy_nonoverlapping(v.as_ptr().add(src), cv.add(dst), d);
            }
        }
        let (ck, cv, o) = (ck as usize, cv as usize, out.data_ptr() as usize);
        let tasks = n * nh;
        let threads = (tch::get_num_threads().max(1) as usize).min(tasks);
        crate::kernels::omp::parallel(threads, &|t, nt| {
            let (ck, cv, o) = (ck as *const f32, cv as *const f32, o as *mut f32);
            let (mut qr, mut scores) = (vec![0f32; d], vec![0f32; keys]);
            let per = tasks.div_ceil(nt);
            for task in t * per..((t + 1) * per).min(tasks) {
                let (r, h) = (task / nh, task % nh);
                let kv_head = h / (nh / nkv);
                let src = (r * nh + h) * d;
                rope(&q[src..src + d], &cos[r * d..(r + 1) * d], &sin[r * d..(r + 1) * d], qr.as_mut_ptr());
                let c = cache_row(r);
                let head = Head {
                    q: &qr,
                    keys: std::slice::from_raw_parts(ck.add(slot(c, kv_head, 0)), keys * d),
                    values: std::slice::from_raw_parts(cv.add(slot(c, kv_head, 0)), keys * d),
                    mask: &mask[c * keys..(c + 1) * keys],
                };
                let y = std::slice::from_raw_parts_mut(o.add(src), d);
                attend_head_fast(&head, &mut scores, y);
            }
        });
    }
    Some(out)
}

/// One query head (rotated) and its row's cached keys and values [keys, d].
struct Head<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    mask: &'a [bool],
}

/// y = Σⱼ softmax(q·kⱼ/√d)ⱼ·vⱼ over the masked-in keys j.
#[inline(always)]
fn attend_head(h: &Head, scores: &mut [f32], y: &mut [f32]) {
    let d = h.q.len();
    let scale = 1.0 / (d as f32).sqrt();
    let mut max = f32::NEG_INFINITY;
    for ((sc, k), &m) in scores.iter_mut().zip(h.keys.chunks_exact(d)).zip(h.mask) {
        *sc = if m { crate::kernels::vmath::dot(h.q, k) * scale } else { f32::NEG_INFINITY };
        max = max.max(*sc);
    }
    // exp(−∞) = 0: masked keys drop out without a branch, so this loop vectorises.
    scores.iter_mut().for_each(|sc| *sc = crate::kernels::vmath::exp_f32(*sc - max));
    let total = crate::kernels::vmath::sum(scores);
    y.iter_mut().for_each(|x| *x = 0.0);
    for ((&p, v), &m) in scores.iter().zip(h.values.chunks_exact(d)).zip(h.mask) {
        if m {
            y.iter_mut().zip(v).for_each(|(a, &b)| *a += p * b);
        }
    }
    y.iter_mut().for_each(|x| *x /= total);
}

crate::kernels::vmath::simd_dispatch!(fn attend_head_fast(h: &Head, scores: &mut [f32], y: &mut [f32]) = attend_head);

/// out = x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁] (transformers' convention).
unsafe fn rope(x: &[f32], cos: &[f32], sin: &[f32], out: *mut f32) {
    let half = x.len() / 2;
    for i in 0..half {
        *out.add(i) = x[i] * cos[i] + -x[i + half] * sin[i];
        *out.add(i + half) = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotate_half(x: &Tensor) -> Tensor {
        let half = x.size()[3] / 2;
        Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3)
    }

    const OPTS: (Kind, Device) = (Kind::Float, Device::Cpu);
    /// Rows, query heads, kv heads, head size, cache capacity, the new token's slot.
    const SHAPE: (i64, i64, i64, i64, i64, i64) = (5, 6, 2, 16, 12, 8);

    /// A step's random inputs at [`SHAPE`]: projections, RoPE tables of real angles, and a mask
    /// with random holes in which the new token always sees itself.
    struct Inputs {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
    }

    fn inputs(seed: i64) -> Inputs {
        tch::manual_seed(seed);
        let (b, nh, nkv, d, _, pos) = SHAPE;
        let angle = Tensor::rand([b, 1, 1, d / 2], OPTS) * 6.0;
        let angle = Tensor::cat(&[&angle, &angle], 3);
        let mask = Tensor::rand([b, 1, 1, pos + 1], OPTS).gt(0.3);
        let _ = mask.narrow(3, pos, 1).fill_(1);
        Inputs {
            q: Tensor::randn([b, 1, nh * d], OPTS),
            k: Tensor::randn([b, 1, nkv * d], OPTS),
            v: Tensor::randn([b, 1, nkv * d], OPTS),
            cos: angle.cos(),
            sin: angle.sin(),
            mask,
        }
    }

    /// The full step over every row of the cache `ck`, `cv`.
    fn full_step<'a>(x: &'a Inputs, ck: &'a Tensor, cv: &'a Tensor) -> DecodeStep<'a> {
        let (_, nh, nkv, d, _, pos) = SHAPE;
        DecodeStep {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            cos: &x.cos,
            sin: &x.sin,
            cache_k: ck,
            cache_v: cv,
            pos,
            mask: &x.mask,
            n_heads: nh,
            n_kv: nkv,
            head_dim: d,
            rows: None,
        }
    }

    /// Against libtorch's path (rotate_half RoPE, cache write, SDPA with GQA and a mask with
    /// holes): same output and same cache contents.
    #[test]
    fn equals_rope_cache_write_and_sdpa() {
        let x = inputs(7);
        let (Inputs { q, k, v, cos, sin, mask }, (b, nh, nkv, d, cap, pos)) = (&x, SHAPE);
        // A bigger buffer whose first b rows are the cache, as `KvCache::front_rows` gives.
        let (big_k, big_v) = (Tensor::randn([b + 2, nkv, cap, d], OPTS), Tensor::randn([b + 2, nkv, cap, d], OPTS));
        let (ck, cv) = (big_k.narrow(0, 0, b), big_v.narrow(0, 0, b));
        let (ck_ref, cv_ref) = (ck.copy(), cv.copy());
        let beyond = big_k.narrow(0, b, 2).copy();

        let heads = |t: &Tensor, n: i64| t.view([b, 1, n, d]).transpose(1, 2);
        let qr = heads(q, nh) * cos + rotate_half(&heads(q, nh)) * sin;
        let kr = heads(k, nkv) * cos + rotate_half(&heads(k, nkv)) * sin;
        ck_ref.narrow(2, pos, 1).copy_(&kr);
        cv_ref.narrow(2, pos, 1).copy_(&heads(v, nkv));
        let (keys_ref, values_ref) = (ck_ref.narrow(2, 0, pos + 1), cv_ref.narrow(2, 0, pos + 1));
        let want =
            Tensor::scaled_dot_product_attention(&qr, &keys_ref, &values_ref, Some(mask), 0.0, false, None, true)
                .transpose(1, 2)
                .reshape([b, 1, nh * d]);

        let step = full_step(&x, &ck, &cv);
        let got = attend(&step).expect("a plain f32 decode step");
        assert!(got.allclose(&want, 1e-5, 1e-5, false), "max {}", (&got - &want).abs().max().double_value(&[]));
        assert!(ck.allclose(&ck_ref, 1e-6, 1e-6, false) && cv.equal(&cv_ref), "cache contents");
        assert!(big_k.narrow(0, b, 2).equal(&beyond), "rows past the front are untouched");
        // Not a decode step's shape (two new tokens): libtorch's path.
        let q2 = Tensor::randn([b, 2, nh * d], OPTS);
        assert!(attend(&DecodeStep { q: &q2, ..step }).is_none());
    }

    /// A packed step (some cache rows named, in any order) gives each named row what the full
    /// step gives it, writes only the named rows' slots, and reads each row's own mask.
    #[test]
    fn a_packed_step_equals_the_full_step_on_its_rows() {
        let x = inputs(11);
        let (Inputs { q, k, v, cos, sin, .. }, (b, _, nkv, d, cap, _)) = (&x, SHAPE);
        let cache = Tensor::randn([b, nkv, cap, d], OPTS);
        let (full_k, full_v) = (cache.copy(), cache.copy() * 2.0);
        let (part_k, part_v) = (full_k.copy(), full_v.copy());
        let full = full_step(&x, &full_k, &full_v);
        let want = attend(&full).unwrap();
        let rows = [3usize, 0, 4];
        let pick = Tensor::from_slice(&rows.map(|r| r as i64));
        let (qp, kp, vp) = (q.index_select(0, &pick), k.index_select(0, &pick), v.index_select(0, &pick));
        let (cp, sp) = (cos.index_select(0, &pick), sin.index_select(0, &pick));
        let packed = DecodeStep {
            q: &qp,
            k: &kp,
            v: &vp,
            cos: &cp,
            sin: &sp,
            cache_k: &part_k,
            cache_v: &part_v,
            rows: Some(&rows),
            ..full
        };
        let got = attend(&packed).expect("a packed decode step");
        assert!(got.equal(&want.index_select(0, &pick)), "the named rows' outputs");
        for r in 0..b {
            let named = rows.contains(&(r as usize));
            let (same_k, same_v) = (part_k.get(r).equal(&full_k.get(r)), part_v.get(r).equal(&full_v.get(r)));
            let untouched = part_k.get(r).equal(&cache.get(r));
            assert!(if named { same_k && same_v } else { untouched }, "cache row {r} (named: {named})");
        }
        // A row map that names a row outside the cache, or does not match q's rows: libtorch's path.
        assert!(attend(&DecodeStep { rows: Some(&[3, 0, 5]), ..packed }).is_none());
        assert!(attend(&DecodeStep { rows: Some(&[3, 0]), ..packed }).is_none());
    }
}
