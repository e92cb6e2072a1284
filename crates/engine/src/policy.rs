//! A policy = decoder LM + tokenizer + its VarStore, loaded from a standard HF directory, with
//! optional LoRA (base frozen) and export back to a plain HF directory (LoRA merged).
use crate::config::DecoderConfig;
use crate::error::{EngineError, Result};
pub use crate::layers::is_lora_param;
use crate::layers::LoraConfig;
use crate::models::llama::DecoderLm;
use crate::tokenizer::Tokenizer;
use crate::weights;
use std::path::{Path, PathBuf};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    pub dtype: Kind,
    pub lora: Option<LoraConfig>,
    /// Seeds the draw of a fresh LoRA's A matrices (kaiming-uniform, as PEFT): `load` reseeds
    /// libtorch's generator with it before building, so two processes with the same seed and
    /// device start from the same adapter (CPU and CUDA draw from different generators, so a CPU
    /// and a CUDA run of one seed do not). Weights read from files do not depend on it.
    pub seed: i64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { device: Device::Cpu, dtype: Kind::Float, lora: None, seed: 0 }
    }
}

pub struct Policy {
    pub lm: DecoderLm,
    pub vs: VarStore,
    pub tokenizer: Option<Tokenizer>,
    pub lora: Option<LoraConfig>,
    /// The model directory (the base's, when loaded from an adapter directory).
    pub dir: Option<PathBuf>,
    /// The PEFT adapter directory merged into the base at load time, if any.
    pub adapter: Option<PathBuf>,
}

/// Builds the VarStore and module tree; with LoRA, everything but the adapters is frozen.
pub(crate) fn build<M>(opts: &LoadOptions, make: impl FnOnce(&tch::nn::Path) -> M) -> (VarStore, M) {
    let mut vs = VarStore::new(opts.device);
    vs.set_kind(opts.dtype);
    let m = make(&vs.root());
    if opts.lora.is_some() {
        for (name, mut t) in vs.variables() {
            if !is_lora_param(&name) {
                let _ = t.set_requires_grad(false);
            } else if matches!(opts.dtype, Kind::BFloat16 | Kind::Half) {
                // On a 16-bit base the adapter trains in f32 (and so do its AdamW moments), as
                // PEFT keeps it; the forward casts its input (`Linear::forward`).
                tch::no_grad(|| t.set_data(&t.to_kind(Kind::Float)));
            }
        }
    }
    (vs, m)
}

impl Policy {
    /// Loads a model directory, or an adapter directory ([`crate::adapter`]): its base (found
    /// and checked by the sha256 the adapter records) with the adapter merged in; `opts.lora`
    /// then adds a fresh, trainable LoRA on top.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Policy> {
        if crate::adapter::is_adapter_dir(dir) {
            let base = crate::adapter::resolve_base(dir)?;
            let mut p = Policy::load(&base, opts)?;
            crate::adapter::merge_into(dir, &p.vs.variables())?;
            p.adapter = Some(dir.to_path_buf());
            return Ok(p);
        }
        if !dir.is_dir() {
            let e = std::io::Error::new(std::io::ErrorKind::NotFound, "not a model directory");
            return Err(EngineError::io(dir, e));
        }
        let cfg = DecoderConfig::from_dir(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let files = weights::weight_files(dir)?;
        tch::manual_seed(opts.seed);
        let (vs, lm) = build(opts, |root| DecoderLm::new(root, &cfg, opts.lora.as_ref(), false));
        let tied = cfg.tie_word_embeddings;
        weights::load_into(&files, &vs.variables(), is_lora_param, |n| {
            (tied && n == "lm_head.weight") || n.ends_with("rotary_emb.inv_freq")
        })?;
        if tokenizer.vocab_size() as i64 > cfg.vocab_size {
            return Err(EngineError::config(
                dir.join("config.json"),
                "vocab_size",
                format!("{} is smaller than the tokenizer's {} tokens", cfg.vocab_size, tokenizer.vocab_size()),
            ));
        }
        Ok(Policy {
            lm,
            vs,
            tokenizer: Some(tokenizer),
            lora: opts.lora.clone(),
            dir: Some(dir.to_path_buf()),
            adapter: None,
        })
    }

