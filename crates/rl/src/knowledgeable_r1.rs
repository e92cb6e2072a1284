//! Knowledgeable-R1 ("Resisting Contextual Interference in RAG via Parametric-Knowledge Reinforcement"; released code: docs/methods/knowledgeable-r1.md).
//!
//! Algorithm 1, per question: n_pk responses o from the query-only prompt p and n_ck responses
//! o′ from the context prompt p′ (joint sampling). Three policies share the weights:
//!   PK  = o  scored under p,   CK = o′ scored under p′,   RPK = the same o scored under p′.
//! Advantages mix local (same prompt, same policy) and global (pool U_p′ = CK ∪ RPK rewards)
//! group normalisation (§3.3); RPK's pass through the asymmetric transform T(Â; β) (§3.4);
//! J = λ_pk J_PK + λ_ck J_CK + λ_rpk J_RPK with PPO clipping (§3.5).
//! Defaults follow the released code where it differs from the paper (docs/methods/knowledgeable-r1.md).
use crate::advantage::{group_stats, EPS};
use crate::method::{rollout_metrics, Method, MethodSpec, StepCtx, StepOutput};
use crate::sections::RolloutSection;
use crate::task::Task;
use crate::update::{mask_len, LossTerm, Normaliser, PgRow, Sequence};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Beta {
    /// Released code: token-weighted batch means, β = max((E_ck − E_rpk+)/E_rpk−, 0.01),
    /// β = 1 when E_ck < 0 (upper clip at 1 only with `beta_upper_clip`).
    #[default]
    AdaptiveTokens,
    /// Paper §3.4 literally: sums over trajectories, β = clip((S_ck − S_rpk+)/S_rpk−, 0.01, 1).
    AdaptiveTrajectories,
    /// A constant β (`fixed_beta`): the paper's "fixed β" ablation.
    Fixed,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum PkAdvantage {
    /// Released code: J_PK uses the (untransformed) global advantage of the PK responses.
    #[default]
    Global,
    /// Paper §3.3: A_i = A^{pk-local}_i (normalised within the PK group).
    Local,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KnowledgeableR1Config {
    /// Responses per question from the query-only prompt p (released script: 16). 0 (with
    /// `ck_global = false`, n_ck doubled) is the GRPO-with-RAG baseline at an equal budget.
    pub n_pk: usize,
    /// Responses per question from the context prompt p′ (released script: 16).
    pub n_ck: usize,
    pub lambda_pk: f64,
    pub lambda_ck: f64,
    pub lambda_rpk: f64,
    pub beta: Beta,
    /// Used when `beta = "fixed"`.
    pub fixed_beta: f64,
    /// Clip the adaptive β at 1 from above (the paper's range; the released code does not).
    pub beta_upper_clip: bool,
    pub pk_advantage: PkAdvantage,
    /// Ablations "w/o A_ck-local" / "w/o A_ck-global".
    pub ck_local: bool,
    pub ck_global: bool,
}

impl Default for KnowledgeableR1Config {
    fn default() -> Self {
        KnowledgeableR1Config {
            n_pk: 8,
            n_ck: 8,
            lambda_pk: 1.0,
            lambda_ck: 1.0,
            lambda_rpk: 1.0,
            beta: Beta::AdaptiveTokens,
            fixed_beta: 0.5,
            beta_upper_clip: false,
            pk_advantage: PkAdvantage::Global,
            ck_local: true,
            ck_global: true,
        }
    }
}

impl MethodSpec for KnowledgeableR1Config {
    fn build(&self) -> Box<dyn Method> {
        Box::new(KnowledgeableR1 { cfg: self.clone() })
    }

    fn validate(&self, _rollout: &RolloutSection) -> Result<(), String> {
        // n_pk = 0 with ck_global = false is GRPO with RAG (the paper's baseline).
        if self.n_ck == 0 {
            return Err("field `method.n_ck`: the context path needs at least one response".into());
        }
        if !(self.ck_local || self.ck_global) {
            return Err("field `method.ck_local`/`ck_global`: CK needs at least one of them".into());
        }
        if self.beta == Beta::Fixed && !(0.0..=1.0).contains(&self.fixed_beta) {
            return Err(format!("field `method.fixed_beta`: {} is outside [0, 1]", self.fixed_beta));
        }
        Ok(())
    }
}

/// One question's rewards: CK responses (from p′) and PK responses (from p, also the RPK ones),
/// with each response's token count (β is token-weighted in the released code).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QuestionRewards {
    pub ck: Vec<f64>,
    pub pk: Vec<f64>,
    pub ck_tokens: Vec<f64>,
    pub pk_tokens: Vec<f64>,
}

/// The batch's advantages, per question in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// A′_j = A^{ck-local}_j + A^{ck-global}_j (§3.3 CK).
    pub ck: Vec<Vec<f64>>,
    /// Â_i = Â^{global}_i before the transform (§3.3 RPK).
    pub rpk_raw: Vec<Vec<f64>>,
    /// T(Â_i; β) (§3.4).
    pub rpk: Vec<Vec<f64>>,
    /// J_PK's advantage (global or local, per `pk_advantage`).
    pub pk: Vec<Vec<f64>>,
    pub beta: f64,
    /// (S_ck, S_rpk+, S_rpk−) as the β rule computed them.
    pub sums: (f64, f64, f64),
}

