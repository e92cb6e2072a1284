//! Batched, KV-cached, resumable generation.
//!
//! A [`DecodeSession`] owns one KV cache for a batch of rows. Rows are fed ragged blocks of
//! tokens (right-aligned, padding masked out), so a prompt prefill, a sampled token and an
//! appended `<information>` observation all go through the same `feed`. Masked padding can sit
//! in the middle of a row's cache ("holes"); RoPE positions count only real tokens, so a resumed
//! sequence is computed exactly as if it had been one contiguous prompt. A row whose history
//! and new block equal an earlier row's (a prompt's G samples; samples of a group that issued
//! the same search and got the same observation, or that sampled the same tokens so far) is not
//! computed: it gets a copy of that row's new cache slots and logits.
use crate::error::{EngineError, Result};
use crate::layers::Mode;
use crate::models::llama::{DecoderLm, KvCache};
use crate::sampling::{sample_with, Rng, SamplingParams, Scratch};
use crate::tokenizer::Tokenizer;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    Eos,
    Stop,
    Length,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// Per-token log-probs under the sampling distribution (see `sampling::sample`).
    pub logprobs: Vec<f32>,
    pub finish: Finish,
    /// The stop string that ended generation, when `finish == Stop`.
    pub stop: Option<String>,
}

/// Where a session's time went (seconds), for benchmarks and step-time breakdowns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodeStats {
    pub forward_s: f64,
    /// Host time issuing the forwards (on CUDA the rest of `forward_s` is waiting for the
    /// device; a launch time close to `forward_s` means the decode is host-bound).
    pub launch_s: f64,
    pub sample_s: f64,
    pub forwards: usize,
    /// Batch rows computed, summed over forwards (finished rows moved out are not computed).
    pub rows_computed: usize,
    /// Rows of feeds copied from an identical row instead of computed, and their tokens (a
    /// prompt's G samples; samples of a group that issued the same search or sampled the same
    /// tokens: at temperature 1 two thirds of a GRPO rollout's decode rows).
    pub rows_shared: usize,
    pub tokens_shared: usize,
}

pub struct DecodeSession<'a> {
    lm: &'a DecoderLm,
    pub stats: DecodeStats,
    cache: KvCache,
    /// valid[r][j]: cache slot j of row r holds a real token (not padding).
    valid: Vec<Vec<bool>>,
    /// Real tokens per row so far = the RoPE position of the row's next token.
    n_real: Vec<i64>,
    /// Tokens sampled but not yet fed (the last token of a finished generation).
    pending: Vec<Vec<u32>>,
    /// Real tokens fed to each row so far: rows with equal histories hold equal caches.
    history: Vec<Vec<u32>>,
    /// Next-token logits per row [B, V] (float32, on the model's device).
    last_logits: Option<Tensor>,
    /// slot[r]: the cache row holding row r. A forward pass runs only the cache rows up to the
    /// last one fed, so rows that finished (or do not search this turn) are moved behind the
    /// fed ones instead of being computed as padding.
    slot: Vec<usize>,
    pad_id: u32,
    /// The session decodes on LoRA-merged weights (one product per projection, not three).
    _merged: crate::models::llama::MergedAdapters<'a>,
}

impl<'a> DecodeSession<'a> {
    pub fn new(lm: &'a DecoderLm, batch: usize, pad_id: u32) -> Self {
        DecodeSession {
            lm,
            stats: DecodeStats::default(),
            cache: KvCache::new(),
            valid: vec![vec![]; batch],
            n_real: vec![0; batch],
            pending: vec![vec![]; batch],
            history: vec![vec![]; batch],
            last_logits: None,
            slot: (0..batch).collect(),
            pad_id,
            _merged: lm.merged_adapters(),
        }
    }

    pub fn batch(&self) -> usize {
        self.valid.len()
    }

    /// Real tokens seen by row `r` (including a pending sampled token).
    pub fn len(&self, r: usize) -> usize {
        self.n_real[r] as usize + self.pending[r].len()
    }

    pub fn is_empty(&self) -> bool {
        self.valid.iter().all(|v| v.is_empty())
    }

