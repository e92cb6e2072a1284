//! The memory model of an RL step: what the weights, the optimiser, the rollout's KV cache and
//! the training micro-batch's activations take, from the architecture and the step's shapes.
//! `knowrl bench memory` checks it against measured peak RSS on CPU with random-init models;
//! docs/gpu.md applies it to the GPU presets. Bytes throughout.
use crate::config::DecoderConfig;

/// The shapes of one RL step on one device.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Rows decoded together (prompts × samples), their prompt tokens, and the tokens each
    /// reaches (prompt + response).
    pub rollout_rows: i64,
    pub prompt_tokens: i64,
    pub rollout_tokens: i64,
    /// Sequences per training micro-batch and the tokens of each (prompt + response).
    pub micro_batch: i64,
    pub train_tokens: i64,
    /// The run's LoRA rank on every linear layer (None: a full fine-tune).
    pub lora_rank: Option<i64>,
    /// Bytes per weight and activation: 4 (f32) or 2 (bf16).
    pub dtype_bytes: i64,
    /// On CPU attention and its cache run in f32 whatever the dtype (`llama::attention_kind`).
    pub cpu: bool,
    /// A frozen reference copy (KL without LoRA, or a method that needs one).
    pub reference_copy: bool,
}

/// The model's predicted figures.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Estimate {
    pub parameters: f64,
    pub trainable_parameters: f64,
    pub weights: f64,
    /// Gradients, AdamW moments (f32) and, for a 16-bit full fine-tune, f32 master weights.
    pub optimiser: f64,
    pub reference: f64,
    /// The rollout's KV cache at its peak (while it doubles, the old and the new buffers).
    pub kv_cache: f64,
    /// The rollout's prefill transient (all rows' prompts through one block at a time).
    pub prefill: f64,
    /// While decoding: the LoRA-adapted f32 weights merged once more (`DecoderLm::merged_adapters`).
    pub merged_adapters: f64,
    /// Saved activations of one training micro-batch.
    pub activations: f64,
    /// The LM head's share while scoring: the probabilities kept per token, a chunk in flight.
    pub logits: f64,
    /// Weights + optimiser + reference + the larger of the rollout's and the update's own.
    pub peak: f64,
}

/// The score's LM-head chunk (rows at a time).
const HEAD_CHUNK: f64 = crate::score::HEAD_CHUNK as f64;

/// Parameters of a decoder (embeddings, attention, MLP, norms; the LM head when untied).
pub fn parameters(c: &DecoderConfig) -> f64 {
    let (h, i, v) = (c.hidden_size as f64, c.intermediate_size as f64, c.vocab_size as f64);
    let (q, kv) = ((c.num_heads * c.head_dim) as f64, (c.num_kv_heads * c.head_dim) as f64);
    let bias = if c.attention_bias { q + 2.0 * kv } else { 0.0 };
    let per_layer = h * q + 2.0 * h * kv + q * h + bias + 3.0 * h * i + 2.0 * h;
    let head = if c.tie_word_embeddings { 0.0 } else { v * h };
    v * h + head + c.num_layers as f64 * per_layer + h
}

/// LoRA parameters at rank r on every linear layer of every block.
pub fn lora_parameters(c: &DecoderConfig, r: i64) -> f64 {
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let (q, kv) = ((c.num_heads * c.head_dim) as f64, (c.num_kv_heads * c.head_dim) as f64);
    // A is r × in, B is out × r: r · (in + out) per linear.
    let per_layer = (h + q) + 2.0 * (h + kv) + (q + h) + 2.0 * (h + i) + (i + h);
    c.num_layers as f64 * r as f64 * per_layer
}

/// Saved activations per token per block of a training forward over sequences of `seq`
/// tokens (what autograd keeps for the backward): both RMSNorms' f32 input and output (4h
/// floats, the norms run in f32), q and the attention output and o_proj's input (3q), k and v
/// (2kv), the MLP's gate, up, SiLU and product (4i), the LoRA intermediates (r per linear), and
/// attention's own: on CPU libtorch's SDPA with a mask is the math kernel, which keeps the
/// probabilities (heads × seq floats a token); on CUDA the memory-efficient kernel keeps a
/// log-sum-exp per head.
pub fn activation_bytes_per_token_layer(c: &DecoderConfig, w: &Workload, seq: i64) -> f64 {
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let (q, kv) = ((c.num_heads * c.head_dim) as f64, (c.num_kv_heads * c.head_dim) as f64);
    let a = w.dtype_bytes as f64;
    let attn = if w.cpu { 4.0 } else { a };
    let lora = w.lora_rank.map_or(0.0, |r| 7.0 * r as f64 * a);
    let heads = c.num_heads as f64;
    let probs = if w.cpu { 4.0 * heads * seq as f64 } else { 4.0 * heads };
    4.0 * 4.0 * h + a * (q + 4.0 * i) + attn * (2.0 * q + 2.0 * kv) + probs + lora
}

