//! The RL loop every method shares: pick questions → the method's step (rollout → reward →
//! advantage → rows, see `grpo`, `knowledgeable_r1`, `akbe`) → PPO mini-batches × epochs
//! (`update_policy`: each a backward through `update`, a clip and an AdamW step) → metrics
//! (JSONL), atomic checkpoints, exact resumption.
//!
//! Determinism: questions are drawn from the trainer's generator (checkpointed), and rollout row
//! j of step s samples from `Rng::new(seed ⊕ s ⊕ j)`, so a resumed run repeats exactly what the
//! uninterrupted one would have done (tested bit-identical on CPU).
use crate::agent::{rollout, AgentConfig, Trajectory};
use crate::config::{Method, TrainConfig};
use crate::reward::reward;
use crate::task::{Prompt, Task};
use crate::update::{
    ce_backward, dpo_backward, mask_len, pg_backward, rag_backward, score_old, CeRow, DpoPair, Normaliser, PgRow,
    PgStats, RagTurn,
};
use knowrl_engine::checkpoint;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::{Policy, Rng, Tokenizer};
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_retrieval::{Hit, Retriever};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: u64,
    pub reward: f64,
    pub em: f64,
    pub tool_calls: f64,
    pub response_len: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_frac: f64,
    pub loss: f64,
    pub grad_norm: f64,
    pub kept_groups: usize,
    pub rollout_s: f64,
    pub update_s: f64,
    pub step_s: f64,
    /// Method-specific figures (Knowledgeable-R1's β, AKBE's category counts, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

/// What a step needs: the policy (and a frozen copy of its starting weights when a method or
/// the KL term needs a reference), the retriever, the config and the step number.
pub struct StepCtx<'a> {
    pub policy: &'a Policy,
    pub reference: Option<&'a Policy>,
    pub tok: &'a Tokenizer,
    pub retriever: &'a dyn Retriever,
    /// The same retriever as a dense one with a query adapter (BRIDGE trains it).
    pub dense: Option<&'a DenseRetriever>,
    pub cfg: &'a TrainConfig,
    pub step: u64,
}

/// What a run trains with: the policy, a frozen copy of its starting weights when needed (KL or
/// DPO without LoRA, AKBE's offline signals), and the search tool.
pub struct TrainEnv<'a> {
    pub policy: &'a Policy,
    pub reference: Option<&'a Policy>,
    pub retriever: &'a dyn Retriever,
    pub dense: Option<&'a DenseRetriever>,
}

/// A step's rollouts turned into loss rows, plus its rollout metrics.
#[derive(Default)]
pub struct StepOutput {
    pub pg: Vec<PgRow>,
    pub norm: Option<Normaliser>,
    pub ce: Vec<CeRow>,
    pub ce_coef: f64,
    pub dpo: Vec<DpoPair>,
    pub dpo_beta: f64,
    /// Policy-side RAG-likelihood terms (coef, turns): BRIDGE's Drop / two-state estimators.
    pub rag: Vec<(f64, Vec<RagTurn>)>,
    pub metrics: StepMetrics,
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

    /// Samples one trajectory per prompt with `policy`; `tools = false` is a single turn with no
    /// retrieval. Row j (counted from `first_row`) uses the step's j-th generator.
    pub fn rollout_with(
        &self,
        policy: &Policy,
        prompts: &[Vec<u32>],
        tools: bool,
        first_row: usize,
    ) -> knowrl_engine::Result<Vec<Trajectory>> {
        let r = &self.cfg.rollout;
        let turns = if tools { r.max_turns } else { 1 };
        let agent = AgentConfig { max_turns: turns, ..r.agent(r.temperature) };
        let mut rngs: Vec<Rng> =
            (0..prompts.len()).map(|j| Rng::new(row_seed(self.cfg.run.seed, self.step, first_row + j))).collect();
        let retriever: &dyn Retriever = if tools { self.retriever } else { &NoTool };
        rollout(&policy.lm, self.tok, prompts, retriever, &agent, &mut rngs)
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
        trajs
            .iter()
            .zip(group)
            .map(|(t, &k)| reward(self.cfg.reward.name, t.answer.as_deref(), &tasks[k].golden))
            .collect()
    }
}

