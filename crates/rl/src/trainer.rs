//! The RL loop every method shares: pick questions → the method's step (rollout → reward →
//! advantage → loss terms; the `method::Method` the config builds) → PPO mini-batches × epochs
//! (`update_policy`: each one `update::backward` over its share of every term, a clip and an
//! AdamW step) → metrics (JSONL), atomic checkpoints (with the method's own state), exact
//! resumption. Nothing here knows which method runs.
//!
//! Determinism: questions are drawn from the trainer's generator (checkpointed), and rollout row
//! j of step s samples from `Rng::new(seed ⊕ s ⊕ j)`, so a resumed run repeats exactly what the
//! uninterrupted one would have done (tested bit-identical on CPU).
//!
//! Data parallel (`env.group`): every rank draws the same questions and rolls out its
//! contiguous share (row j keeps its one-process generator: `Shard::batch_row`); the loss
//! normaliser and the mini-batches are the batch's, gradients are summed over ranks before the
//! clip, so every rank takes the one-process step. Rank 0 alone writes metrics, evaluations
//! and checkpoints (`data_parallel`).
use crate::config::TrainConfig;
use crate::data_parallel;
use crate::method::{row_seed, MethodState, Shard, StepCtx, StepMetrics, StepOutput, TrainEnv};
use crate::task::{Task, TaskDraw};
use crate::update::{backward, mask_len, score_old, term_names, LossTerm, Normaliser, PgRow, PgStats};
use knowrl_engine::checkpoint;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::{Policy, Rng};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

/// A periodic evaluation of the policy (`run.eval_every`): a JSON object of figures, or why it
/// failed (the run goes on without that row).
pub type Evaluate<'a> = &'a dyn Fn(&Policy) -> Result<serde_json::Value, String>;

/// Trains `env.policy` in place for `cfg.run.steps` steps (continuing from the latest
/// checkpoint when `resume`). Returns the metrics of the steps run by this call.
pub fn train(
    env: &TrainEnv,
    tasks: &[Task],
    cfg: &TrainConfig,
    resume: bool,
    on_step: &dyn Fn(&StepMetrics),
) -> knowrl_engine::Result<Vec<StepMetrics>> {
    train_with_eval(env, tasks, cfg, resume, on_step, None)
}

