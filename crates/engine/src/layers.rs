//! Building blocks shared by the decoder and the encoder: a linear layer with an optional LoRA
//! adapter, RMSNorm and LayerNorm. Parameters live in a tch `VarStore` under their Hugging Face
//! names, so checkpoints load and export without a renaming table.
use serde::{Deserialize, Serialize};
use tch::nn::{Init, Path};
use tch::Tensor;

/// How a forward pass runs. `adapters: false` turns every LoRA adapter off, which *is* the
/// frozen reference policy: KL to the reference costs a second forward pass but no second copy
/// of the weights.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    pub train: bool,
    pub adapters: bool,
}

impl Mode {
    pub const EVAL: Mode = Mode { train: false, adapters: true };
    pub const TRAIN: Mode = Mode { train: true, adapters: true };
    pub const REFERENCE: Mode = Mode { train: false, adapters: false };
}

/// LoRA hyper-parameters (Hu et al. 2021), PEFT's conventions: `scale = alpha / rank`,
/// A ~ kaiming-uniform(a=√5), B = 0 so the adapted model starts equal to the base.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    #[serde(default)]
    pub dropout: f64,
    /// Module names (last path component), e.g. ["q_proj", "v_proj"] or ["query", "value"].
    pub target_modules: Vec<String>,
}

impl LoraConfig {
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| t == module)
    }
}

/// transformers' default `initializer_range` (Llama, Qwen, BERT configs).
pub const INIT_STD: f64 = 0.02;

#[derive(Debug)]
pub struct LoraAdapter {
    pub a: Tensor, // [rank, in]
    pub b: Tensor, // [out, rank]
    pub scale: f64,
    pub dropout: f64,
}

#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor, // [out, in]
    pub bias: Option<Tensor>,
    pub lora: Option<LoraAdapter>,
    /// W + scale·B·A while a merged-adapter scope is open ([`Linear::merge_adapter`]):
    /// inference forwards then run one product instead of three.
    merged: std::sync::Mutex<Option<Tensor>>,
}

