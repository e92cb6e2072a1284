//! What the trainer does differently as one rank of several (`knowrl-dist`'s process group):
//! batch-wide sums (the loss normaliser, row counts), the gradient all-reduce, and one metrics
//! row for the step. With no group every function is the one-process identity, so the trainer
//! has one code path.
use crate::method::{dist_error, StepMetrics};
use crate::update::LossTerm;
use knowrl_dist::{ProcessGroup, DEFAULT_BUCKET_BYTES};
use knowrl_engine::Result;
use std::collections::BTreeMap;
use tch::Tensor;

/// In place: each value summed over ranks.
pub fn sum(group: Option<&ProcessGroup>, v: &mut [f64]) -> Result<()> {
    match group {
        Some(g) => g.all_reduce_f64(v).map_err(dist_error),
        None => Ok(()),
    }
}

/// Every rank's `n`, in rank order.
pub fn counts(group: Option<&ProcessGroup>, n: usize) -> Result<Vec<usize>> {
    let Some(g) = group else {
        return Ok(vec![n]);
    };
    let mut v = vec![0.0; g.size()];
    v[g.rank()] = n as f64;
    g.all_reduce_f64(&mut v).map_err(dist_error)?;
    Ok(v.into_iter().map(|x| x as usize).collect())
}

/// Sums every parameter's gradient over ranks (buckets of DDP's 25 MiB), so each rank holds
/// the batch's gradient and takes the same optimiser step. A parameter with a gradient on some
/// rank but not here gets zeros first (every rank passes the same list); one no rank touched
/// keeps none, and AdamW skips it as one process would. Returns the seconds spent waiting for
/// the slowest rank (a barrier first) and the seconds of the reduction itself.
pub fn all_reduce_grads(group: Option<&ProcessGroup>, params: &[(String, Tensor)]) -> Result<(f64, f64)> {
    let Some(g) = group else {
        return Ok((0.0, 0.0));
    };
    let t0 = std::time::Instant::now();
    g.barrier().map_err(dist_error)?;
    let waited = t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let mut has: Vec<f64> = params.iter().map(|(_, p)| f64::from(u8::from(p.grad().defined()))).collect();
    g.all_reduce_f64(&mut has).map_err(dist_error)?;
    let missing: Vec<Tensor> = params
        .iter()
        .zip(&has)
        .filter(|((_, p), &h)| h > 0.0 && !p.grad().defined())
        .map(|((_, p), _)| p.sum(p.kind()) * 0.0)
        .collect();
    if !missing.is_empty() {
        Tensor::stack(&missing, 0).sum(tch::Kind::Float).backward();
    }
    let mut grads: Vec<Tensor> =
        params.iter().zip(&has).filter(|(_, &h)| h > 0.0).map(|((_, p), _)| p.grad()).collect();
    tch::no_grad(|| g.all_reduce_buckets(&mut grads, DEFAULT_BUCKET_BYTES)).map_err(dist_error)?;
    Ok((waited, t0.elapsed().as_secs_f64()))
}

/// This rank's share of part `i` of `m` of an auxiliary term (a CE, DPO or RAG term: a mean
/// over its items), whose ranks hold `counts[r]` items each, the batch's items in rank order:
/// the items one process would give the part, cut to this rank's, their mean taken over the
/// part's size on all ranks (so the ranks' gradients and losses sum to the part's, computed in
/// the same arithmetic). Returns it and that size; with one rank it is `term.part(i, m)`.
pub fn aux_part(term: &LossTerm, counts: &[usize], rank: usize, i: usize, m: usize) -> (LossTerm, usize) {
    let n: usize = counts.iter().sum();
    let (first, mine) = (counts[..rank].iter().sum::<usize>(), counts[rank]);
    let (lo, hi) = (i * n / m, (i + 1) * n / m);
    let (a, b) = (lo.clamp(first, first + mine), hi.clamp(first, first + mine));
    let local = term.range(a - first, b - first);
    let part = if counts.len() == 1 { local } else { LossTerm::Share { term: Box::new(local), mean_over: hi - lo } };
    (part, hi - lo)
}

/// In place: the auxiliary terms' losses (`names`, each this rank's sum over the batch's mean)
/// summed over ranks; a rank whose share was empty reports 0.
pub fn merge_term_stats(
    group: Option<&ProcessGroup>,
    stats: &mut BTreeMap<String, f64>,
    names: &[String],
) -> Result<()> {
    if group.is_none() {
        return Ok(());
    }
    let mut v: Vec<f64> = names.iter().map(|k| stats.get(k).copied().unwrap_or(0.0)).collect();
    sum(group, &mut v)?;
    for (k, x) in names.iter().zip(v) {
        stats.insert(k.clone(), x);
    }
    Ok(())
}

/// One mini-batch's policy-gradient figures for the batch: the loss is a sum over rows divided
/// by the batch's normaliser, so the ranks' parts add up; the per-token means are weighted by
/// each rank's scored tokens (a rank whose rows all carried no gradient scored none).
pub fn merge_pg_stats(group: Option<&ProcessGroup>, st: &mut crate::update::PgStats) -> Result<()> {
    if group.is_none() {
        return Ok(());
    }
    let t = st.scored_tokens;
    let mut v = [st.loss, st.kl * t, st.entropy * t, st.clip_frac * t, st.ppo_kl * t, t];
    sum(group, &mut v)?;
    let w = v[5].max(1.0);
    (st.loss, st.kl, st.entropy, st.clip_frac, st.ppo_kl, st.scored_tokens) =
        (v[0], v[1] / w, v[2] / w, v[3] / w, v[4] / w, v[5]);
    Ok(())
}