/// [`train`], evaluating every `run.eval_every` steps with `evaluate`. The trainer is the one
/// owner of `eval.jsonl` (rows `{"step": steps done, …}`): it starts it afresh, trims it to
/// the checkpoint on resume, appends each row, and logs the figures to TensorBoard as `eval/*`.
pub fn train_with_eval(
    env: &TrainEnv,
    tasks: &[Task],
    cfg: &TrainConfig,
    resume: bool,
    on_step: &dyn Fn(&StepMetrics),
    evaluate: Option<Evaluate>,
) -> knowrl_engine::Result<Vec<StepMetrics>> {
    let (policy, reference, group) = (env.policy, env.reference, env.group);
    let tok = policy.tokenizer()?;
    let (rank, ranks) = group.map_or((0, 1), |g| (g.rank(), g.size()));
    let lead = rank == 0;
    if ranks > 1 {
        cfg.method.spec().data_parallel().map_err(knowrl_engine::EngineError::Invalid)?;
        if !cfg.rollout.prompts_per_step.is_multiple_of(ranks) {
            return Err(knowrl_engine::EngineError::Invalid(format!(
                "rollout.prompts_per_step = {} does not split over {ranks} ranks (groups never split)",
                cfg.rollout.prompts_per_step
            )));
        }
    }
    let mut method = cfg.method.spec().build();
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
            let tensors = checkpoint::method_tensors(&dir)?;
            if !tensors.is_empty() || !state["method"].is_null() {
                method.restore(env, MethodState { tensors, json: state["method"].clone() })?;
            }
            start = step;
            // Every rank must resume from the same step (a checkpoint directory all ranks see).
            let hint = "every rank must see the same run directory";
            data_parallel::same_on_all_ranks(group, start, "the resumed step", hint)?;
            // Drop rows of steps after the checkpoint: they will be run again. metrics.jsonl
            // rows carry the 0-based step index; eval.jsonl rows the steps completed.
            if lead {
                trim_jsonl(&metrics_path, |step| step < start)?;
                trim_jsonl(&out.join("eval.jsonl"), |done| done <= start)?;
            }
        }
    } else if lead {
        for f in [metrics_path.clone(), out.join("eval.jsonl")] {
            if f.exists() {
                std::fs::remove_file(&f).map_err(|e| knowrl_engine::EngineError::io(&f, e))?;
            }
        }
    }
    // TensorBoard beside metrics.jsonl; a resumed run marks its restart so the interrupted run's
    // later points are dropped, as metrics.jsonl's rows are.
    let mut board = if lead { Some(crate::tensorboard::EventWriter::create(out)?) } else { None };
    if let (Some(b), true) = (board.as_mut(), start > 0) {
        b.restart(start as i64)?;
    }
    let draw = TaskDraw::new(tasks);
    let mut all = vec![];
    for step in start..cfg.run.steps {
        let (t0, flops0) = (Instant::now(), knowrl_engine::flops::snapshot());
        let picks: Vec<&Task> = (0..cfg.rollout.prompts_per_step).map(|_| &tasks[draw.pick(&mut rng)]).collect();
        // This rank's contiguous share of the questions (all of them in one process).
        let shard = Shard::of(group, picks.len());
        let picks = &picks[shard.first_task..shard.first_task + shard.local_tasks];
        let ctx = step_ctx(env, tok, cfg, step, shard);
        let mut out = method.step(&ctx, picks)?;
        let diagnostics = method.diagnose(&ctx, &out)?;
        out.metrics.extra.extend(diagnostics);
        let rollout_s = t0.elapsed().as_secs_f64();
        let rollout = knowrl_engine::flops::snapshot() - flops0;
        let t1 = Instant::now();
        let seed = row_seed(cfg.run.seed, step, usize::MAX);
        let up = update_policy(group, policy, reference, &mut opt, &mut out, cfg, seed)?;
        let mut extra = out.metrics.extra.clone();
        extra.extend(up.extra.clone());
        // The step's matmul FLOPs (weight GEMMs and attention products of generation, scoring
        // and backward): its compute floor. `attention_flops` is the attention's share.
        let step_flops = knowrl_engine::flops::snapshot() - flops0;
        extra.insert("gemm_flops".into(), step_flops.total());
        extra.insert("attention_flops".into(), step_flops.attention);
        extra.insert("rollout_gemm_flops".into(), rollout.total());
        // What sharing skipped (rows repeating a prompt or a history): computed + shared is the
        // step's nominal work, every row computed in full.
        extra.insert("shared_flops".into(), step_flops.shared);
        extra.insert("rollout_shared_flops".into(), rollout.shared);
        if step_flops.memory_bound_bytes + step_flops.compute_bound_flops > 0.0 {
            // The roofline's split, when a bench set the machine balance (`knowrl_engine::flops`).
            extra.insert("memory_bound_bytes".into(), step_flops.memory_bound_bytes);
            extra.insert("compute_bound_flops".into(), step_flops.compute_bound_flops);
            extra.insert("rollout_memory_bound_bytes".into(), rollout.memory_bound_bytes);
            extra.insert("rollout_compute_bound_flops".into(), rollout.compute_bound_flops);
        }
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
        let metrics = data_parallel::merge_metrics(group, metrics)?;
        if let Some(board) = board.as_mut() {
            append_jsonl(&metrics_path, &serde_json::to_value(&metrics).unwrap())?;
            board.scalars(step as i64, &scalars(&metrics))?;
        }
        let done = step + 1;
        let due = cfg.run.eval_every > 0 && done.is_multiple_of(cfg.run.eval_every);
        if let (Some(eval), Some(board), true) = (evaluate, board.as_mut(), due) {
            match eval(policy) {
                Ok(mut row) => {
                    // Plotted at the index of the step it follows (metrics.jsonl's numbering).
                    board.scalars(step as i64, &eval_scalars(&row))?;
                    row["step"] = done.into();
                    append_jsonl(&cfg.run.out_dir.join("eval.jsonl"), &row)?;
                }
                Err(e) => eprintln!("step {done}: periodic evaluation failed: {e}"),
            }
        }
        on_step(&metrics);
        all.push(metrics);
        if (cfg.run.checkpoint_every > 0 && done % cfg.run.checkpoint_every == 0) || done == cfg.run.steps {
            let m = method.state(env)?;
            let tensors = knowrl_engine::weights::by_name(m.tensors);
            let state = serde_json::json!({ "rng": rng, "method": m.json });
            if lead {
                checkpoint::save(&ckpt_root, done, &params, &opt, &state, &tensors)?;
            }
            // The others may read it (a resume) only once it is whole.
            data_parallel::barrier(group)?;
        }
    }
    Ok(all)
}

/// Appends one JSON row to a JSONL log.
fn append_jsonl(path: &std::path::Path, row: &serde_json::Value) -> knowrl_engine::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| knowrl_engine::EngineError::io(path, e))?;
    writeln!(f, "{row}").map_err(|e| knowrl_engine::EngineError::io(path, e))
}

