//! Token sampling on the host: temperature, top-k, top-p, greedy, with one seeded generator per
//! sequence so a sequence's sample does not depend on what else is in its batch.
use crate::kernels::vmath::exp_f32;
use serde::{Deserialize, Serialize};

/// xoshiro256** seeded through splitmix64. Small, fast, and its state is four integers, so it
/// checkpoints trivially (bit-identical resume).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n.max(1)
    }

    /// An independent generator derived from this one (e.g. one per sequence).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f64,
    /// 1.0 = off.
    pub top_p: f64,
    /// 0 = off.
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Generation stops once the decoded continuation contains one of these (kept in the output).
    #[serde(default)]
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 256, stop: vec![] }
    }
}

impl SamplingParams {
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_new_tokens, ..Default::default() }
    }
}

/// Picks a token from one row of logits. Returns (token, log-prob of that token under the
/// distribution actually sampled from: after temperature, top-k and top-p renormalisation; for
/// greedy, under the untempered softmax).
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> (u32, f32) {
    sample_with(logits, p, rng, &mut Scratch::default())
}

/// Per-thread buffers of [`sample_with`]: a batch samples many rows of a large vocabulary.
#[derive(Default)]
pub struct Scratch {
    exps: Vec<f32>,
    block_sums: Vec<f64>,
}

/// [`sample`] with caller-owned buffers.
pub fn sample_with(logits: &[f32], p: &SamplingParams, rng: &mut Rng, scratch: &mut Scratch) -> (u32, f32) {
    let max = crate::kernels::vmath::max(logits);
    if p.temperature <= 0.0 {
        let best = logits.iter().position(|&v| v == max).unwrap_or(0);
        let z = exp_shifted(logits, max, 1.0, scratch);
        return (best as u32, (-z.ln()) as f32);
    }
    let inv_t = 1.0 / p.temperature as f32;
    let top_k_active = p.top_k > 0 && p.top_k < logits.len();
    if !top_k_active && p.top_p >= 1.0 {
        // Plain temperature sampling: one pass of exps (kept, with block sums), then an
        // inverse-CDF walk over the block sums and inside one block.
        let z = exp_shifted(logits, max, inv_t, scratch);
        let pick = inverse_cdf(scratch, rng.uniform() * z);
        let lp = ((logits[pick] - max) * inv_t) as f64 - z.ln();
        return (pick as u32, lp as f32);
    }
    // Truncated sampling: candidates sorted by logit, cut by k, then by cumulative mass p
    // (the smallest prefix whose mass reaches p, at least one token), renormalised.
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = if top_k_active { p.top_k } else { logits.len() };
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
    }
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let w: Vec<f64> = idx.iter().map(|&i| exp_f32((logits[i] - max) * inv_t) as f64).collect();
    let total: f64 = w.iter().sum();
    let mut keep = w.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (j, &x) in w.iter().enumerate() {
            acc += x / total;
            if acc >= p.top_p {
                keep = j + 1;
                break;
            }
        }
    }
    let z: f64 = w[..keep].iter().sum();
    let target = rng.uniform() * z;
    let mut acc = 0.0;
    let mut pick = keep - 1;
    for (j, &x) in w[..keep].iter().enumerate() {
        acc += x;
        if acc > target {
            pick = j;
            break;
        }
    }
    (idx[pick] as u32, (w[pick] / z).ln() as f32)
}

/// Tokens per block of the inverse-CDF walk.
const BLOCK: usize = 256;

/// Fills `s` with e^((l − max)·inv_t) per logit and the f64 sum of each [`BLOCK`]; returns Z,
/// the sum of the block sums.
fn exp_shifted(logits: &[f32], max: f32, inv_t: f32, s: &mut Scratch) -> f64 {
    s.exps.clear();
    s.exps.resize(logits.len(), 0.0);
    s.block_sums.clear();
    s.block_sums.resize(logits.len().div_ceil(BLOCK), 0.0);
    exp_blocks_fast(logits, max, inv_t, s);
    s.block_sums.iter().sum()
}

// `exp_f32` is branch-free, so `exp_blocks` vectorises; `mul_add` is exactly rounded either way
// and the summation order is fixed, so both copies give the same bits.
crate::kernels::vmath::simd_dispatch!(fn exp_blocks_fast(logits: &[f32], max: f32, inv_t: f32, s: &mut Scratch) = exp_blocks);

#[inline(always)]
fn exp_blocks(logits: &[f32], max: f32, inv_t: f32, s: &mut Scratch) {
    for ((l, e), sum) in logits.chunks(BLOCK).zip(s.exps.chunks_mut(BLOCK)).zip(s.block_sums.iter_mut()) {
        for (o, &x) in e.iter_mut().zip(l) {
            *o = exp_f32((x - max) * inv_t);
        }
        // Eight f64 partial sums: the chain of one accumulator would cost more than the exps.
        let mut part = [0f64; 8];
        let chunks = e.chunks_exact(8);
        let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
        for c in chunks {
            for j in 0..8 {
                part[j] += c[j] as f64;
            }
        }
        *sum = part.iter().sum::<f64>() + tail;
    }
}

