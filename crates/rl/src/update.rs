//! The loss → gradient stage every method shares. A method's step returns loss terms
//! ([`LossTerm`]): policy-gradient rows (prompt, response, loss mask, advantage, objective
//! weight), cross-entropy targets (AKBE), preference pairs (AKBE's DPO variant) and RAG
//! likelihood turns (BRIDGE); [`backward`] scores each in micro-batches and accumulates its
//! gradient. The equations are `loss`'s; the optimiser step is the trainer's.
pub use crate::loss::Normaliser;
use crate::loss::{aggregate, clipped_surrogate, gspo_sequence_loss, kl, Aggregation};
use crate::sections::{Algorithm, AlgorithmSection};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{Mode, Policy};
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

/// A response to score under a prompt: the one sequence type of every loss term (policy
/// gradient rows, cross-entropy targets, preference pairs, RAG candidates). `loss_mask` is true
/// for the policy's own tokens, false for observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    pub loss_mask: Vec<bool>,
}

impl Sequence {
    /// A trajectory's response under `prompt`.
    pub fn of(prompt: &[u32], t: &crate::agent::Trajectory) -> Sequence {
        Sequence { prompt: prompt.to_vec(), response: t.response.clone(), loss_mask: t.loss_mask.clone() }
    }

    /// The scorer's borrowed view (`with_mask = false`: every response token counts).
    pub fn request(&self, with_mask: bool) -> ScoreRequest<'_> {
        ScoreRequest {
            prompt: &self.prompt,
            response: &self.response,
            loss_mask: with_mask.then_some(&self.loss_mask[..]),
        }
    }
}

/// One response in a policy-gradient objective. The same generated tokens may appear in several
/// rows under different prompts (Knowledgeable-R1's PK and RPK).
#[derive(Debug, Clone, PartialEq)]
pub struct PgRow {
    pub seq: Sequence,
    pub advantage: f64,
    /// The objective's weight λ (1 for plain GRPO).
    pub weight: f64,
    /// log π_old of each response token, scored once before the first of several updates
    /// ([`score_old`]); empty = π_old is the current policy (one update per batch, or the
    /// first mini-batch of a single epoch).
    pub old_logprobs: Vec<f64>,
}

impl PgRow {
    pub fn new(seq: Sequence, advantage: f64, weight: f64) -> PgRow {
        PgRow { seq, advantage, weight, old_logprobs: vec![] }
    }
}

/// A preference pair sharing nothing but the question (AKBE Appendix C's DPO variant).
#[derive(Debug, Clone, PartialEq)]
pub struct DpoPair {
    pub chosen: Sequence,
    pub rejected: Sequence,
}

impl Normaliser {
    /// Every row counted once (plain GRPO / DAPO / GSPO).
    pub fn of(rows: &[PgRow]) -> Normaliser {
        Normaliser { tokens: rows.iter().map(|r| mask_len(&r.seq.loss_mask)).sum(), sequences: rows.len() as f64 }
    }
}

pub fn mask_len(mask: &[bool]) -> f64 {
    mask.iter().filter(|m| **m).count() as f64
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PgStats {
    pub loss: f64,
    pub kl: f64,
    pub entropy: f64,
    pub clip_frac: f64,
    /// mean(log π_old − log π) over the scored tokens (verl's `ppo_kl`): 0 on the first update
    /// of a batch, how far the policy has moved from the rollout policy after it.
    pub ppo_kl: f64,
    /// Seconds in forward scoring (π_old, π, reference) and in backward.
    pub score_s: f64,
    pub backward_s: f64,
    /// Rows not scored because they carry no gradient (`skip_zero_advantage`).
    pub skipped_rows: usize,
    /// Tokens the means above are over (a data-parallel rank's weight when they are merged).
    pub scored_tokens: f64,
}

fn requests<'a>(rows: &[&'a PgRow]) -> Vec<ScoreRequest<'a>> {
    rows.iter().map(|r| r.seq.request(true)).collect()
}