    /// Appends tokens to rows (`blocks[r]` may be empty); e.g. a prompt, or a retrieved
    /// observation after a stop. Generation then continues from the cache.
    pub fn append(&mut self, blocks: &[Vec<u32>]) -> Result<()> {
        if blocks.len() != self.batch() {
            return Err(EngineError::Invalid(format!(
                "append: {} blocks for a batch of {}",
                blocks.len(),
                self.batch()
            )));
        }
        let merged: Vec<Vec<u32>> = blocks
            .iter()
            .enumerate()
            .map(|(r, b)| {
                let mut m = std::mem::take(&mut self.pending[r]);
                m.extend_from_slice(b);
                m
            })
            .collect();
        self.feed(&merged);
        Ok(())
    }

    /// Moves the `fed` rows to the front cache rows when the rows in between would waste a
    /// quarter or more of the pass. One copy of the cache; a batch shrinking to nothing
    /// triggers it a handful of times.
    fn compact(&mut self, fed: &[usize]) {
        let front = fed.iter().map(|&r| self.slot[r]).max().map_or(0, |s| s + 1);
        if 4 * (front - fed.len()) < front.max(4) {
            return;
        }
        let mut is_fed = vec![false; self.batch()];
        fed.iter().for_each(|&r| is_fed[r] = true);
        let mut order: Vec<usize> = (0..self.batch()).collect();
        // Fed rows first, everything else after, each in its current cache order.
        order.sort_by_key(|&r| (!is_fed[r], self.slot[r]));
        let perm: Vec<i64> = order.iter().map(|&r| self.slot[r] as i64).collect();
        self.cache.select_rows(&Tensor::from_slice(&perm).to_device(self.lm.device()));
        for (s, &r) in order.iter().enumerate() {
            self.slot[r] = s;
        }
    }