/// Whether a parameter name is a LoRA adapter's (`…lora_A.weight` / `…lora_B.weight`).
pub fn is_lora_param(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

impl Linear {
    /// `p` is the module's path (e.g. `model.layers.0.self_attn.q_proj`); `name` its last
    /// component, matched against the LoRA target list.
    /// `random`: transformers' `_init_weights` for Llama and BERT (weight ~ N(0, 0.02), bias 0;
    /// models built from scratch, e.g. the world policy); otherwise zeros, to be overwritten by
    /// a checkpoint without paying for a random fill of billions of weights. The previous
    /// PyTorch-`nn.Linear`-style uniform ±1/√in (std 0.051 at width 128) slowed learning to
    /// copy a name from the prompt ~2× in a side-by-side PyTorch run (copy-drill loss 3.6 vs
    /// 1.6 after 300 steps).
    pub fn new(p: &Path, name: &str, dims: (i64, i64), bias: bool, lora: Option<&LoraConfig>, random: bool) -> Linear {
        let (in_dim, out_dim) = dims;
        let p = p / name;
        let bound = 1.0 / (in_dim as f64).sqrt();
        let init = if random { Init::Randn { mean: 0.0, stdev: INIT_STD } } else { Init::Const(0.0) };
        let weight = p.var("weight", &[out_dim, in_dim], init);
        let bias = bias.then(|| p.var("bias", &[out_dim], Init::Const(0.0)));
        let lora = lora.filter(|c| c.targets(name)).map(|c| LoraAdapter {
            a: (&p / "lora_A").var("weight", &[c.rank, in_dim], Init::Uniform { lo: -bound, up: bound }),
            b: (&p / "lora_B").var("weight", &[out_dim, c.rank], Init::Const(0.0)),
            scale: c.alpha / c.rank as f64,
            dropout: c.dropout,
        });
        Linear { weight, bias, lora, merged: Default::default() }
    }

    /// Caches W + scale·B·A for inference forwards (adapters on, no gradient needed) until
    /// [`Linear::unmerge_adapter`]: a decode step's ~420 rank-r products become none, as in
    /// verl, whose rollout engine runs on merged LoRA weights. Only for f32/f64 bases: merged
    /// into 16 bits, a small update would round away (PEFT keeps the adapter's path in f32).
    /// The cache is the weights of the moment it is made; callers scope it (a decode session)
    /// so that no optimiser step falls inside.
    pub fn merge_adapter(&self) {
        if self.lora.is_some() && matches!(self.weight.kind(), tch::Kind::Float | tch::Kind::Double) {
            *self.merged.lock().unwrap() = Some(tch::no_grad(|| self.merged_weight()));
        }
    }

    pub fn unmerge_adapter(&self) {
        *self.merged.lock().unwrap() = None;
    }

    pub fn forward(&self, x: &Tensor, mode: Mode) -> Tensor {
        if let Some(y) = self.forward_merged(x, mode) {
            return y;
        }
        let l = match &self.lora {
            Some(l) if mode.adapters => l,
            _ => return linear(x, &self.weight, self.bias.as_ref()),
        };
        let xa = if mode.train && l.dropout > 0.0 { x.dropout(l.dropout, true) } else { x.shallow_clone() };
        // An f32 adapter on a 16-bit base: its path runs in f32, its output is cast back (PEFT).
        let xa = if xa.kind() == l.a.kind() { xa } else { xa.to_kind(l.a.kind()) };
        // The scale goes on the rank-r activations, not on the [N, out] product: a pass over
        // N·r floats instead of N·out (exactly the same values when the scale is a power of
        // two, as PEFT's usual α = 2r is). Through `linear` as the base weight is: a decode
        // step's few rows go to `small_gemm` too.
        let h = linear(&xa, &l.a, None) * l.scale;
        let d = *x.size().last().unwrap_or(&0);
        let rows = x.numel() as i64 / d.max(1);
        if h.kind() == self.weight.kind()
            && x.kind() == self.weight.kind()
            && rows > crate::kernels::small_gemm::MAX_ROWS
        {
            // Many rows (prefill, scoring, training): h·Bᵀ accumulates into the base product in
            // one GEMM (β = 1), with no [N, out] delta tensor and no add pass over it. On 7,000
            // tokens × 576 → 1,536 (2 cores) the adapter cost +55% over the base product as a
            // separate product and add, +10% accumulated.
            let base = linear(&x.reshape([rows, d]), &self.weight, self.bias.as_ref());
            let h = h.reshape([rows, l.a.size()[0]]);
            let y = if crate::kernels::needs_grad(&[&h, &l.b]) {
                // Under autograd the base product (a view when oneDNN made it) must not be
                // written in place: autograd would copy and zero-fill [N, out] around it in the
                // backward. h·Bᵀ is a fresh tensor that takes the base product in place instead:
                // a 1,360-token × 576 → 1,536 projection's forward + backward with the adapter
                // 37.2 → 33.8 ms (base alone 27.6; `experiments/world-v2/lora_forms.py`).
                let mut z = h.mm(&l.b.tr());
                z += base;
                z
            } else {
                let mut y = base;
                let _ = y.addmm_(&h, &l.b.tr());
                y
            };
            let mut shape = x.size();
            *shape.last_mut().unwrap() = self.weight.size()[0];
            return y.view(shape.as_slice());
        }
        let y = linear(x, &self.weight, self.bias.as_ref());
        let delta = linear(&h, &l.b, None).to_kind(y.kind());
        y + delta
    }

    /// The merged weight's product, when a scope holds one and nothing needs a gradient.
    fn forward_merged(&self, x: &Tensor, mode: Mode) -> Option<Tensor> {
        let l = self.lora.as_ref().filter(|_| mode.adapters && !mode.train)?;
        let merged = self.merged.lock().unwrap();
        let w = merged.as_ref()?;
        if crate::kernels::needs_grad(&[x, &l.a, &l.b]) {
            return None;
        }
        Some(linear(x, w, self.bias.as_ref()))
    }

    /// W + scale·B·A: the weight an exported (merged) checkpoint carries.
    pub fn merged_weight(&self) -> Tensor {
        match &self.lora {
            Some(l) => &self.weight + l.b.matmul(&l.a).to_kind(self.weight.kind()) * l.scale,
            None => self.weight.shallow_clone(),
        }
    }
}

/// x·Wᵀ + b. A decode step's few rows of f32 on CPU (outside autograd) go to
/// [`crate::kernels::small_gemm`] when the CPU has AVX-512 or AVX2+FMA; many rows go to oneDNN
/// where it is the faster library ([`crate::kernels::onednn_linear`]); other few rows of f32 on
/// CPU (under autograd, or without those ISAs) are computed as (W·xᵀ)ᵀ, which
/// MKL runs faster than x·Wᵀ: 32 sampled rows of SmolLM2-135M generate 64 tokens in 10.1 s
/// instead of 11.4 s (3 alternating runs each, libtorch 2.11, 2 cores). Same values up to
/// summation order.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
    if let Some(y) = crate::kernels::small_gemm::linear(x, w) {
        return match bias {
            Some(b) => y + b,
            None => y,
        };
    }
    if let Some(y) = crate::kernels::onednn_linear::linear(x, w, bias) {
        return y;
    }
    let d = x.size()[x.dim() - 1];
    let rows = x.numel() as i64 / d.max(1);
    if rows > 64 || x.device() != tch::Device::Cpu || x.kind() != tch::Kind::Float || x.dim() < 2 {
        return x.linear(w, bias);
    }
    let mut shape = x.size();
    *shape.last_mut().unwrap() = w.size()[0];
    let y = w.matmul(&x.reshape([rows, d]).tr()).tr().contiguous().view(shape.as_slice());
    match bias {
        Some(b) => y + b,
        None => y,
    }
}

