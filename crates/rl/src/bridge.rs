//! BRIDGE ("BRIDGE: Bilevel Retrieval-Credit-Aware Agentic Reinforcement Learning"): bilevel co-training of a query-side LoRA on the dense
//! retriever (lower level) and the policy (upper level, GRPO). The paper's copy lost Eqs.
//! (6)–(17); the derivation implemented here is in docs/methods/bridge.md, equation by equation
//! (numbers B1–B9 below refer to it).
//!
//! Per step: rollouts with the current retriever η (top-m shown) → GRPO advantages → every
//! retrieval turn t of trajectory i is logged with its history h_{i,t}, top-k candidates N_k,
//! ρ_old(d|h) and the policy's answer likelihood p_θ(y|h,d) → retriever update on the penalised
//! lower-level loss (B6) → policy update with the chosen estimator (B7–B9).
use crate::agent::Trajectory;
use crate::grpo::policy_rows;
use crate::method::{rollout_metrics, Method, MethodSpec, MethodState, StepCtx, StepOutput, TrainEnv};
use crate::query_adapter::QueryAdapter;
use crate::sections::RolloutSection;
use crate::task::Task;
use crate::update::{LossTerm, PgRow, RagTurn, Sequence};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::Mode;
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_retrieval::format::information_block;
use knowrl_retrieval::Hit;
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tch::{Kind, Tensor};

/// How the policy gradient treats the lower level (§3.2; B7–B9).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// BRIDGE: −∇_θ J_RL(θ, η_γ) only (single retriever state).
    #[default]
    Bridge,
    /// Drop the value-function term: −∇_θ J_RL + γ ∇_θ L_RAG(θ, η_γ).
    Drop,
    /// Two-state first-order penalty estimator: also tracks the RAG-only retriever η*:
    /// −∇_θ J_RL + γ (∇_θ L_RAG(θ, η_γ) − ∇_θ L_RAG(θ, η*)).
    TwoState,
}

/// Training schedules of §4.2 (same rollout machinery, different update switches).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// Online bilevel: retriever (RL credit + RAG) then policy, every step.
    #[default]
    Bridge,
    /// The fixed-retriever baseline (GRPO through the same code path).
    Fixed,
    /// `phase_steps` retriever-only steps (RAG likelihood), then policy-only steps.
    RagThenRl,
    /// Policy-only steps, then the last `phase_steps` retriever-only (RAG likelihood).
    RlThenRag,
    /// Online, the retriever trained with the RL credit only.
    DecoupledRl,
    /// Online, the retriever trained with the RAG likelihood only.
    DecoupledRag,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BridgeConfig {
    /// Candidates per retrieval turn N_k (paper 40); the policy sees `rollout.topk` = m.
    pub k: usize,
    /// Retrieval temperature τ_r of ρ_η (paper 0.4).
    pub tau_r: f64,
    /// Posterior temperature τ_p of the credit weights (paper 0.5).
    pub tau_p: f64,
    /// Penalty γ: the retriever loss weighs RL and RAG by 1/(1+γ) and γ/(1+γ) (paper 0.25).
    pub gamma: f64,
    /// Retriever LoRA learning rate (paper 1e-5 for E5-base).
    pub retriever_lr: f64,
    pub lora_rank: i64,
    pub lora_alpha: f64,
    /// Retriever update every N steps (periodic updates, §3.2).
    pub update_every: u64,
    /// Ratio clip of the retrieval-credit surrogate.
    pub clip: f64,
    pub estimator: Estimator,
    pub pipeline: Pipeline,
    /// Steps of the retriever-only phase of rag_then_rl / rl_then_rag.
    pub phase_steps: u64,
    /// How the gold answer y is written after an `<information>` block for p_θ(y|h,d).
    pub answer_template: String,
    /// Every N steps, measure the three estimators against each other (needs two_state).
    pub fidelity_every: u64,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            k: 10,
            tau_r: 0.4,
            tau_p: 0.5,
            gamma: 0.25,
            retriever_lr: 1e-3,
            lora_rank: 16,
            lora_alpha: 16.0,
            update_every: 1,
            clip: 0.2,
            estimator: Estimator::Bridge,
            pipeline: Pipeline::Bridge,
            phase_steps: 0,
            answer_template: "<answer> {} </answer>".into(),
            fidelity_every: 0,
        }
    }
}

