//! Teacher-forced scoring: per-token log-probs and entropy of responses given prompts.
//!
//! Prompt and response are passed separately, so the same response can be scored under a
//! different prompt (Knowledgeable-R1 scores query-only rollouts under the context prompt).
//! Only response positions that count (loss mask true) go through the LM head, which keeps the
//! [N, V] logits small.
use crate::kernels::target_logprobs::target_logprobs;
use crate::layers::Mode;
use crate::models::llama::{DecoderLm, Packing};
use tch::{Device, Kind, Tensor};

/// Right-padded sequences with positions and a causal+padding mask, ready for one forward.
pub struct PackedBatch {
    pub ids: Tensor,       // [B, L]
    pub positions: Tensor, // [B, L]
    pub mask: Tensor,      // [B, 1, L, L] bool
    pub lens: Vec<usize>,
    pub width: usize,
}

impl PackedBatch {
    pub fn new(seqs: &[Vec<u32>], device: Device) -> PackedBatch {
        let b = seqs.len();
        let l = seqs.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut ids = vec![0i64; b * l];
        for (r, s) in seqs.iter().enumerate() {
            for (i, &t) in s.iter().enumerate() {
                ids[r * l + i] = t as i64;
            }
        }
        let lens: Vec<i64> = seqs.iter().map(|s| s.len() as i64).collect();
        let ar = Tensor::arange(l as i64, (Kind::Int64, device));
        let key_ok = ar.unsqueeze(0).lt_tensor(&Tensor::from_slice(&lens).to_device(device).unsqueeze(1)); // [B, L]
        let causal = ar.unsqueeze(1).ge_tensor(&ar.unsqueeze(0)); // [L(q), L(k)]
        let diag = Tensor::eye(l as i64, (Kind::Bool, device));
        let mask = causal.unsqueeze(0).logical_and(&key_ok.unsqueeze(1)).logical_or(&diag.unsqueeze(0)).unsqueeze(1);
        PackedBatch {
            ids: Tensor::from_slice(&ids).view([b as i64, l as i64]).to_device(device),
            positions: ar.unsqueeze(0).expand([b as i64, l as i64], false).contiguous(),
            mask,
            lens: seqs.iter().map(Vec::len).collect(),
            width: l,
        }
    }
}

/// Per-token results, padded to [B, R] with R the longest response.
pub struct Scored {
    /// log π(y_t | prompt, y_<t), differentiable w.r.t. trainable parameters.
    pub logprobs: Tensor,
    /// Token entropy of the (tempered) distribution; detached.
    pub entropy: Tensor,
    /// 1.0 where a token counts for the loss (response token and loss-mask true), else 0.0.
    pub mask: Tensor,
}

pub struct ScoreRequest<'a> {
    pub prompt: &'a [u32],
    pub response: &'a [u32],
    /// Per response token: false for tokens the policy did not generate (retrieved
    /// observations). `None` = every response token counts.
    pub loss_mask: Option<&'a [bool]>,
}

/// Scores a micro-batch. `temperature` divides the logits as the sampler did, so the
/// log-probs match the rollout distribution (verl's convention). Rows that share a prompt (a
/// GRPO group, Knowledgeable-R1's re-scored rows) run it once: [`score_shared`].
pub fn score(lm: &DecoderLm, reqs: &[ScoreRequest], temperature: f64, mode: Mode) -> Scored {
    let (unique, _) = distinct(reqs.iter().map(|q| q.prompt));
    if unique.len() < reqs.len() && reqs.iter().all(|q| q.prompt.len() > 1) {
        shared(lm, reqs, temperature, mode)
    } else {
        score_packed(lm, reqs, temperature, mode)
    }
}

/// The distinct token sequences of `seqs` (first-appearance order) and, per sequence, the index
/// of its copy among them.
fn distinct<'a>(seqs: impl IntoIterator<Item = &'a [u32]>) -> (Vec<&'a [u32]>, Vec<i64>) {
    let mut index: std::collections::HashMap<&[u32], i64> = std::collections::HashMap::new();
    let mut unique = vec![];
    let rows = seqs
        .into_iter()
        .map(|s| {
            *index.entry(s).or_insert_with(|| {
                unique.push(s);
                unique.len() as i64 - 1
            })
        })
        .collect();
    (unique, rows)
}

