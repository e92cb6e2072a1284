//! AKBE (Chen et al., Tencent, 2026: adaptive knowledge-boundary exploration for agentic RL; Algorithm 1; released code: docs/methods/akbe.md).
//!
//! Per question: n_wt with-tool trajectories (agent prompt) and n_nt no-tool trajectories
//! (no-tool prompt, one turn, never searched). Comparing the two paths' correctness places the
//! question in a knowledge-boundary category (§4.2) that picks a target trajectory; the joint
//! objective (Eq. 5) is the base RL loss on the with-tool trajectories (GRPO / DAPO / GSPO:
//! `grpo::policy_rows`) plus λ × the cross-entropy of the targets (Eq. 6), per-sequence
//! token-mean, observation tokens masked.
use crate::agent::Trajectory;
use crate::grpo::policy_rows;
use crate::method::{correct, rollout_metrics, row_seed, Method, MethodSpec, Shard, StepCtx, StepOutput};
use crate::sections::RolloutSection;
use crate::task::Task;
use crate::update::{mask_len, DpoPair, LossTerm, Sequence};
use knowrl_engine::Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;

/// §4.2's four categories (with-tool correct?, no-tool correct?).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// WT ✓, NT ✗: the tool is needed; target = a correct WT trajectory with fewest calls.
    ToolDependent,
    /// WT ✓, NT ✓: the tool is redundant; target = a correct NT trajectory.
    Efficiency,
    /// WT ✗, NT ✓: the tool hurts; target = a correct NT trajectory.
    Hallucination,
    /// WT ✗, NT ✗: no target; only the RL loss.
    BothWrong,
}

impl Category {
    pub const ALL: [Category; 4] =
        [Category::ToolDependent, Category::Efficiency, Category::Hallucination, Category::BothWrong];
    pub fn name(self) -> &'static str {
        match self {
            Category::ToolDependent => "tool_dependent",
            Category::Efficiency => "efficiency",
            Category::Hallucination => "hallucination",
            Category::BothWrong => "both_wrong",
        }
    }
}

/// How a target is chosen among the correct trajectories of the chosen path.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum TargetRule {
    /// Released code: the shortest correct trajectory for every category, counted in
    /// attention-mask tokens (tool results included, so each extra call costs its results).
    #[default]
    Shortest,
    /// The shortest correct trajectory counted in generated tokens only (tool results excluded).
    ShortestGenerated,
    /// Paper §4.2: fewest tool calls with a random tie-break (tool-dependent); a random correct
    /// no-tool trajectory (efficiency, hallucination).
    FewestCallsRandom,
}