impl MethodSpec for BridgeConfig {
    fn data_parallel(&self) -> Result<(), String> {
        if self.fidelity_every > 0 {
            // Its three gradients would be this rank's, not the batch's.
            return Err("field `method.fidelity_every`: the estimator-fidelity diagnostic runs in one process only; \
                        set it to 0 to train BRIDGE data-parallel"
                .into());
        }
        Ok(())
    }
    fn build(&self) -> Box<dyn Method> {
        Box::new(Bridge { cfg: self.clone(), adapter: QueryAdapter::default() })
    }

    fn validate(&self, rollout: &RolloutSection) -> Result<(), String> {
        let m = rollout.topk;
        if self.k <= m {
            return Err(format!(
                "field `method.k`: {} candidates must exceed rollout.topk = {m} shown (the paper's k > m)",
                self.k
            ));
        }
        if self.tau_r <= 0.0 || self.tau_p <= 0.0 {
            return Err("field `method.tau_r`/`tau_p`: temperatures must be positive".into());
        }
        if !self.answer_template.contains("{}") {
            return Err("field `method.answer_template`: needs a {} for the answer".into());
        }
        if self.fidelity_every > 0 && self.estimator != Estimator::TwoState {
            return Err("field `method.fidelity_every`: needs estimator = \"two_state\" (the reference)".into());
        }
        Ok(())
    }

    /// LoRA on the query encoder's attention query and value projections.
    fn query_lora(&self) -> Option<knowrl_engine::LoraConfig> {
        Some(knowrl_engine::LoraConfig {
            rank: self.lora_rank,
            alpha: self.lora_alpha,
            dropout: 0.0,
            target_modules: vec!["query".into(), "value".into()],
        })
    }
}

impl BridgeConfig {
    /// (w_rl, w_rag) of the retriever loss under the pipeline (B6).
    pub fn retriever_weights(&self) -> (f64, f64) {
        match self.pipeline {
            Pipeline::Bridge => (1.0 / (1.0 + self.gamma), self.gamma / (1.0 + self.gamma)),
            Pipeline::DecoupledRl => (1.0, 0.0),
            Pipeline::RagThenRl | Pipeline::RlThenRag | Pipeline::DecoupledRag => (0.0, 1.0),
            Pipeline::Fixed => (0.0, 0.0),
        }
    }

    /// (update the retriever?, update the policy?) at `step` of `steps`.
    pub fn schedule(&self, step: u64, steps: u64) -> (bool, bool) {
        let periodic = self.update_every > 0 && step.is_multiple_of(self.update_every);
        match self.pipeline {
            Pipeline::Fixed => (false, true),
            Pipeline::RagThenRl => (step < self.phase_steps, step >= self.phase_steps),
            Pipeline::RlThenRag => {
                let rl = step < steps.saturating_sub(self.phase_steps);
                (!rl, rl)
            }
            _ => (periodic, true),
        }
    }
}

/// One logged retrieval turn.
#[derive(Debug, Clone)]
pub struct LoggedTurn {
    pub query: String,
    /// Candidate rows N_k(h_t), best first under η at rollout time.
    pub rows: Vec<usize>,
    /// log ρ_old(d|h_t) (B1), fixed.
    pub log_rho_old: Vec<f64>,
    /// log p_θ(y | h_t, d) (B2), fixed for the retriever update.
    pub log_py: Vec<f64>,
    /// The GRPO advantage of the trajectory the turn belongs to.
    pub advantage: f64,
    /// Teacher-forcing rows per candidate: prompt h_t, response ⟨information⟩d ‖ y with only y's
    /// tokens in the loss mask (the policy-side RAG term and B2).
    pub docs: Vec<Sequence>,
}

