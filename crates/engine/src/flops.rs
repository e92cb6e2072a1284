//! A per-thread count of the decoder's matmul FLOPs (the thread that runs the model reads it),
//! for the compute floor of a training step (`knowrl bench world-speed`).
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
//! (scoring) or history and block (generation) are not computed. A [`Snapshot`]'s `total()` +
//! `shared` is the step's nominal work, every row computed in full.
//!
//! A roofline beside the FLOP count, once a bench sets the machine's balance
//! ([`set_machine_balance`]: GEMM FLOP/s ÷ memory bytes/s): each model call (the blocks of a
//! forward, the LM head) must also read its weights (once more for the backward's activation
//! gradients) and, for attention, the K/V of every key its rows see. A call with fewer FLOPs per
//! byte than the balance is memory-bound: its bytes, not its FLOPs, are its floor
//! ([`Snapshot::roofline_s`]). A decode step over a few rows streams all the weights for a
//! few GFLOP, which a FLOP floor prices at the GEMM rate.
use std::cell::Cell;

thread_local! {
    static COUNTS: Cell<Snapshot> = Cell::new(Snapshot::default());
    /// FLOPs per byte; 0: no roofline classification.
    static BALANCE: Cell<f64> = const { Cell::new(0.0) };
}

/// Every counter at one moment; the difference of two is what ran in between.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Weight GEMMs computed.
    pub weights: f64,
    /// Attention's score and value products computed.
    pub attention: f64,
    /// Work that sharing copied instead of computing (not in the two above).
    pub shared: f64,
    /// The roofline's split (0 without a machine balance): bytes of the memory-bound calls,
    /// FLOPs of the others.
    pub memory_bound_bytes: f64,
    pub compute_bound_flops: f64,
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            weights: self.weights - o.weights,
            attention: self.attention - o.attention,
            shared: self.shared - o.shared,
            memory_bound_bytes: self.memory_bound_bytes - o.memory_bound_bytes,
            compute_bound_flops: self.compute_bound_flops - o.compute_bound_flops,
        }
    }
}

impl Snapshot {
    /// Weight GEMMs and attention products computed.
    pub fn total(&self) -> f64 {
        self.weights + self.attention
    }

    /// The roofline floor at a `gflops` GEMM rate and `gb_s` memory bandwidth: the memory-bound
    /// calls' bytes at the bandwidth, the other calls' FLOPs at the GEMM rate.
    pub fn roofline_s(&self, gflops: f64, gb_s: f64) -> f64 {
        self.memory_bound_bytes / (gb_s * 1e9) + self.compute_bound_flops / (gflops * 1e9)
    }

    /// Adds a call of `flops` that must read `bytes`, split by `balance` (FLOPs per byte).
    fn add_call(&mut self, flops: f64, bytes: f64, balance: f64) {
        if flops < balance * bytes {
            self.memory_bound_bytes += bytes;
        } else {
            self.compute_bound_flops += flops;
        }
    }
}

fn update(f: impl FnOnce(&mut Snapshot)) {
    COUNTS.with(|c| {
        let mut s = c.get();
        f(&mut s);
        c.set(s);
    });
}

/// The counts of this thread since it started.
pub fn snapshot() -> Snapshot {
    COUNTS.with(Cell::get)
}

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

/// Adds computed weight-GEMM FLOPs ([`forward`]).
pub fn add_weights(flops: f64) {
    update(|s| s.weights += flops);
}

/// Adds computed attention products ([`attention_products`]).
pub fn add_attention(flops: f64) {
    update(|s| s.attention += flops);
}

/// Adds FLOPs that sharing saved: work of the step's rows that was copied, not computed.
pub fn add_shared(flops: f64) {
    update(|s| s.shared += flops.max(0.0));
}

/// Classifies this thread's later calls ([`add_call`]) by a machine balance: FLOPs per byte,
/// the GEMM rate over the memory bandwidth; 0 turns the roofline off.
pub fn set_machine_balance(flops_per_byte: f64) {
    BALANCE.with(|b| b.set(flops_per_byte.max(0.0)));
}

/// Whether this thread classifies calls for the roofline (a bench set a machine balance): the
/// model computes a call's bytes only then.
pub fn roofline_on() -> bool {
    BALANCE.with(Cell::get) > 0.0
}

/// A model call of `flops` FLOPs that must read at least `bytes` bytes, for the roofline.
pub fn add_call(flops: f64, bytes: f64) {
    let balance = BALANCE.with(Cell::get);
    if balance > 0.0 {
        update(|s| s.add_call(flops, bytes, balance));
    }
}

#[cfg(test)]
mod tests {
    // Counts are per thread, and each test runs on its own: the differences are this test's.
    #[test]
    fn a_forward_with_its_backward_counts_each_pass() {
        let s0 = super::snapshot();
        super::add_weights(super::forward(10, 100.0, 0));
        super::add_weights(super::forward(10, 100.0, 2));
        // 6 pairs × 2 layers × width 8: 4·6·8·2 = 384 forward, three times that with the backward.
        super::add_attention(super::attention_products(6, 2, 8, false));
        super::add_attention(super::attention_products(6, 2, 8, true));
        super::add_shared(super::forward(10, 100.0, 0));
        let d = super::snapshot() - s0;
        // 2·10·100 for the forward alone, three times that with two backward passes.
        assert_eq!((d.weights, d.attention, d.shared), (2000.0 + 6000.0, 384.0 + 1152.0, 2000.0));
        assert_eq!(d.total(), 8000.0 + 1536.0, "shared work is counted apart");
    }

    #[test]
    fn the_roofline_prices_a_call_by_its_bytes_under_the_balance() {
        let s0 = super::snapshot();
        super::add_call(1e9, 1e9); // no balance set: not classified
        assert_eq!(super::snapshot() - s0, super::Snapshot::default());
        super::set_machine_balance(4.0); // e.g. 200 GFLOP/s over 50 GB/s
        super::add_call(2e9, 1e9); // 2 FLOPs a byte: memory-bound, 1 GB
        super::add_call(8e9, 1e9); // 8 FLOPs a byte: compute-bound, 8 GFLOP
        let d = super::snapshot() - s0;
        assert_eq!((d.memory_bound_bytes, d.compute_bound_flops), (1e9, 8e9));
        // 1 GB at 50 GB/s + 8 GFLOP at 200 GFLOP/s = 0.02 + 0.04 s, where the FLOP floor says 0.05.
        assert!((d.roofline_s(200.0, 50.0) - 0.06).abs() < 1e-12);
    }
}