/// Whether a row can change the gradient. A row with A = 0 (or λ = 0) has per-token loss
/// −min(ρ·0, clip(ρ)·0) = 0 for every ρ, so without a KL term it adds nothing; the loss is
/// divided by the normaliser, which counts it anyway. GRPO groups whose samples all earned the
/// same reward are such rows.
fn carries(alg: &AlgorithmSection, r: &PgRow) -> bool {
    !r.seq.response.is_empty()
        && (alg.kl_coef > 0.0 || !alg.skip_zero_advantage || (r.advantage != 0.0 && r.weight != 0.0))
}

/// π_old for several updates per batch (PPO): fills each row's `old_logprobs` from one no-grad
/// scoring pass under the current weights, which are the weights that generated the batch.
/// Rows that carry no gradient, and rows whose `on_policy` is true (the first update scores
/// them before any step, so its detached log-probs are π_old), are left empty.
pub fn score_old(
    policy: &Policy,
    rows: &mut [PgRow],
    on_policy: &[bool],
    alg: &AlgorithmSection,
    temperature: f64,
    micro_batch: usize,
) {
    let temp = temperature.max(1e-6);
    // One product per projection: the adapters merged for the pass (no step falls inside).
    let _merged = policy.lm.merged_adapters();
    let mut todo: Vec<&mut PgRow> =
        rows.iter_mut().zip(on_policy).filter(|(r, &fresh)| !fresh && carries(alg, r)).map(|(r, _)| r).collect();
    tch::no_grad(|| {
        for mb in todo.chunks_mut(micro_batch.max(1)) {
            let refs: Vec<&PgRow> = mb.iter().map(|r| &**r).collect();
            let s = score(&policy.lm, &requests(&refs), temp, Mode::EVAL);
            let width = s.logprobs.size()[1] as usize;
            let flat = Vec::<f64>::try_from(s.logprobs.to_kind(Kind::Double).flatten(0, -1)).expect("f64 logprobs");
            for (i, r) in mb.iter_mut().enumerate() {
                r.old_logprobs = flat[i * width..i * width + r.seq.response.len()].to_vec();
            }
        }
    });
}

/// The [B, width] π_old tensor of a micro-batch whose rows all carry `old_logprobs`, laid out as
/// `score` lays out log-probs (response token t in column t, zero padding).
fn old_tensor(rows: &[&PgRow], like: &Tensor) -> Tensor {
    let width = like.size()[1] as usize;
    let mut flat = vec![0f64; rows.len() * width];
    for (i, r) in rows.iter().enumerate() {
        flat[i * width..i * width + r.old_logprobs.len()].copy_from_slice(&r.old_logprobs);
    }
    Tensor::from_slice(&flat).view([rows.len() as i64, width as i64]).to_kind(like.kind()).to_device(like.device())
}

