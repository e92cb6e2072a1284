//! x·Wᵀ (+ b) over many rows of f32 on CPU through oneDNN, as the 1×1 convolution it is.
//!
//! Why: libtorch's `linear` and `matmul` on CPU call MKL's sgemm, and MKL picks its kernels by
//! CPU vendor. On an AMD EPYC with full-width AVX-512 (Zen 5) it runs its AVX2 kernels: ~200
//! GFLOP/s on 2 cores, where oneDNN (inside the same libtorch, dispatching on CPU features)
//! reaches ~450 on the same shapes, forward and backward
//! (`experiments/world-v2/onednn_gemm.py`). libtorch reaches oneDNN's GEMM from autograd only
//! through convolution: a 1×1 convolution of the channels-last view [1, k, rows, 1] of x is
//! x·Wᵀ, with x and y in their row-major memory (no copies), and its backward is oneDNN's too.
//! (`mkldnn_linear` needs oneDNN's own tensor layout; the output's reorder back cost more than
//! the GEMM saved.)
//!
//! Which library runs the many-row products is decided once per process ([`backend`]).
use tch::Tensor;

/// The library that runs many-row f32 CPU products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmBackend {
    /// libtorch's `linear` (MKL's sgemm).
    Mkl,
    /// A 1×1 convolution (oneDNN).
    OneDnn,
}

/// This process's backend: `KNOWRL_GEMM=mkl` or `onednn` when set, else oneDNN on x86 CPUs
/// that are not Intel's (MKL runs its slower non-Intel path there; measured faster on an AMD
/// EPYC with AVX-512, and there with both libraries capped at AVX2) and MKL on Intel's (its AVX-512 kernels; oneDNN not measured
/// there). Another value of `KNOWRL_GEMM` is reported once and ignored.
pub fn backend() -> GemmBackend {
    static BACKEND: std::sync::OnceLock<GemmBackend> = std::sync::OnceLock::new();
    *BACKEND.get_or_init(|| match std::env::var("KNOWRL_GEMM").as_deref() {
        Ok("mkl") => GemmBackend::Mkl,
        Ok("onednn") => GemmBackend::OneDnn,
        Ok(other) => {
            eprintln!("warning: KNOWRL_GEMM={other:?} is not mkl or onednn; using the CPU's default");
            default_backend()
        }
        Err(_) => default_backend(),
    })
}

fn default_backend() -> GemmBackend {
    if cpu_vendor().is_some_and(|v| v != "GenuineIntel") {
        GemmBackend::OneDnn
    } else {
        GemmBackend::Mkl
    }
}

/// CPUID leaf 0's vendor string ("GenuineIntel", "AuthenticAMD", ..).
#[cfg(target_arch = "x86_64")]
pub fn cpu_vendor() -> Option<String> {
    let r = std::arch::x86_64::__cpuid(0);
    let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx].iter().flat_map(|v| v.to_le_bytes()).collect();
    String::from_utf8(bytes).ok()
}

#[cfg(not(target_arch = "x86_64"))]
pub fn cpu_vendor() -> Option<String> {
    None
}

/// Smallest row count, input and output width routed here: below them (a decode step's rows,
/// a LoRA adapter's rank-16 side) MKL's call overhead is lower (timed in the experiment above).
const MIN_ROWS: i64 = 65;
const MIN_WIDTH: i64 = 128;

/// x [.., k] · w [n, k]ᵀ (+ bias [n]) as a 1×1 convolution, when the backend is oneDNN and the
/// shape is a large f32 CPU product (and, without AVX-512, w does not train); `None`
/// otherwise. Differentiable in x, w and bias.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
    if backend() != GemmBackend::OneDnn {
        return None;
    }
    if trained_weight_on_mkl() && super::needs_grad(&[w]) {
        return None;
    }
    linear_conv(x, w, bias)
}