/// Every row as one right-padded sequence prompt ‖ response.
pub fn score_packed(lm: &DecoderLm, reqs: &[ScoreRequest], temperature: f64, mode: Mode) -> Scored {
    let dev = lm.device();
    let seqs: Vec<Vec<u32>> = reqs.iter().map(|q| [q.prompt, q.response].concat()).collect();
    let batch = PackedBatch::new(&seqs, dev);
    // Row i's response token t sits at p_i + t and is predicted by the hidden state at p_i + t - 1,
    // which is real token start_i + p_i + t - 1 of the packed (padding-free) hidden states.
    let mut src = vec![];
    let mut start = 0i64;
    for (q, seq) in reqs.iter().zip(&seqs) {
        let p = q.prompt.len() as i64;
        assert!(p > 0, "score: empty prompt");
        src.extend((0..q.response.len() as i64).map(|t| start + p + t - 1));
        start += seq.len() as i64;
    }
    let packing = Packing::new(&batch.lens, batch.width, dev);
    let hidden = lm.forward_packed(&batch.ids, &batch.positions, &batch.mask, &packing, mode);
    let h = hidden.index_select(0, &Tensor::from_slice(&src).to_device(dev));
    response_scores(lm, h, reqs, temperature)
}

/// Shared-prefix scoring: each distinct prefix runs once ([`DecoderLm::forward_prefix`]); every
/// row then runs the rest of its sequence attending to its prefix's keys/values. A row's prefix
/// is its prompt minus the last token, or, where another row has the same prompt and the same
/// response up to the end of one of this row's observations (loss-masked runs), the sequence up
/// to that observation's last token: the samples of a group that issued the same search and got
/// the same passages. Same values and gradients as [`score_packed`] (tested), with each shared
/// prefix computed once instead of once per row.
pub fn score_shared(lm: &DecoderLm, reqs: &[ScoreRequest], temperature: f64, mode: Mode) -> Scored {
    assert!(reqs.iter().all(|q| q.prompt.len() > 1), "score_shared: prompts need 2+ tokens");
    shared(lm, reqs, temperature, mode)
}

/// Each row's prefix length (tokens of prompt ‖ response), as [`score_shared`] chooses it: the
/// furthest observation end e (response[e-1] masked, response[e] not) whose prompt ‖
/// response[..e] m rows repeat, where sharing those e tokens saves more than running the prompt
/// once more in a prefix of its own ((m − 1)·e > prompt length); else the prompt. The prefix
/// stops one token short (that token starts the row's own continuation). The test matters for
/// BRIDGE: its k candidates of a turn share the history as their prompt, and two samples with
/// one history share each candidate passage d (e = |d|); a prefix per passage would run the
/// history k times to save one |d| each.
fn prefix_lens(reqs: &[ScoreRequest]) -> Vec<usize> {
    let ends = |q: &ScoreRequest| -> Vec<usize> {
        let Some(m) = q.loss_mask else { return vec![] };
        (1..q.response.len().min(m.len())).filter(|&e| !m[e - 1] && m[e]).collect()
    };
    let mut seen: std::collections::HashMap<(&[u32], &[u32]), usize> = std::collections::HashMap::new();
    for q in reqs {
        for e in ends(q) {
            *seen.entry((q.prompt, &q.response[..e])).or_default() += 1;
        }
    }
    reqs.iter()
        .map(|q| {
            let saves = |e: usize| (seen[&(q.prompt, &q.response[..e])] - 1) * e > q.prompt.len();
            let e = ends(q).into_iter().rev().find(|&e| saves(e)).unwrap_or(0);
            q.prompt.len() + e - 1
        })
        .collect()
}

