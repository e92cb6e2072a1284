//! The search-agent rollout (Search-R1's loop): generate until `</search>` or `</answer>` (or
//! eos); take the first `<search>…</search>` / `<answer>…</answer>` of the turn; on a search,
//! call the retriever for *all* searching trajectories of the batch at once, append the
//! `<information>` block (masked out of the loss) and continue from the KV cache.
use knowrl_engine::generate::{DecodeSession, Finish, Generation};
use knowrl_engine::models::llama::DecoderLm;
use knowrl_engine::{Rng, SamplingParams, Tokenizer};
use knowrl_retrieval::format::{information_block, PassageStyle};
use knowrl_retrieval::Retriever;

/// Search-R1's observation for a turn with neither a search nor an answer.
pub const INVALID_ACTION: &str = "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n";

/// Search-R1's `max_obs_length` (its v0.2 scripts).
pub const SEARCH_R1_MAX_OBS_TOKENS: usize = 500;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub max_turns: usize,
    pub topk: usize,
    /// An observation (the `<information>` block) is cut to its first this many tokens
    /// (Search-R1's `max_obs_length`).
    pub max_obs_tokens: usize,
    pub sampling: SamplingParams,
    pub style: PassageStyle,
    /// Rows decoded together (0 = all).
    pub max_rows: usize,
}

