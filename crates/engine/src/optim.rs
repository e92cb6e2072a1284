//! AdamW with decoupled weight decay (Loshchilov & Hutter 2019; torch.optim.AdamW's update),
//! global grad-norm clipping, learning-rate schedules and gradient accumulation bookkeeping.
//! Written out rather than using libtorch's optimiser so its state can be checkpointed.
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tch::Tensor;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    Constant {
        lr: f64,
    },
    /// Linear warm-up from 0 to `lr` over `warmup` steps, then linear decay to 0 at `total`.
    Linear {
        lr: f64,
        warmup: u64,
        total: u64,
    },
    /// Linear warm-up, then cosine decay to `lr * min_ratio` at `total`.
    Cosine {
        lr: f64,
        warmup: u64,
        total: u64,
        min_ratio: f64,
    },
    /// Linear warm-up, then constant.
    WarmupConstant {
        lr: f64,
        warmup: u64,
    },
}

impl LrSchedule {
    /// Learning rate for optimiser step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        let warm = |lr: f64, w: u64| {
            if w > 0 && step < w {
                lr * (step + 1) as f64 / w as f64
            } else {
                lr
            }
        };
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::WarmupConstant { lr, warmup } => warm(lr, warmup),
            LrSchedule::Linear { lr, warmup, total } => {
                if step < warmup {
                    warm(lr, warmup)
                } else {
                    let left = total.saturating_sub(step) as f64 / (total.saturating_sub(warmup)).max(1) as f64;
                    lr * left.clamp(0.0, 1.0)
                }
            }
            LrSchedule::Cosine { lr, warmup, total, min_ratio } => {
                if step < warmup {
                    warm(lr, warmup)
                } else {
                    let prog = ((step - warmup) as f64 / (total.saturating_sub(warmup)).max(1) as f64).min(1.0);
                    let cos = 0.5 * (1.0 + (std::f64::consts::PI * prog).cos());
                    lr * (min_ratio + (1.0 - min_ratio) * cos)
                }
            }
        }
    }
}

/// Whether a parameter is decayed: biases and norm weights are not (the usual transformer
/// recipe; TRL/HF Trainer do the same).
pub fn decays(name: &str) -> bool {
    !(name.ends_with(".bias") || name.contains("norm") || name.contains("LayerNorm"))
}

