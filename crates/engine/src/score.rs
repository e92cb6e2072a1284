//! Teacher-forced scoring: per-token log-probs and entropy of responses given prompts.
//!
//! Prompt and response are passed separately, so the same response can be scored under a
//! different prompt (Knowledgeable-R1 scores query-only rollouts under the context prompt).
//! Only response positions go through the LM head, which keeps the [N, V] logits small.
use crate::layers::Mode;
use crate::models::llama::DecoderLm;
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
/// log-probs match the rollout distribution (verl's convention).
pub fn score(lm: &DecoderLm, reqs: &[ScoreRequest], temperature: f64, mode: Mode) -> Scored {
    let dev = lm.device();
    let b = reqs.len() as i64;
    let r_max = reqs.iter().map(|q| q.response.len()).max().unwrap_or(0).max(1) as i64;
    let seqs: Vec<Vec<u32>> = reqs.iter().map(|q| [q.prompt, q.response].concat()).collect();
    let batch = PackedBatch::new(&seqs, dev);
    let l = batch.width as i64;
    // Row i's response token t sits at p_i + t and is predicted by the hidden state at p_i + t - 1.
    let (mut src, mut dst, mut targets, mut keep) = (vec![], vec![], vec![], vec![0f32; (b * r_max) as usize]);
    for (i, q) in reqs.iter().enumerate() {
        let p = q.prompt.len() as i64;
        assert!(p > 0, "score: empty prompt");
        for (t, &tok) in q.response.iter().enumerate() {
            src.push(i as i64 * l + p + t as i64 - 1);
            dst.push(i as i64 * r_max + t as i64);
            targets.push(tok as i64);
            keep[(i as i64 * r_max) as usize + t] = q.loss_mask.map_or(1.0, |m| m[t] as u8 as f32);
        }
    }
    let hidden = lm.forward_hidden(&batch.ids, &batch.positions, &batch.mask, None, mode);
    let d = hidden.size()[2];
    let src = Tensor::from_slice(&src).to_device(dev);
    let dst = Tensor::from_slice(&dst).to_device(dev);
    let h = hidden.view([b * l, d]).index_select(0, &src);
    let logits = lm.logits(&h);
    let logits = if temperature > 0.0 && temperature != 1.0 { logits / temperature } else { logits };
    let logp_all = logits.log_softmax(-1, logits.kind());
    let targets = Tensor::from_slice(&targets).to_device(dev).unsqueeze(1);
    let lp = logp_all.gather(1, &targets, false).squeeze_dim(1);
    let ent = tch::no_grad(|| -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, logp_all.kind()));
    let scatter =
        |v: &Tensor| Tensor::zeros([b * r_max], (v.kind(), dev)).index_put(&[Some(&dst)], v, false).view([b, r_max]);
    Scored {
        logprobs: scatter(&lp),
        entropy: scatter(&ent),
        mask: Tensor::from_slice(&keep).to_device(dev).view([b, r_max]).to_kind(lp.kind()),
    }
}
