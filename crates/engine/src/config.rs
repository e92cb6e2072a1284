//! Model configs read from a Hugging Face `config.json`. Parsed field by field (not with a
//! derive) so that a missing or mistyped field is reported by name, and so that both the
//! transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`) layouts load.
use crate::error::{read_json, EngineError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The decoder families that share one implementation (models/llama.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3, SmolLM2, Mistral-style: optional attention/MLP bias flags.
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v projections carry a bias.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE.
    Qwen3,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Llama 3.1+ frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Plain linear position interpolation.
    Linear {
        factor: f64,
    },
}

#[derive(Debug, Clone)]
pub struct DecoderConfig {
    pub family: Family,
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub qk_norm: bool,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    /// The raw JSON, kept so an export writes back every field we do not interpret.
    pub raw: Value,
}

pub(crate) struct Fields<'a> {
    pub file: PathBuf,
    pub v: &'a Value,
}

impl Fields<'_> {
    pub fn get(&self, k: &str) -> Option<&Value> {
        self.v.get(k).filter(|x| !x.is_null())
    }
    pub fn int(&self, k: &str) -> Result<i64> {
        match self.get(k) {
            None => Err(EngineError::config(&self.file, k, "missing")),
            Some(x) => self.as_int(k, x),
        }
    }
    pub fn int_or(&self, k: &str, d: i64) -> Result<i64> {
        self.get(k).map_or(Ok(d), |x| self.as_int(k, x))
    }
    fn as_int(&self, k: &str, x: &Value) -> Result<i64> {
        x.as_i64().ok_or_else(|| EngineError::config(&self.file, k, format!("expected an integer, found {x}")))
    }
    pub fn float_or(&self, k: &str, d: f64) -> Result<f64> {
        match self.get(k) {
            None => Ok(d),
            Some(x) => {
                x.as_f64().ok_or_else(|| EngineError::config(&self.file, k, format!("expected a number, found {x}")))
            }
        }
    }
    pub fn bool_or(&self, k: &str, d: bool) -> Result<bool> {
        match self.get(k) {
            None => Ok(d),
            Some(x) => {
                x.as_bool().ok_or_else(|| EngineError::config(&self.file, k, format!("expected true/false, found {x}")))
            }
        }
    }
    pub fn str_or(&self, k: &str, d: &str) -> Result<String> {
        match self.get(k) {
            None => Ok(d.to_string()),
            Some(x) => x
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| EngineError::config(&self.file, k, format!("expected a string, found {x}"))),
        }
    }
    /// `eos_token_id` is an int or a list of ints.
    pub fn ids(&self, k: &str) -> Result<Vec<i64>> {
        match self.get(k) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|x| self.as_int(k, x)).collect(),
            Some(x) => Ok(vec![self.as_int(k, x)?]),
        }
    }
}

pub const SUPPORTED_DECODERS: &str = "llama, mistral, qwen2, qwen3 (architectures LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)";

impl DecoderConfig {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let file = dir.join("config.json");
        let v = read_json(&file)?;
        Self::from_value(&file, v)
    }

    pub fn from_value(file: &Path, v: Value) -> Result<Self> {
        let f = Fields { file: file.to_path_buf(), v: &v };
        let model_type = f.str_or("model_type", "")?;
        let family = match model_type.as_str() {
            "llama" | "mistral" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "" => return Err(EngineError::config(file, "model_type", "missing")),
            other => {
                return Err(EngineError::config(
                    file,
                    "model_type",
                    format!("unsupported architecture `{other}`; supported: {SUPPORTED_DECODERS}"),
                ))
            }
        };
        let hidden_size = f.int("hidden_size")?;
        let num_heads = f.int("num_attention_heads")?;
        let num_kv_heads = f.int_or("num_key_value_heads", num_heads)?;
        if num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 {
            return Err(EngineError::config(
                file,
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads = {num_heads}"),
            ));
        }
        let head_dim = f.int_or("head_dim", hidden_size / num_heads)?;
        // transformers 5 moved rope_theta/rope_scaling into `rope_parameters`.
        let rope = f.get("rope_parameters").or_else(|| f.get("rope_scaling")).cloned();
        let rope_theta = match rope.as_ref().and_then(|r| r.get("rope_theta")) {
            Some(t) => t
                .as_f64()
                .ok_or_else(|| EngineError::config(file, "rope_parameters.rope_theta", "expected a number"))?,
            None => f.float_or("rope_theta", 10000.0)?,
        };
        let rope_scaling = parse_rope_scaling(file, rope.as_ref())?;
        let (attention_bias, qk_norm) = match family {
            Family::Llama => (f.bool_or("attention_bias", false)?, false),
            Family::Qwen2 => (true, false),
            Family::Qwen3 => (f.bool_or("attention_bias", false)?, true),
        };
        let cfg = DecoderConfig {
            family,
            vocab_size: f.int("vocab_size")?,
            hidden_size,
            intermediate_size: f.int("intermediate_size")?,
            num_layers: f.int("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f.float_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings: f.int_or("max_position_embeddings", 4096)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            attention_bias,
            mlp_bias: f.bool_or("mlp_bias", false)?,
            qk_norm,
            bos_token_id: f.get("bos_token_id").and_then(Value::as_i64),
            eos_token_ids: f.ids("eos_token_id")?,
            model_type,
            raw: v.clone(),
        };
        for (name, x) in [
            ("vocab_size", cfg.vocab_size),
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_hidden_layers", cfg.num_layers),
            ("head_dim", cfg.head_dim),
        ] {
            if x <= 0 {
                return Err(EngineError::config(file, name, format!("must be positive, found {x}")));
            }
        }
        if cfg.head_dim % 2 != 0 {
            return Err(EngineError::config(file, "head_dim", "must be even for RoPE"));
        }
        Ok(cfg)
    }
}

