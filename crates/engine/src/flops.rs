//! A process-wide count of the decoder's matmul FLOPs, for the compute floor of a training
//! step (`knowrl bench world-speed`).
//! - Weight GEMMs: each forward adds 2 × (its weights' multiply-adds) per token it runs; when
//!   autograd records the forward, the backward's GEMMs are added with it: the activation
//!   gradients (one more forward's worth) and, when the base weights train, the weight
//!   gradients (another). Generation feeds and scored responses are packed, so their padding
//!   is neither computed nor counted; a decode step counts every cache row it runs, and the
//!   shared prompt prefixes of scoring run (and count) padded.
//! - Attention's score and value products (QKᵀ and PV): 4 × heads × head_dim per layer per
//!   (query, visible key) pair of a real query token, counted from the mask on CPU; the backward
//!   (dQ, dK, dV, dP) adds twice that. With a few hundred keys they are 10–20% of a SmolLM2
//!   layer's FLOPs. On CUDA they are not counted (counting reads the mask back, a device sync).
//!
//! Not counted: LoRA's rank-r products, the retriever's encoder.
//!
//! Shared work is counted apart ([`add_shared`]): rows that repeat another row's prompt
//! (scoring) or history and block (generation) are not computed. `total() + shared()` is the
//! step's nominal work, every row computed in full.
use std::sync::atomic::{AtomicU64, Ordering};

static WEIGHT_FLOPS: AtomicU64 = AtomicU64::new(0);
static ATTENTION_FLOPS: AtomicU64 = AtomicU64::new(0);
static SHARED_FLOPS: AtomicU64 = AtomicU64::new(0);

/// FLOPs of a forward of `tokens` rows through weights of `macs_per_token` multiply-adds.
/// `backward_passes`: 0 without autograd, 1 for activation gradients only (frozen weights,
/// LoRA), 2 with weight gradients as well.
pub fn forward(tokens: i64, macs_per_token: f64, backward_passes: u32) -> f64 {
    2.0 * tokens.max(0) as f64 * macs_per_token * (1 + backward_passes) as f64
}

/// FLOPs of attention over `pairs` (query, visible key) pairs in each of `layers` layers of
/// `heads × head_dim` query width; `with_backward` when autograd records it.
pub fn attention_products(pairs: i64, layers: usize, width: i64, with_backward: bool) -> f64 {
    let passes = if with_backward { 3.0 } else { 1.0 };
    4.0 * pairs.max(0) as f64 * width as f64 * layers as f64 * passes
}

/// Adds a computed forward ([`forward`]).
pub fn add_forward(tokens: i64, macs_per_token: f64, backward_passes: u32) {
    WEIGHT_FLOPS.fetch_add(forward(tokens, macs_per_token, backward_passes) as u64, Ordering::Relaxed);
}

/// Adds computed attention products ([`attention_products`]).
pub fn add_attention(pairs: i64, layers: usize, width: i64, with_backward: bool) {
    ATTENTION_FLOPS.fetch_add(attention_products(pairs, layers, width, with_backward) as u64, Ordering::Relaxed);
}

/// Adds FLOPs that sharing saved: work of the step's rows that was copied, not computed.
pub fn add_shared(flops: f64) {
    SHARED_FLOPS.fetch_add(flops.max(0.0) as u64, Ordering::Relaxed);
}

/// FLOPs saved by sharing since the process started (not in [`total`]).
pub fn shared() -> f64 {
    SHARED_FLOPS.load(Ordering::Relaxed) as f64
}

/// FLOPs counted since the process started: weight GEMMs and attention products.
pub fn total() -> f64 {
    weights() + attention()
}

/// The weight GEMMs' share of [`total`].
pub fn weights() -> f64 {
    WEIGHT_FLOPS.load(Ordering::Relaxed) as f64
}

/// The attention products' share of [`total`].
pub fn attention() -> f64 {
    ATTENTION_FLOPS.load(Ordering::Relaxed) as f64
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forward_with_its_backward_counts_each_pass() {
        let (w0, a0) = (super::weights(), super::attention());
        super::add_forward(10, 100.0, 0);
        super::add_forward(10, 100.0, 2);
        // 2·10·100 for the forward alone, three times that with two backward passes.
        assert_eq!(super::weights() - w0, 2000.0 + 6000.0);
        // 6 pairs × 2 layers × width 8: 4·6·8·2 = 384 forward, three times that with the backward.
        super::add_attention(6, 2, 8, false);
        super::add_attention(6, 2, 8, true);
        assert_eq!(super::attention() - a0, 384.0 + 1152.0);
        let s0 = super::shared();
        super::add_shared(super::forward(10, 100.0, 0));
        assert_eq!((super::shared() - s0, super::weights() - w0), (2000.0, 8000.0), "shared work is counted apart");
    }
}