/// RMSNorm as transformers computes it: in float32, cast back before the weight multiply.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(p: &Path, dim: i64, eps: f64) -> RmsNorm {
        RmsNorm { weight: p.var("weight", &[dim], Init::Const(1.0)), eps }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        if let Some(y) = self.forward_few_rows(x) {
            return y;
        }
        let kind = x.kind();
        let xf = x.to_kind(tch::Kind::Float);
        let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, tch::Kind::Float);
        let normed = (xf * (var + self.eps).rsqrt()).to_kind(kind);
        &self.weight * normed
    }

    /// A decode step's few rows of f32 outside autograd: one pass over the rows instead of
    /// seven libtorch ops (each a fixed dispatch cost that a decode step pays per layer).
    fn forward_few_rows(&self, x: &Tensor) -> Option<Tensor> {
        let d = *x.size().last()?;
        let f32_cpu = |t: &Tensor| t.device() == tch::Device::Cpu && t.kind() == tch::Kind::Float;
        let rows = x.numel() as i64 / d.max(1);
        if !f32_cpu(x) || !f32_cpu(&self.weight) || rows > 64 || d == 0 || self.weight.size() != [d] {
            return None;
        }
        if crate::kernels::needs_grad(&[x, &self.weight]) {
            return None;
        }
        let (x, w) = (x.contiguous(), self.weight.contiguous());
        let y = Tensor::empty(x.size(), (tch::Kind::Float, tch::Device::Cpu));
        let (rows, d) = (rows as usize, d as usize);
        // SAFETY: contiguous f32 CPU tensors of rows·d (x, y) and d (w) elements, alive here.
        unsafe {
            let xs = std::slice::from_raw_parts(x.data_ptr() as *const f32, rows * d);
            let ws = std::slice::from_raw_parts(w.data_ptr() as *const f32, d);
            let ys = std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, rows * d);
            rms_rows_fast(xs, ws, ys, self.eps as f32);
        }
        Some(y)
    }
}