/// (r − mean(pool)) / (std(pool) + ε), unbiased std, singleton pool → mean 0, std 1 (verl).
fn normalise(r: &[f64], pool: &[f64]) -> Vec<f64> {
    let (m, s) = group_stats(pool);
    r.iter().map(|x| (x - m) / (s + EPS)).collect()
}

/// T(Â; β): positive advantages kept, non-positive ones scaled by β (§3.4).
pub fn transform(a: f64, beta: f64) -> f64 {
    if a > 0.0 {
        a
    } else {
        beta * a
    }
}

/// §3.4's β from the batch: S_ck over CK responses, S_rpk± over RPK responses with positive /
/// non-positive Â. Token-weighted means (released code) or plain sums (paper).
pub fn adaptive_beta(cfg: &KnowledgeableR1Config, ck: &[(f64, f64)], rpk: &[(f64, f64)]) -> (f64, (f64, f64, f64)) {
    let weighted = cfg.beta == Beta::AdaptiveTokens;
    let w = |len: f64| if weighted { len } else { 1.0 };
    let ck_norm = if weighted { ck.iter().map(|x| x.1).sum::<f64>().max(1.0) } else { 1.0 };
    let rpk_norm = if weighted { rpk.iter().map(|x| x.1).sum::<f64>().max(1.0) } else { 1.0 };
    let s_ck = ck.iter().map(|(a, l)| a * w(*l)).sum::<f64>() / ck_norm;
    let s_pos = rpk.iter().filter(|x| x.0 > 0.0).map(|(a, l)| a * w(*l)).sum::<f64>() / rpk_norm;
    let s_neg = rpk.iter().filter(|x| x.0 <= 0.0).map(|(a, l)| a * w(*l)).sum::<f64>() / rpk_norm;
    let sums = (s_ck, s_pos, s_neg);
    let beta = match cfg.beta {
        Beta::Fixed => cfg.fixed_beta,
        // Released code: CK doing worse than average → no modulation.
        Beta::AdaptiveTokens if s_ck < 0.0 => 1.0,
        // Guard (absent in the released code, where it divides by zero): no non-positive RPK
        // advantage to scale, so β does not matter; 1 leaves T the identity.
        _ if s_neg == 0.0 => 1.0,
        Beta::AdaptiveTokens => {
            let b = ((s_ck - s_pos) / s_neg).max(0.01);
            if cfg.beta_upper_clip {
                b.min(1.0)
            } else {
                b
            }
        }
        Beta::AdaptiveTrajectories => ((s_ck - s_pos) / s_neg).clamp(0.01, 1.0),
    };
    (beta, sums)
}

/// §3.3 + §3.4 for a batch of questions.
pub fn advantages(cfg: &KnowledgeableR1Config, batch: &[QuestionRewards]) -> Advantages {
    let (mut ck, mut rpk_raw, mut pk) = (vec![], vec![], vec![]);
    for q in batch {
        // U_p′ = {R^ck_j} ∪ {R^rpk_i}: the RPK reward is the PK response's reward.
        let pool: Vec<f64> = q.ck.iter().chain(&q.pk).copied().collect();
        let ck_global = normalise(&q.ck, &pool);
        let ck_local = normalise(&q.ck, &q.ck);
        let a_ck: Vec<f64> = ck_global
            .iter()
            .zip(&ck_local)
            .map(|(g, l)| if cfg.ck_global { *g } else { 0.0 } + if cfg.ck_local { *l } else { 0.0 })
            .collect();
        let a_rpk = normalise(&q.pk, &pool);
        pk.push(match cfg.pk_advantage {
            PkAdvantage::Global => a_rpk.clone(),
            PkAdvantage::Local => normalise(&q.pk, &q.pk),
        });
        ck.push(a_ck);
        rpk_raw.push(a_rpk);
    }
    let flat = |a: &[Vec<f64>], l: &dyn Fn(&QuestionRewards) -> &Vec<f64>| -> Vec<(f64, f64)> {
        a.iter().zip(batch).flat_map(|(v, q)| v.iter().copied().zip(l(q).iter().copied())).collect()
    };
    let (beta, sums) = adaptive_beta(cfg, &flat(&ck, &|q| &q.ck_tokens), &flat(&rpk_raw, &|q| &q.pk_tokens));
    let rpk = rpk_raw.iter().map(|v| v.iter().map(|a| transform(*a, beta)).collect()).collect();
    Advantages { ck, rpk_raw, rpk, pk, beta, sums }
}

pub struct KnowledgeableR1 {
    pub cfg: KnowledgeableR1Config,
}