/// Which prompt the target is trained under.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum TeacherPrompt {
    /// Released code: a no-tool target keeps its no-tool prompt.
    #[default]
    Own,
    /// Not studied by the paper: every target is trained under the with-tool prompt, so the
    /// "answer directly" behaviour is taught where the tool is available.
    WithTool,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Signals {
    /// On-policy: both paths sampled from the current policy every step (the paper).
    #[default]
    Online,
    /// Offline AKBE: signals built once per question from the fixed starting checkpoint.
    Offline,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Eq. 6: cross-entropy on the targets.
    #[default]
    Ce,
    /// Appendix C: DPO with preferred = target, rejected = the with-tool trajectory with the
    /// most tool calls.
    Dpo,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AkbeConfig {
    /// With-tool trajectories per question (released: 16; `rollout.group_size` is not used).
    pub n_wt: usize,
    /// No-tool trajectories per question (released: 8).
    pub n_nt: usize,
    /// λ of Eq. 5 (released `sdpo_weight` = 0.05).
    pub lambda: f64,
    /// Categories whose targets are trained on (ablations of Table 3 remove some).
    pub categories: Vec<Category>,
    pub target: TargetRule,
    pub teacher_prompt: TeacherPrompt,
    pub signals: Signals,
    pub objective: Objective,
    /// DPO's β (Appendix C variant).
    pub dpo_beta: f64,
    /// Offline AKBE: the checkpoint whose policy builds the signals (a run's `checkpoints`
    /// directory, its `latest` step, or one `step-N` directory; the paper's "fixed GRPO-trained
    /// checkpoint"). Unset: the starting policy.
    pub signals_checkpoint: Option<std::path::PathBuf>,
    /// Generated tokens the no-tool path may use. 0 (default): the with-tool path's whole
    /// generation budget (`max_turns × max_tokens_per_turn`), as the released code gives both
    /// paths one response budget (6,192 tokens).
    pub no_tool_max_tokens: usize,
}

impl Default for AkbeConfig {
    fn default() -> Self {
        AkbeConfig {
            n_wt: 8,
            n_nt: 4,
            lambda: 0.05,
            categories: vec![Category::ToolDependent, Category::Efficiency, Category::Hallucination],
            target: TargetRule::Shortest,
            teacher_prompt: TeacherPrompt::Own,
            signals: Signals::Online,
            objective: Objective::Ce,
            dpo_beta: 0.1,
            signals_checkpoint: None,
            no_tool_max_tokens: 0,
        }
    }
}

impl AkbeConfig {
    /// The no-tool path's generation budget (see `no_tool_max_tokens`).
    pub fn no_tool_budget(&self, rollout: &RolloutSection) -> usize {
        match self.no_tool_max_tokens {
            0 => rollout.max_turns * rollout.max_tokens_per_turn,
            n => n,
        }
    }
}

impl MethodSpec for AkbeConfig {
    fn build(&self) -> Box<dyn Method> {
        Box::new(Akbe { cfg: self.clone(), offline: OfflineSignals::default() })
    }

    /// Offline signals come from a frozen policy (the starting one, or `signals_checkpoint`'s);
    /// DPO scores against the same frozen policy.
    fn needs_reference(&self) -> bool {
        self.signals == Signals::Offline || self.objective == Objective::Dpo
    }

    fn reference_checkpoint(&self) -> Option<std::path::PathBuf> {
        self.signals_checkpoint.clone()
    }

    fn validate(&self, _rollout: &RolloutSection) -> Result<(), String> {
        if self.n_wt < 2 {
            return Err(format!("field `method.n_wt`: {} (group advantages need at least 2)", self.n_wt));
        }
        if self.lambda < 0.0 {
            return Err(format!("field `method.lambda`: {} must be ≥ 0", self.lambda));
        }
        if self.categories.contains(&Category::BothWrong) {
            return Err("field `method.categories`: both_wrong has no target".into());
        }
        if self.signals_checkpoint.is_some() && self.signals != Signals::Offline {
            return Err("field `method.signals_checkpoint`: needs signals = \"offline\"".into());
        }
        if self.signals_checkpoint.is_some() && self.objective == Objective::Dpo {
            return Err("field `method.signals_checkpoint`: the DPO variant's reference is the starting policy".into());
        }
        Ok(())
    }
}

/// What categorisation and target choice need to know about one trajectory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub correct: bool,
    pub tool_calls: usize,
    /// Generated tokens (the loss mask's).
    pub tokens: usize,
    /// All response tokens, tool results included (the attention mask's, past the prompt).
    pub all_tokens: usize,
}

/// Which path and which trajectory of it is the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    WithTool(usize),
    NoTool(usize),
}

/// §4.2: the category from the two paths (a missing path counts as all wrong).
pub fn categorise(wt: &[Outcome], nt: &[Outcome]) -> Category {
    match (wt.iter().any(|o| o.correct), nt.iter().any(|o| o.correct)) {
        (true, false) => Category::ToolDependent,
        (true, true) => Category::Efficiency,
        (false, true) => Category::Hallucination,
        (false, false) => Category::BothWrong,
    }
}

/// Among the correct trajectories, those minimising `key`; the first of them (Shortest) or a
/// uniformly random one (paper's tie-break).
fn pick(outcomes: &[Outcome], key: impl Fn(&Outcome) -> usize, random: bool, rng: &mut Rng) -> Option<usize> {
    let best = outcomes.iter().filter(|o| o.correct).map(&key).min()?;
    let ties: Vec<usize> = (0..outcomes.len()).filter(|&i| outcomes[i].correct && key(&outcomes[i]) == best).collect();
    Some(if random { ties[rng.below(ties.len())] } else { ties[0] })
}

/// The target of a question in `category` (None for both-wrong or a disabled category).
pub fn select_target(
    category: Category,
    wt: &[Outcome],
    nt: &[Outcome],
    cfg: &AkbeConfig,
    rng: &mut Rng,
) -> Option<Target> {
    if !cfg.categories.contains(&category) {
        return None;
    }
    let random = cfg.target == TargetRule::FewestCallsRandom;
    let length = |o: &Outcome| if cfg.target == TargetRule::ShortestGenerated { o.tokens } else { o.all_tokens };
    match category {
        Category::ToolDependent if random => pick(wt, |o| o.tool_calls, true, rng).map(Target::WithTool),
        Category::ToolDependent => pick(wt, length, false, rng).map(Target::WithTool),
        Category::Efficiency | Category::Hallucination if random => pick(nt, |_| 0, true, rng).map(Target::NoTool),
        Category::Efficiency | Category::Hallucination => pick(nt, length, false, rng).map(Target::NoTool),
        Category::BothWrong => None,
    }
}