/// Accumulates ∇ of the clipped policy-gradient objective (GRPO / DAPO token ratios, GSPO
/// sequence ratios), plus the KL to `reference` when `kl_coef > 0`, over `rows`.
pub fn pg_backward(
    policy: &Policy,
    reference: Option<&Policy>,
    rows: &[PgRow],
    norm: Normaliser,
    alg: &AlgorithmSection,
    temperature: f64,
    micro_batch: usize,
) -> PgStats {
    let with_response: Vec<&PgRow> = rows.iter().filter(|r| !r.seq.response.is_empty()).collect();
    let rows: Vec<&PgRow> = with_response.iter().copied().filter(|r| carries(alg, r)).collect();
    let temp = temperature.max(1e-6);
    let gspo = alg.name == Algorithm::Gspo;
    let agg = if gspo { Aggregation::SeqMeanTokenMean } else { alg.aggregation };
    let mut st = PgStats { skipped_rows: with_response.len() - rows.len(), ..PgStats::default() };
    st.scored_tokens = rows.iter().map(|r| mask_len(&r.seq.loss_mask)).sum::<f64>();
    let counted = st.scored_tokens.max(1.0);
    for mb in rows.chunks(micro_batch.max(1)) {
        let reqs = requests(mb);
        let t0 = std::time::Instant::now();
        // π_old is the policy that generated the batch: scored before the first update when a
        // batch makes several ([`score_old`]); with one update per batch it is the current
        // policy, and detaching saves the second forward pass (TRL does the same).
        let s = score(&policy.lm, &reqs, temp, Mode::TRAIN);
        let old = if mb.iter().all(|r| !r.old_logprobs.is_empty()) {
            old_tensor(mb, &s.logprobs)
        } else {
            s.logprobs.detach()
        };
        let dev = s.logprobs.device();
        let adv = Tensor::from_slice(&mb.iter().map(|r| r.advantage as f32).collect::<Vec<_>>()).to_device(dev);
        let weight =
            Tensor::from_slice(&mb.iter().map(|r| r.weight as f32).collect::<Vec<_>>()).to_device(dev).unsqueeze(1);
        let (per_token, clipped) = if gspo {
            let (l, c) = gspo_sequence_loss(&s.logprobs, &old, &adv, &s.mask, alg.clip_low, alg.clip_high);
            (l.unsqueeze(1) * &s.mask, c.unsqueeze(1) * &s.mask)
        } else {
            clipped_surrogate(&s.logprobs, &old, &adv, alg.clip_low, alg.clip_high)
        };
        // Out of place: autograd saved `per_token`'s inputs.
        let per_token = if alg.kl_coef > 0.0 {
            let r = reference.unwrap_or(policy);
            let mode = if reference.is_some() { Mode::EVAL } else { Mode::REFERENCE };
            let reference_lp = tch::no_grad(|| score(&r.lm, &reqs, temp, mode).logprobs);
            let k = kl(&s.logprobs, &reference_lp, alg.kl_estimator);
            st.kl += (&k * &s.mask).sum(Kind::Float).double_value(&[]);
            per_token + k * alg.kl_coef
        } else {
            per_token
        };
        let loss = aggregate(&(per_token * weight), &s.mask, agg, norm);
        let t1 = std::time::Instant::now();
        loss.backward();
        st.score_s += (t1 - t0).as_secs_f64();
        st.backward_s += t1.elapsed().as_secs_f64();
        st.loss += loss.double_value(&[]);
        st.entropy += (&s.entropy * &s.mask).sum(Kind::Float).double_value(&[]);
        st.clip_frac += (clipped * &s.mask).sum(Kind::Float).double_value(&[]);
        st.ppo_kl += ((&old - s.logprobs.detach()) * &s.mask).sum(Kind::Float).double_value(&[]);
    }
    st.kl /= counted;
    st.entropy /= counted;
    st.clip_frac /= counted;
    st.ppo_kl /= counted;
    st
}

/// Per-sequence token-mean negative log-likelihood [B] of `rows` (mask applied).
pub fn sequence_nll(policy: &Policy, rows: &[&Sequence], mode: Mode) -> Tensor {
    let (logp, n) = sequence_logp(policy, rows, mode);
    -logp / n.clamp_min(1.0)
}

/// Accumulates ∇ of coef × the per-sequence token-mean NLL summed over rows and divided by
/// `mean_over` (the rows' count, or a data-parallel part's over all ranks); returns that mean
/// NLL (before the coefficient).
pub fn ce_backward(policy: &Policy, rows: &[Sequence], coef: f64, mean_over: usize, micro_batch: usize) -> f64 {
    if rows.is_empty() || coef == 0.0 {
        return 0.0;
    }
    let n = mean_over as f64;
    let mut total = 0.0;
    let refs: Vec<&Sequence> = rows.iter().collect();
    for mb in refs.chunks(micro_batch.max(1)) {
        let nll = sequence_nll(policy, mb, Mode::TRAIN).sum(Kind::Float);
        total += nll.double_value(&[]);
        (nll * (coef / n)).backward();
    }
    total / n
}

/// Sum of each sequence's masked token log-probs [B] and its masked token count [B].
fn sequence_logp(policy: &Policy, rows: &[&Sequence], mode: Mode) -> (Tensor, Tensor) {
    let reqs: Vec<ScoreRequest> = rows.iter().map(|r| r.request(true)).collect();
    let s = score(&policy.lm, &reqs, 1.0, mode);
    ((&s.logprobs * &s.mask).sum_dim_intlist(1, false, Kind::Float), s.mask.sum_dim_intlist(1, false, Kind::Float))
}