/// An evaluation row's figures as `eval/<name>` (nested objects as `eval/<name>/<key>`).
fn eval_scalars(row: &serde_json::Value) -> Vec<(String, f64)> {
    let mut out = vec![];
    for (k, x) in row.as_object().into_iter().flatten().filter(|(k, _)| *k != "step") {
        match x {
            serde_json::Value::Object(inner) => {
                out.extend(inner.iter().filter_map(|(s, x)| Some((format!("eval/{k}/{s}"), x.as_f64()?))))
            }
            x => out.extend(x.as_f64().map(|x| (format!("eval/{k}"), x))),
        }
    }
    out
}

/// Every figure of a step's metrics as `train/<name>` (method extras included), for TensorBoard.
pub fn scalars(m: &StepMetrics) -> Vec<(String, f64)> {
    let v = serde_json::to_value(m).unwrap_or_default();
    let mut out = vec![];
    for (k, x) in v.as_object().into_iter().flatten() {
        match (k.as_str(), x) {
            ("step", _) => {}
            ("extra", serde_json::Value::Object(e)) => {
                out.extend(e.iter().filter_map(|(k, x)| Some((format!("train/{k}"), x.as_f64()?))))
            }
            (_, x) => out.extend(x.as_f64().map(|x| (format!("train/{k}"), x))),
        }
    }
    out
}

