//! A process-wide count of the decoder's weight-GEMM FLOPs, for the compute floor of a training
//! step (`knowrl bench world-speed`): each forward adds 2 × (its weights' multiply-adds) per
//! token it runs; when autograd records the forward, the backward's GEMMs are added with it:
//! the activation gradients (one more forward's worth) and, when the base weights train, the
//! weight gradients (another). Unpacked batches (generation) count their padding too. Not counted: attention's score and value products (~5% of a
//! SmolLM2 layer at a few hundred tokens), LoRA's rank-r products, the retriever's encoder.
use std::sync::atomic::{AtomicU64, Ordering};

static FLOPS: AtomicU64 = AtomicU64::new(0);

/// Adds a forward of `tokens` rows through weights of `macs_per_token` multiply-adds.
/// `backward_passes`: 0 without autograd, 1 for activation gradients only (frozen weights,
/// LoRA), 2 with weight gradients as well.
pub fn add_forward(tokens: i64, macs_per_token: f64, backward_passes: u32) {
    let f = 2.0 * tokens.max(0) as f64 * macs_per_token * (1 + backward_passes) as f64;
    FLOPS.fetch_add(f as u64, Ordering::Relaxed);
}

/// FLOPs counted since the process started.
pub fn total() -> f64 {
    FLOPS.load(Ordering::Relaxed) as f64
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forward_with_its_backward_counts_each_pass() {
        let before = super::total();
        super::add_forward(10, 100.0, 0);
        super::add_forward(10, 100.0, 2);
        // 2·10·100 for the forward alone, three times that with two backward passes.
        assert_eq!(super::total() - before, 2000.0 + 6000.0);
    }
}