    /// One forward pass over right-aligned ragged blocks; updates cache and next-token logits.
    /// Only cache rows up to the last fed row run (see `slot`).
    fn feed(&mut self, blocks: &[Vec<u32>]) {
        let b = self.batch();
        let t = blocks.iter().map(Vec::len).max().unwrap_or(0);
        if t == 0 {
            return;
        }
        let t0 = std::time::Instant::now();
        let fed: Vec<usize> = (0..b).filter(|&r| !blocks[r].is_empty()).collect();
        // A block whose row repeats an earlier row (same history, same block) is not computed:
        // that row's new cache slots and logits are copied after the pass. Its row stays in the
        // computed front (no reorder) as a row of padding, which a packed pass skips.
        let copies = same_as_earlier(&self.history, blocks);
        let mut copied = vec![false; b];
        copies.iter().for_each(|&(r, _)| copied[r] = true);
        self.compact(&fed);
        let k = fed.iter().map(|&r| self.slot[r]).max().unwrap() + 1;
        let past = self.cache.len as usize;
        let keys = past + t;
        let mut ids = vec![self.pad_id as i64; k * t];
        let mut pos = vec![0i64; k * t];
        let mut mask = vec![false; k * t * keys];
        // Real tokens per computed cache row (0 for a row inside the front that takes none).
        let mut lens = vec![0usize; k];
        for (r, block) in blocks.iter().enumerate() {
            // A copied row's new slots will hold its source's block, laid out as its own.
            let off = t - block.len();
            self.valid[r].extend((0..t).map(|i| i >= off));
            self.history[r].extend_from_slice(block);
            if copied[r] {
                self.n_real[r] += block.len() as i64;
                continue;
            }
            let s = self.slot[r];
            if s >= k {
                continue; // not computed: its new slots are holes
            }
            lens[s] = block.len();
            for (i, &tok) in block.iter().enumerate() {
                ids[s * t + off + i] = tok as i64;
                pos[s * t + off + i] = self.n_real[r] + i as i64;
            }
            self.n_real[r] += block.len() as i64;
            let row_valid = &self.valid[r];
            for q in 0..t {
                let m = &mut mask[(s * t + q) * keys..(s * t + q + 1) * keys];
                for (j, slot) in m.iter_mut().enumerate().take(past + q + 1) {
                    *slot = row_valid[j];
                }
                m[past + q] = true; // a padding query attends to itself: no empty softmax row
            }
        }
        let dev = self.lm.device();
        let ids = Tensor::from_slice(&ids).view([k as i64, t as i64]).to_device(dev);
        let pos = Tensor::from_slice(&pos).view([k as i64, t as i64]).to_device(dev);
        let mask = Tensor::from_slice(&mask).view([k as i64, 1, t as i64, keys as i64]).to_device(dev);
        self.lm.reserve_cache(&mut self.cache, b as i64, t as i64);
        if k < b {
            self.cache.clear_block(k as i64, past as i64, t as i64); // rows not run this pass
        }
        let mut front = self.cache.front_rows(k as i64);
        let padded = lens.iter().any(|&n| n != t);
        // The computed cache rows, and the hidden state of each one's last token.
        let computed: Vec<usize> = (0..k).filter(|&s| lens[s] > 0).collect();
        let last = if padded {
            // A ragged block (observations, prompts of different lengths): the projections and
            // MLPs run on the real tokens only. Row s's last token is packed row Σ_{<s} lens + lens[s] − 1.
            let packing = crate::models::llama::Packing::right_aligned(&lens, t, dev);
            let hidden =
                tch::no_grad(|| self.lm.forward_cached_packed(&ids, &pos, &mask, &mut front, &packing, Mode::EVAL));
            let ends: Vec<i64> = lens
                .iter()
                .scan(0i64, |end, &n| {
                    *end += n as i64;
                    Some(*end - 1)
                })
                .zip(&lens)
                .filter(|(_, &n)| n > 0)
                .map(|(e, _)| e)
                .collect();
            hidden.index_select(0, &Tensor::from_slice(&ends).to_device(dev))
        } else {
            let hidden = tch::no_grad(|| self.lm.forward_hidden(&ids, &pos, &mask, Some(&mut front), Mode::EVAL));
            hidden.select(1, -1)
        };
        self.cache.len += t as i64;
        // LM head on the computed rows only; a copied row takes its source's logits.
        let logits = tch::no_grad(|| self.lm.logits(&last));
        let mut at = vec![usize::MAX; k];
        computed.iter().enumerate().for_each(|(i, &s)| at[s] = i);
        let mut source: Vec<usize> = (0..b).collect();
        copies.iter().for_each(|&(r, from)| source[r] = from);
        let pick: Vec<i64> = fed.iter().map(|&r| at[self.slot[source[r]]] as i64).collect();
        let in_place = fed.len() == b
            && fed.iter().all(|&r| self.slot[r] == r)
            && pick.iter().enumerate().all(|(i, &p)| p == i as i64);
        self.last_logits = Some(if in_place {
            logits // every row fed and computed, in cache order: no [B, V] copy
        } else {
            let to = |v: Vec<i64>| Tensor::from_slice(&v).to_device(dev);
            let rows = to(fed.iter().map(|&r| r as i64).collect());
            let old = self
                .last_logits
                .take()
                .unwrap_or_else(|| Tensor::zeros([b as i64, logits.size()[1]], (logits.kind(), dev)));
            old.index_copy(0, &rows, &logits.index_select(0, &to(pick)))
        });
        // The copied rows' work, as computing them would have counted it: their tokens, their
        // attention pairs (row r's i-th new token sees its n_real + i + 1 real keys) and one LM-head row.
        let (tokens, pairs) = copies.iter().fold((0i64, 0i64), |(tk, pr), &(r, from)| {
            let (n, before) = (blocks[r].len() as i64, self.n_real[from] - blocks[r].len() as i64);
            (tk + n, pr + n * before + n * (n + 1) / 2)
        });
        crate::flops::add_shared(self.lm.forward_flops(tokens, pairs, copies.len() as i64, 0));
        self.copy_slots(&copies, past as i64);
        self.stats.forwards += 1;
        self.stats.rows_computed += computed.len();
        self.stats.rows_shared += copies.len();
        self.stats.tokens_shared += copies.iter().map(|&(r, _)| blocks[r].len()).sum::<usize>();
        self.stats.launch_s += t0.elapsed().as_secs_f64();
        crate::device::synchronize(self.lm.device()); // forward_s: the GPU's time, not its launches
        self.stats.forward_s += t0.elapsed().as_secs_f64();
    }

    /// Rows `(r, from)` with equal histories before this feed: row r's cache slots from `first`
    /// on (this feed's) become copies of row `from`'s. Its earlier slots stay: they hold the same
    /// tokens, and the new keys and values depend only on those tokens and their positions.
    fn copy_slots(&mut self, pairs: &[(usize, usize)], first: i64) {
        if pairs.is_empty() {
            return;
        }
        let dev = self.lm.device();
        let to = |v: Vec<i64>| Tensor::from_slice(&v).to_device(dev);
        let (dst, src) = (
            to(pairs.iter().map(|&(r, _)| self.slot[r] as i64).collect()),
            to(pairs.iter().map(|&(_, f)| self.slot[f] as i64).collect()),
        );
        self.cache.copy_rows(&src, &dst, first);
    }