/// Fails unless every rank holds the same `value` (naming `what`, the ranks' values and `hint`).
pub fn same_on_all_ranks(group: Option<&ProcessGroup>, value: u64, what: &str, hint: &str) -> Result<()> {
    let all = counts(group, value as usize)?;
    if all.iter().any(|v| *v != all[0]) {
        return Err(knowrl_engine::EngineError::Invalid(format!(
            "data parallel: {what} differs between ranks ({all:?}); {hint}"
        )));
    }
    Ok(())
}

/// Figures that add up over ranks (counts and FLOPs: these names, and AKBE's `cat_*`
/// category counts); every other figure is the ranks' mean (each rank holds the same number of
/// questions, so a mean over rows is exact).
const ADDITIVE: [&str; 14] = [
    "skipped_rows",
    "gemm_flops",
    "rollout_gemm_flops",
    "attention_flops",
    "shared_flops",
    "rollout_shared_flops",
    "memory_bound_bytes",
    "compute_bound_flops",
    "rollout_memory_bound_bytes",
    "rollout_compute_bound_flops",
    "kept_rows",
    "targets",
    "retrieval_turns",
    "zero_advantage_turns",
];

fn additive(key: &str) -> bool {
    ADDITIVE.contains(&key) || key.starts_with("cat_")
}

/// One metrics row for the step from every rank's.
pub fn merge_metrics(group: Option<&ProcessGroup>, m: StepMetrics) -> Result<StepMetrics> {
    let Some(g) = group else {
        return Ok(m);
    };
    let bytes = serde_json::to_vec(&m).expect("serialisable");
    let rows: Vec<StepMetrics> = g
        .all_gather_bytes(&bytes)
        .map_err(dist_error)?
        .iter()
        .map(|b| serde_json::from_slice(b).expect("a rank's metrics row"))
        .collect();
    let k = rows.len() as f64;
    let mean = |f: &dyn Fn(&StepMetrics) -> f64| rows.iter().map(f).sum::<f64>() / k;
    let mut out = StepMetrics {
        step: m.step,
        reward: mean(&|r| r.reward),
        em: mean(&|r| r.em),
        tool_calls: mean(&|r| r.tool_calls),
        response_len: mean(&|r| r.response_len),
        kl: mean(&|r| r.kl),
        entropy: mean(&|r| r.entropy),
        clip_frac: mean(&|r| r.clip_frac),
        loss: mean(&|r| r.loss),
        grad_norm: mean(&|r| r.grad_norm),
        kept_groups: rows.iter().map(|r| r.kept_groups).sum(),
        rollout_s: mean(&|r| r.rollout_s),
        update_s: mean(&|r| r.update_s),
        step_s: mean(&|r| r.step_s),
        extra: Default::default(),
    };
    let keys: std::collections::BTreeSet<&String> = rows.iter().flat_map(|r| r.extra.keys()).collect();
    for key in keys {
        let v: Vec<f64> = rows.iter().filter_map(|r| r.extra.get(key).copied()).collect();
        let total: f64 = v.iter().sum();
        out.extra.insert(key.clone(), if additive(key) { total } else { total / v.len() as f64 });
    }
    Ok(out)
}

/// Returns once every rank is here (after rank 0 wrote a checkpoint the others may read).
pub fn barrier(group: Option<&ProcessGroup>) -> Result<()> {
    group.map_or(Ok(()), |g| g.barrier().map_err(dist_error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::{term_names, Sequence};

    fn ce(n: usize) -> LossTerm {
        let row = |i: u32| Sequence { prompt: vec![i], response: vec![i], loss_mask: vec![true] };
        LossTerm::Ce { rows: (0..n as u32).map(row).collect(), coef: 0.5 }
    }

    /// Items 0..5 of the batch, ranks holding [3, 2]; 2 parts: one process takes 0..2 and
    /// 2..5. Rank 0 holds 0,1 of part 0 and 2 of part 1; rank 1 holds 3,4 of part 1.
    #[test]
    fn an_auxiliary_part_is_the_one_process_part_cut_to_the_ranks_items() {
        let first = |t: &LossTerm| match t {
            LossTerm::Share { term, mean_over } => match &**term {
                LossTerm::Ce { rows, coef } => {
                    (rows.iter().map(|r| r.prompt[0]).collect::<Vec<_>>(), *coef, *mean_over)
                }
                _ => unreachable!(),
            },
            _ => panic!("a rank's part is a share"),
        };
        let (t0, t1) = (ce(3), ce(2));
        let (p, n) = aux_part(&t0, &[3, 2], 0, 0, 2);
        assert_eq!((first(&p), n), ((vec![0, 1], 0.5, 2), 2));
        let (p, n) = aux_part(&t0, &[3, 2], 0, 1, 2);
        assert_eq!((first(&p), n), ((vec![2], 0.5, 3), 3));
        let (p, _) = aux_part(&t1, &[3, 2], 1, 0, 2);
        assert_eq!(first(&p), (vec![], 0.5, 2));
        let (p, _) = aux_part(&t1, &[3, 2], 1, 1, 2);
        assert_eq!(first(&p), (vec![0, 1], 0.5, 3));
        // One process: the term's own part, unwrapped.
        assert_eq!(aux_part(&ce(5), &[5], 0, 1, 2).0, ce(5).part(1, 2));
    }

    #[test]
    fn shares_keep_their_terms_names_and_rag_numbering() {
        let rag = || LossTerm::Rag { turns: vec![], coef: 1.0 };
        let share = |t| LossTerm::Share { term: Box::new(t), mean_over: 4 };
        let terms = [LossTerm::Pg { rows: vec![], normaliser: None }, share(rag()), share(rag()), share(ce(1))];
        assert_eq!(term_names(&terms), ["pg", "policy_l_rag_0", "policy_l_rag_1", "ce_nll"]);
    }
}
