//! The engine's own CPU kernels, for the shapes where libtorch's generic paths lose: a decode
//! step's few rows of x·Wᵀ (`small_gemm`), many rows of it through oneDNN where MKL runs its
//! slower non-Intel kernels (`onednn_linear`), one decode step's attention (`decode_attention`),
//! attention of many queries per row outside autograd (`prefill_attention`),
//! log p(target) + entropy over a vocabulary row (`target_logprobs`), and the loops they share
//! (`vmath`: dot, sum, max, exp), run on libtorch's OpenMP team (`omp`). The RMSNorm and AdamW
//! row loops use the same `vmath::simd_dispatch!`.
//!
//! One CPU-feature probe decides which copy runs, once per process: `vmath::isa()` (AVX-512,
//! AVX2 + FMA, or the portable baseline; `KNOWRL_ISA=avx2` caps it so the AVX2 copies are tested
//! on AVX-512 machines). Each kernel is compiled for every ISA by `simd_dispatch!`, so no call
//! site chooses. `unsafe` in the engine lives here (the vector intrinsics and the OpenMP FFI),
//! in the safetensors mmap and in the logits read.
pub mod decode_attention;
pub mod omp;
pub mod onednn_linear;
pub mod prefill_attention;
pub mod small_gemm;
pub mod target_logprobs;
pub mod vmath;

/// The first half of every kernel's guard: f32 tensors on the CPU (each kernel adds its shape
/// limits, and `None` sends the caller to libtorch).
pub fn f32_cpu(tensors: &[&tch::Tensor]) -> bool {
    tensors.iter().all(|t| t.device() == tch::Device::Cpu && t.kind() == tch::Kind::Float)
}

/// The second half, for kernels whose output autograd cannot see (`small_gemm`,
/// `decode_attention` write it directly): true when one of `inputs` requires a gradient and
/// grad mode is on, so the caller must take libtorch's path.
pub fn needs_grad(inputs: &[&tch::Tensor]) -> bool {
    if !inputs.iter().any(|t| t.requires_grad()) {
        return false;
    }
    // Reads grad mode (set and restore: libtorch's C API has no getter).
    // SAFETY: plain calls into libtorch's thread-local grad mode.
    let enabled = unsafe { torch_sys::at_grad_set_enabled(0) };
    unsafe { torch_sys::at_grad_set_enabled(enabled) };
    enabled != 0
}
