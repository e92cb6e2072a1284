//! The sections of a `knowrl train` TOML that every method shares (model, data, rollout,
//! algorithm, optim, run, reward). A method's own section lives in its file; `config` puts
//! them together. Unknown fields are rejected with their name (serde `deny_unknown_fields`).
use crate::advantage::Normalisation;
use crate::loss::{Aggregation, KlEstimator};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// em (default) | f1 | em_format (−1 without an answer, AKBE).
    #[serde(default)]
    pub name: crate::reward::RewardKind,
    /// OTC-PO-style shaping of the agent's reward: × r_tool(m, n), n = the group's fewest calls
    /// among correct responses (the reward-shaping baseline AKBE argues against).
    #[serde(default)]
    pub tool_productivity: bool,
    /// OTC's smoothing constant c.
    #[serde(default = "default_otc_c")]
    pub otc_c: f64,
}

fn default_otc_c() -> f64 {
    1.0
}

impl Default for RewardSection {
    fn default() -> Self {
        RewardSection { name: Default::default(), tool_productivity: false, otc_c: default_otc_c() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// HF model directory of the policy.
    pub path: PathBuf,
    /// Optional LoRA (base frozen; adapters off = the KL reference).
    #[serde(default)]
    pub lora: Option<knowrl_engine::LoraConfig>,
    /// Where every tensor of a step lives (rollout and its KV cache, scoring, backward, AdamW,
    /// the reference policy, the retriever's encoder): cpu | cuda | cuda:N | auto (CUDA when
    /// libtorch sees one). A CUDA device that is not there fails at load, naming it.
    #[serde(default = "default_device")]
    pub device: String,
    /// The weights' and activations' precision: f32 | bf16. LoRA parameters, AdamW moments,
    /// log-softmax, KL and ratio stay f32 (as verl and TRL run bf16).
    #[serde(default = "default_dtype")]
    pub dtype: String,
}

fn default_device() -> String {
    "cpu".into()
}

fn default_dtype() -> String {
    "f32".into()
}

impl ModelSection {
    /// The spelling of `device` and `dtype` (whether the device exists is checked at load).
    pub fn validate(&self) -> Result<(), String> {
        let d = self.device.as_str();
        let cuda_n = d.strip_prefix("cuda:").is_some_and(|n| n.parse::<usize>().is_ok());
        if !(matches!(d, "cpu" | "cuda" | "auto") || cuda_n) {
            return Err(format!("field `model.device`: unknown device {d:?} (cpu, cuda, cuda:N, auto)"));
        }
        if !matches!(self.dtype.as_str(), "f32" | "bf16") {
            return Err(format!("field `model.dtype`: unknown dtype {:?} (f32, bf16)", self.dtype));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A world directory (`knowrl world build`): questions.jsonl, corpus.jsonl, encoder/.
    pub world: PathBuf,
    /// agent (questions, searched through the world's retriever) | context (scenario items
    /// with their given context: Knowledgeable-R1's training data).
    #[serde(default)]
    pub suite: Suite,
    /// Scenarios trained on when `suite = "context"` (ConFiQA-style mix of correct and
    /// counterfactual contexts by default), each drawn with an equal share of a step's questions
    /// whatever its number of items (`task::TaskDraw`). S1..S5, or S2p: S2's counterfactuals
    /// stated plainly, without the made-up source the world's S2 passages cite (["S1", "S2p"]
    /// trains without that cue).
    #[serde(default = "default_scenarios")]
    pub scenarios: Vec<String>,
    /// `suite = "jsonl"`: a FlashRAG (`{"id","question","golden_answers"}`) or Search-R1
    /// (`{"prompt":[…], "reward_model":{"ground_truth":{"target":[…]}}}`) file, jsonl or parquet
    /// (by extension: Search-R1's `train.parquet` / `test.parquet` load as they are).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// `suite = "jsonl"`: an index directory from `knowrl index build` (BM25 / dense / hybrid);
    /// without it the world's retriever is used.
    #[serde(default)]
    pub index: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Suite {
    #[default]
    Agent,
    Context,
    /// Real QA data from `data.path` with Search-R1's agent prompt.
    Jsonl,
}

fn default_scenarios() -> Vec<String> {
    vec!["S1".into(), "S2".into()]
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
    /// How retrieved passages are shown to the policy: `search_r1` (`<information>Doc 1(Title:
    /// …) …</information>`), `verl` (verl's search tool) or `akbe` (` <result>\nPage 1: …\n</result>`,
    /// AKBE's released tool, with its `<result>`-tag prompt).
    #[serde(default)]
    pub observation_format: knowrl_retrieval::format::PassageStyle,
    /// Each observation is cut to its first this many tokens (default: Search-R1's 500;
    /// BRIDGE's and verl-tool's setups use 1,024).
    #[serde(default = "default_max_obs")]
    pub max_observation_tokens: usize,
    /// Rows decoded together (0 = the whole step's at once): a GPU's KV cache holds
    /// rows × tokens × 2 × layers × kv_dim, so large steps are rolled out in chunks of this many
    /// rows (verl's `rollout.max_num_seqs`). Each row keeps its own generator, so the samples do
    /// not depend on the chunking beyond batched floating-point order.
    #[serde(default)]
    pub max_rows: usize,
}

fn default_max_obs() -> usize {
    crate::agent::SEARCH_R1_MAX_OBS_TOKENS
}

impl RolloutSection {
    /// The agent loop's settings for this section at `temperature`.
    pub fn agent(&self, temperature: f64) -> crate::agent::AgentConfig {
        let mut a = crate::agent::AgentConfig::new(self.max_turns, self.topk, self.max_tokens_per_turn, temperature);
        a.style = self.observation_format;
        a.max_obs_tokens = self.max_observation_tokens;
        a.max_rows = self.max_rows;
        a
    }
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
    /// Skip the forward/backward of rows whose advantage (or objective weight) is exactly 0
    /// when there is no KL term: they add nothing to the gradient, and the loss is divided by
    /// the whole batch's tokens/sequences either way, so the update is the same (tested).
    /// Entropy and clip fraction are then averaged over the rows that were scored.
    #[serde(default = "default_true")]
    pub skip_zero_advantage: bool,
    /// Policy-gradient rows (responses) per optimiser step: each epoch deals the batch's rows,
    /// in a seeded random order, into mini-batches of this size, one clip + AdamW step each
    /// (PPO; verl's `ppo_mini_batch_size`, which counts prompts × n). The papers' setups make
    /// 2 (Search-R1, 512/256), 4 (Knowledgeable-R1, 512/128) or 8 (AKBE 64/8, BRIDGE 512/64)
    /// steps per batch. 0 = the whole batch in one step.
    #[serde(default)]
    pub ppo_mini_batch: usize,
    /// Passes over each rollout batch (verl's `ppo_epochs`); π_old stays the rollout policy.
    #[serde(default = "default_one")]
    pub ppo_epochs: usize,
}

fn default_one() -> usize {
    1
}

fn default_kl() -> KlEstimator {
    KlEstimator::LowVar
}

fn default_true() -> bool {
    true
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
    /// Greedy evaluation on the validation split every N steps (0 = never), appended to
    /// `<out_dir>/eval.jsonl` (agent suite: EM/TC/TP; context suite: S1–S5 EM, and S2p when
    /// `data.scenarios` holds it).
    #[serde(default)]
    pub eval_every: u64,
    /// Validation questions per periodic evaluation (0 = all).
    #[serde(default = "default_eval_limit")]
    pub eval_limit: usize,
}

fn default_eval_limit() -> usize {
    100
}