/// The step context of `step` for a run of `cfg` on `env`, holding `shard` of its questions.
pub fn step_ctx<'a>(
    env: &TrainEnv<'a>,
    tok: &'a knowrl_engine::Tokenizer,
    cfg: &'a TrainConfig,
    step: u64,
    shard: Shard<'a>,
) -> StepCtx<'a> {
    StepCtx {
        policy: env.policy,
        reference: env.reference,
        tok,
        retriever: env.retriever,
        dense: env.dense,
        rollout: &cfg.rollout,
        algorithm: &cfg.algorithm,
        reward: &cfg.reward,
        micro_batch: cfg.optim.micro_batch,
        seed: cfg.run.seed,
        step,
        steps: cfg.run.steps,
        shard,
    }
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
/// `ppo_mini_batch_size` × `ppo_epochs`): π_old is scored once under the rollout weights (for
/// the rows of every mini-batch but a single epoch's first, which scores itself before any step), then
/// every epoch deals the rows into mini-batches in a random order drawn from `seed`, and each
/// mini-batch is one backward over its share of every loss term, a clip and an AdamW step.
/// The advantages stay the batch's; a mini-batch's loss normaliser is its share of the batch's
/// (token-mean over its own tokens, as verl's). One mini-batch and one epoch is exactly the
/// single update of earlier versions, π_old the detached current log-probs.
///
/// As one rank of `group` (`None`: one process), this rank's rows are rows `offset..offset + n`
/// of the batch's (ranks in order, each a contiguous piece: `Method` lays rows out question by
/// question). The normaliser, the mini-batch dealing and each mini-batch's token share are the
/// batch's; an auxiliary term's part is the one process's part cut to this rank's items, its
/// mean over the part's size on all ranks (`data_parallel::aux_part`). Each rank back-propagates its
/// rows of a mini-batch and the gradients are summed before the clip, so all ranks take the
/// step one process would. Only a collective can fail.
pub fn update_policy(
    group: Option<&knowrl_dist::ProcessGroup>,
    policy: &Policy,
    reference: Option<&Policy>,
    opt: &mut AdamW,
    out: &mut StepOutput,
    cfg: &TrainConfig,
    seed: u64,
) -> knowrl_engine::Result<UpdateStats> {
    let (alg, mb, temp) = (&cfg.algorithm, cfg.optim.micro_batch, cfg.rollout.temperature);
    // The policy-gradient term's rows are dealt into mini-batches; every other term is cut into
    // as many contiguous parts.
    let (mut pg, own_norm, aux) = split_terms(std::mem::take(&mut out.terms));
    // Each auxiliary term's items on every rank (the batch's, in rank order); a term empty on
    // every rank is dropped, as one process drops it.
    let hint = "a method returns the same terms on every rank";
    data_parallel::same_on_all_ranks(group, aux.len() as u64, "the number of auxiliary loss terms", hint)?;
    let aux_counts =
        aux.iter().map(|t| data_parallel::counts(group, t.len())).collect::<knowrl_engine::Result<Vec<_>>>()?;
    let (aux, aux_counts): (Vec<LossTerm>, Vec<Vec<usize>>) =
        aux.into_iter().zip(aux_counts).filter(|(_, c)| c.iter().sum::<usize>() > 0).unzip();
    let tokens = |rows: &[PgRow]| rows.iter().map(|r| mask_len(&r.seq.loss_mask)).sum::<f64>();
    let local_norm = own_norm.unwrap_or_else(|| Normaliser::of(&pg));
    let mut totals = [local_norm.tokens, local_norm.sequences, tokens(&pg)];
    data_parallel::sum(group, &mut totals)?;
    let [norm_tokens, norm_sequences, all_tokens] = totals;
    let counts = data_parallel::counts(group, pg.len())?;
    let rank = group.map_or(0, |g| g.rank());
    let (offset, n, n_all) = (counts[..rank].iter().sum::<usize>(), pg.len(), counts.iter().sum::<usize>());
    let size = if alg.ppo_mini_batch == 0 { n_all.max(1) } else { alg.ppo_mini_batch };
    let per_epoch = n_all.div_ceil(size).max(1);
    let updates = per_epoch * alg.ppo_epochs;
    if updates > 1 {
        // With one epoch, the first mini-batch is scored before any optimiser step: its own
        // detached log-probs are π_old, so only the later mini-batches' rows need this pass
        // (half of it at two mini-batches). With more epochs every row is seen again after a step.
        let mut on_policy = vec![false; n];
        if alg.ppo_epochs == 1 {
            for &j in &mini_batches(n_all, size, seed, 0)[0] {
                if (offset..offset + n).contains(&j) {
                    on_policy[j - offset] = true;
                }
            }
        }
        score_old(policy, &mut pg, &on_policy, alg, temp, mb);
    }
    let mut st = UpdateStats::default();
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for epoch in 0..alg.ppo_epochs {
        let batches = mini_batches(n_all, size, seed, epoch);
        // Each mini-batch's rows on this rank, and its tokens over all ranks.
        let mine: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().filter(|&&j| (offset..offset + n).contains(&j)).map(|&j| j - offset).collect())
            .collect();
        let mut batch_tokens: Vec<f64> =
            mine.iter().map(|b| b.iter().map(|&j| mask_len(&pg[j].seq.loss_mask)).sum()).collect();
        data_parallel::sum(group, &mut batch_tokens)?;
        for (i, (batch, mine)) in batches.iter().zip(&mine).enumerate() {
            let rows: Vec<PgRow> = mine.iter().map(|&j| pg[j].clone()).collect();
            let share = if all_tokens > 0.0 { batch_tokens[i] / all_tokens } else { 1.0 / per_epoch as f64 };
            let normaliser = Some(Normaliser {
                tokens: norm_tokens * share,
                sequences: norm_sequences * batch.len() as f64 / n_all.max(1) as f64,
            });
            let mut terms = vec![LossTerm::Pg { rows, normaliser }];
            let mut aux_items = 0;
            for (t, c) in aux.iter().zip(&aux_counts) {
                let (part, items) = data_parallel::aux_part(t, c, rank, i, per_epoch);
                terms.push(part);
                aux_items += items;
            }
            opt.zero_grad();
            let mut b = backward(policy, reference, &terms, alg, temp, mb);
            data_parallel::merge_term_stats(group, &mut b.terms, &term_names(&terms)[1..])?;
            let (wait_s, reduce_s) = data_parallel::all_reduce_grads(group, opt.params())?;
            if group.is_some() {
                *sums.entry("allreduce_wait_s".into()).or_default() += wait_s;
                *sums.entry("allreduce_s".into()).or_default() += reduce_s;
            }
            data_parallel::merge_pg_stats(group, &mut b.pg)?;
            *sums.entry("score_s".into()).or_default() += b.pg.score_s;
            *sums.entry("backward_s".into()).or_default() += b.pg.backward_s;
            *sums.entry("skipped_rows".into()).or_default() += b.pg.skipped_rows as f64 / alg.ppo_epochs as f64;
            for (k, v) in b.terms {
                *sums.entry(k).or_default() += v / updates as f64;
            }
            // Whether the mini-batch holds anything on any rank (the same answer on every rank).
            let any = !batch.is_empty() || aux_items > 0;
            let grad_norm = if any { opt.clip_grad_norm(cfg.optim.max_grad_norm) } else { 0.0 };
            if any {
                opt.step(cfg.optim.lr);
            }
            st.per_update.push((b.pg, grad_norm));
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
    // The terms go back as the update saw them (π_old scored into the rows).
    out.terms = std::iter::once(LossTerm::Pg { rows: pg, normaliser: own_norm }).chain(aux).collect();
    Ok(st)
}

/// A step's policy-gradient rows (at most one such term), the normaliser the method set for
/// them, and the other terms.
fn split_terms(terms: Vec<LossTerm>) -> (Vec<PgRow>, Option<Normaliser>, Vec<LossTerm>) {
    let (mut rows, mut norm, mut aux) = (vec![], None, vec![]);
    for t in terms {
        match t {
            LossTerm::Pg { rows: r, normaliser } => {
                assert!(rows.is_empty(), "a step returns at most one policy-gradient term");
                rows = r;
                norm = normaliser;
            }
            t => aux.push(t),
        }
    }
    (rows, norm, aux)
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
