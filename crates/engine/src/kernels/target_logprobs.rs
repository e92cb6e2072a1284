//! The scorer's softmax over the vocabulary in one pass per row: from float32 logits [N, V] and
//! the tokens that were generated, each token's log-prob log p(y) = z_y − log Σ exp z, the
//! entropy of the row, and q = softmax(z) − onehot(y), z = logits / temperature. The gradient
//! of log p(y) with respect to the logits is −q / temperature, so the caller hands q to autograd
//! instead of keeping a [N, V] log-softmax for it.
//!
//! Why: the op path (log_softmax, gather, exp · log p for the entropy; in backward a zero-filled
//! [N, V] tensor scattered into, then log_softmax's backward) streams the logits about ten
//! times, 326 MB a pass for a 32 × 52-token GRPO batch at SmolLM2's 49k vocabulary. Here a row
//! (192 KB) comes from memory once and is reread from cache: the LM head of that batch, forward
//! and backward, 1.52 → 1.40 s on 2 cores (the rest is its two GEMMs).
use crate::kernels::vmath::exp_f32;
use tch::{Device, Kind, Tensor};

/// Log-probs [N] and entropies [N] (float32), and q [N, V] when `with_q`. `None` when the
/// logits are not float32 on the CPU: the caller keeps libtorch's ops.
pub fn target_logprobs(
    logits: &Tensor,
    targets: &[i64],
    inv_t: f32,
    with_q: bool,
) -> Option<(Tensor, Tensor, Option<Tensor>)> {
    if !super::f32_cpu(&[logits]) || logits.dim() != 2 {
        return None;
    }
    let (n, v) = (logits.size()[0] as usize, logits.size()[1] as usize);
    assert_eq!(targets.len(), n, "target_logprobs: one target per row");
    assert!(targets.iter().all(|&t| (0..v as i64).contains(&t)), "target_logprobs: target outside the vocabulary");
    let x = logits.detach().contiguous();
    let (mut lp, mut ent) = (vec![0f32; n], vec![0f32; n]);
    let q = with_q.then(|| Tensor::empty([n as i64, v as i64], (Kind::Float, Device::Cpu)));
    let threads = (tch::get_num_threads().max(1) as usize).min(n.max(1));
    // Addresses as integers so the closure is Sync; each thread writes only its own rows.
    let (xp, qp) = (x.data_ptr() as usize, q.as_ref().map_or(0, |q| q.data_ptr() as usize));
    let (lpp, entp) = (lp.as_mut_ptr() as usize, ent.as_mut_ptr() as usize);
    crate::kernels::omp::parallel(threads, &|t, nt| {
        let per = n.div_ceil(nt);
        let mut scratch = if qp == 0 { vec![0f32; v] } else { vec![] };
        let rows = t * per..((t + 1) * per).min(n);
        for (r, &target) in targets.iter().enumerate().take(rows.end).skip(rows.start) {
            // SAFETY: x is [n, v] contiguous f32 and alive for the call; q, lp and ent are
            // written at row r only, by the one thread that owns r.
            unsafe {
                let row = std::slice::from_raw_parts((xp as *const f32).add(r * v), v);
                let out = if qp == 0 {
                    scratch.as_mut_slice()
                } else {
                    std::slice::from_raw_parts_mut((qp as *mut f32).add(r * v), v)
                };
                let (l, e) = softmax_row(row, target as usize, inv_t, out);
                *(lpp as *mut f32).add(r) = l as f32;
                *(entp as *mut f32).add(r) = e as f32;
            }
        }
    });
    Some((Tensor::from_slice(&lp), Tensor::from_slice(&ent), q))
}

crate::kernels::vmath::simd_dispatch!(
    /// One row: writes q = softmax − onehot(target) into `q`, returns (log p(target), entropy).
    fn softmax_row(x: &[f32], target: usize, inv_t: f32, q: &mut [f32]) -> (f64, f64) = softmax_row_plain
);

#[inline(always)]
fn softmax_row_plain(x: &[f32], target: usize, inv_t: f32, q: &mut [f32]) -> (f64, f64) {
    let max = crate::kernels::vmath::max(x);
    // With u = (x − max)/t: s = Σ e^u, su = Σ e^u·u; log Z = max/t + ln s and
    // H = log Z − Σ p·z = ln s − su/s.
    let (s, su) = exps(x, max, inv_t, q);
    let ln_s = s.ln();
    let inv_s = (1.0 / s) as f32;
    for v in q.iter_mut() {
        *v *= inv_s;
    }
    q[target] -= 1.0;
    let logprob = ((x[target] - max) * inv_t) as f64 - ln_s;
    (logprob, ln_s - su / s)
}

/// q_i = e^{u_i}, u_i = (x_i − max)·inv_t; returns (Σ e^u, Σ e^u·u) in float64. Two loops,
/// each of which the compiler vectorises (one loop doing both stays scalar); the second rereads
/// the row from cache. Eight partial sums, so the f64 adds do not wait on one accumulator.
#[inline(always)]
fn exps(x: &[f32], max: f32, inv_t: f32, q: &mut [f32]) -> (f64, f64) {
    for (o, &xi) in q.iter_mut().zip(x) {
        *o = exp_f32((xi - max) * inv_t);
    }
    let (mut s, mut su) = ([0f64; 8], [0f64; 8]);
    let (xc, qc) = (x.chunks_exact(8), q.chunks_exact(8));
    for (&xi, &e) in xc.remainder().iter().zip(qc.remainder()) {
        s[0] += e as f64;
        su[0] += (e * ((xi - max) * inv_t)) as f64;
    }
    for (xs, es) in xc.zip(qc) {
        for j in 0..8 {
            s[j] += es[j] as f64;
            su[j] += (es[j] * ((xs[j] - max) * inv_t)) as f64;
        }
    }
    (s.iter().sum(), su.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against libtorch in float64 on logits with a wide spread, a tempered row and a row whose
    /// target is the argmax.
    #[test]
    fn matches_log_softmax_in_float64() {
        let (n, v) = (5i64, 1000i64);
        let logits = (Tensor::randn([n, v], (Kind::Double, Device::Cpu)) * 8.0).to_kind(Kind::Float);
        let mut targets: Vec<i64> = vec![3, 999, 0, 517, 42];
        targets[4] = logits.get(4).argmax(0, false).int64_value(&[]);
        for (inv_t, with_q) in [(1.0f32, true), (1.0 / 0.7, true), (1.0 / 0.7, false)] {
            let (lp, ent, q) = target_logprobs(&logits, &targets, inv_t, with_q).unwrap();
            let z = logits.to_kind(Kind::Double) * inv_t as f64;
            let logp = z.log_softmax(-1, Kind::Double);
            let t = Tensor::from_slice(&targets).unsqueeze(1);
            let want_lp = logp.gather(1, &t, false).squeeze_dim(1);
            let want_ent = -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Double);
            let d = |a: &Tensor, b: &Tensor| (a.to_kind(Kind::Double) - b).abs().max().double_value(&[]);
            assert!(d(&lp, &want_lp) < 2e-5, "log-probs off by {}", d(&lp, &want_lp));
            assert!(d(&ent, &want_ent) < 2e-5, "entropies off by {}", d(&ent, &want_ent));
            match q {
                Some(q) => {
                    let want_q =
                        logp.exp() - Tensor::zeros([n, v], (Kind::Double, Device::Cpu)).scatter_value(1, &t, 1.0);
                    assert!(d(&q, &want_q) < 1e-6, "q off by {}", d(&q, &want_q));
                }
                None => assert!(!with_q),
            }
        }
    }
}
