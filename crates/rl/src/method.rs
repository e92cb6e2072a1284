//! The step contract between the trainer and a method. A method's step turns questions into
//! rollouts, rewards and advantages, and returns loss terms ([`StepOutput`]); the trainer owns
//! the schedule (PPO mini-batches, optimiser, checkpoints) and never looks inside a method.
//! A method file imports this file, never the trainer; a new method is one file implementing
//! [`MethodSpec`] (its TOML section) and [`Method`] (its step), plus its line in `config`.
use crate::agent::{rollout, AgentConfig, Trajectory};
use crate::reward::reward;
use crate::sections::{AlgorithmSection, RewardSection, RolloutSection};
use crate::task::{Prompt, Task};
use crate::update::{mask_len, LossTerm, Normaliser, PgRow};
use knowrl_dist::ProcessGroup;
use knowrl_engine::{LoraConfig, Policy, Rng, Tokenizer};
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_retrieval::{Hit, Retriever};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use tch::Tensor;

/// A method's TOML section (`[method] name = "…"` plus its fields): what it needs from the run
/// and how to build its step.
pub trait MethodSpec {
    fn build(&self) -> Box<dyn Method>;
    /// Checks the section (and how it fits the rollout section); errors name the field.
    fn validate(&self, _rollout: &RolloutSection) -> Result<(), String> {
        Ok(())
    }
    /// Whether the method needs a frozen copy of the starting weights (besides the KL term's).
    fn needs_reference(&self) -> bool {
        false
    }
    /// A training checkpoint of the run's own model to load as that frozen copy instead of the
    /// starting weights (offline AKBE's "fixed GRPO-trained checkpoint").
    fn reference_checkpoint(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// The query-side LoRA the method trains on the dense retriever, if any.
    fn query_lora(&self) -> Option<LoraConfig> {
        None
    }
    /// Whether the method's step runs as one rank of several (`Err`: why not, naming the field).
    fn data_parallel(&self) -> Result<(), String> {
        Ok(())
    }
}

/// One method's step, with whatever state it carries between steps.
pub trait Method {
    fn step(&mut self, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput>;
    /// The state a checkpoint must hold for a resumed run to continue bit-identically.
    fn state(&self, _env: &TrainEnv) -> knowrl_engine::Result<MethodState> {
        Ok(MethodState::default())
    }
    /// Restores [`Method::state`] from a checkpoint.
    fn restore(&mut self, _env: &TrainEnv, _state: MethodState) -> knowrl_engine::Result<()> {
        Ok(())
    }
    /// Opt-in measurements on a step's output before the update (figures for the metrics'
    /// `extra`); they may back-propagate, and leave no gradient behind.
    fn diagnose(&mut self, _ctx: &StepCtx, _out: &StepOutput) -> knowrl_engine::Result<Vec<(String, f64)>> {
        Ok(vec![])
    }
}

/// A method's checkpointed state: named tensors (saved as safetensors) and JSON figures.
#[derive(Default)]
pub struct MethodState {
    pub tensors: HashMap<String, Tensor>,
    pub json: serde_json::Value,
}

/// What a run trains with: the policy, a frozen copy of its starting weights when needed (KL or
/// DPO without LoRA, AKBE's offline signals), the search tool (also as the dense retriever
/// whose query LoRA BRIDGE trains), and the process group when this process is one rank of
/// several (`None`: one process).
pub struct TrainEnv<'a> {
    pub policy: &'a Policy,
    pub reference: Option<&'a Policy>,
    pub retriever: &'a dyn Retriever,
    pub dense: Option<&'a DenseRetriever>,
    pub group: Option<&'a ProcessGroup>,
}

/// What a step sees: the run's resources, the shared sections it rolls out and scores with,
/// and where it is in the run.
pub struct StepCtx<'a> {
    pub policy: &'a Policy,
    pub reference: Option<&'a Policy>,
    pub tok: &'a Tokenizer,
    pub retriever: &'a dyn Retriever,
    /// The same retriever as a dense one with a query adapter (BRIDGE trains it).
    pub dense: Option<&'a DenseRetriever>,
    pub rollout: &'a RolloutSection,
    pub algorithm: &'a AlgorithmSection,
    pub reward: &'a RewardSection,
    /// Responses per forward pass (scoring inside a step).
    pub micro_batch: usize,
    /// The run's seed, step (0-based) and number of steps.
    pub seed: u64,
    pub step: u64,
    pub steps: u64,
    /// Which of the step's questions this process holds (all of them in one process).
    pub shard: Shard<'a>,
}

/// This rank's share of a step's questions: a contiguous run of them, so groups never split.
/// A rank sees only its own questions; batch-level statistics go through [`Shard::gather`].
#[derive(Clone, Copy)]
pub struct Shard<'a> {
    pub group: Option<&'a ProcessGroup>,
    /// The index of this rank's first question in the step's batch, how many it holds, and
    /// the batch's size.
    pub first_task: usize,
    pub local_tasks: usize,
    pub tasks: usize,
}