    /// A randomly initialised model (tests, benchmarks), seeded through libtorch's generator.
    /// That generator is process-wide: another thread drawing from it while this one builds
    /// changes the weights, so equal seeds give equal models only without concurrent draws.
    pub fn random(cfg: &DecoderConfig, opts: &LoadOptions, seed: i64) -> Policy {
        tch::manual_seed(seed);
        let (vs, lm) = build(opts, |root| DecoderLm::new(root, cfg, opts.lora.as_ref(), true));
        Policy { lm, vs, tokenizer: None, lora: opts.lora.clone(), dir: None, adapter: None }
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| EngineError::Invalid("this policy has no tokenizer".into()))
    }

    /// Parameters the optimiser updates (adapters only under LoRA), sorted by name.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        weights::by_name(self.vs.variables().into_iter().filter(|(_, t)| t.requires_grad()))
    }

    /// All named parameters (base and adapters), sorted by name.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        weights::by_name(self.vs.variables())
    }

    /// Saves raw (unmerged) weights + config as an HF-style directory (random test models).
    pub fn save_weights(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        let cfg = serde_json::to_string_pretty(&self.lm.cfg.raw).unwrap();
        crate::fsutil::write_atomic(&dir.join("config.json"), cfg.as_bytes())?;
        weights::write_atomic(&dir.join("model.safetensors"), &self.parameters())
    }

    /// Writes a plain transformers directory: merged weights in `dtype`, config.json with every
    /// original field, and the tokenizer files. Built in a sibling temp directory and renamed
    /// into place, so a crash never leaves a half-exported model.
    /// Writes the run's LoRA as a PEFT adapter directory (loadable by `peft`, vLLM's LoRA
    /// loading and [`Policy::load`]) for the base model. A policy loaded from an adapter
    /// directory (the world's knowledge adapter) exports both adapters stacked into one
    /// ([`crate::adapter::stack`]), so the directory applies to the plain base.
    pub fn export_adapter(&self, out: &Path) -> Result<()> {
        let cfg = self.lora.as_ref().ok_or_else(|| {
            EngineError::Invalid(format!("{}: the policy has no LoRA to export as an adapter", out.display()))
        })?;
        let own: Vec<(String, Tensor)> =
            self.trainable_parameters().into_iter().filter(|(n, _)| is_lora_param(n)).collect();
        match &self.adapter {
            None => {
                let base = self
                    .dir
                    .as_ref()
                    .ok_or_else(|| EngineError::Invalid("the policy has no model directory".into()))?;
                crate::adapter::save(out, cfg, &own, base)
            }
            Some(first) => {
                let (first_cfg, first_tensors) = crate::adapter::read_lora(first)?;
                let own: std::collections::HashMap<String, Tensor> = own.into_iter().collect();
                let (stacked, tensors) = crate::adapter::stack((&first_cfg, &first_tensors), (cfg, &own));
                crate::adapter::save(out, &stacked, &tensors, &crate::adapter::resolve_base(first)?)
            }
        }
    }

    pub fn export_hf(&self, out: &Path, dtype: Kind) -> Result<()> {
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
        let params: Vec<(String, Tensor)> =
            tch::no_grad(|| self.lm.merged_parameters().into_iter().map(|(n, t)| (n, t.to_kind(dtype))).collect());
        weights::write_atomic(&tmp.join("model.safetensors"), &params)?;
        let mut cfg = self.lm.cfg.raw.clone();
        if let Some(o) = cfg.as_object_mut() {
            o.insert("dtype".into(), crate::device::dtype_name(dtype).into());
            o.remove("torch_dtype");
            o.remove("quantization_config");
        }
        crate::fsutil::write_atomic(&tmp.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap().as_bytes())?;
        if let Some(src) = &self.dir {
            for f in [
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja",
                "generation_config.json",
                "special_tokens_map.json",
            ] {
                let p = src.join(f);
                if p.exists() {
                    std::fs::copy(&p, tmp.join(f)).map_err(|e| EngineError::io(&p, e))?;
                }
            }
        }
        if out.exists() {
            std::fs::remove_dir_all(out).map_err(|e| EngineError::io(out, e))?;
        }
        std::fs::rename(&tmp, out).map_err(|e| EngineError::io(out, e))?;
        crate::fsutil::sync_dir(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model built from scratch starts as transformers' `_init_weights` starts it: every
    /// matrix (embeddings, projections, untied head) ~ N(0, 0.02), biases 0, norm weights 1;
    /// LoRA A keeps PEFT's Kaiming-uniform bound 1/√in, B is 0.
    #[test]
    fn random_init_is_transformers_init() {
        let v = serde_json::json!({
            "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 300,
            "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64, "tie_word_embeddings": false,
        });
        let cfg = crate::config::DecoderConfig::from_value(Path::new("config.json"), v).unwrap();
        let lora = crate::LoraConfig {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: vec!["q_proj".into(), "down_proj".into()],
        };
        let p = Policy::random(&cfg, &LoadOptions { lora: Some(lora), ..Default::default() }, 3);
        let (mut matrices, mut biases) = (0, 0);
        for (name, t) in p.parameters() {
            let t = t.detach();
            if name.contains("lora_A") {
                let bound = 1.0 / (t.size()[1] as f64).sqrt();
                assert!(t.abs().max().double_value(&[]) <= bound, "{name}");
                assert!(t.std(true).double_value(&[]) > 0.5 * bound / 3f64.sqrt(), "{name}");
            } else if name.contains("lora_B") || name.ends_with(".bias") {
                assert_eq!(t.abs().max().double_value(&[]), 0.0, "{name}");
                biases += name.ends_with(".bias") as usize;
            } else if name.contains("norm") {
                assert_eq!((t - 1.0).abs().max().double_value(&[]), 0.0, "{name}");
            } else {
                let (mean, std) = (t.mean(tch::Kind::Double).double_value(&[]), t.std(true).double_value(&[]));
                assert!(mean.abs() < 0.003 && (std - 0.02).abs() < 0.002, "{name}: mean {mean}, std {std}");
                matrices += 1;
            }
        }
        // 2 layers × (q, k, v, o, gate, up, down) + embeddings + head; q/k/v biases.
        assert_eq!((matrices, biases), (16, 6));
    }
}