/// Whether products whose weight trains stay on MKL: everywhere but on AVX-512 CPUs. oneDNN's
/// 1×1 weight-gradient kernel is slower than MKL's sgemm there too, but its forward gains more
/// (full fine-tuning, `bench grpo`'s step: AVX-512 AMD 10.1–10.7 s all on MKL, 9.5–10.1 on
/// oneDNN, 10.4–10.7 with trained weights on MKL; AVX2-only Zen 2 15.3–15.5 all on MKL, 20.0 on
/// oneDNN, 15.2–15.6 with trained weights on MKL). A frozen base under a LoRA trains no weight
/// here, so the world's RL steps keep every large product on oneDNN.
fn trained_weight_on_mkl() -> bool {
    crate::kernels::vmath::isa() != crate::kernels::vmath::Isa::Avx512
}

/// The convolution itself, whatever the backend (tests compare it with `Tensor::linear`).
pub fn linear_conv(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
    if !super::f32_cpu(&[x, w]) || w.dim() != 2 || x.dim() < 1 {
        return None;
    }
    let (n, k) = (w.size()[0], w.size()[1]);
    let rows = x.numel() as i64 / k.max(1);
    if *x.size().last()? != k || rows < MIN_ROWS || k < MIN_WIDTH || n < MIN_WIDTH {
        return None;
    }
    // [rows, k] row-major is [1, k, rows, 1] channels-last; the output [1, n, rows, 1] in
    // channels-last is [rows, n] row-major, so the permute back and reshape are views.
    let x4 = x.contiguous().view([1, rows, 1, k]).permute([0, 3, 1, 2]);
    let w4 = w.contiguous().view([n, k, 1, 1]);
    let y = x4.conv2d(&w4, bias, [1, 1], [0, 0], [1, 1], 1);
    let mut shape = x.size();
    *shape.last_mut().unwrap() = n;
    Some(y.permute([0, 2, 3, 1]).reshape(shape.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Values and gradients (x, w, bias) of the convolution equal `Tensor::linear`'s, for a 3-D
    /// input and a bias; the output is row-major contiguous.
    #[test]
    fn a_one_by_one_convolution_is_linear_with_its_gradients() {
        tch::manual_seed(3);
        let f = (Kind::Float, Device::Cpu);
        let x = Tensor::randn([3, 50, 160], f).set_requires_grad(true);
        let w = (Tensor::randn([200, 160], f) * 0.1).set_requires_grad(true);
        let b = Tensor::randn([200], f).set_requires_grad(true);
        let g = Tensor::randn([3, 50, 200], f);
        let y = linear_conv(&x, &w, Some(&b)).expect("a large f32 product");
        assert_eq!(y.size(), [3, 50, 200]);
        assert!(y.is_contiguous());
        let grads = |y: &Tensor| {
            let gs = Tensor::run_backward(&[(y * &g).sum(Kind::Float)], &[&x, &w, &b], false, false);
            gs.into_iter().map(|t| t.detach()).collect::<Vec<_>>()
        };
        let reference = x.linear(&w, Some(&b));
        assert!(
            y.allclose(&reference, 1e-4, 1e-4, false),
            "values: max diff {}",
            (&y - &reference).abs().max().double_value(&[])
        );
        for (name, (a, r)) in ["x", "w", "bias"].iter().zip(grads(&y).iter().zip(grads(&reference).iter())) {
            let diff = (a - r).abs().max().double_value(&[]);
            assert!(a.allclose(r, 1e-3, 1e-3, false), "grad of {name}: max diff {diff}");
        }
        // Outside its shapes it declines: few rows, a narrow side, another dtype.
        assert!(linear_conv(&Tensor::randn([64, 160], f), &w.detach(), None).is_none());
        assert!(linear_conv(&Tensor::randn([100, 160], f), &Tensor::randn([16, 160], f), None).is_none());
        assert!(linear_conv(&Tensor::randn([100, 160], (Kind::Double, Device::Cpu)), &w.detach(), None).is_none());
    }
}