impl<'a> Shard<'a> {
    /// One process holding the whole batch of `tasks` questions.
    pub fn whole(tasks: usize) -> Shard<'a> {
        Self::of(None, tasks)
    }

    /// This rank's share of a batch of `tasks` questions (`tasks` divides by the ranks).
    pub fn of(group: Option<&'a ProcessGroup>, tasks: usize) -> Shard<'a> {
        let (rank, ranks) = group.map_or((0, 1), |g| (g.rank(), g.size()));
        let local = tasks / ranks;
        Shard { group, first_task: rank * local, local_tasks: local, tasks }
    }

    /// The batch's row index of local row `j` of a block of `n` rows that starts at local row
    /// `first_row`. A step lays its rows out in blocks of questions × copies (`replicate`),
    /// so every block of the batch is `tasks / local_tasks` times the rank's, and this rank's
    /// rows sit at its questions' place in it: the one-process numbering, whatever the ranks.
    pub fn batch_row(&self, first_row: usize, n: usize, j: usize) -> usize {
        if self.local_tasks == self.tasks {
            return first_row + j;
        }
        let l = self.local_tasks.max(1);
        assert!(
            n.is_multiple_of(l) && (first_row * self.tasks).is_multiple_of(l),
            "rows are blocks of questions × copies"
        );
        first_row * self.tasks / l + self.first_task * (n / l) + j
    }

    /// In place: each value summed over the ranks (one process: unchanged).
    pub fn sum(&self, v: &mut [f64]) -> knowrl_engine::Result<()> {
        self.group.map_or(Ok(()), |g| g.all_reduce_f64(v).map_err(dist_error))
    }

    /// Every rank's `local` items in rank order, i.e. the batch's (one process: `local`).
    pub fn gather<T: Serialize + serde::de::DeserializeOwned>(&self, local: Vec<T>) -> knowrl_engine::Result<Vec<T>> {
        let Some(g) = self.group else {
            return Ok(local);
        };
        let bytes = serde_json::to_vec(&local).expect("serialisable");
        let mut all = vec![];
        for (rank, b) in g.all_gather_bytes(&bytes).map_err(dist_error)?.iter().enumerate() {
            let part: Vec<T> = serde_json::from_slice(b)
                .map_err(|e| knowrl_engine::EngineError::Invalid(format!("data parallel: rank {rank}'s items: {e}")))?;
            all.extend(part);
        }
        Ok(all)
    }
}

/// A collective's failure as the engine's error.
pub fn dist_error(e: knowrl_dist::DistError) -> knowrl_engine::EngineError {
    knowrl_engine::EngineError::Invalid(format!("data parallel: {e}"))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
/// One step's figures, a row of metrics.jsonl. JSON has no NaN (serde_json writes null), so
/// null reads back as NaN.
pub struct StepMetrics {
    pub step: u64,
    #[serde(deserialize_with = "null_is_nan")]
    pub reward: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub em: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub tool_calls: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub response_len: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub kl: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub entropy: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub clip_frac: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub loss: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub grad_norm: f64,
    pub kept_groups: usize,
    #[serde(deserialize_with = "null_is_nan")]
    pub rollout_s: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub update_s: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub step_s: f64,
    /// Method-specific figures (Knowledgeable-R1's β, AKBE's category counts, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", deserialize_with = "nulls_are_nan")]
    pub extra: BTreeMap<String, f64>,
}

fn null_is_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nulls_are_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    Ok(BTreeMap::<String, Option<f64>>::deserialize(d)?.into_iter().map(|(k, v)| (k, v.unwrap_or(f64::NAN))).collect())
}

/// A step's loss terms and its rollout metrics.
#[derive(Default)]
pub struct StepOutput {
    pub terms: Vec<LossTerm>,
    pub metrics: StepMetrics,
}

impl StepOutput {
    /// The policy-gradient term's rows (empty when the step returned none).
    pub fn pg_rows(&self) -> &[PgRow] {
        self.terms
            .iter()
            .find_map(|t| match t {
                LossTerm::Pg { rows, .. } => Some(rows.as_slice()),
                _ => None,
            })
            .unwrap_or(&[])
    }

    /// The policy-gradient term's own normaliser, if the method set one.
    pub fn pg_normaliser(&self) -> Option<Normaliser> {
        self.terms.iter().find_map(|t| match t {
            LossTerm::Pg { normaliser, .. } => *normaliser,
            _ => None,
        })
    }
}

/// A retriever for rollouts without the tool (no-tool paths never search).
pub struct NoTool;