/// DPO (Rafailov et al. 2023): −log σ(β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]),
/// summed over pairs, divided by `mean_over` (as [`ce_backward`]), × coef. Returns that mean loss.
pub fn dpo_backward(
    policy: &Policy,
    reference: Option<&Policy>,
    pairs: &[DpoPair],
    (beta, coef): (f64, f64),
    mean_over: usize,
    micro_batch: usize,
) -> f64 {
    if pairs.is_empty() || coef == 0.0 {
        return 0.0;
    }
    let n = mean_over as f64;
    let mut total = 0.0;
    for mb in pairs.chunks(micro_batch.max(1)) {
        let w: Vec<&Sequence> = mb.iter().map(|p| &p.chosen).collect();
        let l: Vec<&Sequence> = mb.iter().map(|p| &p.rejected).collect();
        let (r, mode) = match reference {
            Some(r) => (r, Mode::EVAL),
            None => (policy, Mode::REFERENCE),
        };
        let (rw, rl) = tch::no_grad(|| (sequence_logp(r, &w, mode).0, sequence_logp(r, &l, mode).0));
        let margin = (sequence_logp(policy, &w, Mode::TRAIN).0 - rw) - (sequence_logp(policy, &l, Mode::TRAIN).0 - rl);
        let loss = -(margin * beta).log_sigmoid().sum(Kind::Float);
        total += loss.double_value(&[]);
        (loss * (coef / n)).backward();
    }
    total / n
}

/// One retrieval turn for the policy-side RAG likelihood: the candidates' teacher-forcing rows
/// (h_t + ⟨information⟩d, y) and the retriever's fixed ρ(d|h_t) over them.
#[derive(Debug, Clone, PartialEq)]
pub struct RagTurn {
    pub docs: Vec<Sequence>,
    pub rho: Vec<f64>,
}

/// Accumulates ∇_θ of coef × L_RAG(θ) with L_RAG = −mean_t log Σ_d ρ_d p_θ(y | h_t, d)
/// (Lewis et al. 2020's marginal likelihood; BRIDGE's Drop and two-state estimators), the mean
/// over `mean_over` turns (as [`ce_backward`]). Returns L_RAG.
pub fn rag_backward(policy: &Policy, turns: &[RagTurn], coef: f64, mean_over: usize, micro_batch: usize) -> f64 {
    if turns.is_empty() || coef == 0.0 {
        return 0.0;
    }
    let n = mean_over as f64;
    let k = turns[0].docs.len().max(1);
    let per = (micro_batch.max(1) / k).max(1);
    let mut total = 0.0;
    for mb in turns.chunks(per) {
        let rows: Vec<&Sequence> = mb.iter().flat_map(|t| t.docs.iter()).collect();
        let logp = sequence_logp(policy, &rows, Mode::TRAIN).0;
        let log_rho: Vec<f32> = mb.iter().flat_map(|t| t.rho.iter().map(|r| r.max(1e-30).ln() as f32)).collect();
        let shape = [mb.len() as i64, k as i64];
        let log_rho = Tensor::from_slice(&log_rho).to_device(logp.device()).view(shape);
        let mix = (logp.view(shape) + log_rho).logsumexp([1i64].as_slice(), false);
        let loss = -mix.sum(Kind::Float);
        total += loss.double_value(&[]);
        (loss * (coef / n)).backward();
    }
    total / n
}

/// One term of a step's loss. A step returns its terms; [`backward`] applies them all.
#[derive(Debug, Clone, PartialEq)]
pub enum LossTerm {
    /// The clipped policy-gradient objective (GRPO / DAPO / GSPO) over `rows`, divided by
    /// `normaliser` (`None`: every row counted once).
    Pg { rows: Vec<PgRow>, normaliser: Option<Normaliser> },
    /// coef × the per-sequence token-mean cross-entropy of target sequences (AKBE Eq. 6).
    Ce { rows: Vec<Sequence>, coef: f64 },
    /// coef × DPO over preference pairs (AKBE Appendix C).
    Dpo { pairs: Vec<DpoPair>, beta: f64, coef: f64 },
    /// coef × the policy-side RAG likelihood (BRIDGE's Drop / two-state estimators).
    Rag { turns: Vec<RagTurn>, coef: f64 },
    /// A data-parallel rank's items of an auxiliary term whose mean runs over `mean_over` items
    /// on all ranks (its part of the batch's term, as one process would take it).
    Share { term: Box<LossTerm>, mean_over: usize },
}