/// [`score_shared`] without the check.
fn shared(lm: &DecoderLm, reqs: &[ScoreRequest], temperature: f64, mode: Mode) -> Scored {
    let dev = lm.device();
    let seqs: Vec<Vec<u32>> = reqs.iter().map(|q| [q.prompt, q.response].concat()).collect();
    let plen = prefix_lens(reqs);
    let (unique, rows) = distinct(seqs.iter().zip(&plen).map(|(s, &n)| &s[..n]));
    let prefixes: Vec<Vec<u32>> = unique.iter().map(|u| u.to_vec()).collect();
    let pre = PackedBatch::new(&prefixes, dev);
    let (kv, pre_hidden) = lm.forward_prefix(&pre.ids, &pre.positions, &pre.mask, mode);
    // The prefixes' work for the rows that repeat one: tokens and causal attention pairs.
    let (mut tokens, mut pairs) = (0i64, 0i64);
    for (n, sign) in plen.iter().map(|&n| (n as i64, 1)).chain(unique.iter().map(|u| (u.len() as i64, -1))) {
        tokens += sign * n;
        pairs += sign * n * (n + 1) / 2;
    }
    crate::flops::add_shared(lm.forward_flops(tokens, pairs, 0, kv.backward_passes(lm)));
    // Continuation of row i: its sequence after the prefix, minus the last token (it predicts
    // nothing); at least one token.
    let conts: Vec<&[u32]> = seqs.iter().zip(&plen).map(|(s, &n)| &s[n..(s.len() - 1).max(n + 1)]).collect();
    let (b, t, pw) = (reqs.len(), conts.iter().map(|c| c.len()).max().unwrap_or(1), pre.width);
    let (mut ids, mut pos, mut mask) = (vec![0i64; b * t], vec![0i64; b * t], vec![false; b * t * (pw + t)]);
    // Hidden states predicting response tokens: the prefixes' [U·pw] rows, then the packed
    // continuations'.
    let (mut src, mut start, prefix_rows) = (vec![], 0usize, prefixes.len() * pw);
    for (i, c) in conts.iter().enumerate() {
        let p0 = plen[i]; // real prefix tokens of this row
        for q in 0..t {
            if q < c.len() {
                ids[i * t + q] = c[q] as i64;
            }
            pos[i * t + q] = (p0 + q) as i64;
            let m = &mut mask[(i * t + q) * (pw + t)..(i * t + q + 1) * (pw + t)];
            m[..p0].iter_mut().for_each(|x| *x = true);
            for (j, x) in m[pw..].iter_mut().enumerate() {
                *x = j == q || (j < q && j < c.len());
            }
        }
        // Response token q sits at p + q and is predicted by the hidden state at p + q - 1.
        let p = reqs[i].prompt.len();
        src.extend((0..reqs[i].response.len()).map(|q| match p + q - 1 {
            at if at < p0 => (rows[i] as usize * pw + at) as i64,
            at => (prefix_rows + start + at - p0) as i64,
        }));
        start += c.len();
    }
    let ids = Tensor::from_slice(&ids).view([b as i64, t as i64]).to_device(dev);
    let pos = Tensor::from_slice(&pos).view([b as i64, t as i64]).to_device(dev);
    let mask = Tensor::from_slice(&mask).view([b as i64, 1, t as i64, (pw + t) as i64]).to_device(dev);
    let rows = Tensor::from_slice(&rows).to_device(dev);
    let lens: Vec<usize> = conts.iter().map(|c| c.len()).collect();
    let packing = Packing::new(&lens, t, dev);
    let hidden = lm.forward_after_prefix(&ids, &pos, &mask, &kv, &rows, &packing, mode);
    // Prefix hidden states are needed only where a prefix reaches into a response.
    let all = match src.iter().any(|&i| (i as usize) < prefix_rows) {
        true => Tensor::cat(&[pre_hidden.reshape([-1, hidden.size()[1]]), hidden], 0),
        false => {
            src.iter_mut().for_each(|i| *i -= prefix_rows as i64);
            hidden
        }
    };
    let h = all.index_select(0, &Tensor::from_slice(&src).to_device(dev));
    response_scores(lm, h, reqs, temperature)
}

/// Rows of the LM head's output computed at once when scoring (~100 MB at a 49k vocabulary).
pub(crate) const HEAD_CHUNK: i64 = 512;

/// Log-probs and entropies from `h` [N, D]: the hidden states that predict each response token,
/// row by row. Only these go through the LM head.
fn response_scores(lm: &DecoderLm, h: Tensor, reqs: &[ScoreRequest], temperature: f64) -> Scored {
    response_scores_in(lm, h, reqs, temperature, HEAD_CHUNK, true)
}

