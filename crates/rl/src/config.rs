//! `knowrl train` configuration (TOML). Every field is documented here; unknown fields are
//! rejected with their name (serde `deny_unknown_fields`).
use crate::advantage::Normalisation;
use crate::loss::{Aggregation, KlEstimator};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelSection,
    pub data: DataSection,
    pub rollout: RolloutSection,
    pub algorithm: AlgorithmSection,
    pub optim: OptimSection,
    pub run: RunSection,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// HF model directory of the policy.
    pub path: PathBuf,
    /// Optional LoRA (base frozen; adapters off = the KL reference).
    #[serde(default)]
    pub lora: Option<knowrl_engine::LoraConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A world directory (`knowrl world build`): questions.jsonl, corpus.jsonl, encoder/.
    pub world: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    /// Prompts per step.
    pub prompts_per_step: usize,
    /// Responses per prompt (the GRPO group).
    pub group_size: usize,
    pub max_turns: usize,
    pub topk: usize,
    pub max_tokens_per_turn: usize,
    pub temperature: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    Grpo,
    Dapo,
    Gspo,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlgorithmSection {
    pub name: Algorithm,
    pub clip_low: f64,
    pub clip_high: f64,
    /// 0 = no KL term.
    #[serde(default)]
    pub kl_coef: f64,
    #[serde(default = "default_kl")]
    pub kl_estimator: KlEstimator,
    pub aggregation: Aggregation,
    pub normalisation: Normalisation,
}

fn default_kl() -> KlEstimator {
    KlEstimator::LowVar
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimSection {
    pub lr: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    /// Responses per forward/backward (gradients accumulate over micro-batches).
    pub micro_batch: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    pub steps: u64,
    pub seed: u64,
    pub out_dir: PathBuf,
    /// Checkpoint every N steps (0 = only at the end).
    pub checkpoint_every: u64,
}

impl TrainConfig {
    pub fn load(path: &Path) -> Result<TrainConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let c: TrainConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        c.validate().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        let r = &self.rollout;
        let bad = |f: &str, m: String| Err(format!("field `{f}`: {m}"));
        if r.group_size < 2 {
            return bad("rollout.group_size", format!("{} (group advantages need at least 2)", r.group_size));
        }
        if r.prompts_per_step == 0 || r.max_turns == 0 || r.topk == 0 || r.max_tokens_per_turn == 0 {
            return bad("rollout", "prompts_per_step, max_turns, topk and max_tokens_per_turn must be positive".into());
        }
        if self.optim.micro_batch == 0 {
            return bad("optim.micro_batch", "must be positive".into());
        }
        if self.algorithm.clip_low <= 0.0 || self.algorithm.clip_high <= 0.0 {
            return bad("algorithm.clip_low", "clip ranges must be positive".into());
        }
        Ok(())
    }
}
