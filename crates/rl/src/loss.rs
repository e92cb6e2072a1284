//! Policy-gradient losses over a batch of scored responses, CleanRL-style: inputs are
//! [B, T] log-probs under the current policy (`logp`), at rollout time (`old`), under the
//! reference (`reference`), per-response advantages [B], and the loss mask [B, T].
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Mean over every valid token of the batch (DAPO's token-level loss).
    TokenMean,
    /// Mean over tokens within a response, then over responses (GRPO paper).
    SeqMeanTokenMean,
}

/// What a batch's summed loss is divided by: its loss tokens (token-mean) or its sequences
/// (sequence-mean). A micro- or mini-batch divides by its share of the whole batch's, so the
/// gradients of its parts add up to the batch's; Knowledgeable-R1's released code counts only
/// the generated responses, so a method may set its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normaliser {
    pub tokens: f64,
    pub sequences: f64,
}

impl Normaliser {
    /// The counts of a [B, T] mask itself (the batch is the whole batch).
    pub fn of_mask(mask: &Tensor) -> Normaliser {
        Normaliser { tokens: mask.sum(Kind::Float).double_value(&[]), sequences: mask.size()[0] as f64 }
    }
}

/// Aggregates a [B, T] per-token loss under `mask`: summed over tokens and divided by
/// `norm.tokens` (token-mean), or token-mean within each response, summed over responses and
/// divided by `norm.sequences`.
pub fn aggregate(per_token: &Tensor, mask: &Tensor, agg: Aggregation, norm: Normaliser) -> Tensor {
    match agg {
        Aggregation::TokenMean => (per_token * mask).sum(Kind::Float) / norm.tokens.max(1.0),
        Aggregation::SeqMeanTokenMean => {
            let per_seq = (per_token * mask).sum_dim_intlist(1, false, Kind::Float)
                / mask.sum_dim_intlist(1, false, Kind::Float).clamp_min(1.0);
            per_seq.sum(Kind::Float) / norm.sequences.max(1.0)
        }
    }
}

/// PPO's clipped surrogate per token: −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = π/π_old.
/// GRPO uses ε_low = ε_high = 0.2; DAPO decouples them (clip-higher, ε_high = 0.28).
/// Returns (per-token loss, per-token 1.0 where the clip was active).
pub fn clipped_surrogate(logp: &Tensor, old: &Tensor, adv: &Tensor, eps_low: f64, eps_high: f64) -> (Tensor, Tensor) {
    let ratio = (logp - old).exp();
    let a = adv.unsqueeze(-1);
    let unclipped = &ratio * &a;
    let clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * &a;
    let loss = -unclipped.minimum(&clipped);
    let active = clipped.lt_tensor(&unclipped).to_kind(Kind::Float);
    (loss, active)
}

/// GSPO (Zheng et al. 2025): one importance ratio per sequence, the geometric mean of the token
/// ratios s_i = exp(mean_t(log π − log π_old)), clipped per sequence; returns the per-sequence
/// loss [B] and the clipped indicator [B].
pub fn gspo_sequence_loss(
    logp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
) -> (Tensor, Tensor) {
    let mean_log_ratio = ((logp - old) * mask).sum_dim_intlist(1, false, Kind::Float)
        / mask.sum_dim_intlist(1, false, Kind::Float).clamp_min(1.0);
    let s = mean_log_ratio.exp();
    let unclipped = &s * adv;
    let clipped = s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv;
    (-unclipped.minimum(&clipped), clipped.lt_tensor(&unclipped).to_kind(Kind::Float))
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// k1 = log π − log π_ref.
    K1,
    /// k2 = ½ (log π − log π_ref)².
    K2,
    /// k3 = π_ref/π − log(π_ref/π) − 1 (Schulman's low-variance estimator; verl `low_var_kl`,
    /// clamped to [−10, 10] as verl does).
    LowVar,
}