/// `fused`: use [`crate::kernels::target_logprobs`] where it applies (float32 CPU logits); the tests
/// turn it off to compare against libtorch's ops.
fn response_scores_in(
    lm: &DecoderLm,
    h: Tensor,
    reqs: &[ScoreRequest],
    temperature: f64,
    chunk: i64,
    fused: bool,
) -> Scored {
    let dev = lm.device();
    let b = reqs.len() as i64;
    let r_max = reqs.iter().map(|q| q.response.len()).max().unwrap_or(0).max(1) as i64;
    let (mut dst, mut target_ids, mut keep) = (vec![], vec![], vec![0f32; (b * r_max) as usize]);
    // Masked tokens (observations, BRIDGE's documents) skip the LM head: their log-prob and
    // entropy are 0, and the mask drops them from every loss. `kept`: the rows of `h` that count.
    let (mut kept, mut row) = (vec![], 0i64);
    for (i, q) in reqs.iter().enumerate() {
        for (t, &tok) in q.response.iter().enumerate() {
            let counts = q.loss_mask.is_none_or(|m| m[t]);
            keep[(i as i64 * r_max) as usize + t] = f32::from(u8::from(counts));
            if counts {
                kept.push(row);
                dst.push(i as i64 * r_max + t as i64);
                target_ids.push(tok as i64);
            }
            row += 1;
        }
    }
    let h = if (kept.len() as i64) < row { h.index_select(0, &Tensor::from_slice(&kept).to_device(dev)) } else { h };
    let dst = Tensor::from_slice(&dst).to_device(dev);
    let targets = Tensor::from_slice(&target_ids).to_device(dev).unsqueeze(1);
    // The [N, vocab] log-softmax runs `chunk` rows at a time. Whole, it is one 300+ MB tensor
    // per step (plus as many for the entropy and the backward) whose size follows the completion
    // lengths, so glibc never reuses the freed block for the next step's: the heap grew by
    // ~2.8 GB of freshly zeroed pages per GRPO step (7.6% of the bench's CPU time in
    // clear_page). Equal-sized chunks reuse the same blocks and never exist all at once for
    // the entropy.
    let (mut lp, mut ent) = (vec![], vec![]);
    let n = h.size()[0];
    let starts: Vec<i64> = if n == 0 { vec![0] } else { (0..n).step_by(chunk as usize).collect() };
    let inv_t = if temperature > 0.0 { 1.0 / temperature } else { 1.0 };
    // A frozen float32 head on the CPU (LoRA runs) keeps its [len, V] logits out of autograd:
    // ∂ log p(y)/∂h = −(q · W)/t is computed here, one MKL product, and rides on a zero-valued
    // h · g term. Autograd's way (the logits' product with q, then the head's backward-data
    // through oneDNN) took 832 ms a 512-row chunk against 406 for the forward and this product.
    let frozen_head = fused && h.requires_grad() && lm.head_is_frozen_f32_cpu();
    for start in starts {
        let len = chunk.min(n - start);
        let ids = &target_ids[start as usize..(start + len) as usize];
        let h_chunk = h.narrow(0, start, len);
        if frozen_head {
            let logits = tch::no_grad(|| lm.logits(&h_chunk));
            let (value, entropy, q) = target_logprobs(&logits, ids, inv_t as f32, true).expect("f32 CPU logits");
            drop(logits);
            let g = lm.head_input_grad(&q.expect("asked for q")).expect("a frozen f32 CPU head") * -inv_t;
            let carrier = (&h_chunk * &g).sum_dim_intlist(-1, false, Kind::Float);
            lp.push(value + (&carrier - carrier.detach()));
            ent.push(entropy);
            continue;
        }
        let logits = lm.logits(&h_chunk);
        let one_pass = fused.then(|| target_logprobs(&logits, ids, inv_t as f32, logits.requires_grad())).flatten();
        if let Some((value, entropy, q)) = one_pass {
            // ∂ log p(y)/∂ logits = −q/t rides on a term whose value is exactly zero.
            let lp_chunk = match q {
                Some(q) => {
                    // A row-wise product and sum: its backward is one pass (grad · q); a batched
                    // dot (bmm) was 0.3 s slower per GRPO step in MKL.
                    let carrier = (&logits * &q).sum_dim_intlist(-1, false, Kind::Float) * -inv_t;
                    value + (&carrier - carrier.detach())
                }
                None => value,
            };
            lp.push(lp_chunk);
            ent.push(entropy);
            continue;
        }
        let logits = if temperature > 0.0 && temperature != 1.0 { logits / temperature } else { logits };
        let logp_all = logits.log_softmax(-1, logits.kind());
        lp.push(logp_all.gather(1, &targets.narrow(0, start, len), false).squeeze_dim(1));
        ent.push(tch::no_grad(|| -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, logp_all.kind())));
    }
    let (lp, ent) = (Tensor::cat(&lp, 0), Tensor::cat(&ent, 0));
    let scatter =
        |v: &Tensor| Tensor::zeros([b * r_max], (v.kind(), dev)).index_put(&[Some(&dst)], v, false).view([b, r_max]);
    Scored {
        logprobs: scatter(&lp),
        entropy: scatter(&ent),
        mask: Tensor::from_slice(&keep).to_device(dev).view([b, r_max]).to_kind(lp.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DecoderConfig;
    use crate::{LoadOptions, Policy};

    /// A one-layer Llama with tied embeddings: the LM head under test is the embedding matrix.
    fn tiny_tied_lm(vocab: i64, dtype: Kind, seed: i64) -> Policy {
        let v = serde_json::json!({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
            "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64, "tie_word_embeddings": true,
        });
        let cfg = DecoderConfig::from_value(std::path::Path::new("config.json"), v).unwrap();
        Policy::random(&cfg, &LoadOptions { dtype, ..Default::default() }, seed)
    }

    /// Two responses to the same one-token prompt; the second with an observation token masked.
    fn two_requests<'a>(r1: &'a [u32], r2: &'a [u32], m2: &'a [bool]) -> [ScoreRequest<'a>; 2] {
        [
            ScoreRequest { prompt: &[1], response: r1, loss_mask: None },
            ScoreRequest { prompt: &[1], response: r2, loss_mask: Some(m2) },
        ]
    }

    /// The LM head in row chunks gives the same log-probs, entropies and gradients as in one piece.
    /// Prefixes reach the furthest observation end (a loss-masked run followed by a kept token)
    /// that other rows repeat often enough to save work; otherwise the prompt minus its last token.
    #[test]
    fn prefixes_reach_the_furthest_shared_observation_that_saves_work() {
        let (a, b): (&[u32], &[u32]) = (&[1, 5], &[1, 3]);
        let (t, f) = (true, false);
        let reqs = [
            ScoreRequest { prompt: a, response: &[9, 30, 31, 10, 2], loss_mask: Some(&[t, f, f, t, t]) },
            ScoreRequest { prompt: a, response: &[9, 30, 31, 12], loss_mask: Some(&[t, f, f, t]) },
            ScoreRequest { prompt: a, response: &[9, 30, 31, 10, 40, 14], loss_mask: Some(&[t, f, f, t, f, t]) },
            ScoreRequest { prompt: a, response: &[9, 30, 31, 10, 40, 15], loss_mask: Some(&[t, f, f, t, f, t]) },
            ScoreRequest { prompt: b, response: &[9, 30, 31, 10], loss_mask: Some(&[t, f, f, t]) },
            ScoreRequest { prompt: a, response: &[9, 30, 31], loss_mask: Some(&[t, f, f]) },
            ScoreRequest { prompt: a, response: &[7, 30, 11], loss_mask: Some(&[t, f, t]) },
            ScoreRequest { prompt: a, response: &[7, 30, 12], loss_mask: Some(&[t, f, t]) },
        ];
        // a ‖ [9, 30, 31]: 4 rows (rows 0-3), 3·3 tokens saved > 2; rows 2, 3 go on to
        // a ‖ [9, 30, 31, 10, 40] (1·5 > 2). Row 4's prompt is alone; row 5 ends on its
        // observation; rows 6, 7 share a ‖ [7, 30], which saves 1·2 tokens, not more than the prompt.
        assert_eq!(prefix_lens(&reqs), vec![2 + 3 - 1, 2 + 3 - 1, 2 + 5 - 1, 2 + 5 - 1, 1, 1, 1, 1]);
    }

    #[test]
    fn chunked_head_equals_the_whole() {
        let p = tiny_tied_lm(50, Kind::Double, 3);
        let (r1, r2, m2) = (vec![4u32, 5, 6, 7, 8], vec![9u32, 10, 11], vec![true, false, true]);
        let reqs = two_requests(&r1, &r2, &m2);
        let run = |chunk: i64| {
            // 8 rows: one hidden state per response token.
            let h = Tensor::arange(128, (Kind::Double, tch::Device::Cpu)).view([8, 16]).sin().set_requires_grad(true);
            let s = response_scores_in(&p.lm, h.shallow_clone(), &reqs, 0.7, chunk, true);
            (&s.logprobs * &s.mask).sum(Kind::Double).backward();
            (s.logprobs.detach(), s.entropy, h.grad())
        };
        let (whole, chunked) = (run(512), run(3));
        assert!(whole.0.allclose(&chunked.0, 1e-12, 1e-12, false));
        assert!(whole.1.allclose(&chunked.1, 1e-12, 1e-12, false));
        assert!(whole.2.allclose(&chunked.2, 1e-12, 1e-12, false));
        assert!(whole.2.abs().sum(Kind::Double).double_value(&[]) > 0.0);
    }

    /// Masked tokens skip the head: kept tokens score as with no mask (values and ∂/∂h), masked
    /// ones are 0 with no gradient.
    #[test]
    fn masked_tokens_skip_the_head_and_kept_ones_score_as_unmasked() {
        let p = tiny_tied_lm(50, Kind::Double, 3);
        let (r1, r2, m2, all) = (vec![4u32, 5, 6, 7, 8], vec![9u32, 10, 11], vec![true, false, true], vec![true; 3]);
        let run = |m: &[bool]| {
            let reqs = two_requests(&r1, &r2, m);
            let h = Tensor::arange(128, (Kind::Double, tch::Device::Cpu)).view([8, 16]).sin().set_requires_grad(true);
            let s = response_scores_in(&p.lm, h.shallow_clone(), &reqs, 0.7, 512, true);
            (&s.logprobs * &s.mask).sum(Kind::Double).backward();
            (s.logprobs.detach(), s.entropy, h.grad(), s.mask)
        };
        let (masked, full) = (run(&m2), run(&all));
        let keep = &masked.3;
        assert!((&masked.0 - &full.0 * keep).abs().max().double_value(&[]) < 1e-12);
        assert!((&masked.1 - &full.1 * keep).abs().max().double_value(&[]) < 1e-12);
        // h row 6 predicts row 2's masked token: no gradient there, the others' as unmasked.
        let rows = |g: &Tensor, r: &[i64]| g.index_select(0, &Tensor::from_slice(r));
        assert!(rows(&masked.2, &[6]).abs().max().double_value(&[]) == 0.0);
        let others = [0i64, 1, 2, 3, 4, 5, 7];
        assert!((rows(&masked.2, &others) - rows(&full.2, &others)).abs().max().double_value(&[]) < 1e-12);
        assert!(full.0.get(1).get(1).double_value(&[]) < 0.0, "the masked token has a log-prob when it counts");
    }

    /// The one-pass float32 head (crate::kernels::target_logprobs) gives libtorch's log-probs, entropies
    /// and gradients (to the hidden states and to the tied embedding), tempered and not; with the
    /// embedding frozen (a LoRA run's head), the gradient to h computed ahead of autograd
    /// (`DecoderLm::head_input_grad`) equals libtorch's too.
    #[test]
    fn one_pass_head_equals_libtorch_ops() {
        let p = tiny_tied_lm(300, Kind::Float, 5);
        let (r1, r2, m2) = (vec![4u32, 250, 6, 299, 8], vec![0u32, 10, 11], vec![true, false, true]);
        let reqs = two_requests(&r1, &r2, &m2);
        let embed = p.trainable_parameters().into_iter().find(|(n, _)| n.contains("embed_tokens")).unwrap().1;
        for frozen in [false, true] {
            let _ = embed.shallow_clone().set_requires_grad(!frozen);
            assert_eq!(p.lm.head_is_frozen_f32_cpu(), frozen);
            for temperature in [1.0, 0.7] {
                let run = |fused: bool| {
                    if !frozen {
                        embed.shallow_clone().zero_grad();
                    }
                    let h = (Tensor::arange(128, (Kind::Float, tch::Device::Cpu)).view([8, 16]).sin() * 3.0)
                        .set_requires_grad(true);
                    let s = response_scores_in(&p.lm, h.shallow_clone(), &reqs, temperature, 3, fused);
                    // Per-token weights, so a wrong row or sign in the gradient shows.
                    let w = Tensor::arange(10, (Kind::Float, tch::Device::Cpu)).view([2, 5]) - 4.0;
                    (&s.logprobs * &s.mask * w).sum(Kind::Float).backward();
                    let embed_grad =
                        if frozen { Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)) } else { embed.grad().copy() };
                    (s.logprobs.detach(), s.entropy, h.grad(), embed_grad)
                };
                let (ops, one) = (run(false), run(true));
                let d = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
                assert!(d(&ops.0, &one.0) < 1e-5, "log-probs off by {}", d(&ops.0, &one.0));
                assert!(d(&ops.1, &one.1) < 1e-5, "entropies off by {}", d(&ops.1, &one.1));
                assert!(d(&ops.2, &one.2) < 1e-4, "∂/∂h off by {} (frozen {frozen})", d(&ops.2, &one.2));
                assert!(d(&ops.3, &one.3) < 1e-4, "∂/∂embedding off by {}", d(&ops.3, &one.3));
                assert!(
                    one.2.abs().sum(Kind::Float).double_value(&[]) > 1e-3 && one.1.max().double_value(&[]) > 1.0,
                    "trivial case"
                );
            }
        }
    }
}