/// B4: credit weights c̄_{t,d} ∝ ρ_old(d|h) p(y|h,d)^{1/τ_p}, normalised over N_k (sum to 1).
pub fn credit_weights(log_rho_old: &[f64], log_py: &[f64], tau_p: f64) -> Vec<f64> {
    let z: Vec<f64> = log_rho_old.iter().zip(log_py).map(|(r, p)| r + p / tau_p).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// B3: L_RAG(η) = −mean_t log Σ_d ρ_η(d|h_t) p(y|h_t,d) from log ρ [T,k] and log p [T,k].
pub fn rag_loss(log_rho: &Tensor, log_py: &Tensor) -> Tensor {
    -(log_rho + log_py).logsumexp([1i64].as_slice(), false).mean(Kind::Float)
}

/// B5: the retrieval-credit surrogate J = mean_t Σ_d c̄_{t,d} min(r A, clip(r, 1±ε) A),
/// r = ρ_η / ρ_old. Returns J (to be maximised).
pub fn credit_surrogate(log_rho: &Tensor, log_rho_old: &Tensor, credit: &Tensor, adv: &Tensor, clip: f64) -> Tensor {
    let ratio = (log_rho - log_rho_old).exp();
    let a = adv.unsqueeze(1);
    let unclipped = &ratio * &a;
    let clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * &a;
    (unclipped.minimum(&clipped) * credit).sum_dim_intlist(1, false, Kind::Float).mean(Kind::Float)
}

/// B6: the retriever's loss on logged turns under the current adapter (differentiable w.r.t.
/// the query LoRA only): w_rl (−J) + w_rag L_RAG. Returns (loss, J, L_RAG).
pub fn retriever_loss(
    dense: &DenseRetriever,
    turns: &[LoggedTurn],
    cfg: &BridgeConfig,
    (w_rl, w_rag): (f64, f64),
) -> knowrl_engine::Result<(Tensor, f64, f64)> {
    let queries: Vec<String> = turns.iter().map(|t| t.query.clone()).collect();
    let rows: Vec<Vec<usize>> = turns.iter().map(|t| t.rows.clone()).collect();
    let k = rows[0].len() as i64;
    let scores = dense.scores_of(&queries, &rows, Mode::TRAIN).map_err(ret_err)?;
    let log_rho = (&scores / cfg.tau_r).log_softmax(1, Kind::Float);
    let mat = |f: &dyn Fn(&LoggedTurn) -> &Vec<f64>| {
        let v: Vec<f32> = turns.iter().flat_map(|t| f(t).iter().map(|x| *x as f32)).collect();
        Tensor::from_slice(&v).to_device(scores.device()).view([turns.len() as i64, k])
    };
    let log_py = mat(&|t| &t.log_py);
    let log_rho_old = mat(&|t| &t.log_rho_old);
    let credit: Vec<f32> = turns
        .iter()
        .flat_map(|t| credit_weights(&t.log_rho_old, &t.log_py, cfg.tau_p).into_iter().map(|x| x as f32))
        .collect();
    let credit = Tensor::from_slice(&credit).to_device(scores.device()).view([turns.len() as i64, k]);
    let adv =
        Tensor::from_slice(&turns.iter().map(|t| t.advantage as f32).collect::<Vec<_>>()).to_device(scores.device());
    let rag = rag_loss(&log_rho, &log_py);
    let j = credit_surrogate(&log_rho, &log_rho_old, &credit, &adv, cfg.clip);
    let loss = -&j * w_rl + &rag * w_rag;
    Ok((loss, j.double_value(&[]), rag.double_value(&[])))
}

fn ret_err(e: knowrl_retrieval::RetrievalError) -> knowrl_engine::EngineError {
    knowrl_engine::EngineError::Invalid(e.to_string())
}

/// Logs every retrieval turn of `trajs` (B1, B2) with the retriever as it was during rollout.
#[allow(clippy::too_many_arguments)]
fn log_turns(
    cfg: &BridgeConfig,
    ctx: &StepCtx,
    dense: &DenseRetriever,
    prompts: &[Vec<u32>],
    trajs: &[Trajectory],
    tasks: &[&Task],
    group: &[usize],
    adv: &[f64],
) -> knowrl_engine::Result<Vec<LoggedTurn>> {
    let mut turns = vec![];
    let mut histories = vec![];
    for (j, t) in trajs.iter().enumerate() {
        for (q, &start) in t.queries.iter().zip(&t.observation_starts) {
            let mut h = prompts[j].clone();
            h.extend(&t.response[..start]);
            histories.push((h, group[j], adv[j]));
            turns.push(q.clone());
        }
    }
    if turns.is_empty() {
        return Ok(vec![]);
    }
    let rows = dense.top_rows(&turns, cfg.k).map_err(ret_err)?;
    let scores = tch::no_grad(|| dense.scores_of(&turns, &rows, Mode::EVAL)).map_err(ret_err)?;
    let log_rho: Vec<f32> = Vec::try_from((scores / cfg.tau_r).log_softmax(1, Kind::Float).view(-1)).unwrap();
    let mut out = vec![];
    for (ti, ((h, g, a), q)) in histories.into_iter().zip(&turns).enumerate() {
        let y = cfg.answer_template.replace("{}", &tasks[g].golden[0]);
        let answer = ctx.tok.encode(&y, false)?;
        let docs: Vec<Sequence> = rows[ti]
            .iter()
            .map(|&r| {
                let p = dense.corpus.get(r);
                // d alone, shown the way the rollout shows results.
                let block = information_block(
                    &[Hit { id: p.id, contents: p.contents, score: 0.0 }],
                    ctx.rollout.observation_format,
                );
                // The history is the prompt and d the masked head of the response, so the k
                // candidates of a turn share one prompt, which scoring runs once
                // (`score_shared`); only y's tokens count.
                let mut response = ctx.tok.encode(&block, false)?;
                let mut loss_mask = vec![false; response.len()];
                response.extend(&answer);
                loss_mask.resize(response.len(), true);
                Ok(Sequence { prompt: h.clone(), response, loss_mask })
            })
            .collect::<knowrl_engine::Result<_>>()?;
        let k = rows[ti].len();
        out.push(LoggedTurn {
            query: q.clone(),
            rows: rows[ti].clone(),
            log_rho_old: log_rho[ti * k..(ti + 1) * k].iter().map(|x| *x as f64).collect(),
            log_py: vec![],
            advantage: a,
            docs,
        });
    }
    // B2: log p_θ(y | h, d) for every candidate, teacher-forced, no gradient.
    let all: Vec<&Sequence> = out.iter().flat_map(|t| t.docs.iter()).collect();
    let mut lp = vec![];
    let _merged = ctx.policy.lm.merged_adapters();
    for mb in all.chunks(ctx.micro_batch.max(1) * 4) {
        let reqs: Vec<ScoreRequest> = mb.iter().map(|r| r.request(true)).collect();
        let s = tch::no_grad(|| score(&ctx.policy.lm, &reqs, 1.0, Mode::EVAL));
        let v: Vec<f32> = Vec::try_from((s.logprobs * s.mask).sum_dim_intlist(1, false, Kind::Float)).unwrap();
        lp.extend(v.into_iter().map(|x| x as f64));
    }
    let mut it = lp.into_iter();
    for t in &mut out {
        t.log_py = (0..t.rows.len()).map(|_| it.next().unwrap()).collect();
    }
    Ok(out)
}

/// ρ under the current adapter values (no gradient), for the policy-side RAG terms.
fn rho(dense: &DenseRetriever, turns: &[LoggedTurn], tau_r: f64) -> knowrl_engine::Result<Vec<Vec<f64>>> {
    if turns.is_empty() {
        return Ok(vec![]);
    }
    let q: Vec<String> = turns.iter().map(|t| t.query.clone()).collect();
    let rows: Vec<Vec<usize>> = turns.iter().map(|t| t.rows.clone()).collect();
    let s = tch::no_grad(|| dense.scores_of(&q, &rows, Mode::EVAL)).map_err(ret_err)?;
    let p = (s / tau_r).softmax(1, Kind::Float);
    let k = rows[0].len();
    let v: Vec<f32> = Vec::try_from(p.view(-1)).unwrap();
    Ok((0..turns.len()).map(|t| v[t * k..(t + 1) * k].iter().map(|x| *x as f64).collect()).collect())
}

fn rag_turns(turns: &[LoggedTurn], rho: Vec<Vec<f64>>) -> Vec<RagTurn> {
    turns.iter().zip(rho).map(|(t, r)| RagTurn { docs: t.docs.clone(), rho: r }).collect()
}

/// Peak-RSS bookkeeping for one retriever update (Linux: VmHWM reset through clear_refs).
fn reset_peak() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    vm("VmRSS")
}