/// The DPO variant's rejected trajectory: the with-tool one with the most tool calls (first on
/// ties), unless it is the target itself.
pub fn rejected(wt: &[Outcome], target: Target) -> Option<usize> {
    let most = (0..wt.len()).max_by_key(|&i| (wt[i].tool_calls, std::cmp::Reverse(i)))?;
    (target != Target::WithTool(most)).then_some(most)
}

/// One question's signal: its category and target sequence (prompt ids, response, mask).
#[derive(Debug, Clone)]
pub struct Signal {
    pub category: Category,
    pub target: Option<crate::update::Sequence>,
    pub rejected: Option<crate::update::Sequence>,
}

/// Offline AKBE's per-question signals, built from the starting checkpoint on first use.
#[derive(Default)]
pub struct OfflineSignals(HashMap<String, Signal>);

fn outcomes(trajs: &[Trajectory], task: &Task) -> Vec<Outcome> {
    trajs
        .iter()
        .map(|t| Outcome {
            correct: correct(t, task),
            tool_calls: t.tool_calls(),
            tokens: mask_len(&t.loss_mask) as usize,
            all_tokens: t.response.len(),
        })
        .collect()
}

/// Categorises question `task` from its two paths and builds the target rows.
#[allow(clippy::too_many_arguments)]
fn signal(
    cfg: &AkbeConfig,
    task: &Task,
    wt_prompt: &[u32],
    wt: &[Trajectory],
    nt_prompt: &[u32],
    nt: &[Trajectory],
    rng: &mut Rng,
) -> Signal {
    let (wo, no) = (outcomes(wt, task), outcomes(nt, task));
    let category = categorise(&wo, &no);
    let target = select_target(category, &wo, &no, cfg, rng);
    let ce = Sequence::of;
    let teacher_nt_prompt = match cfg.teacher_prompt {
        TeacherPrompt::Own => nt_prompt,
        TeacherPrompt::WithTool => wt_prompt,
    };
    let target_row = target.map(|t| match t {
        Target::WithTool(i) => ce(wt_prompt, &wt[i]),
        Target::NoTool(i) => ce(teacher_nt_prompt, &nt[i]),
    });
    let rejected_row = target.and_then(|t| rejected(&wo, t)).map(|i| ce(wt_prompt, &wt[i]));
    Signal { category, target: target_row, rejected: rejected_row }
}

pub struct Akbe {
    pub cfg: AkbeConfig,
    /// Built on first use from the frozen policy, seeded by the question: a resumed run
    /// rebuilds the same signals, so they need no checkpoint.
    offline: OfflineSignals,
}