impl LossTerm {
    /// How many items (rows, pairs, turns) the term holds.
    pub fn len(&self) -> usize {
        match self {
            LossTerm::Pg { rows, .. } => rows.len(),
            LossTerm::Ce { rows, .. } => rows.len(),
            LossTerm::Dpo { pairs, .. } => pairs.len(),
            LossTerm::Rag { turns, .. } => turns.len(),
            LossTerm::Share { term, .. } => term.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The i-th of m near-equal contiguous parts of an auxiliary term (a PPO mini-batch's
    /// share); policy-gradient rows are dealt by the trainer instead.
    pub fn part(&self, i: usize, m: usize) -> LossTerm {
        let n = self.len();
        self.range(i * n / m, (i + 1) * n / m)
    }

    /// Items `lo..hi` of the term.
    pub fn range(&self, lo: usize, hi: usize) -> LossTerm {
        match self {
            LossTerm::Pg { rows, normaliser } => LossTerm::Pg { rows: rows[lo..hi].to_vec(), normaliser: *normaliser },
            LossTerm::Ce { rows, coef } => LossTerm::Ce { rows: rows[lo..hi].to_vec(), coef: *coef },
            LossTerm::Dpo { pairs, beta, coef } => {
                LossTerm::Dpo { pairs: pairs[lo..hi].to_vec(), beta: *beta, coef: *coef }
            }
            LossTerm::Rag { turns, coef } => LossTerm::Rag { turns: turns[lo..hi].to_vec(), coef: *coef },
            LossTerm::Share { .. } => panic!("a rank's share is not cut further"),
        }
    }
}

/// The name [`backward`] reports each term's loss under, in term order (`pg` for the
/// policy-gradient term, whose figures are [`PgStats`]).
pub fn term_names(terms: &[LossTerm]) -> Vec<String> {
    let mut rag = 0;
    let mut name = |t: &LossTerm| match t {
        LossTerm::Pg { .. } => "pg".to_string(),
        LossTerm::Ce { .. } => "ce_nll".into(),
        LossTerm::Dpo { .. } => "dpo_loss".into(),
        LossTerm::Rag { .. } => {
            rag += 1;
            format!("policy_l_rag_{}", rag - 1)
        }
        LossTerm::Share { .. } => unreachable!("unwrapped below"),
    };
    terms
        .iter()
        .map(|t| match t {
            LossTerm::Share { term, .. } => name(term),
            t => name(t),
        })
        .collect()
}

/// What one [`backward`] did: the policy-gradient figures and each auxiliary term's loss
/// (`ce_nll`, `dpo_loss`, `policy_l_rag_<k>` for the k-th RAG term).
#[derive(Debug, Clone, Default)]
pub struct BackwardStats {
    pub pg: PgStats,
    pub terms: BTreeMap<String, f64>,
}

/// Accumulates the gradient of every term (the sum of their losses) into the policy's
/// parameters; the caller zeroes gradients before and steps the optimiser after.
pub fn backward(
    policy: &Policy,
    reference: Option<&Policy>,
    terms: &[LossTerm],
    alg: &AlgorithmSection,
    temperature: f64,
    micro_batch: usize,
) -> BackwardStats {
    let mut st = BackwardStats::default();
    for (term, name) in terms.iter().zip(term_names(terms)) {
        let (term, mean_over) = match term {
            LossTerm::Share { term, mean_over } => (&**term, *mean_over),
            t => (t, t.len()),
        };
        let loss = match term {
            LossTerm::Pg { rows, normaliser } => {
                let norm = normaliser.unwrap_or_else(|| Normaliser::of(rows));
                st.pg = pg_backward(policy, reference, rows, norm, alg, temperature, micro_batch);
                continue;
            }
            LossTerm::Ce { rows, coef } => ce_backward(policy, rows, *coef, mean_over, micro_batch),
            LossTerm::Dpo { pairs, beta, coef } => {
                dpo_backward(policy, reference, pairs, (*beta, *coef), mean_over, micro_batch)
            }
            LossTerm::Rag { turns, coef } => rag_backward(policy, turns, *coef, mean_over, micro_batch),
            LossTerm::Share { .. } => panic!("a share of a share"),
        };
        st.terms.insert(name, loss);
    }
    st
}