    /// Generates for `rows` (each with its own params and generator) until eos, a stop string
    /// or `max_new_tokens`. Rows not listed are left untouched. The stop/eos token is kept in
    /// the output and stays pending in the session, so a later `append` continues after it.
    pub fn generate(
        &mut self,
        rows: &[usize],
        params: &[SamplingParams],
        rngs: &mut [Rng],
        tokenizer: Option<&Tokenizer>,
        eos_ids: &[u32],
    ) -> Result<Vec<Generation>> {
        if params.len() != rows.len() || rngs.len() != rows.len() {
            return Err(EngineError::Invalid("generate: rows, params and rngs differ in length".into()));
        }
        if tokenizer.is_none() && params.iter().any(|p| !p.stop.is_empty()) {
            return Err(EngineError::Invalid("generate: stop strings need a tokenizer".into()));
        }
        // Feed what an earlier generate left pending for these rows.
        if rows.iter().any(|&r| !self.pending[r].is_empty()) {
            let mut blocks = vec![vec![]; self.batch()];
            for &r in rows {
                blocks[r] = std::mem::take(&mut self.pending[r]);
            }
            self.feed(&blocks);
        }
        let Some(_) = self.last_logits else {
            return Err(EngineError::Invalid("generate: append a prompt first".into()));
        };
        let mut out: Vec<Generation> = rows
            .iter()
            .map(|_| Generation { tokens: vec![], logprobs: vec![], finish: Finish::Length, stop: None })
            .collect();
        let mut active: Vec<usize> = (0..rows.len()).filter(|&i| params[i].max_new_tokens > 0).collect();
        let vocab = self.lm.cfg.vocab_size as usize;
        while !active.is_empty() {
            let t0 = std::time::Instant::now();
            let sel: Vec<i64> = active.iter().map(|&i| rows[i] as i64).collect();
            let dev = self.lm.device();
            let logits = self.last_logits.as_ref().unwrap();
            // All rows active (the common case): sample from the logits in place.
            let logits = if sel.len() as i64 == logits.size()[0] && sel.iter().enumerate().all(|(a, &r)| a as i64 == r)
            {
                logits.shallow_clone()
            } else {
                logits.index_select(0, &Tensor::from_slice(&sel).to_device(dev))
            };
            let logits = logits.to_device(tch::Device::Cpu).to_kind(tch::Kind::Float).contiguous();
            // SAFETY: a contiguous f32 CPU tensor of active·vocab elements, alive below.
            let host = unsafe { std::slice::from_raw_parts(logits.data_ptr() as *const f32, active.len() * vocab) };
            let mut blocks = vec![vec![]; self.batch()];
            let mut still = vec![];
            let picks = sample_rows(host, vocab, &active, params, rngs);
            for (a, &i) in active.iter().enumerate() {
                let (tok, lp) = picks[a];
                let g = &mut out[i];
                g.tokens.push(tok);
                g.logprobs.push(lp);
                let done = if eos_ids.contains(&tok) {
                    g.finish = Finish::Eos;
                    true
                } else if let Some(s) = hit_stop(tokenizer, &g.tokens, &params[i].stop)? {
                    g.finish = Finish::Stop;
                    g.stop = Some(s);
                    true
                } else {
                    g.tokens.len() >= params[i].max_new_tokens
                };
                if done {
                    self.pending[rows[i]].push(tok);
                } else {
                    blocks[rows[i]].push(tok);
                    still.push(i);
                }
            }
            active = still;
            self.stats.sample_s += t0.elapsed().as_secs_f64();
            if !active.is_empty() {
                self.feed(&blocks);
            }
        }
        Ok(out)
    }
}

/// Rows `(r, from)` whose non-empty block and history equal those of an earlier row `from`
/// that is computed itself.
fn same_as_earlier(history: &[Vec<u32>], blocks: &[Vec<u32>]) -> Vec<(usize, usize)> {
    let mut first = std::collections::HashMap::new();
    let mut copies = vec![];
    for (r, block) in blocks.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        match first.entry((history[r].as_slice(), block.as_slice())) {
            std::collections::hash_map::Entry::Occupied(e) => copies.push((r, *e.get())),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(r);
            }
        }
    }
    copies
}

