//! GRPO / DAPO / GSPO on the search-agent loop: G trajectories per question from the agent
//! prompt, group-relative advantages (Shao et al. 2024 §4.1.2), DAPO's dynamic sampling (drop
//! groups whose rewards are all equal); the loss itself (token ratios or GSPO's sequence ratio,
//! clip, aggregation) is `update::pg_backward`.
use crate::advantage::{group_advantages, informative_groups};
use crate::agent::Trajectory;
use crate::method::{rollout_metrics, Method, MethodSpec, StepCtx, StepMetrics, StepOutput};
use crate::reward::otc_tool_factor;
use crate::sections::Algorithm;
use crate::task::Task;
use crate::update::{LossTerm, PgRow, Sequence};
use serde::{Deserialize, Serialize};

/// `[method] name = "grpo"`: no fields of its own (the algorithm is `[algorithm] name`, the OTC
/// shaping `[reward] tool_productivity`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GrpoConfig {}

impl MethodSpec for GrpoConfig {
    fn build(&self) -> Box<dyn Method> {
        Box::new(Grpo)
    }
}

pub struct Grpo;

/// Policy-gradient rows for trajectories grouped by question (shared with AKBE, whose base
/// loss is this one). Returns the rows and the number of groups kept.
pub fn policy_rows(
    ctx: &StepCtx,
    prompts: &[Vec<u32>],
    trajs: &[Trajectory],
    rewards: &[f64],
    group: &[usize],
) -> (Vec<PgRow>, usize) {
    let alg = ctx.algorithm;
    let adv = group_advantages(rewards, group, alg.normalisation);
    let kept = match alg.name {
        Algorithm::Dapo => informative_groups(rewards, group),
        _ => group.iter().copied().collect(),
    };
    let rows = (0..trajs.len())
        .filter(|&j| kept.contains(&group[j]))
        .map(|j| PgRow::new(Sequence::of(&prompts[j], &trajs[j]), adv[j], 1.0))
        .collect();
    (rows, kept.len())
}

/// OTC-GRPO: each correct response's reward × r_tool(m, n), n = the fewest tool calls among
/// the correct responses of its group.
pub fn otc_shaped(rewards: &[f64], trajs: &[Trajectory], group: &[usize], c: f64) -> Vec<f64> {
    let mut best: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for ((r, t), g) in rewards.iter().zip(trajs).zip(group) {
        if *r > 0.0 {
            let e = best.entry(*g).or_insert(usize::MAX);
            *e = (*e).min(t.tool_calls());
        }
    }
    rewards
        .iter()
        .zip(trajs)
        .zip(group)
        .map(|((r, t), g)| if *r > 0.0 { r * otc_tool_factor(t.tool_calls(), best[g], c) } else { *r })
        .collect()
}

impl Method for Grpo {
    fn step(&mut self, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput> {
        let (prompts, group) = ctx.replicate(tasks, ctx.rollout.group_size, |t| &t.agent)?;
        let trajs = ctx.rollout(&prompts, true, 0)?;
        let mut rewards = ctx.rewards(&trajs, tasks, &group);
        if ctx.reward.tool_productivity {
            rewards = otc_shaped(&rewards, &trajs, &group, ctx.reward.otc_c);
        }
        let (rows, kept_groups) = policy_rows(ctx, &prompts, &trajs, &rewards, &group);
        let metrics = StepMetrics { kept_groups, ..rollout_metrics(&trajs, &rewards, tasks, &group) };
        Ok(StepOutput { terms: vec![LossTerm::Pg { rows, normaliser: None }], metrics })
    }
}
