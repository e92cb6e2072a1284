//! LoRA adapters in PEFT's directory format (`adapter_config.json` + `adapter_model.safetensors`),
//! so an adapter knowrl trains loads in `peft` and vLLM, and one PEFT trained loads here.
//!
//! knowrl adds one file, `knowrl_base.json`: the base model's directory name (looked up under
//! `$KNOWRL_MODELS`, where `scripts/fetch-real-models` puts the real models) and the sha256 of
//! its weights. An adapter is a delta on one exact set of weights; applied to another base it
//! gives a model that is silently wrong, so a mismatch is an error naming the file.
//!
//! A loaded adapter is merged into the base weights (W ← W + (α/r)·B·A, PEFT's `merge_and_unload`):
//! the knowledge adapter becomes part of the policy, and a run's own LoRA (if any) sits on top,
//! so "adapters off" is the merged policy, the RL reference.
use crate::error::{read_json, EngineError, Result};
use crate::layers::LoraConfig;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const CONFIG: &str = "adapter_config.json";
pub const WEIGHTS: &str = "adapter_model.safetensors";
pub const BASE: &str = "knowrl_base.json";
/// PEFT's prefix of adapter tensor names (`PeftModel` wraps the `*ForCausalLM` as `base_model.model`).
const PEFT_PREFIX: &str = "base_model.model.";

/// True when `dir` holds an adapter rather than a full model.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG).is_file()
}

/// The base an adapter was trained on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseRecord {
    /// Directory name under `$KNOWRL_MODELS` (e.g. `smollm2-135m-instruct`).
    pub base: String,
    /// sha256 of the base's `model.safetensors`.
    pub sha256: String,
}

/// Where `scripts/fetch-real-models` puts the real models: `$KNOWRL_MODELS`, else
/// `~/.cache/knowrl/models`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("KNOWRL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/knowrl/models"),
    }
}

/// An adapter directory's LoRA settings (PEFT field names).
pub fn read_config(dir: &Path) -> Result<LoraConfig> {
    let path = dir.join(CONFIG);
    let v = read_json(&path)?;
    let field = |k: &str| v.get(k).ok_or_else(|| EngineError::config(&path, k, "missing"));
    if field("peft_type")?.as_str() != Some("LORA") {
        return Err(EngineError::config(&path, "peft_type", "only LORA adapters are supported"));
    }
    let rank = field("r")?
        .as_i64()
        .filter(|r| *r > 0)
        .ok_or_else(|| EngineError::config(&path, "r", "not a positive integer"))?;
    let alpha =
        field("lora_alpha")?.as_f64().ok_or_else(|| EngineError::config(&path, "lora_alpha", "not a number"))?;
    let targets = field("target_modules")?
        .as_array()
        .and_then(|a| a.iter().map(|t| t.as_str().map(String::from)).collect::<Option<Vec<_>>>())
        .ok_or_else(|| EngineError::config(&path, "target_modules", "not a list of module names"))?;
    if v.get("use_dora").and_then(|d| d.as_bool()) == Some(true)
        || v.get("use_rslora").and_then(|d| d.as_bool()) == Some(true)
    {
        return Err(EngineError::config(&path, "use_dora/use_rslora", "DoRA and rsLoRA adapters are not supported"));
    }
    Ok(LoraConfig { rank, alpha, dropout: 0.0, target_modules: targets })
}

/// The base model directory of an adapter, checked against its recorded sha256.
pub fn resolve_base(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(BASE);
    let rec: BaseRecord = serde_json::from_value(read_json(&path)?)
        .map_err(|e| EngineError::config(&path, "<document>", e.to_string()))?;
    let base = models_dir().join(&rec.base);
    let weights = base.join("model.safetensors");
    if !weights.is_file() {
        return Err(EngineError::config(
            &path,
            "base",
            format!(
                "base model `{}` not found at {} (run scripts/fetch-real-models, or set KNOWRL_MODELS)",
                rec.base,
                base.display()
            ),
        ));
    }
    let actual = crate::fsutil::sha256_file(&weights)?;
    if actual != rec.sha256 {
        return Err(EngineError::config(
            &path,
            "sha256",
            format!(
                "{} has sha256 {actual}, the adapter was trained on {}: another base model",
                weights.display(),
                rec.sha256
            ),
        ));
    }
    Ok(base)
}

/// The adapter's config and tensors, named as knowrl names them (PEFT's prefix removed).
pub fn read_lora(dir: &Path) -> Result<(LoraConfig, HashMap<String, Tensor>)> {
    let cfg = read_config(dir)?;
    let file = dir.join(WEIGHTS);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    crate::weights::for_each_tensor(&file, |name, t| {
        let Some(n) = name.strip_prefix(PEFT_PREFIX) else {
            return Err(EngineError::weights(
                &file,
                name,
                format!("not a PEFT adapter tensor (expected the `{PEFT_PREFIX}` prefix)"),
            ));
        };
        tensors.insert(n.to_string(), t);
        Ok(())
    })?;
    Ok((cfg, tensors))
}