pub struct AdamW {
    pub cfg: AdamWConfig,
    params: Vec<(String, Tensor)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// f32 master copies of 16-bit parameters (a bf16 full fine-tune): the update runs on them
    /// and the model's weights are rounded from them after each step, as mixed-precision
    /// training keeps them (torch.amp, verl's FSDP). `None` for f32 parameters.
    master: Vec<Option<Tensor>>,
    decay: Vec<bool>,
    /// Optimiser steps taken (bias-correction counter).
    pub steps: u64,
    /// libtorch's own optimiser over the same tensors, used only for its `zero_grad`, which
    /// drops the gradients (`set_to_none`, PyTorch's default): tch can only zero them in place.
    grad_release: tch::COptimizer,
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, cfg: AdamWConfig) -> AdamW {
        let master: Vec<Option<Tensor>> = params
            .iter()
            .map(|(_, p)| {
                matches!(p.kind(), tch::Kind::BFloat16 | tch::Kind::Half)
                    .then(|| tch::no_grad(|| p.detach().to_kind(tch::Kind::Float)))
            })
            .collect();
        // Moments in f32 whatever the parameter's precision.
        let zeros = |i: usize, p: &Tensor| master[i].as_ref().unwrap_or(p).zeros_like();
        let m = params.iter().enumerate().map(|(i, (_, p))| zeros(i, p)).collect();
        let v = params.iter().enumerate().map(|(i, (_, p))| zeros(i, p)).collect();
        let decay = params.iter().map(|(n, _)| decays(n)).collect();
        let mut grad_release = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).expect("libtorch SGD");
        for (_, p) in &params {
            grad_release.add_parameters(p, 0).expect("libtorch SGD parameter");
        }
        AdamW { cfg, params, m, v, master, decay, steps: 0, grad_release }
    }

    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Drops every gradient, as `torch.optim.Optimizer.zero_grad()` does by default: the next
    /// backward then writes fresh gradients instead of zero-filling and adding into the old ones
    /// (two passes over 4 bytes a weight saved), and a parameter the next backward does not
    /// reach is skipped by [`AdamW::step`], as in PyTorch.
    pub fn zero_grad(&mut self) {
        self.grad_release.zero_grad().expect("libtorch zero_grad");
    }

    /// Scales all gradients so their global L2 norm is at most `max_norm` (torch's
    /// `clip_grad_norm_`); returns the norm before clipping.
    pub fn clip_grad_norm(&self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self.params.iter().map(|(_, p)| p.grad()).filter(|g| g.defined()).collect();
            if grads.is_empty() {
                return 0.0;
            }
            // One read per gradient (no squared copy): Σ over parameters of ‖g‖².
            let sq: Vec<Tensor> = grads.iter().map(|g| g.to_kind(tch::Kind::Float).norm().square()).collect();
            let total = Tensor::stack(&sq, 0).sum(tch::Kind::Float).sqrt().double_value(&[]);
            let coef = max_norm / (total + 1e-6);
            if max_norm > 0.0 && coef < 1.0 {
                for g in &grads {
                    let _ = g.shallow_clone().g_mul_scalar_(coef);
                }
            }
            total
        })
    }

    /// One AdamW update with learning rate `lr`; parameters without a gradient are skipped.
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let AdamWConfig { beta1: b1, beta2: b2, eps, weight_decay } = self.cfg;
        let bc1 = 1.0 - b1.powi(self.steps as i32);
        let bc2 = 1.0 - b2.powi(self.steps as i32);
        tch::no_grad(|| {
            for (i, (_, param)) in self.params.iter().enumerate() {
                let g = param.grad();
                if !g.defined() {
                    continue;
                }
                // A 16-bit parameter is updated through its f32 master copy.
                let (p, g) = match &self.master[i] {
                    Some(w) => (w.shallow_clone(), g.to_kind(tch::Kind::Float)),
                    None => (param.shallow_clone(), g),
                };
                let wd = if self.decay[i] { weight_decay } else { 0.0 };
                let hyper = Hyper { lr, wd, b1, b2, eps, bc1, bc2 };
                if !fused_step(&p, &g, &self.m[i], &self.v[i], &hyper) {
                    let mut p = p.shallow_clone();
                    if wd != 0.0 {
                        let _ = p.g_mul_scalar_(1.0 - lr * wd);
                    }
                    let _ = self.m[i].lerp_(&g, 1.0 - b1);
                    let _ = self.v[i].g_mul_scalar_(b2).g_add_(&(g.square() * (1.0 - b2)));
                    let denom = self.v[i].sqrt() / bc2.sqrt() + eps;
                    let _ = p.g_add_(&(&self.m[i] / denom * (-lr / bc1)));
                }
                if self.master[i].is_some() {
                    param.shallow_clone().copy_(&p);
                }
            }
        })
    }

    /// Moments as named tensors (`exp_avg.<param>`, `exp_avg_sq.<param>`, and `master.<param>`
    /// for a 16-bit parameter) for checkpoints.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        for (i, (n, _)) in self.params.iter().enumerate() {
            out.push((format!("exp_avg.{n}"), self.m[i].shallow_clone()));
            out.push((format!("exp_avg_sq.{n}"), self.v[i].shallow_clone()));
            if let Some(w) = &self.master[i] {
                out.push((format!("master.{n}"), w.shallow_clone()));
            }
        }
        out
    }

    pub fn load_state_tensors(&mut self, mut t: HashMap<String, Tensor>, steps: u64) -> crate::Result<()> {
        for (i, (n, _)) in self.params.iter().enumerate() {
            let mut slots = vec![("exp_avg", &mut self.m[i]), ("exp_avg_sq", &mut self.v[i])];
            if let Some(w) = self.master[i].as_mut() {
                slots.push(("master", w));
            }
            for (prefix, dst) in slots {
                let key = format!("{prefix}.{n}");
                let src = t.remove(&key).ok_or_else(|| {
                    crate::EngineError::Invalid(format!(
                        "optimizer state has no `{key}` (checkpoint from another model?)"
                    ))
                })?;
                if src.size() != dst.size() {
                    return Err(crate::EngineError::Invalid(format!(
                        "optimizer state `{key}` has shape {:?}, parameter has {:?}",
                        src.size(),
                        dst.size()
                    )));
                }
                tch::no_grad(|| dst.copy_(&src));
            }
        }
        self.steps = steps;
        Ok(())
    }
}

/// One step's scalars: learning rate, decay (0 for parameters that do not decay), the
/// betas, ε, and the bias corrections 1 − βᵗ.
struct Hyper {
    lr: f64,
    wd: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    bc1: f64,
    bc2: f64,
}