impl Method for KnowledgeableR1 {
    fn step(&mut self, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput> {
        step(&self.cfg, ctx, tasks)
    }
}

/// One step of Algorithm 1 on single-turn answers (no search): joint sampling, rewards,
/// advantages, and the three objectives as policy-gradient rows.
fn step(k: &KnowledgeableR1Config, ctx: &StepCtx, tasks: &[&Task]) -> knowrl_engine::Result<StepOutput> {
    for t in tasks {
        if t.with_context.is_none() {
            return Err(knowrl_engine::EngineError::Invalid(format!(
                "knowledgeable_r1: task {} has no context prompt (use data.suite = \"context\")",
                t.id
            )));
        }
    }
    fn ctx_prompt(t: &Task) -> &crate::task::Prompt {
        t.with_context.as_ref().expect("checked above")
    }
    // Joint sampling (Algorithm 1): o ~ π(·|p), o′ ~ π(·|p′).
    let (p_ids, pk_group) = ctx.replicate(tasks, k.n_pk, |t| &t.query_only)?;
    let (pc_ids, ck_group) = ctx.replicate(tasks, k.n_ck, ctx_prompt)?;
    let pk_trajs = ctx.rollout(&p_ids, false, 0)?;
    let ck_trajs = ctx.rollout(&pc_ids, false, p_ids.len())?;
    let r_pk = ctx.rewards(&pk_trajs, tasks, &pk_group);
    let r_ck = ctx.rewards(&ck_trajs, tasks, &ck_group);
    let batch: Vec<QuestionRewards> = (0..tasks.len())
        .map(|q| {
            let pick =
                |g: &[usize], v: &[f64]| -> Vec<f64> { (0..g.len()).filter(|&j| g[j] == q).map(|j| v[j]).collect() };
            let len =
                |tr: &[crate::agent::Trajectory]| -> Vec<f64> { tr.iter().map(|t| mask_len(&t.loss_mask)).collect() };
            QuestionRewards {
                ck: pick(&ck_group, &r_ck),
                pk: pick(&pk_group, &r_pk),
                ck_tokens: pick(&ck_group, &len(&ck_trajs)),
                pk_tokens: pick(&pk_group, &len(&pk_trajs)),
            }
        })
        .collect();
    // β (§3.4) is a statistic of the whole batch: under data parallelism every rank computes
    // the advantages over all ranks' questions and keeps its own, from question q0 on.
    let q0 = ctx.shard.first_task;
    let adv = advantages(k, &ctx.shard.gather(batch)?);
    // Rows of the three objectives (§3.5). The RPK row is the PK response's tokens under the
    // context prompt p′: one more scoring pass, no generation.
    let context_ids: Vec<Vec<u32>> = tasks.iter().map(|t| ctx_prompt(t).ids(ctx.tok)).collect::<Result<_, _>>()?;
    // Question by question (its CK rows, then each PK response's RPK and PK rows), so that a
    // data-parallel rank's rows are a contiguous piece of the batch's.
    let mut pg = vec![];
    for (q, context) in context_ids.iter().enumerate() {
        for (i, j) in (0..ck_trajs.len()).filter(|&j| ck_group[j] == q).enumerate() {
            pg.push(row(&pc_ids[j], &ck_trajs[j], adv.ck[q0 + q][i], k.lambda_ck));
        }
        for (i, j) in (0..pk_trajs.len()).filter(|&j| pk_group[j] == q).enumerate() {
            pg.push(row(context, &pk_trajs[j], adv.rpk[q0 + q][i], k.lambda_rpk));
            pg.push(row(&p_ids[j], &pk_trajs[j], adv.pk[q0 + q][i], k.lambda_pk));
        }
    }
    pg.retain(|r| r.weight != 0.0);
    // Released code: one token-mean over the 2n generated responses (J_PK and J_RPK add up per
    // token of the same response), not over the 3n rows. A response none of whose objectives
    // is on (λ = 0: the "w/o J_PK" + "w/o J_RPK" ablation) is not counted: its rows are gone,
    // and counting its tokens would only shrink the other objectives' step.
    let pk_on = k.lambda_pk != 0.0 || k.lambda_rpk != 0.0;
    let ck_on = k.lambda_ck != 0.0;
    let generated = pk_trajs.iter().filter(|_| pk_on).chain(ck_trajs.iter().filter(|_| ck_on));
    let norm = Normaliser {
        tokens: generated.clone().map(|t| mask_len(&t.loss_mask)).sum(),
        sequences: generated.count() as f64,
    };
    let mut metrics = rollout_metrics(&ck_trajs, &r_ck, tasks, &ck_group);
    metrics.extra.insert("beta".into(), adv.beta);
    metrics.extra.insert("s_ck".into(), adv.sums.0);
    metrics.extra.insert("s_rpk_pos".into(), adv.sums.1);
    metrics.extra.insert("s_rpk_neg".into(), adv.sums.2);
    metrics.extra.insert("reward_ck".into(), mean(&r_ck));
    metrics.extra.insert("reward_pk".into(), mean(&r_pk));
    metrics.kept_groups = tasks.len();
    Ok(StepOutput { terms: vec![LossTerm::Pg { rows: pg, normaliser: Some(norm) }], metrics })
}

fn row(prompt: &[u32], t: &crate::agent::Trajectory, advantage: f64, weight: f64) -> PgRow {
    PgRow::new(Sequence::of(prompt, t), advantage, weight)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}