/// Rollout figures of a set of trajectories (reward, EM, tool calls, response length).
pub fn rollout_metrics(trajs: &[Trajectory], rewards: &[f64], tasks: &[&Task], group: &[usize]) -> StepMetrics {
    let n = trajs.len().max(1) as f64;
    let em = trajs
        .iter()
        .zip(group)
        .filter(|(t, &k)| crate::reward::exact_match(t.answer.as_deref().unwrap_or(""), &tasks[k].golden))
        .count() as f64;
    StepMetrics {
        reward: rewards.iter().sum::<f64>() / n,
        em: em / n,
        tool_calls: trajs.iter().map(|t| t.tool_calls() as f64).sum::<f64>() / n,
        response_len: trajs.iter().map(|t| crate::update::mask_len(&t.loss_mask)).sum::<f64>() / n,
        ..Default::default()
    }
}

/// Trains `env.policy` in place for `cfg.run.steps` steps (continuing from the latest
/// checkpoint when `resume`). Returns the metrics of the steps run by this call.
pub fn train(
    env: &TrainEnv,
    tasks: &[Task],
    cfg: &TrainConfig,
    resume: bool,
    on_step: &dyn Fn(&StepMetrics),
) -> knowrl_engine::Result<Vec<StepMetrics>> {
    let TrainEnv { policy, reference, retriever, dense } = *env;
    let tok = policy.tokenizer()?;
    let out = &cfg.run.out_dir;
    std::fs::create_dir_all(out).map_err(|e| knowrl_engine::EngineError::io(out, e))?;
    let ckpt_root = out.join("checkpoints");
    let params = policy.trainable_parameters();
    let mut opt = AdamW::new(
        params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        AdamWConfig { weight_decay: cfg.optim.weight_decay, ..Default::default() },
    );
    let mut rng = Rng::new(cfg.run.seed);
    let mut start = 0;
    let metrics_path = out.join("metrics.jsonl");
    if resume {
        if let Some(dir) = checkpoint::latest(&ckpt_root)? {
            let (step, state) = checkpoint::load(&dir, &params, &mut opt)?;
            rng = serde_json::from_value(state["rng"].clone())
                .map_err(|e| knowrl_engine::EngineError::Invalid(format!("{}: trainer state: {e}", dir.display())))?;
            start = step;
            // Drop rows of steps after the checkpoint: they will be run again. metrics.jsonl
            // rows carry the 0-based step index; eval.jsonl rows the steps completed.
            trim_jsonl(&metrics_path, |step| step < start)?;
            trim_jsonl(&out.join("eval.jsonl"), |done| done <= start)?;
        }
    } else {
        for f in [metrics_path.clone(), out.join("eval.jsonl")] {
            if f.exists() {
                std::fs::remove_file(&f).map_err(|e| knowrl_engine::EngineError::io(&f, e))?;
            }
        }
    }
    let mut akbe_signals = crate::akbe::OfflineSignals::default();
    let mut bridge_state = crate::bridge::BridgeState::new();
    let adapter_file = out.join("retriever-adapter.safetensors");
    if let (true, Some(d), true) = (resume && start > 0, dense, adapter_file.exists()) {
        d.encoder.lock().unwrap().load_adapter(&adapter_file)?;
    }
    let mut all = vec![];
    for step in start..cfg.run.steps {
        let (t0, flops0) = (Instant::now(), knowrl_engine::flops::total());
        let picks: Vec<&Task> = (0..cfg.rollout.prompts_per_step).map(|_| &tasks[rng.below(tasks.len())]).collect();
        let ctx = StepCtx { policy, reference, tok, retriever, dense, cfg, step };
        let mut out = match cfg.method.name {
            Method::Grpo => crate::grpo::step(&ctx, &picks)?,
            Method::KnowledgeableR1 => crate::knowledgeable_r1::step(&ctx, &picks)?,
            Method::Akbe => crate::akbe::step(&ctx, &picks, &mut akbe_signals)?,
            Method::Bridge => crate::bridge::step(&ctx, &picks, &mut bridge_state)?,
        };
        let rollout_s = t0.elapsed().as_secs_f64();
        let rollout_flops = knowrl_engine::flops::total() - flops0;
        let t1 = Instant::now();
        let up = update_policy(policy, reference, &mut opt, &mut out, cfg, row_seed(cfg.run.seed, step, usize::MAX));
        let mut extra = out.metrics.extra.clone();
        extra.extend(up.extra.clone());
        // The step's weight-GEMM FLOPs (generation, scoring, backward): its compute floor.
        extra.insert("gemm_flops".into(), knowrl_engine::flops::total() - flops0);
        extra.insert("rollout_gemm_flops".into(), rollout_flops);
        let metrics = StepMetrics {
            step,
            loss: up.pg.loss,
            kl: up.pg.kl,
            entropy: up.pg.entropy,
            clip_frac: up.pg.clip_frac,
            grad_norm: up.grad_norm,
            rollout_s,
            update_s: t1.elapsed().as_secs_f64(),
            step_s: t0.elapsed().as_secs_f64(),
            extra,
            ..out.metrics
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .map_err(|e| knowrl_engine::EngineError::io(&metrics_path, e))?;
        writeln!(f, "{}", serde_json::to_string(&metrics).unwrap())
            .map_err(|e| knowrl_engine::EngineError::io(&metrics_path, e))?;
        on_step(&metrics);
        all.push(metrics);
        let done = step + 1;
        if (cfg.run.checkpoint_every > 0 && done % cfg.run.checkpoint_every == 0) || done == cfg.run.steps {
            // The retriever adapter first: a checkpoint that exists has its adapter beside it.
            if let (Some(d), Method::Bridge) = (dense, cfg.method.name) {
                d.encoder.lock().unwrap().save_adapter(&adapter_file)?;
            }
            checkpoint::save(&ckpt_root, done, &params, &opt, &serde_json::json!({ "rng": rng }))?;
        }
    }
    Ok(all)
}

/// What the update of one rollout batch did: the policy-gradient figures and gradient norm
/// averaged over its optimiser steps, each step's own, and the auxiliary terms' losses.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    pub pg: PgStats,
    pub grad_norm: f64,
    /// (policy-gradient figures, gradient norm before clipping) of each optimiser step, in order.
    pub per_update: Vec<(PgStats, f64)>,
    pub extra: BTreeMap<String, f64>,
}