impl AgentConfig {
    pub fn new(max_turns: usize, topk: usize, max_tokens_per_turn: usize, temperature: f64) -> AgentConfig {
        AgentConfig {
            max_turns,
            topk,
            max_obs_tokens: SEARCH_R1_MAX_OBS_TOKENS,
            sampling: SamplingParams {
                temperature,
                max_new_tokens: max_tokens_per_turn,
                stop: vec!["</search>".into(), "</answer>".into()],
                ..Default::default()
            },
            style: PassageStyle::SearchR1,
            max_rows: 0,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trajectory {
    pub response: Vec<u32>,
    /// true for policy-generated tokens, false for observations.
    pub loss_mask: Vec<bool>,
    /// Sampling log-probs (0 for observation tokens).
    pub logprobs: Vec<f32>,
    pub queries: Vec<String>,
    pub retrieved_ids: Vec<Vec<String>>,
    /// Where each search's `<information>` block starts in `response` (so the history h_t
    /// before retrieval turn t is `prompt + response[..observation_starts[t]]`).
    pub observation_starts: Vec<usize>,
    pub invalid_actions: usize,
    /// The decoded response (observations included).
    pub text: String,
    pub answer: Option<String>,
}

impl Trajectory {
    pub fn tool_calls(&self) -> usize {
        self.queries.len()
    }

    /// Whether the answer matches one of `golds` (exact match after normalisation; no answer is
    /// wrong). Every place that scores a trajectory's correctness asks this.
    pub fn is_correct(&self, golds: &[String]) -> bool {
        crate::reward::exact_match(self.answer.as_deref().unwrap_or(""), golds)
    }
}

pub enum Action {
    Search(String),
    Answer(String),
    Invalid,
}

/// Search-R1's rule: the first `<search>…</search>` or `<answer>…</answer>` of the turn.
pub fn parse_action(turn: &str) -> Action {
    let find = |tag: &str| {
        let (o, c) = (format!("<{tag}>"), format!("</{tag}>"));
        let s = turn.find(&o)?;
        let e = turn[s + o.len()..].find(&c)?;
        Some((s, turn[s + o.len()..s + o.len() + e].trim().to_string()))
    };
    match (find("search"), find("answer")) {
        (Some((i, q)), Some((j, a))) => {
            if i < j {
                Action::Search(q)
            } else {
                Action::Answer(a)
            }
        }
        (Some((_, q)), None) => Action::Search(q),
        (None, Some((_, a))) => Action::Answer(a),
        (None, None) => Action::Invalid,
    }
}

/// What the loop needs from a policy: generate one turn for some rows, then take appended
/// tokens. `DecodeSession` is the real one; tests script it.
pub trait TurnPolicy {
    fn generate(
        &mut self,
        rows: &[usize],
        params: &[SamplingParams],
        rngs: &mut [Rng],
        tok: Option<&Tokenizer>,
        eos: &[u32],
    ) -> knowrl_engine::Result<Vec<Generation>>;
    fn append(&mut self, blocks: &[Vec<u32>]) -> knowrl_engine::Result<()>;
}

impl TurnPolicy for DecodeSession<'_> {
    fn generate(
        &mut self,
        rows: &[usize],
        params: &[SamplingParams],
        rngs: &mut [Rng],
        tok: Option<&Tokenizer>,
        eos: &[u32],
    ) -> knowrl_engine::Result<Vec<Generation>> {
        DecodeSession::generate(self, rows, params, rngs, tok, eos)
    }
    fn append(&mut self, blocks: &[Vec<u32>]) -> knowrl_engine::Result<()> {
        DecodeSession::append(self, blocks)
    }
}

/// Runs the agent for a batch of prompts (token ids); one generator per row.
pub fn rollout(
    lm: &DecoderLm,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    retriever: &dyn Retriever,
    cfg: &AgentConfig,
    rngs: &mut [Rng],
) -> knowrl_engine::Result<Vec<Trajectory>> {
    let chunk = if cfg.max_rows == 0 { prompts.len().max(1) } else { cfg.max_rows };
    let mut out = Vec::with_capacity(prompts.len());
    for (p, r) in prompts.chunks(chunk).zip(rngs.chunks_mut(chunk)) {
        let mut session = DecodeSession::new(lm, p.len(), tok.pad_id);
        session.append(p)?;
        out.extend(run(&mut session, p.len(), tok, retriever, cfg, r)?);
    }
    Ok(out)
}

/// The loop over turns for `n` rows whose prompts the policy already holds.
pub fn run(
    session: &mut dyn TurnPolicy,
    n: usize,
    tok: &Tokenizer,
    retriever: &dyn Retriever,
    cfg: &AgentConfig,
    rngs: &mut [Rng],
) -> knowrl_engine::Result<Vec<Trajectory>> {
    let mut out = vec![Trajectory::default(); n];
    let mut active: Vec<usize> = (0..n).collect();
    for turn in 0..cfg.max_turns {
        if active.is_empty() {
            break;
        }
        let params = vec![cfg.sampling.clone(); active.len()];
        let mut sub: Vec<Rng> = active.iter().map(|&i| rngs[i].clone()).collect();
        let gens = session.generate(&active, &params, &mut sub, Some(tok), &tok.eos_ids)?;
        for (k, &i) in active.iter().enumerate() {
            rngs[i] = sub[k].clone();
        }
        let mut searches: Vec<(usize, String)> = vec![];
        let mut blocks = vec![vec![]; n];
        let mut still = vec![];
        for (g, &i) in gens.iter().zip(&active) {
            let t = &mut out[i];
            t.response.extend(&g.tokens);
            t.loss_mask.extend(std::iter::repeat_n(true, g.tokens.len()));
            t.logprobs.extend(&g.logprobs);
            let text = tok.decode(&g.tokens, true)?;
            t.text.push_str(&text);
            match parse_action(&text) {
                Action::Answer(a) => t.answer = Some(a),
                _ if g.finish == Finish::Eos => {}
                Action::Search(q) if turn + 1 < cfg.max_turns => {
                    searches.push((i, q));
                    still.push(i);
                }
                Action::Search(_) => {}
                Action::Invalid if turn + 1 < cfg.max_turns => {
                    t.invalid_actions += 1;
                    blocks[i] = tok.encode(INVALID_ACTION, false)?;
                    still.push(i);
                }
                Action::Invalid => t.invalid_actions += 1,
            }
        }
        if !searches.is_empty() {
            // AKBE's tool deletes double quotes from the query before searching.
            let clean = |q: &String| if cfg.style == PassageStyle::Akbe { q.replace('"', "") } else { q.clone() };
            let queries: Vec<String> = searches.iter().map(|(_, q)| clean(q)).collect();
            let results =
                retriever.search(&queries, cfg.topk).map_err(|e| knowrl_engine::EngineError::Invalid(e.to_string()))?;
            for ((i, q), hits) in searches.into_iter().zip(results) {
                let obs = information_block(&hits, cfg.style);
                let mut ids = tok.encode(&obs, false)?;
                ids.truncate(cfg.max_obs_tokens);
                out[i].queries.push(q);
                let start = out[i].response.len();
                out[i].observation_starts.push(start);
                out[i].retrieved_ids.push(hits.iter().map(|h| h.id.clone()).collect());
                blocks[i] = ids;
            }
        }
        for &i in &still {
            let t = &mut out[i];
            t.text.push_str(&tok.decode(&blocks[i], true)?);
            t.response.extend(&blocks[i]);
            t.loss_mask.extend(std::iter::repeat_n(false, blocks[i].len()));
            t.logprobs.extend(std::iter::repeat_n(0.0, blocks[i].len()));
        }
        session.append(&blocks)?;
        active = still;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_action_of_a_turn_wins() {
        assert!(
            matches!(parse_action("<think>x</think><search> Ada birthplace </search>"), Action::Search(q) if q == "Ada birthplace")
        );
        assert!(matches!(parse_action("<answer> London </answer>"), Action::Answer(a) if a == "London"));
        // Both present: whichever comes first (Search-R1's regex takes the first match).
        assert!(matches!(parse_action("<answer>a</answer><search>q</search>"), Action::Answer(a) if a == "a"));
        assert!(matches!(parse_action("<search>q</search><answer>a</answer>"), Action::Search(q) if q == "q"));
        // Unclosed or missing tags are invalid actions.
        assert!(matches!(parse_action("<search> never closed"), Action::Invalid));
        assert!(matches!(parse_action("I think the answer is London."), Action::Invalid));
        assert!(INVALID_ACTION.contains("<search> and </search>"));
    }
}