impl Method for Akbe {
    fn step(&mut self, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput> {
        step(&self.cfg, ctx, tasks, &mut self.offline)
    }
}

/// Algorithm 1, one step.
fn step(
    cfg: &AkbeConfig,
    ctx: &StepCtx,
    tasks: &[&Task],
    offline: &mut OfflineSignals,
) -> knowrl_engine::Result<StepOutput> {
    if let Some(t) = tasks.iter().find(|t| t.no_tool.system.is_none() && t.no_tool.user.is_empty()) {
        return Err(knowrl_engine::EngineError::Invalid(format!(
            "AKBE: task {} has no no-tool prompt (jsonl/parquet rows need a `prompt_no_tool` column, as AKBE's data has)",
            t.id
        )));
    }
    // Dual-path rollouts (lines 3-4). The no-tool path never calls the retriever.
    let t0 = Instant::now();
    let (wt_prompts, wt_group) = ctx.replicate(tasks, cfg.n_wt, |t| &t.agent)?;
    let wt = ctx.rollout(&wt_prompts, true, 0)?;
    let wt_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let (nt_prompts, nt_group) = ctx.replicate(tasks, cfg.n_nt, |t| &t.no_tool)?;
    let budget = cfg.no_tool_budget(ctx.rollout);
    let nt = if cfg.signals == Signals::Online {
        ctx.rollout_once(ctx.policy, &nt_prompts, wt.len(), budget)?
    } else {
        vec![]
    };
    let nt_s = t1.elapsed().as_secs_f64();

    // Base RL loss on the with-tool trajectories only (released: no-tool rollouts are teachers only).
    let rewards = ctx.rewards(&wt, tasks, &wt_group);
    let (pg, kept_groups) = policy_rows(ctx, &wt_prompts, &wt, &rewards, &wt_group);

    // Categories and targets (lines 5-16). The random tie-break draws from the question's own
    // generator (its index in the step's batch), whatever rank holds it.
    let mut signals = vec![];
    for (q, task) in tasks.iter().enumerate() {
        let mut rng = Rng::new(row_seed(ctx.seed ^ 0xA4BE, ctx.step, ctx.shard.first_task + q));
        let rows = |g: &[usize]| -> Vec<usize> { (0..g.len()).filter(|&j| g[j] == q).collect() };
        let (wi, ni) = (rows(&wt_group), rows(&nt_group));
        let s = match cfg.signals {
            Signals::Online => {
                let pick = |v: &[Trajectory], idx: &[usize]| -> Vec<Trajectory> {
                    idx.iter().map(|&j| v[j].clone()).collect()
                };
                signal(cfg, task, &wt_prompts[wi[0]], &pick(&wt, &wi), &nt_prompts[ni[0]], &pick(&nt, &ni), &mut rng)
            }
            Signals::Offline => offline_signal(cfg, ctx, task, &wt_prompts[wi[0]], &nt_prompts[ni[0]], offline)?,
        };
        signals.push(s);
    }
    let mut metrics = rollout_metrics(&wt, &rewards, tasks, &wt_group);
    metrics.kept_groups = kept_groups;
    for c in Category::ALL {
        metrics.extra.insert(format!("cat_{}", c.name()), signals.iter().filter(|s| s.category == c).count() as f64);
    }
    metrics.extra.insert("wt_rollout_s".into(), wt_s);
    metrics.extra.insert("nt_rollout_s".into(), nt_s);
    if !nt.is_empty() {
        metrics.extra.insert("nt_em".into(), outcomes_em(&nt, tasks, &nt_group) / nt.len() as f64);
    }
    let targets: Vec<&Signal> = signals.iter().filter(|s| s.target.is_some()).collect();
    metrics.extra.insert("targets".into(), targets.len() as f64);
    let aux = match cfg.objective {
        Objective::Ce => {
            LossTerm::Ce { rows: targets.iter().filter_map(|s| s.target.clone()).collect(), coef: cfg.lambda }
        }
        Objective::Dpo => LossTerm::Dpo {
            pairs: targets
                .iter()
                .filter_map(|s| Some(DpoPair { chosen: s.target.clone()?, rejected: s.rejected.clone()? }))
                .collect(),
            beta: cfg.dpo_beta,
            coef: cfg.lambda,
        },
    };
    Ok(StepOutput { terms: vec![LossTerm::Pg { rows: pg, normaliser: None }, aux], metrics })
}

fn outcomes_em(trajs: &[Trajectory], tasks: &[&Task], group: &[usize]) -> f64 {
    trajs.iter().zip(group).filter(|(t, &k)| correct(t, tasks[k])).count() as f64
}

/// Offline AKBE: the question's signal from the frozen policy (the starting weights, or the
/// `signals_checkpoint` the run loaded as its reference), computed once.
fn offline_signal(
    cfg: &AkbeConfig,
    ctx: &StepCtx,
    task: &Task,
    wt_prompt: &[u32],
    nt_prompt: &[u32],
    cache: &mut OfflineSignals,
) -> knowrl_engine::Result<Signal> {
    if let Some(s) = cache.0.get(&task.id) {
        return Ok(s.clone());
    }
    let frozen = ctx.reference.ok_or_else(|| {
        knowrl_engine::EngineError::Invalid("[method] signals = \"offline\" needs the frozen policy".into())
    })?;
    // Seeded by the question, not the step: the signal is the same whenever it is first built
    // (so a resumed run rebuilds it identically).
    let seed = task.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    // Rows numbered within the question (not the rank's batch), so any rank builds the same.
    let frozen_ctx = StepCtx { step: seed, shard: Shard::whole(1), ..*ctx };
    let wt = frozen_ctx.rollout_with(frozen, &vec![wt_prompt.to_vec(); cfg.n_wt], true, 0)?;
    let budget = cfg.no_tool_budget(ctx.rollout);
    let nt = frozen_ctx.rollout_once(frozen, &vec![nt_prompt.to_vec(); cfg.n_nt], cfg.n_wt, budget)?;
    let mut rng = Rng::new(seed);
    let s = signal(cfg, task, wt_prompt, &wt, nt_prompt, &nt, &mut rng);
    cache.0.insert(task.id.clone(), s.clone());
    Ok(s)
}