impl Retriever for NoTool {
    fn search(&self, queries: &[String], _k: usize) -> Result<Vec<Vec<Hit>>, knowrl_retrieval::RetrievalError> {
        Ok(vec![vec![]; queries.len()])
    }
    fn len(&self) -> usize {
        0
    }
}

/// The seed of rollout row `row` at `step`: a resumed run repeats exactly what the
/// uninterrupted one would have sampled.
pub fn row_seed(seed: u64, step: u64, row: usize) -> u64 {
    seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (row as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
}

impl StepCtx<'_> {
    /// `per` copies of each task's `which` prompt (token ids) and the task index of each row.
    pub fn replicate(
        &self,
        tasks: &[&Task],
        per: usize,
        which: impl Fn(&Task) -> &Prompt,
    ) -> knowrl_engine::Result<(Vec<Vec<u32>>, Vec<usize>)> {
        let (mut prompts, mut group) = (vec![], vec![]);
        for (k, t) in tasks.iter().enumerate() {
            let ids = which(t).ids(self.tok)?;
            for _ in 0..per {
                prompts.push(ids.clone());
                group.push(k);
            }
        }
        Ok((prompts, group))
    }

    /// Samples one trajectory per prompt with `policy`; `tools = false` is a single turn of
    /// `max_tokens_per_turn` with no retrieval. Row j (counted from `first_row`) uses the step's
    /// j-th generator.
    pub fn rollout_with(
        &self,
        policy: &Policy,
        prompts: &[Vec<u32>],
        tools: bool,
        first_row: usize,
    ) -> knowrl_engine::Result<Vec<Trajectory>> {
        if !tools {
            return self.rollout_once(policy, prompts, first_row, self.rollout.max_tokens_per_turn);
        }
        let agent = self.rollout.agent(self.rollout.temperature);
        rollout(&policy.lm, self.tok, prompts, self.retriever, &agent, &mut self.rngs(prompts.len(), first_row))
    }

    /// One turn of up to `max_tokens` generated tokens per prompt, no retrieval.
    pub fn rollout_once(
        &self,
        policy: &Policy,
        prompts: &[Vec<u32>],
        first_row: usize,
        max_tokens: usize,
    ) -> knowrl_engine::Result<Vec<Trajectory>> {
        let mut agent = AgentConfig { max_turns: 1, ..self.rollout.agent(self.rollout.temperature) };
        agent.sampling.max_new_tokens = max_tokens;
        rollout(&policy.lm, self.tok, prompts, &NoTool, &agent, &mut self.rngs(prompts.len(), first_row))
    }

    fn rngs(&self, n: usize, first_row: usize) -> Vec<Rng> {
        (0..n).map(|j| Rng::new(row_seed(self.seed, self.step, self.shard.batch_row(first_row, n, j)))).collect()
    }

    pub fn rollout(
        &self,
        prompts: &[Vec<u32>],
        tools: bool,
        first_row: usize,
    ) -> knowrl_engine::Result<Vec<Trajectory>> {
        self.rollout_with(self.policy, prompts, tools, first_row)
    }

    /// The configured reward of each trajectory against its task's gold answers.
    pub fn rewards(&self, trajs: &[Trajectory], tasks: &[&Task], group: &[usize]) -> Vec<f64> {
        trajs.iter().zip(group).map(|(t, &k)| reward(self.reward.name, t.answer.as_deref(), &tasks[k].golden)).collect()
    }
}

/// Whether a trajectory's answer is one of its task's gold answers (exact match, normalised).
pub fn correct(t: &Trajectory, task: &Task) -> bool {
    t.is_correct(&task.golden)
}

/// Rollout figures of a set of trajectories (reward, EM, tool calls, response length).
pub fn rollout_metrics(trajs: &[Trajectory], rewards: &[f64], tasks: &[&Task], group: &[usize]) -> StepMetrics {
    let n = trajs.len().max(1) as f64;
    let em = trajs.iter().zip(group).filter(|(t, &k)| correct(t, tasks[k])).count() as f64;
    StepMetrics {
        reward: rewards.iter().sum::<f64>() / n,
        em: em / n,
        tool_calls: trajs.iter().map(|t| t.tool_calls() as f64).sum::<f64>() / n,
        response_len: trajs.iter().map(|t| mask_len(&t.loss_mask)).sum::<f64>() / n,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_row_with_nan_reads_back_from_its_json() {
        let m = StepMetrics {
            step: 3,
            kl: f64::NAN,
            step_s: 1.5,
            extra: [("beta".into(), f64::NAN)].into(),
            ..Default::default()
        };
        let line = serde_json::to_string(&m).unwrap();
        assert!(line.contains("\"kl\":null"), "{line}");
        let back: StepMetrics = serde_json::from_str(&line).unwrap();
        assert!(back.kl.is_nan() && back.extra["beta"].is_nan());
        assert_eq!((back.step, back.step_s), (3, 1.5));
    }
}