/// One token for each active row (`host` holds their logits in order). Rows sample
/// independently (own generator each), so they are split across libtorch's OpenMP team
/// (a rayon pool would fight its spinning workers; see [`crate::kernels::omp`]).
fn sample_rows(
    host: &[f32],
    vocab: usize,
    active: &[usize],
    params: &[SamplingParams],
    rngs: &mut [Rng],
) -> Vec<(u32, f32)> {
    use std::sync::Mutex;
    let rows: Vec<Mutex<(usize, Rng)>> = active.iter().map(|&i| Mutex::new((i, rngs[i].clone()))).collect();
    let picks: Vec<Mutex<(u32, f32)>> = active.iter().map(|_| Mutex::new((0, 0.0))).collect();
    let threads = (tch::get_num_threads().max(1) as usize).min(active.len());
    crate::kernels::omp::parallel(threads, &|t, nt| {
        let mut scratch = Scratch::default();
        for a in (t..rows.len()).step_by(nt.max(1)) {
            let mut row = rows[a].lock().unwrap();
            let (i, ref mut rng) = *row;
            *picks[a].lock().unwrap() = sample_with(&host[a * vocab..(a + 1) * vocab], &params[i], rng, &mut scratch);
        }
    });
    for row in rows {
        let (i, rng) = row.into_inner().unwrap();
        rngs[i] = rng;
    }
    picks.into_iter().map(|p| p.into_inner().unwrap()).collect()
}

/// The first stop string found in the decoded tail of `tokens` (only the last few tokens are
/// decoded: a stop string is detected on the token that completes it).
fn hit_stop(tok: Option<&Tokenizer>, tokens: &[u32], stops: &[String]) -> Result<Option<String>> {
    let Some(tok) = tok.filter(|_| !stops.is_empty()) else {
        return Ok(None);
    };
    let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
    let tail = &tokens[tokens.len().saturating_sub(longest + 2)..];
    let text = tok.decode(tail, false)?;
    Ok(stops.iter().find(|s| text.contains(s.as_str())).cloned())
}

/// One-call batched generation from ragged prompts: each row has its own seed.
pub fn generate(
    lm: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    seeds: &[u64],
    eos_ids: &[u32],
    pad_id: u32,
) -> Result<Vec<Generation>> {
    if seeds.len() != prompts.len() {
        return Err(EngineError::Invalid("generate: one seed per prompt".into()));
    }
    if prompts.iter().any(|p| p.is_empty()) {
        return Err(EngineError::Invalid("generate: empty prompt".into()));
    }
    let mut s = DecodeSession::new(lm, prompts.len(), pad_id);
    s.append(prompts)?;
    let rows: Vec<usize> = (0..prompts.len()).collect();
    let params = vec![params.clone(); prompts.len()];
    let mut rngs: Vec<Rng> = seeds.iter().map(|&x| Rng::new(x)).collect();
    s.generate(&rows, &params, &mut rngs, tokenizer, eos_ids)
}