/// AdamW on a float32 CPU parameter in one pass over p, g, m, v (the op-by-op update makes
/// ~20 passes over 4-byte-per-weight arrays, memory-bound: 0.5 s per step for 135M weights).
/// Same formula and order as torch.optim.AdamW's single-tensor update. Returns false (nothing
/// done) for other dtypes, devices or layouts.
fn fused_step(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: &Hyper) -> bool {
    let ok = |t: &Tensor| t.device() == tch::Device::Cpu && t.kind() == tch::Kind::Float && t.is_contiguous();
    if ![p, g, m, v].iter().all(|t| ok(t)) || g.size() != p.size() {
        return false;
    }
    let n = p.numel();
    let (pp, gp, mp, vp) = (p.data_ptr() as usize, g.data_ptr() as usize, m.data_ptr() as usize, v.data_ptr() as usize);
    let s = AdamScalars {
        decay: (1.0 - h.lr * h.wd) as f32,
        one_minus_b1: (1.0 - h.b1) as f32,
        b2: h.b2 as f32,
        one_minus_b2: (1.0 - h.b2) as f32,
        bc2_sqrt: h.bc2.sqrt() as f32,
        eps: h.eps as f32,
        step_size: (h.lr / h.bc1) as f32,
    };
    let threads = if n < 1 << 16 { 1 } else { tch::get_num_threads().max(1) as usize };
    crate::kernels::omp::parallel(threads, &|t, nt| {
        let (lo, hi) = (n * t / nt, n * (t + 1) / nt);
        // SAFETY: four live, distinct, contiguous f32 tensors of n elements; each thread owns
        // the range lo..hi of each.
        unsafe {
            let range = |ptr: usize| std::slice::from_raw_parts_mut((ptr as *mut f32).add(lo), hi - lo);
            let (p, m, v) = (range(pp), range(mp), range(vp));
            let g = std::slice::from_raw_parts((gp as *const f32).add(lo), hi - lo);
            adam_fast(p, g, m, v, &s);
        }
    });
    true
}

struct AdamScalars {
    decay: f32,
    one_minus_b1: f32,
    b2: f32,
    one_minus_b2: f32,
    bc2_sqrt: f32,
    eps: f32,
    step_size: f32,
}

#[inline(always)]
fn adam(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamScalars) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *p *= s.decay; // decoupled weight decay
        *m += s.one_minus_b1 * (g - *m); // m ← lerp(m, g, 1 − β₁)
        *v = *v * s.b2 + s.one_minus_b2 * g * g;
        let denom = v.sqrt() / s.bc2_sqrt + s.eps;
        *p += -s.step_size * *m / denom;
    }
}