fn vm(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

pub struct Bridge {
    pub cfg: BridgeConfig,
    adapter: QueryAdapter,
}

fn needs_dense(dense: Option<&DenseRetriever>) -> knowrl_engine::Result<&DenseRetriever> {
    dense.ok_or_else(|| {
        knowrl_engine::EngineError::Invalid("bridge: needs the dense retriever with a query LoRA".into())
    })
}

impl Method for Bridge {
    fn step(&mut self, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput> {
        step(&self.cfg, ctx, tasks, &mut self.adapter)
    }

    fn state(&self, env: &TrainEnv) -> knowrl_engine::Result<MethodState> {
        Ok(self.adapter.state(needs_dense(env.dense)?))
    }

    fn restore(&mut self, env: &TrainEnv, state: MethodState) -> knowrl_engine::Result<()> {
        self.adapter = QueryAdapter::restore(needs_dense(env.dense)?, state)?;
        Ok(())
    }

    /// §4.2's estimator fidelity every `fidelity_every` steps, on the step's own terms (the
    /// two-state estimator's PG and two RAG terms): a diagnostic the trainer runs between the
    /// step and the update, so the step itself never back-propagates.
    fn diagnose(&mut self, ctx: &StepCtx, out: &StepOutput) -> knowrl_engine::Result<Vec<(String, f64)>> {
        let every = self.cfg.fidelity_every;
        let rag: Vec<LossTerm> = out.terms.iter().filter(|t| matches!(t, LossTerm::Rag { .. })).cloned().collect();
        if every == 0 || !ctx.step.is_multiple_of(every) || rag.len() != 2 {
            return Ok(vec![]);
        }
        Ok(fidelity(ctx, out.pg_rows(), &rag)?.into_iter().filter(|(_, v)| v.is_finite()).collect())
    }
}

/// Algorithm: one BRIDGE step.
fn step(
    cfg: &BridgeConfig,
    ctx: &StepCtx,
    tasks: &[&Task],
    adapter: &mut QueryAdapter,
) -> knowrl_engine::Result<StepOutput> {
    let dense = needs_dense(ctx.dense)?;
    let (update_retriever, update_policy) = cfg.schedule(ctx.step, ctx.steps);
    let (prompts, group) = ctx.replicate(tasks, ctx.rollout.group_size, |t| &t.agent)?;
    let trajs = ctx.rollout(&prompts, true, 0)?;
    let rewards = ctx.rewards(&trajs, tasks, &group);
    let adv = crate::advantage::group_advantages(&rewards, &group, ctx.algorithm.normalisation);
    let mut metrics = rollout_metrics(&trajs, &rewards, tasks, &group);
    let needs_log = update_retriever || (update_policy && cfg.estimator != Estimator::Bridge);
    let logged = needs_log && cfg.pipeline != Pipeline::Fixed;
    let log = || log_turns(cfg, ctx, dense, &prompts, &trajs, tasks, &group, &adv);
    let turns = if logged { log()? } else { vec![] };
    // Two-state: η* keeps its own retrieval logs (its own candidates N_k, ρ_old and p(y|h,d)),
    // as the paper keeps "the corresponding retrieval logs" for each state; before η*'s first
    // step it equals η, so its logs are η's.
    let two_state = cfg.estimator == Estimator::TwoState;
    let turns_star = if two_state && logged {
        match adapter.with_second(dense, log) {
            Some(t) => t?,
            None => turns.clone(),
        }
    } else {
        vec![]
    };
    metrics.extra.insert("retrieval_turns".into(), turns.len() as f64);
    let zero_adv = turns.iter().filter(|t| t.advantage == 0.0).count() as f64;
    metrics.extra.insert("zero_advantage_turns".into(), zero_adv);
    // The batch's turns (over ranks, when data parallel): the retriever's losses are means
    // over them, so each rank's part weighs its own turns by their share.
    let mut all_turns = [turns.len() as f64];
    ctx.shard.sum(&mut all_turns)?;
    let [all_turns] = all_turns;
    let part = |logged: &[LoggedTurn], weights| -> knowrl_engine::Result<Option<(Tensor, f64, f64)>> {
        if logged.is_empty() {
            return Ok(None);
        }
        let (loss, j, rag) = retriever_loss(dense, logged, cfg, weights)?;
        let share = logged.len() as f64 / all_turns;
        Ok(Some((loss * share, j * share, rag * share)))
    };

    // Lower level first (the retriever adapts before the policy learns on it).
    if update_retriever && all_turns > 0.0 {
        let base = reset_peak();
        let t0 = Instant::now();
        let group = ctx.shard.group;
        // Two-state: also one step of the RAG-only retriever η* on its own logs (its own values
        // and moments; as many turns as η's, the same trajectories).
        if two_state {
            adapter.step_second(dense, cfg.retriever_lr, group, || Ok(part(&turns_star, (0.0, 1.0))?.map(|p| p.0)))?;
        }
        let local = part(&turns, cfg.retriever_weights())?;
        adapter.step(dense, cfg.retriever_lr, group, || Ok(local.as_ref().map(|p| p.0.shallow_clone())))?;
        let mut j_rag = local.map_or([0.0, 0.0], |p| [p.1, p.2]);
        ctx.shard.sum(&mut j_rag)?;
        let [j, rag] = j_rag;
        metrics.extra.insert("retriever_update_s".into(), t0.elapsed().as_secs_f64());
        if let (Some(b), Some(peak)) = (base, vm("VmHWM")) {
            metrics.extra.insert("retriever_update_peak_bytes".into(), peak.saturating_sub(b) as f64);
        }
        // Besides the adapter state: the retrieval logs (η*'s too, for the two-state estimator).
        let per_turn = |t: &LoggedTurn| (t.rows.len() * (std::mem::size_of::<usize>() + 16)) as f64;
        let held = adapter.held_bytes(dense) + turns.iter().chain(&turns_star).map(per_turn).sum::<f64>();
        metrics.extra.insert("retriever_state_bytes".into(), held);
        metrics.extra.insert("retriever_j_rl".into(), j);
        metrics.extra.insert("retriever_l_rag".into(), rag);
    }
    if !update_policy {
        return Ok(StepOutput { terms: vec![], metrics });
    }
    let (pg, kept) = policy_rows(ctx, &prompts, &trajs, &rewards, &group);
    metrics.kept_groups = kept;
    // Upper level: B7 (BRIDGE) / B8 (Drop) / B9 (two-state).
    // Pushed even where this rank logged no turn: every rank returns the same terms.
    let mut rag = vec![];
    if all_turns > 0.0 && cfg.estimator != Estimator::Bridge {
        rag.push(LossTerm::Rag { turns: rag_turns(&turns, rho(dense, &turns, cfg.tau_r)?), coef: cfg.gamma });
        if two_state {
            if let Some(r) = adapter.with_second(dense, || rho(dense, &turns_star, cfg.tau_r)) {
                rag.push(LossTerm::Rag { turns: rag_turns(&turns_star, r?), coef: -cfg.gamma });
            }
        }
    }
    let mut terms = vec![LossTerm::Pg { rows: pg, normaliser: None }];
    terms.extend(rag);
    Ok(StepOutput { terms, metrics })
}

/// §4.2 estimator fidelity on this batch: cosine and relative error of the BRIDGE (B7) and Drop
/// (B8) policy gradients against the two-state one (B9).
fn fidelity(ctx: &StepCtx, pg: &[PgRow], rag: &[LossTerm]) -> knowrl_engine::Result<Vec<(String, f64)>> {
    let params = ctx.policy.trainable_parameters();
    let grab = |f: &dyn Fn()| -> Tensor {
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        f();
        let g: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| {
                let g = p.grad();
                if g.defined() {
                    g.view(-1).to_kind(Kind::Double)
                } else {
                    Tensor::zeros([p.numel() as i64], (Kind::Double, p.device()))
                }
            })
            .collect();
        Tensor::cat(&g, 0)
    };
    let pg_term = [LossTerm::Pg { rows: pg.to_vec(), normaliser: None }];
    let (alg, temp, mb) = (ctx.algorithm, ctx.rollout.temperature, ctx.micro_batch);
    let g_rl = grab(&|| {
        crate::update::backward(ctx.policy, ctx.reference, &pg_term, alg, temp, mb);
    });
    let g_gamma = grab(&|| {
        crate::update::backward(ctx.policy, ctx.reference, &rag[..1], alg, temp, mb);
    });
    let g_star = grab(&|| {
        crate::update::backward(ctx.policy, ctx.reference, &rag[1..2], alg, temp, mb);
    });
    for (_, p) in &params {
        p.shallow_clone().zero_grad();
    }
    let two = &g_rl + &g_gamma + &g_star;
    let drop = &g_rl + &g_gamma;
    // A batch whose advantages are all zero has no RL gradient: BRIDGE's direction is undefined
    // there (NaN: not recorded), while its relative error, 1, says it missed the update.
    let cos = |a: &Tensor, b: &Tensor| {
        let n = (a.norm() * b.norm()).double_value(&[]);
        if n > 0.0 {
            a.dot(b).double_value(&[]) / n
        } else {
            f64::NAN
        }
    };
    let rel = |a: &Tensor, b: &Tensor| ((a - b).norm() / b.norm().clamp_min(1e-30)).double_value(&[]);
    Ok(vec![
        ("fidelity_cos_bridge".into(), cos(&g_rl, &two)),
        ("fidelity_cos_drop".into(), cos(&drop, &two)),
        ("fidelity_relerr_bridge".into(), rel(&g_rl, &two)),
        ("fidelity_relerr_drop".into(), rel(&drop, &two)),
    ])
}