/// Uncached reference: next-token logits [B, T, V] for right-padded full sequences (used by
/// tests to check the cache, and by scoring).
pub fn full_logits(lm: &DecoderLm, seqs: &[Vec<u32>]) -> Tensor {
    let batch = crate::score::PackedBatch::new(seqs, lm.device());
    let h = tch::no_grad(|| lm.forward_hidden(&batch.ids, &batch.positions, &batch.mask, None, Mode::EVAL));
    lm.logits(&h).to_kind(Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DecoderConfig;
    use crate::sampling::SamplingParams;
    use crate::{LoadOptions, Policy};

    fn tiny_policy() -> Policy {
        tiny_of("qwen3")
    }

    /// `qwen3` has q/k norms, which the one-pass decode kernel does not take; `llama` runs it.
    fn tiny_of(model_type: &str) -> Policy {
        let v = serde_json::json!({"model_type": model_type, "vocab_size": 61, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": true});
        let cfg = DecoderConfig::from_value(std::path::Path::new("tiny/config.json"), v).unwrap();
        Policy::random(&cfg, &LoadOptions::default(), 3)
    }

    /// Sampled rows that share a prompt share their decode steps until their tokens differ:
    /// each row's tokens and log-probs are those it gets generated alone with its generator,
    /// through the one-pass decode kernel (llama) and the row-by-row attention (qwen3).
    #[test]
    fn sampled_rows_share_decode_steps_until_they_differ() {
        for model_type in ["llama", "qwen3"] {
            let p = tiny_of(model_type);
            let (a, b) = (vec![3u32, 4, 5, 6], vec![7u32, 8]);
            let prompts = vec![a.clone(), a.clone(), b.clone(), a.clone(), b.clone(), a.clone()];
            let params = SamplingParams { temperature: 0.05, ..SamplingParams::greedy(10) }; // near-flat random logits: diverge partway
            let mut s = DecodeSession::new(&p.lm, prompts.len(), 0);
            s.append(&prompts).unwrap();
            let prompt_copies = s.stats.rows_shared;
            let all: Vec<usize> = (0..prompts.len()).collect();
            let mut rngs: Vec<Rng> = (0..prompts.len() as u64).map(Rng::new).collect();
            let got = s.generate(&all, &vec![params.clone(); prompts.len()], &mut rngs, None, &[]).unwrap();
            let decode_copies = s.stats.rows_shared - prompt_copies;
            assert!(decode_copies > 0, "{model_type}: no decode step was shared");
            let distinct: std::collections::HashSet<&Vec<u32>> = got.iter().map(|g| &g.tokens).collect();
            assert!(distinct.len() > 2, "{model_type}: the samples never diverged, so the test shows little");
            for (r, prompt) in prompts.iter().enumerate() {
                let alone = generate(&p.lm, None, std::slice::from_ref(prompt), &params, &[r as u64], &[], 0).unwrap();
                assert_eq!(got[r].tokens, alone[0].tokens, "{model_type} row {r}");
                for (x, y) in got[r].logprobs.iter().zip(&alone[0].logprobs) {
                    assert!((x - y).abs() < 1e-4, "{model_type} row {r}: {x} vs {y}");
                }
            }
        }
    }

    /// Rows that repeat an earlier row (same prompt; then the same turn and the same
    /// observation) are copied rather than computed, and go on exactly as if computed: each
    /// generates what it generates alone from its concatenated history.
    #[test]
    fn repeated_rows_are_copied_and_continue_as_computed() {
        let p = tiny_policy();
        let (a, b) = (vec![3u32, 4, 5, 6], vec![7u32, 8]);
        let prompts = vec![a.clone(), b.clone(), a.clone(), a.clone(), b.clone()];
        let mut s = DecodeSession::new(&p.lm, 5, 0);
        s.append(&prompts).unwrap();
        assert_eq!((s.stats.rows_shared, s.stats.tokens_shared), (3, 10), "rows 2, 3 copy row 0; row 4 copies row 1");
        let all: Vec<usize> = (0..5).collect();
        let mut rngs = vec![Rng::new(0); 5];
        let first = s.generate(&all, &vec![SamplingParams::greedy(3); 5], &mut rngs, None, &[]).unwrap();
        assert_eq!(first[0].tokens, first[2].tokens);
        // Greedy, the copies sample what their sources do: each of the two decode feeds (the
        // third token stays pending) copies rows 2, 3 (row 0's) and 4 (row 1's).
        assert_eq!((s.stats.rows_shared, s.stats.tokens_shared), (3 + 6, 10 + 6), "decode feeds share too");
        // Rows 0 and 2 take the same observation (row 2 is copied), row 3 another one; rows 1
        // and 4 the same one (row 4 is copied).
        let obs = vec![vec![40u32, 41, 42], vec![50, 51], vec![40, 41, 42], vec![43, 44], vec![50, 51]];
        s.append(&obs).unwrap();
        assert_eq!(
            (s.stats.rows_shared, s.stats.tokens_shared),
            (9 + 2, 16 + 4 + 3),
            "the copied tokens include the pending one"
        );
        let second = s.generate(&all, &vec![SamplingParams::greedy(4); 5], &mut rngs, None, &[]).unwrap();
        for r in 0..5 {
            let history = [prompts[r].clone(), first[r].tokens.clone(), obs[r].clone()].concat();
            let alone = generate(&p.lm, None, &[history], &SamplingParams::greedy(4), &[0], &[], 0).unwrap();
            assert_eq!(second[r].tokens, alone[0].tokens, "row {r}");
            for (x, y) in second[r].logprobs.iter().zip(&alone[0].logprobs) {
                assert!((x - y).abs() < 1e-4, "row {r}: {x} vs {y}");
            }
        }
    }

    /// The cache's buffers start as NaN in unit tests (`llama::buffer`): a session whose rows
    /// finish at different lengths, leave the computed batch, and resume after ragged
    /// observations while others stay out must never read a slot it did not write. Every row
    /// generates what it generates alone from its concatenated history.
    #[test]
    fn no_cache_slot_is_read_before_it_is_written() {
        let p = tiny_policy();
        let batch: Vec<Vec<u32>> = (0..6u32).map(|r| (1..4 + r % 3).map(|t| t + 5 * r).collect()).collect();
        let mut s = DecodeSession::new(&p.lm, 6, 0);
        s.append(&batch).unwrap();
        let lens = [2usize, 9, 3, 7, 1, 5];
        let params: Vec<SamplingParams> = lens.iter().map(|&n| SamplingParams::greedy(n)).collect();
        let mut rngs = vec![Rng::new(0); 6];
        let first = s.generate(&(0..6).collect::<Vec<_>>(), &params, &mut rngs, None, &[]).unwrap();
        // Ragged observations for rows 4, 1 and 3 (packed feed); rows 0, 2, 5 take none.
        let mut obs = vec![vec![]; 6];
        obs[4] = vec![40, 41, 42, 43, 44, 45, 46];
        obs[1] = vec![50];
        obs[3] = vec![51, 52, 53];
        s.append(&obs).unwrap();
        let searching = [4usize, 1, 3];
        let second = s.generate(&searching, &vec![SamplingParams::greedy(4); 3], &mut rngs[..3], None, &[]).unwrap();
        for (k, &r) in searching.iter().enumerate() {
            let history = [batch[r].clone(), first[r].tokens.clone(), obs[r].clone()].concat();
            let alone = generate(&p.lm, None, &[history], &SamplingParams::greedy(4), &[0], &[], 0).unwrap();
            assert_eq!(second[k].tokens, alone[0].tokens, "row {r}");
            for (a, b) in second[k].logprobs.iter().zip(&alone[0].logprobs) {
                assert!((a - b).abs() < 1e-4, "row {r}: {a} vs {b}");
            }
        }
        // A row left out of both passes above resumes too.
        s.append(&[vec![], vec![], vec![57, 58], vec![], vec![], vec![]]).unwrap();
        let third = s.generate(&[2], &[SamplingParams::greedy(3)], &mut rngs[..1], None, &[]).unwrap();
        let history = [batch[2].clone(), first[2].tokens.clone(), vec![57, 58]].concat();
        let alone = generate(&p.lm, None, &[history], &SamplingParams::greedy(3), &[0], &[], 0).unwrap();
        assert_eq!(third[0].tokens, alone[0].tokens);
        assert!(third[0].logprobs.iter().all(|x| x.is_finite()));
    }

    /// The roofline's bytes of a session (`crate::flops`): each forward reads every block weight
    /// and the K/V of the keys its rows see, the LM head its matrix; a packed prefill's padding
    /// queries and a row's holes add nothing.
    #[test]
    fn a_forward_reads_its_weights_and_the_keys_its_rows_see() {
        let p = tiny_of("llama");
        crate::flops::set_machine_balance(1e12); // every call memory-bound: the bytes are counted
        let s0 = crate::flops::snapshot();
        let mut s = DecodeSession::new(&p.lm, 2, 0);
        s.append(&[vec![3u32, 4, 5, 6], vec![7, 8]]).unwrap(); // a packed prefill: 4 + 2 keys
        let mut rngs = vec![Rng::new(0); 2];
        s.generate(&[0, 1], &[SamplingParams::greedy(2), SamplingParams::greedy(2)], &mut rngs, None, &[]).unwrap(); // one feed: 5 + 3 keys
        crate::flops::set_machine_balance(0.0);
        let d = crate::flops::snapshot() - s0;
        // Per layer (f32): q, k, v, o, gate, up, down = 32·64 + 2·32·32 + 64·32 + 3·32·64 = 12,288
        // weights; K and V of a key: 2 · 2 heads · 16 · 4 bytes = 256 bytes. LM head: 61 · 32.
        let (blocks, key, head) = (2.0 * 12_288.0 * 4.0, 2.0 * 256.0, 61.0 * 32.0 * 4.0);
        let want = (blocks + 6.0 * key + head) + (blocks + 8.0 * key + head);
        assert_eq!(d.memory_bound_bytes, want);
        assert_eq!(d.compute_bound_flops, 0.0);
    }
}