/// y = w·(x / √(mean(x²) + ε)) row by row (rows of w's length).
#[inline(always)]
fn rms_rows(xs: &[f32], ws: &[f32], ys: &mut [f32], eps: f32) {
    let d = ws.len();
    for (xr, yr) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
        let r = 1.0 / (crate::kernels::vmath::dot(xr, xr) / d as f32 + eps).sqrt();
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(ws) {
            *yv = wv * (xv * r);
        }
    }
}

crate::kernels::vmath::simd_dispatch!(fn rms_rows_fast(xs: &[f32], ws: &[f32], ys: &mut [f32], eps: f32) = rms_rows);

#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(p: &Path, dim: i64, eps: f64) -> LayerNorm {
        LayerNorm {
            weight: p.var("weight", &[dim], Init::Const(1.0)),
            bias: p.var("bias", &[dim], Init::Const(0.0)),
            eps,
        }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let d = *x.size().last().unwrap();
        x.layer_norm([d], Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LoRA layer over many rows accumulates h·Bᵀ into the base product in place: the
    /// output and the gradients of x, A and B equal the adapter's formula written out, in
    /// float64 (3 × 40 rows, past the few-row limit).
    #[test]
    fn lora_accumulated_in_place_equals_the_formula_with_gradients() {
        tch::manual_seed(2);
        let opts = (tch::Kind::Double, tch::Device::Cpu);
        let cfg = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: vec!["q".into()] };
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let lin = Linear::new(&vs.root(), "q", (24, 20), true, Some(&cfg), true);
        let to64 = |t: &Tensor| t.detach().to_kind(tch::Kind::Double);
        let (w, bias) = (to64(&lin.weight), to64(lin.bias.as_ref().unwrap()));
        let l = lin.lora.as_ref().unwrap();
        let (a, b) = (to64(&l.a).set_requires_grad(true), (Tensor::randn([20, 4], opts) * 0.3).set_requires_grad(true));
        let lin = Linear {
            weight: w.shallow_clone(),
            bias: Some(bias.shallow_clone()),
            lora: Some(LoraAdapter { a: a.shallow_clone(), b: b.shallow_clone(), scale: 2.0, dropout: 0.0 }),
            merged: Default::default(),
        };
        let x = Tensor::randn([3, 40, 24], opts).set_requires_grad(true);
        let y = lin.forward(&x, Mode::TRAIN);
        let target = Tensor::randn([3, 40, 20], opts);
        (&y * &target).sum(tch::Kind::Double).backward();
        let grads = |ts: [&Tensor; 3]| ts.map(|t| t.grad().copy());
        let (gx, ga, gb) = grads([&x, &a, &b]).into();
        for t in [&x, &a, &b] {
            let _ = t.grad().zero_();
        }
        let reference = x.matmul(&w.tr()) + &bias + x.matmul(&a.tr()).matmul(&b.tr()) * 2.0;
        (&reference * &target).sum(tch::Kind::Double).backward();
        assert_eq!(y.size(), vec![3, 40, 20]);
        assert!(y.allclose(&reference, 1e-12, 1e-12, false));
        for (got, t) in [(gx, &x), (ga, &a), (gb, &b)] {
            assert!(got.allclose(&t.grad(), 1e-12, 1e-12, false), "gradient of {:?}", t.size());
        }
    }

    /// The few-rows pass equals the seven-op path (forced by a gradient on x).
    #[test]
    fn rms_norm_few_rows_equals_the_op_path() {
        tch::manual_seed(1);
        let opts = (tch::Kind::Float, tch::Device::Cpu);
        let norm = RmsNorm { weight: Tensor::randn([40], opts), eps: 1e-5 };
        let x = Tensor::randn([2, 3, 40], opts) * 3.0;
        let fast = norm.forward_few_rows(&x).expect("3 rows of f32");
        let slow = norm.forward(&x.copy().set_requires_grad(true)).detach();
        assert!(norm.forward_few_rows(&x.copy().set_requires_grad(true)).is_none());
        assert_eq!(fast.size(), vec![2, 3, 40]);
        assert!(fast.allclose(&slow, 1e-5, 1e-6, false), "max {}", (&fast - &slow).abs().max().double_value(&[]));
    }
}
