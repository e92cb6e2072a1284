//! The RL loop: rollout → reward → advantage → loss → optimiser step, with metrics per step
//! (JSONL), atomic checkpoints and exact resumption.
//!
//! Determinism: prompts are drawn from the trainer's generator (checkpointed), and response j of
//! step s samples from `Rng::new(seed ⊕ s ⊕ j)`, so a resumed run repeats exactly what the
//! uninterrupted one would have done (tested bit-identical on CPU).
use crate::advantage::{group_advantages, informative_groups};
use crate::agent::{rollout, AgentConfig, Trajectory};
use crate::config::{Algorithm, TrainConfig};
use crate::loss::{aggregate, clipped_surrogate, gspo_sequence_loss, kl, Aggregation};
use crate::reward::exact_match;
use knowrl_engine::checkpoint;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{Message, Mode, Policy, Rng, Tokenizer};
use knowrl_retrieval::Retriever;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::time::Instant;
use tch::{Kind, Tensor};

/// One training question: the user message and its accepted answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    pub user: String,
    pub golden: Vec<String>,
}

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
}

fn row_seed(seed: u64, step: u64, row: usize) -> u64 {
    seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (row as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
}

fn chat_ids(tok: &Tokenizer, user: &str) -> knowrl_engine::Result<Vec<u32>> {
    tok.encode(&tok.apply_chat_template(&[Message::new("user", user)], true)?, false)
}

/// Trains `policy` in place for `cfg.run.steps` steps (continuing from the latest checkpoint
/// when `resume`). Returns the metrics of the steps run by this call.
pub fn train(
    policy: &Policy,
    tasks: &[Task],
    retriever: &dyn Retriever,
    cfg: &TrainConfig,
    resume: bool,
    on_step: &dyn Fn(&StepMetrics),
) -> knowrl_engine::Result<Vec<StepMetrics>> {
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
            // Drop metrics of steps after the checkpoint: they will be run again.
            if let Ok(text) = std::fs::read_to_string(&metrics_path) {
                let kept: String = text
                    .lines()
                    .filter(|l| serde_json::from_str::<StepMetrics>(l).is_ok_and(|m| m.step < start))
                    .map(|l| format!("{l}\n"))
                    .collect();
                knowrl_engine::fsutil::write_atomic(&metrics_path, kept.as_bytes())?;
            }
        }
    } else if metrics_path.exists() {
        std::fs::remove_file(&metrics_path).map_err(|e| knowrl_engine::EngineError::io(&metrics_path, e))?;
    }
    let agent = AgentConfig::new(
        cfg.rollout.max_turns,
        cfg.rollout.topk,
        cfg.rollout.max_tokens_per_turn,
        cfg.rollout.temperature,
    );
    let mut all = vec![];
    for step in start..cfg.run.steps {
        let t0 = Instant::now();
        // Rollout: G responses for each of the step's prompts.
        let picks: Vec<usize> = (0..cfg.rollout.prompts_per_step).map(|_| rng.below(tasks.len())).collect();
        let g = cfg.rollout.group_size;
        let mut prompts = vec![];
        let mut group = vec![];
        for (k, &i) in picks.iter().enumerate() {
            let ids = chat_ids(tok, &tasks[i].user)?;
            for _ in 0..g {
                prompts.push(ids.clone());
                group.push(k);
            }
        }
        let mut rngs: Vec<Rng> = (0..prompts.len()).map(|j| Rng::new(row_seed(cfg.run.seed, step, j))).collect();
        let trajs = rollout(&policy.lm, tok, &prompts, retriever, &agent, &mut rngs)?;
        let rollout_s = t0.elapsed().as_secs_f64();

        // Reward (EM of the response's last answer) and group advantages.
        let rewards: Vec<f64> = trajs
            .iter()
            .zip(&group)
            .map(|(t, &k)| exact_match(t.answer.as_deref().unwrap_or(""), &tasks[picks[k]].golden) as u8 as f64)
            .collect();
        let adv = group_advantages(&rewards, &group, cfg.algorithm.normalisation);
        // DAPO's dynamic sampling drops groups whose rewards are all equal (no signal).
        let keep: Vec<usize> = match cfg.algorithm.name {
            Algorithm::Dapo => {
                let ok = informative_groups(&rewards, &group);
                (0..trajs.len()).filter(|j| ok.contains(&group[*j])).collect()
            }
            _ => (0..trajs.len()).collect(),
        };
        let t1 = Instant::now();
        let m = update(policy, &mut opt, cfg, &prompts, &trajs, &adv, &keep)?;
        let n = trajs.len() as f64;
        let metrics = StepMetrics {
            step,
            reward: rewards.iter().sum::<f64>() / n,
            em: rewards.iter().sum::<f64>() / n,
            tool_calls: trajs.iter().map(|t| t.tool_calls() as f64).sum::<f64>() / n,
            response_len: trajs.iter().map(|t| t.loss_mask.iter().filter(|x| **x).count() as f64).sum::<f64>() / n,
            kept_groups: keep.iter().map(|j| group[*j]).collect::<std::collections::BTreeSet<_>>().len(),
            rollout_s,
            update_s: t1.elapsed().as_secs_f64(),
            step_s: t0.elapsed().as_secs_f64(),
            ..m
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
            checkpoint::save(&ckpt_root, done, &params, &opt, &serde_json::json!({ "rng": rng }))?;
        }
    }
    Ok(all)
}