/// Per-token KL estimate between the policy and the reference.
pub fn kl(logp: &Tensor, reference: &Tensor, est: KlEstimator) -> Tensor {
    let d = logp - reference;
    match est {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.square() * 0.5,
        KlEstimator::LowVar => {
            let r = -&d; // log(π_ref / π)
            (r.exp() - r - 1.0).clamp(-10.0, 10.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).view(shape)
    }

    #[test]
    fn clipped_surrogate_hand_computed() {
        // ratios e^{0.5} = 1.6487, e^{-0.5} = 0.6065, 1.0; advantages +1, +1, -2.
        let logp = t(&[0.5, -0.5, 0.0], &[3, 1]);
        let old = t(&[0.0, 0.0, 0.0], &[3, 1]);
        let adv = t(&[1.0, 1.0, -2.0], &[3]);
        let (l, clip) = clipped_surrogate(&logp, &old, &adv, 0.2, 0.2);
        let l: Vec<f32> = Vec::try_from(l.view(-1)).unwrap();
        // A>0, ρ=1.6487 → min(1.6487, 1.2) = 1.2 → loss −1.2 (clipped)
        // A>0, ρ=0.6065 → min(0.6065, 0.8) = 0.6065 → loss −0.6065 (not clipped: pessimistic side)
        // A<0, ρ=1 → −(−2) = 2
        assert!((l[0] + 1.2).abs() < 1e-6 && (l[1] + 0.606_530_7).abs() < 1e-6 && (l[2] - 2.0).abs() < 1e-6, "{l:?}");
        assert_eq!(Vec::<f32>::try_from(clip.view(-1)).unwrap(), vec![1.0, 0.0, 0.0]);
        // DAPO clip-higher: ε_high = 0.28 lets the first ratio reach 1.28.
        let (l, _) = clipped_surrogate(&logp, &old, &adv, 0.2, 0.28);
        assert!((l.double_value(&[0, 0]) + 1.28).abs() < 1e-6);
        // A<0 and ρ below 1−ε: min(ρA, clip(ρ)A) = min(−0.6065·2, −0.8·2) = −1.6 → loss 1.6.
        let (l, clip) = clipped_surrogate(&t(&[-0.5], &[1, 1]), &t(&[0.0], &[1, 1]), &t(&[-2.0], &[1]), 0.2, 0.28);
        assert!((l.double_value(&[0, 0]) - 1.6).abs() < 1e-6);
        assert_eq!(clip.double_value(&[0, 0]), 1.0);
    }

    #[test]
    fn aggregation_hand_computed() {
        let per = t(&[1.0, 2.0, 3.0, 4.0, 0.0, 0.0], &[2, 3]);
        let mask = t(&[1.0, 1.0, 1.0, 1.0, 0.0, 0.0], &[2, 3]);
        // token-mean: (1+2+3+4)/4 = 2.5; seq-mean-token-mean: (2 + 4)/2 = 3.
        assert!(
            (aggregate(&per, &mask, Aggregation::TokenMean, Normaliser::of_mask(&mask)).double_value(&[]) - 2.5).abs()
                < 1e-6
        );
        assert!(
            (aggregate(&per, &mask, Aggregation::SeqMeanTokenMean, Normaliser::of_mask(&mask)).double_value(&[]) - 3.0)
                .abs()
                < 1e-6
        );
        // As a part of a batch of 8 tokens in 4 responses: 10/8 = 1.25 and (2 + 4)/4 = 1.5.
        let batch = Normaliser { tokens: 8.0, sequences: 4.0 };
        assert!((aggregate(&per, &mask, Aggregation::TokenMean, batch).double_value(&[]) - 1.25).abs() < 1e-6);
        assert!((aggregate(&per, &mask, Aggregation::SeqMeanTokenMean, batch).double_value(&[]) - 1.5).abs() < 1e-6);
    }

    #[test]
    fn gspo_uses_the_geometric_mean_ratio() {
        // Token log-ratios 0.3 and −0.1 (third token masked): s = e^{0.1} = 1.10517 → within
        // [1−3e-4, 1+4e-4]? No: clipped to 1.0004; A = 1 → loss −1.0004, clipped.
        let logp = t(&[0.3, -0.1, 5.0], &[1, 3]);
        let old = t(&[0.0, 0.0, 0.0], &[1, 3]);
        let mask = t(&[1.0, 1.0, 0.0], &[1, 3]);
        let (l, c) = gspo_sequence_loss(&logp, &old, &t(&[1.0], &[1]), &mask, 3e-4, 4e-4);
        assert!((l.double_value(&[0]) + 1.0004).abs() < 1e-6);
        assert_eq!(c.double_value(&[0]), 1.0);
        let (l, _) = gspo_sequence_loss(&logp, &old, &t(&[1.0], &[1]), &mask, 0.2, 0.2);
        assert!((l.double_value(&[0]) + 0.1f64.exp()).abs() < 1e-5);
    }

    #[test]
    fn kl_estimators_hand_computed() {
        // log π − log π_ref = 0.2: k1 = 0.2, k2 = 0.02, k3 = e^{−0.2} + 0.2 − 1 = 0.018731.
        let lp = t(&[0.2], &[1]);
        let rf = t(&[0.0], &[1]);
        assert!((kl(&lp, &rf, KlEstimator::K1).double_value(&[0]) - 0.2).abs() < 1e-7);
        assert!((kl(&lp, &rf, KlEstimator::K2).double_value(&[0]) - 0.02).abs() < 1e-7);
        assert!((kl(&lp, &rf, KlEstimator::LowVar).double_value(&[0]) - 0.018_730_75).abs() < 1e-6);
        // Clamp: a huge gap is bounded at 10.
        assert_eq!(kl(&t(&[-20.0], &[1]), &rf, KlEstimator::LowVar).double_value(&[0]), 10.0);
    }
}