/// The first token whose running sum of exps exceeds `target`: whole blocks are skipped by
/// their sums, then one block is walked (the last token if rounding leaves the target above
/// the total, as a sequential walk would).
fn inverse_cdf(s: &Scratch, target: f64) -> usize {
    let mut acc = 0.0f64;
    for (b, (e, &sum)) in s.exps.chunks(BLOCK).zip(&s.block_sums).enumerate() {
        if acc + sum <= target {
            acc += sum;
            continue;
        }
        for (j, &v) in e.iter().enumerate() {
            acc += v as f64;
            if acc > target {
                return b * BLOCK + j;
            }
        }
    }
    s.exps.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_with_true_logprob() {
        let l = [0.0f32, 2.0, 1.0];
        let (t, lp) = sample(&l, &SamplingParams::greedy(1), &mut Rng::new(0));
        assert_eq!(t, 1);
        let z = (0f64.exp() + 2f64.exp() + 1f64.exp()).ln();
        assert!((lp as f64 - (2.0 - z)).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_with_logprob_zero() {
        let l = [0.5f32, 3.0, 1.0, -2.0];
        let p = SamplingParams { top_k: 1, ..Default::default() };
        for s in 0..20 {
            let (t, lp) = sample(&l, &p, &mut Rng::new(s));
            assert_eq!((t, lp), (1, 0.0));
        }
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // probs ≈ [0.6439, 0.2369, 0.0871, 0.0321]: p = 0.8 keeps the first two tokens.
        let l = [3.0f32, 2.0, 1.0, 0.0];
        let p = SamplingParams { top_p: 0.8, ..Default::default() };
        let mut seen = [0usize; 4];
        let mut rng = Rng::new(7);
        for _ in 0..4000 {
            let (t, lp) = sample(&l, &p, &mut rng);
            seen[t as usize] += 1;
            let w = [1.0f64, (-1f64).exp()];
            let z = w[0] + w[1];
            assert!((lp as f64 - (w[t as usize] / z).ln()).abs() < 1e-6);
        }
        assert_eq!(seen[2] + seen[3], 0);
        let frac = seen[0] as f64 / 4000.0;
        assert!((frac - 1.0 / (1.0 + (-1f64).exp())).abs() < 0.03, "{frac}");
    }

    #[test]
    fn temperature_sampling_matches_softmax_frequencies() {
        let l = [0.0f32, 1.0, 2.0];
        let p = SamplingParams { temperature: 2.0, ..Default::default() };
        let mut rng = Rng::new(1);
        let mut seen = [0usize; 3];
        for _ in 0..20000 {
            seen[sample(&l, &p, &mut rng).0 as usize] += 1;
        }
        let w: Vec<f64> = l.iter().map(|&x| (x as f64 / 2.0).exp()).collect();
        let z: f64 = w.iter().sum();
        for i in 0..3 {
            assert!((seen[i] as f64 / 20000.0 - w[i] / z).abs() < 0.015);
        }
    }

    /// The block walk picks what a token-by-token walk over exact f64 exps picks, and the
    /// log-prob is the exact one, on a vocabulary-sized row with several blocks.
    #[test]
    fn plain_sampling_matches_a_sequential_f64_walk() {
        let mut gen = Rng::new(3);
        let logits: Vec<f32> = (0..5000).map(|_| (gen.uniform() * 12.0 - 6.0) as f32).collect();
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let p = SamplingParams { temperature: 0.7, ..Default::default() };
        let w: Vec<f64> = logits.iter().map(|&l| (((l - max) / 0.7) as f64).exp()).collect();
        let z: f64 = w.iter().sum();
        for seed in 0..300 {
            let mut r = Rng::new(seed);
            let (tok, lp) = sample(&logits, &p, &mut r.clone());
            let target = r.uniform() * z;
            let mut acc = 0.0;
            let want = w.iter().position(|&x| {
                acc += x;
                acc > target
            });
            assert_eq!(Some(tok as usize), want, "seed {seed}");
            assert!((lp as f64 - (w[tok as usize] / z).ln()).abs() < 1e-5);
        }
        // Greedy: the argmax and its untempered log-softmax.
        let (g, glp) = sample(&logits, &SamplingParams::greedy(1), &mut Rng::new(0));
        let zg: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        assert_eq!(logits[g as usize], max);
        assert!((glp as f64 + zg.ln()).abs() < 1e-5);
    }

    #[test]
    fn rng_is_reproducible_and_seed_sensitive() {
        let a: Vec<u64> = (0..4).scan(Rng::new(42), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..4).scan(Rng::new(42), |r, _| Some(r.next_u64())).collect();
        let c: Vec<u64> = (0..4).scan(Rng::new(43), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