/// One optimiser step over the kept responses, accumulated over micro-batches.
fn update(
    policy: &Policy,
    opt: &mut AdamW,
    cfg: &TrainConfig,
    prompts: &[Vec<u32>],
    trajs: &[Trajectory],
    adv: &[f64],
    keep: &[usize],
) -> knowrl_engine::Result<StepMetrics> {
    let a = &cfg.algorithm;
    let temp = cfg.rollout.temperature.max(1e-6);
    let keep: Vec<usize> = keep.iter().copied().filter(|&j| !trajs[j].response.is_empty()).collect();
    let total_tokens: f64 = keep.iter().map(|&j| trajs[j].loss_mask.iter().filter(|x| **x).count() as f64).sum();
    let total_seqs = keep.len() as f64;
    opt.zero_grad();
    let (mut loss_sum, mut kl_sum, mut ent_sum, mut clip_sum) = (0.0, 0.0, 0.0, 0.0);
    for mb in keep.chunks(cfg.optim.micro_batch) {
        let reqs: Vec<ScoreRequest> = mb
            .iter()
            .map(|&j| ScoreRequest {
                prompt: &prompts[j],
                response: &trajs[j].response,
                loss_mask: Some(&trajs[j].loss_mask),
            })
            .collect();
        // π_old: the policy before this update (one update per batch, so the current weights).
        let old = tch::no_grad(|| score(&policy.lm, &reqs, temp, Mode::EVAL).logprobs);
        let s = score(&policy.lm, &reqs, temp, Mode::TRAIN);
        let advs = Tensor::from_slice(&mb.iter().map(|&j| adv[j] as f32).collect::<Vec<_>>());
        let mb_tokens = s.mask.sum(Kind::Float).double_value(&[]);
        let (per_token, clipped) = match a.name {
            Algorithm::Gspo => {
                let (l, c) = gspo_sequence_loss(&s.logprobs, &old, &advs, &s.mask, a.clip_low, a.clip_high);
                (l.unsqueeze(1) * &s.mask, c.unsqueeze(1) * &s.mask)
            }
            _ => clipped_surrogate(&s.logprobs, &old, &advs, a.clip_low, a.clip_high),
        };
        // The KL term is added out of place: autograd saved `per_token`'s inputs.
        let per_token = if a.kl_coef > 0.0 {
            let reference = tch::no_grad(|| score(&policy.lm, &reqs, temp, Mode::REFERENCE).logprobs);
            let k = kl(&s.logprobs, &reference, a.kl_estimator);
            kl_sum += (&k * &s.mask).sum(Kind::Float).double_value(&[]);
            per_token + k * a.kl_coef
        } else {
            per_token
        };
        // Each micro-batch carries its share of the whole batch's normaliser.
        let share = match (a.name, a.aggregation) {
            (Algorithm::Gspo, _) | (_, Aggregation::SeqMeanTokenMean) => mb.len() as f64 / total_seqs,
            (_, Aggregation::TokenMean) => mb_tokens / total_tokens.max(1.0),
        };
        let agg = if a.name == Algorithm::Gspo { Aggregation::SeqMeanTokenMean } else { a.aggregation };
        let loss = aggregate(&per_token, &s.mask, agg) * share;
        loss.backward();
        loss_sum += loss.double_value(&[]);
        ent_sum += (&s.entropy * &s.mask).sum(Kind::Float).double_value(&[]);
        clip_sum += (clipped * &s.mask).sum(Kind::Float).double_value(&[]);
    }
    let grad_norm = if keep.is_empty() { 0.0 } else { opt.clip_grad_norm(cfg.optim.max_grad_norm) };
    if !keep.is_empty() {
        opt.step(cfg.optim.lr);
    }
    let t = total_tokens.max(1.0);
    Ok(StepMetrics {
        loss: loss_sum,
        kl: kl_sum / t,
        entropy: ent_sum / t,
        clip_frac: clip_sum / t,
        grad_norm,
        ..Default::default()
    })
}