/// A rollout's prefill transient (no autograd, one block at a time) per prompt token: the MLP's
/// gate, up and product (3i), the residual, norm and attention output (3h), and on CPU the
/// math kernel's scores and probabilities (2 × heads × prompt floats).
fn prefill_bytes_per_token(c: &DecoderConfig, w: &Workload, prompt: i64) -> f64 {
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let a = w.dtype_bytes as f64;
    let scores = if w.cpu { 2.0 * 4.0 * c.num_heads as f64 * prompt as f64 } else { 0.0 };
    a * (3.0 * i + 3.0 * h) + scores
}

/// The whole estimate.
pub fn estimate(c: &DecoderConfig, w: &Workload) -> Estimate {
    let p = parameters(c);
    let a = w.dtype_bytes as f64;
    let trainable = w.lora_rank.map_or(p, |r| lora_parameters(c, r));
    let weights = p * a + w.lora_rank.map_or(0.0, |_| trainable * 4.0);
    // LoRA trains in f32: gradient + m + v. A 16-bit full fine-tune: its gradient in 16 bits,
    // m + v + master in f32; an f32 one: gradient + m + v in f32.
    let optimiser = match (w.lora_rank, w.dtype_bytes) {
        (Some(_), _) => trainable * 12.0,
        (None, 4) => trainable * 12.0,
        (None, b) => trainable * (b as f64 + 12.0),
    };
    let reference = if w.reference_copy { p * a } else { 0.0 };
    let layers = c.num_layers as f64;
    let kv_bytes = if w.cpu { 4.0 } else { a };
    let kv_per_token = layers * 2.0 * (c.num_kv_heads * c.head_dim) as f64 * kv_bytes;
    // Capacity doubles from 64: the last growth holds the old buffer and the new (1.5× the new).
    let cap = (w.rollout_tokens as f64).max(64.0).log2().ceil().exp2();
    let kv_cache = w.rollout_rows as f64 * kv_per_token * cap * 1.5;
    let tokens = (w.micro_batch * w.train_tokens) as f64;
    let activations = tokens * layers * activation_bytes_per_token_layer(c, w, w.train_tokens);
    let prefill = (w.rollout_rows * w.prompt_tokens) as f64 * prefill_bytes_per_token(c, w, w.prompt_tokens);
    // Scoring keeps one f32 vocabulary row per token for the backward (the probabilities the
    // log-prob's gradient needs), plus a chunk's logits and log-softmax in flight. A frozen f32
    // head on the CPU (LoRA) takes its gradient in the forward: only a chunk's logits and
    // probabilities exist at once (`score`).
    let kept_rows = if w.lora_rank.is_some() && w.dtype_bytes == 4 && w.cpu { 0.0 } else { tokens };
    let logits = (kept_rows + 2.0 * HEAD_CHUNK.min(tokens)) * c.vocab_size as f64 * 4.0;
    let rollout_logits = 2.0 * w.rollout_rows as f64 * c.vocab_size as f64 * 4.0;
    // Merged only on a 32-bit base: every block's projections, one more copy.
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let (q, kv) = ((c.num_heads * c.head_dim) as f64, (c.num_kv_heads * c.head_dim) as f64);
    let projections = c.num_layers as f64 * (2.0 * h * q + 2.0 * h * kv + 3.0 * h * i);
    let merged_adapters = if w.lora_rank.is_some() && w.dtype_bytes == 4 { projections * 4.0 } else { 0.0 };
    let own = (kv_cache + prefill + merged_adapters + rollout_logits).max(activations + logits);
    Estimate {
        parameters: p,
        trainable_parameters: trainable,
        weights,
        optimiser,
        reference,
        kv_cache,
        prefill,
        merged_adapters,
        activations,
        logits,
        peak: weights + optimiser + reference + own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen25_0_5b() -> DecoderConfig {
        let v = serde_json::json!({
            "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
            "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768, "tie_word_embeddings": true,
        });
        DecoderConfig::from_value(std::path::Path::new("config.json"), v).unwrap()
    }

    #[test]
    fn parameter_counts_match_the_published_ones() {
        // Qwen2.5-0.5B: 494,032,768 parameters (its model card's 0.49B; q/k/v biases included).
        assert_eq!(parameters(&qwen25_0_5b()), 494_032_768.0);
        // LoRA r = 16 on the 7 linears of 24 blocks, as PEFT counts it: 8,798,208.
        assert_eq!(lora_parameters(&qwen25_0_5b(), 16), 8_798_208.0);
    }
}