/// Two LoRAs on the same base as one PEFT adapter with the same effect: rank r₁ + r₂, α = rank
/// (scale 1), A = [A₁; A₂] and B = [(α₁/r₁)·B₁, (α₂/r₂)·B₂], so B·A = Δ₁ + Δ₂; a module only one of
/// them adapts gets zero rows from the other. Tensors are named as knowrl names them.
pub fn stack(
    first: (&LoraConfig, &HashMap<String, Tensor>),
    second: (&LoraConfig, &HashMap<String, Tensor>),
) -> (LoraConfig, Vec<(String, Tensor)>) {
    let rank = first.0.rank + second.0.rank;
    let modules: std::collections::BTreeSet<String> = [first.1, second.1]
        .iter()
        .flat_map(|t| t.keys().filter_map(|k| k.strip_suffix(".lora_A.weight").map(String::from)))
        .collect();
    let mut out = vec![];
    for m in &modules {
        let (a_name, b_name) = (format!("{m}.lora_A.weight"), format!("{m}.lora_B.weight"));
        // (in, out) of the module, from whichever adapter has it.
        let (din, dout) = [first.1, second.1]
            .iter()
            .find_map(|t| Some((t.get(&a_name)?.size()[1], t.get(&b_name)?.size()[0])))
            .expect("a module listed from the adapters' names");
        let part = |(c, t): (&LoraConfig, &HashMap<String, Tensor>)| {
            let scale = c.alpha / c.rank as f64;
            match (t.get(&a_name), t.get(&b_name)) {
                (Some(a), Some(b)) => (a.to_kind(tch::Kind::Float), b.to_kind(tch::Kind::Float) * scale),
                _ => (
                    Tensor::zeros([c.rank, din], (tch::Kind::Float, tch::Device::Cpu)),
                    Tensor::zeros([dout, c.rank], (tch::Kind::Float, tch::Device::Cpu)),
                ),
            }
        };
        let ((a1, b1), (a2, b2)) = tch::no_grad(|| (part(first), part(second)));
        out.push((a_name, Tensor::cat(&[a1, a2], 0)));
        out.push((b_name, Tensor::cat(&[b1, b2], 1)));
    }
    let names = |c: &LoraConfig| c.target_modules.clone();
    let mut targets: Vec<String> = names(first.0).into_iter().chain(names(second.0)).collect();
    targets.sort();
    targets.dedup();
    (LoraConfig { rank, alpha: rank as f64, dropout: 0.0, target_modules: targets }, out)
}

/// Merges the adapter in `dir` into `params` (the base's named weights): W += (α/r)·B·A for
/// every adapted module. Every adapter tensor must match a base weight's shape.
pub fn merge_into(dir: &Path, params: &HashMap<String, Tensor>) -> Result<()> {
    let file = dir.join(WEIGHTS);
    let (cfg, tensors) = read_lora(dir)?;
    let scale = cfg.alpha / cfg.rank as f64;
    let mut merged = 0;
    for (name, a) in &tensors {
        let Some(module) = name.strip_suffix(".lora_A.weight") else { continue };
        let b_name = format!("{module}.lora_B.weight");
        let b = tensors
            .get(&b_name)
            .ok_or_else(|| EngineError::weights(&file, &b_name, "missing (lora_A has no lora_B)"))?;
        let w_name = format!("{module}.weight");
        let w = params.get(&w_name).ok_or_else(|| {
            EngineError::weights(
                &file,
                name,
                format!("the base model has no `{w_name}` (an adapter of another architecture?)"),
            )
        })?;
        let (ws, as_, bs) = (w.size(), a.size(), b.size());
        if as_.len() != 2
            || bs.len() != 2
            || as_[0] != cfg.rank
            || bs[1] != cfg.rank
            || bs[0] != ws[0]
            || as_[1] != ws[1]
        {
            return Err(EngineError::weights(
                &file,
                name,
                format!("shapes A {as_:?}, B {bs:?} do not fit the base weight {ws:?} at rank {} (an adapter of another model size?)", cfg.rank),
            ));
        }
        tch::no_grad(|| {
            let delta = b.to_kind(tch::Kind::Float).matmul(&a.to_kind(tch::Kind::Float)) * scale;
            w.shallow_clone().f_add_(&delta.to_kind(w.kind()).to_device(w.device())).map(|_| ())
        })?;
        merged += 1;
    }
    let pairs = tensors.keys().filter(|k| k.ends_with(".lora_B.weight")).count();
    if merged == 0 || merged != pairs || merged * 2 != tensors.len() {
        return Err(EngineError::weights(
            &file,
            "<all>",
            format!("{} tensors, {merged} lora_A/lora_B pairs: not a LoRA adapter", tensors.len()),
        ));
    }
    Ok(())
}

/// Writes the LoRA tensors of `params` (knowrl names, `…lora_A.weight` / `…lora_B.weight`) as a
/// PEFT adapter directory for `base` (a directory under [`models_dir`] or any model directory).
pub fn save(dir: &Path, cfg: &LoraConfig, params: &[(String, Tensor)], base: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
    let lora: Vec<(String, Tensor)> = params
        .iter()
        .filter(|(n, _)| crate::layers::is_lora_param(n))
        .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t.detach().to_kind(tch::Kind::Float)))
        .collect();
    if lora.is_empty() {
        return Err(EngineError::Invalid(format!("{}: no LoRA parameters to save", dir.display())));
    }
    crate::weights::write_atomic(&dir.join(WEIGHTS), &lora)?;
    let name = base.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let peft = serde_json::json!({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": name,
        "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout,
        "target_modules": cfg.target_modules, "bias": "none", "fan_in_fan_out": false,
        "inference_mode": true, "init_lora_weights": true, "modules_to_save": null,
        "use_rslora": false, "use_dora": false, "layers_to_transform": null,
    });
    crate::fsutil::write_atomic(&dir.join(CONFIG), serde_json::to_string_pretty(&peft).unwrap().as_bytes())?;
    let rec = BaseRecord { base: name, sha256: crate::fsutil::sha256_file(&base.join("model.safetensors"))? };
    crate::fsutil::write_atomic(&dir.join(BASE), serde_json::to_string_pretty(&rec).unwrap().as_bytes())?;
    crate::fsutil::sync_dir(dir)
}