/// PPO's schedule over one rollout batch (Schulman et al. 2017, Algorithm 1; verl's
/// `ppo_mini_batch_size` × `ppo_epochs`): π_old is scored once under the rollout weights, then
/// every epoch deals the rows into mini-batches in a random order drawn from `seed`, and each
/// mini-batch is one backward over its share of every loss term, a clip and an AdamW step.
/// The advantages stay the batch's; a mini-batch's loss normaliser is its share of the batch's
/// (token-mean over its own tokens, as verl's). One mini-batch and one epoch is exactly the
/// single update of earlier versions, π_old the detached current log-probs.
pub fn update_policy(
    policy: &Policy,
    reference: Option<&Policy>,
    opt: &mut AdamW,
    out: &mut StepOutput,
    cfg: &TrainConfig,
    seed: u64,
) -> UpdateStats {
    let (alg, mb, temp) = (&cfg.algorithm, cfg.optim.micro_batch, cfg.rollout.temperature);
    let norm = out.norm.unwrap_or_else(|| Normaliser::of(&out.pg));
    let n = out.pg.len();
    let size = if alg.ppo_mini_batch == 0 { n.max(1) } else { alg.ppo_mini_batch };
    let per_epoch = n.div_ceil(size).max(1);
    let updates = per_epoch * alg.ppo_epochs;
    if updates > 1 {
        score_old(policy, &mut out.pg, alg, temp, mb);
    }
    let tokens = |rows: &[PgRow]| rows.iter().map(|r| mask_len(&r.loss_mask)).sum::<f64>();
    let all_tokens = tokens(&out.pg);
    // Term i of m: the i-th of m near-equal contiguous parts of an auxiliary term's rows.
    fn part<T: Clone>(v: &[T], i: usize, m: usize) -> &[T] {
        &v[i * v.len() / m..(i + 1) * v.len() / m]
    }
    let mut st = UpdateStats::default();
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut add = |k: &str, v: f64| *sums.entry(k.to_string()).or_default() += v;
    for epoch in 0..alg.ppo_epochs {
        for (i, batch) in mini_batches(n, size, seed, epoch).iter().enumerate() {
            let rows: Vec<PgRow> = batch.iter().map(|&j| out.pg[j].clone()).collect();
            let share = if all_tokens > 0.0 { tokens(&rows) / all_tokens } else { 1.0 / per_epoch as f64 };
            let norm_i = Normaliser {
                tokens: norm.tokens * share,
                sequences: norm.sequences * rows.len() as f64 / n.max(1) as f64,
            };
            opt.zero_grad();
            let pg = pg_backward(policy, reference, &rows, norm_i, alg, temp, mb);
            add("score_s", pg.score_s);
            add("backward_s", pg.backward_s);
            add("skipped_rows", pg.skipped_rows as f64 / alg.ppo_epochs as f64);
            let (ce, dpo) = (part(&out.ce, i, per_epoch), part(&out.dpo, i, per_epoch));
            if !out.ce.is_empty() {
                add("ce_nll", ce_backward(policy, ce, out.ce_coef, mb) / updates as f64);
            }
            if !out.dpo.is_empty() {
                add("dpo_loss", dpo_backward(policy, reference, dpo, out.dpo_beta, out.ce_coef, mb) / updates as f64);
            }
            let mut rag_rows = 0;
            for (k, (coef, turns)) in out.rag.iter().enumerate() {
                let turns = part(turns, i, per_epoch);
                rag_rows += turns.len();
                add(&format!("policy_l_rag_{k}"), rag_backward(policy, turns, *coef, mb) / updates as f64);
            }
            let any = !rows.is_empty() || !ce.is_empty() || !dpo.is_empty() || rag_rows > 0;
            let grad_norm = if any { opt.clip_grad_norm(cfg.optim.max_grad_norm) } else { 0.0 };
            if any {
                opt.step(cfg.optim.lr);
            }
            st.per_update.push((pg, grad_norm));
        }
    }
    let k = st.per_update.len() as f64;
    for (pg, g) in &st.per_update {
        st.pg.loss += pg.loss / k;
        st.pg.kl += pg.kl / k;
        st.pg.entropy += pg.entropy / k;
        st.pg.clip_frac += pg.clip_frac / k;
        st.pg.ppo_kl += pg.ppo_kl / k;
        st.grad_norm += g / k;
    }
    sums.insert("ppo_updates".into(), k);
    sums.insert("ppo_kl".into(), st.pg.ppo_kl);
    st.extra = sums;
    st
}

/// The row indices of each mini-batch of `epoch`: `0..n` dealt in a random order drawn from
/// (`seed`, `epoch`) into batches of `size` (the last may be smaller); one batch in row order
/// when it holds them all. Always at least one batch, so terms without rows still apply.
pub fn mini_batches(n: usize, size: usize, seed: u64, epoch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..n).collect();
    if size >= n {
        return vec![order];
    }
    let mut rng = Rng::new(seed ^ (epoch as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order.chunks(size.max(1)).map(<[usize]>::to_vec).collect()
}

/// Keeps the rows of a JSONL log whose `step` passes `keep` (rewritten atomically; a missing
/// file is fine, unparsable rows are dropped).
fn trim_jsonl(path: &std::path::Path, keep: impl Fn(u64) -> bool) -> knowrl_engine::Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v["step"].as_u64()).is_some_and(&keep)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    knowrl_engine::fsutil::write_atomic(path, kept.as_bytes())
}