crate::kernels::vmath::simd_dispatch!(fn adam_fast(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamScalars) = adam);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_hit_hand_computed_values() {
        let c = LrSchedule::Cosine { lr: 1.0, warmup: 2, total: 10, min_ratio: 0.1 };
        assert!((c.lr_at(0) - 0.5).abs() < 1e-12);
        assert!((c.lr_at(1) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(2) - 1.0).abs() < 1e-12);
        // halfway through decay: 0.1 + 0.9 * 0.5
        assert!((c.lr_at(6) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(10) - 0.1).abs() < 1e-12);
        let l = LrSchedule::Linear { lr: 2.0, warmup: 0, total: 4 };
        assert_eq!([l.lr_at(0), l.lr_at(1), l.lr_at(3), l.lr_at(9)], [2.0, 1.5, 0.5, 0.0]);
        let w = LrSchedule::WarmupConstant { lr: 3.0, warmup: 3 };
        assert_eq!([w.lr_at(0), w.lr_at(2), w.lr_at(50)], [1.0, 3.0, 3.0]);
    }

    #[test]
    fn a_bf16_parameter_accumulates_updates_smaller_than_its_spacing() {
        // 100 AdamW steps of −1e-4 on a bf16 weight of 1.0, whose spacing below 1 is 2⁻⁹ ≈ 0.002:
        // each one alone rounds back to 1.0, so without an f32 master copy it never moves. With
        // it the master reaches 0.99 and the bf16 weight is its rounding.
        let p = Tensor::from_slice(&[1.0f32]).to_kind(tch::Kind::BFloat16).set_requires_grad(true);
        let mut opt =
            AdamW::new(vec![("w".into(), p.shallow_clone())], AdamWConfig { weight_decay: 0.0, ..Default::default() });
        for _ in 0..100 {
            opt.zero_grad();
            (&p * 1.0).sum(tch::Kind::Float).backward();
            opt.step(1e-4);
        }
        let master = opt.state_tensors().into_iter().find(|(n, _)| n == "master.w").expect("a master copy").1;
        assert_eq!(master.kind(), tch::Kind::Float);
        assert!((master.double_value(&[0]) - 0.99).abs() < 1e-5, "{}", master.double_value(&[0]));
        assert_eq!(p.double_value(&[0]), master.to_kind(tch::Kind::BFloat16).double_value(&[0]));
        assert!(p.double_value(&[0]) < 0.995);
        assert!(opt.state_tensors().iter().all(|(_, t)| t.kind() == tch::Kind::Float), "moments in f32");
    }

    #[test]
    fn adamw_first_step_moves_by_lr_times_sign() {
        // After one step m̂ = g, v̂ = g², so the update is -lr·g/(|g|+eps) - lr·wd·p.
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let loss = (&p * Tensor::from_slice(&[3.0f32, -0.5])).sum(tch::Kind::Float);
        loss.backward();
        let mut opt =
            AdamW::new(vec![("w".into(), p.shallow_clone())], AdamWConfig { weight_decay: 0.1, ..Default::default() });
        opt.step(0.01);
        let got: Vec<f32> = Vec::try_from(p.detach()).unwrap();
        let want = [1.0 * (1.0 - 0.001) - 0.01, -2.0 * (1.0 - 0.001) + 0.01];
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// zero_grad drops gradients (PyTorch's set_to_none), so a step with no backward in between
    /// leaves the weights where they are; zero-filled gradients would move them by momentum.
    #[test]
    fn step_after_zero_grad_without_backward_moves_nothing() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        (&p * Tensor::from_slice(&[3.0f32, -0.5])).sum(tch::Kind::Float).backward();
        let mut opt =
            AdamW::new(vec![("w".into(), p.shallow_clone())], AdamWConfig { weight_decay: 0.1, ..Default::default() });
        opt.step(0.01);
        opt.zero_grad();
        assert!(!p.grad().defined(), "zero_grad must drop the gradient");
        let before = p.detach().copy();
        opt.step(0.01);
        assert!(p.detach().equal(&before), "{:?} moved to {:?}", before, p.detach());
    }

    /// The one-pass float32 update equals the op-by-op update (run in float64) over three
    /// steps, with and without decay; large enough to be split across threads.
    #[test]
    fn fused_float32_step_equals_the_op_path() {
        tch::manual_seed(5);
        let names = ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"];
        let init: Vec<Tensor> =
            names.iter().map(|_| Tensor::randn([300, 257], (tch::Kind::Float, tch::Device::Cpu))).collect();
        let grads: Vec<Vec<Tensor>> = (0..3).map(|_| init.iter().map(|p| p.randn_like() * 0.1).collect()).collect();
        let run = |kind: tch::Kind| {
            let params: Vec<(String, Tensor)> = names
                .iter()
                .zip(&init)
                .map(|(n, p)| (n.to_string(), p.to_kind(kind).copy().set_requires_grad(true)))
                .collect();
            let shared = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
            let mut opt = AdamW::new(shared, AdamWConfig { weight_decay: 0.1, ..Default::default() });
            for step in &grads {
                opt.zero_grad();
                let loss: Tensor = params.iter().zip(step).map(|((_, p), g)| (p * g.to_kind(kind)).sum(kind)).sum();
                loss.backward();
                opt.step(0.01);
            }
            params.iter().map(|(_, p)| p.detach().to_kind(tch::Kind::Double)).collect::<Vec<_>>()
        };
        let (fused, reference) = (run(tch::Kind::Float), run(tch::Kind::Double));
        for (a, b) in fused.iter().zip(&reference) {
            let d = (a - b).abs().max().double_value(&[]);
            assert!(d < 1e-5, "max |Δ| {d}");
        }
        // It did move the weights (by ~3·lr).
        assert!((&fused[0] - init[0].to_kind(tch::Kind::Double)).abs().max().double_value(&[]) > 0.02);
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let p = Tensor::from_slice(&[0.0f32, 0.0]).set_requires_grad(true);
        (&p * Tensor::from_slice(&[3.0f32, 4.0])).sum(tch::Kind::Float).backward();
        let opt = AdamW::new(vec![("w".into(), p.shallow_clone())], AdamWConfig::default());
        let n = opt.clip_grad_norm(1.0);
        assert!((n - 5.0).abs() < 1e-6);
        let g: Vec<f32> = Vec::try_from(p.grad()).unwrap();
        assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
    }
}