fn parse_rope_scaling(file: &Path, rope: Option<&Value>) -> Result<RopeScaling> {
    let Some(r) = rope else {
        return Ok(RopeScaling::None);
    };
    let f = Fields { file: file.to_path_buf(), v: r };
    let kind = match f.get("rope_type").or_else(|| f.get("type")) {
        Some(Value::String(s)) => s.clone(),
        _ => "default".into(),
    };
    Ok(match kind.as_str() {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: f.float_or("factor", 1.0)? },
        "llama3" => RopeScaling::Llama3 {
            factor: f.float_or("factor", 8.0)?,
            low_freq_factor: f.float_or("low_freq_factor", 1.0)?,
            high_freq_factor: f.float_or("high_freq_factor", 4.0)?,
            original_max_position_embeddings: f.int_or("original_max_position_embeddings", 8192)? as f64,
        },
        other => {
            return Err(EngineError::config(
                file,
                "rope_scaling.rope_type",
                format!("unsupported RoPE scaling `{other}` (supported: default, linear, llama3)"),
            ))
        }
    })
}

/// BERT-family encoder config (BertModel: E5, BGE, MiniLM).
#[derive(Debug, Clone)]
pub struct BertConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub intermediate_size: i64,
    pub max_position_embeddings: i64,
    pub type_vocab_size: i64,
    pub layer_norm_eps: f64,
    pub raw: Value,
}

impl BertConfig {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let file = dir.join("config.json");
        let v = read_json(&file)?;
        Self::from_value(&file, v)
    }

    pub fn from_value(file: &Path, v: Value) -> Result<Self> {
        let file = file.to_path_buf();
        let f = Fields { file: file.clone(), v: &v };
        let model_type = f.str_or("model_type", "bert")?;
        if !matches!(model_type.as_str(), "bert") {
            return Err(EngineError::config(
                &file,
                "model_type",
                format!("unsupported encoder architecture `{model_type}`; supported: bert (BertModel)"),
            ));
        }
        let act = f.str_or("hidden_act", "gelu")?;
        if act != "gelu" {
            return Err(EngineError::config(&file, "hidden_act", format!("unsupported activation `{act}` (gelu)")));
        }
        let cfg = BertConfig {
            vocab_size: f.int("vocab_size")?,
            hidden_size: f.int("hidden_size")?,
            num_layers: f.int("num_hidden_layers")?,
            num_heads: f.int("num_attention_heads")?,
            intermediate_size: f.int("intermediate_size")?,
            max_position_embeddings: f.int_or("max_position_embeddings", 512)?,
            type_vocab_size: f.int_or("type_vocab_size", 2)?,
            layer_norm_eps: f.float_or("layer_norm_eps", 1e-12)?,
            raw: v.clone(),
        };
        if cfg.hidden_size % cfg.num_heads != 0 {
            return Err(EngineError::config(&file, "num_attention_heads", "must divide hidden_size"));
        }
        Ok(cfg)
    }
}
