//! Evaluation of a policy, greedy decoding throughout:
//! - `scenarios`: Knowledgeable-R1's context-reliability suites S1–S5 and S2p (EM against the true
//!   answer, overall and on the PK-answerable subset), how often the answer follows the context,
//!   and Table 4's TITE / TIFE / FITE / FIFE breakdown;
//! - `agent`: the search agent's EM per hop count, tool calls per question (TC), tool
//!   productivity (TP = EM in points / TC, as AKBE defines it) and, on the world, the oracle
//!   knowledge-boundary accuracy (searched iff a hop is missing from PK) with over/under-search.
pub mod data;
pub mod endpoint;
pub mod plot;
pub mod real;

use knowrl_engine::generate::generate;
use knowrl_engine::{Policy, Rng, SamplingParams};
use knowrl_retrieval::Retriever;
use knowrl_rl::agent::{rollout, AgentConfig, Trajectory};
use knowrl_rl::reward::{exact_match, extract_answer};
use knowrl_rl::task::Prompt;
use knowrl_world::questions::Question;
use knowrl_world::suites::ScenarioItem;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub type Result<T> = knowrl_engine::Result<T>;

/// Greedy single-turn responses (decoded, stopped after `</answer>`), batched.
pub fn greedy_responses(policy: &Policy, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>> {
    let tok = policy.tokenizer()?;
    let mut out = vec![];
    for chunk in prompts.chunks(32) {
        let ids: Vec<Vec<u32>> = chunk.iter().map(|p| p.ids(tok)).collect::<Result<_>>()?;
        let params = SamplingParams { stop: vec!["</answer>".into()], ..SamplingParams::greedy(max_new) };
        let gens = generate(&policy.lm, Some(tok), &ids, &params, &vec![0; ids.len()], &tok.eos_ids, tok.pad_id)?;
        for g in gens {
            out.push(tok.decode(&g.tokens, true)?);
        }
    }
    Ok(out)
}

/// What answers single-turn prompts greedily: a local policy or a served model.
pub trait Responder {
    fn responses(&self, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>>;
}

impl Responder for Policy {
    fn responses(&self, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>> {
        greedy_responses(self, prompts, max_new)
    }
}

impl Responder for endpoint::ChatEndpoint {
    fn responses(&self, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>> {
        endpoint::ChatEndpoint::responses(self, prompts, max_new).map_err(knowrl_engine::EngineError::Invalid)
    }
}

/// Greedy single-turn answers (the last `<answer>` of each response; "" when none).
pub fn greedy_answers(policy: &dyn Responder, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>> {
    Ok(policy.responses(prompts, max_new)?.iter().map(|r| extract_answer(r).unwrap_or_default()).collect())
}

/// EM over a subset: (correct, n); `rate` is NaN for an empty subset.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Count {
    pub correct: usize,
    pub n: usize,
}

impl Count {
    pub fn add(&mut self, ok: bool) {
        self.correct += ok as usize;
        self.n += 1;
    }
    pub fn rate(&self) -> f64 {
        if self.n == 0 {
            f64::NAN
        } else {
            self.correct as f64 / self.n as f64
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScenarioReport {
    /// Keyed "S2-mr" etc.: EM against the true answer.
    pub em: BTreeMap<String, Count>,
    /// The same on PK-answerable questions.
    pub pk_em: BTreeMap<String, Count>,
    /// Per scenario (S1..S5, S2p), all variants together.
    pub overall: BTreeMap<String, Count>,
    /// Answers equal to what the context states (where it states one).
    pub follows_context: BTreeMap<String, Count>,
    /// Table 4: TITE / TIFE / FITE / FIFE (parametric = PK-answerable by the oracle,
    /// contextual = the context states the true answer).
    pub knowledge: BTreeMap<String, Count>,
    /// Memory against the context, per scenario: over items whose context states an answer
    /// and whose query-only answer (same policy, same question, no context) is another
    /// non-empty one, how often the answer is that query-only one. On S1 it is wrong memory
    /// overriding a correct context; on S2, memory resisting a counterfactual one. Empty
    /// unless the evaluation also asked the questions alone (`scenarios_vs_memory`).
    #[serde(default)]
    pub follows_memory: BTreeMap<String, Count>,
}

/// Parametric × contextual correctness class of an item (Knowledgeable-R1 Table 4).
pub fn knowledge_class(item: &ScenarioItem) -> &'static str {
    let ctx_true = item.context_answer.as_deref().is_some_and(|a| exact_match(a, &item.golden_answers));
    match (item.pk_answerable, ctx_true) {
        (true, true) => "TITE",
        (true, false) => "TIFE",
        (false, true) => "FITE",
        (false, false) => "FIFE",
    }
}

/// Scores `answers` (one per item) on the scenario suites.
pub fn score_scenarios(items: &[&ScenarioItem], answers: &[String]) -> ScenarioReport {
    let mut r = ScenarioReport::default();
    for (s, a) in items.iter().zip(answers) {
        let ok = exact_match(a, &s.golden_answers);
        let key = format!("{}-{}", s.scenario, s.variant);
        r.em.entry(key.clone()).or_default().add(ok);
        r.overall.entry(s.scenario.clone()).or_default().add(ok);
        if s.pk_answerable {
            r.pk_em.entry(key.clone()).or_default().add(ok);
        }
        if let Some(c) = &s.context_answer {
            r.follows_context.entry(s.scenario.clone()).or_default().add(exact_match(a, std::slice::from_ref(c)));
        }
        // Table 4 is over the paper's scenarios; S2p would count S2's questions twice.
        if knowrl_world::suites::PAPER_SCENARIOS.contains(&s.scenario.as_str()) {
            r.knowledge.entry(knowledge_class(s).into()).or_default().add(ok);
        }
    }
    r
}

/// `follows_memory` from each item's answer and its question's query-only answer.
pub fn score_memory(items: &[&ScenarioItem], answers: &[String], memory: &[String]) -> BTreeMap<String, Count> {
    let mut out: BTreeMap<String, Count> = BTreeMap::new();
    for ((s, a), m) in items.iter().zip(answers).zip(memory) {
        let Some(c) = &s.context_answer else { continue };
        if m.trim().is_empty() || exact_match(m, std::slice::from_ref(c)) {
            continue;
        }
        out.entry(s.scenario.clone()).or_default().add(exact_match(a, std::slice::from_ref(m)));
    }
    out
}

/// `scenarios`, plus `follows_memory` against the same policy's answers under
/// `memory_prompt` (each distinct question asked once).
pub fn scenarios_vs_memory(
    policy: &dyn Responder,
    items: &[&ScenarioItem],
    prompt: impl Fn(&ScenarioItem) -> Prompt,
    memory_prompt: impl Fn(&ScenarioItem) -> Prompt,
) -> Result<ScenarioReport> {
    let answers = scenario_answers(policy, items, prompt)?;
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    let mut distinct: Vec<&ScenarioItem> = vec![];
    for s in items {
        first.entry(s.question_id.as_str()).or_insert_with(|| {
            distinct.push(s);
            distinct.len() - 1
        });
    }
    let asked: Vec<Prompt> = distinct.iter().map(|s| memory_prompt(s)).collect();
    let alone = greedy_answers(policy, &asked, SCENARIO_MAX_NEW)?;
    let memory: Vec<String> = items.iter().map(|s| alone[first[s.question_id.as_str()]].clone()).collect();
    let mut r = score_scenarios(items, &answers);
    r.follows_memory = score_memory(items, &answers, &memory);
    Ok(r)
}

/// New tokens of a scenario answer (one `<answer>` span; the world's answers are a few tokens).
pub const SCENARIO_MAX_NEW: usize = 24;

/// Greedy answers of `policy` under `prompt(item)` for every item, scored.
pub fn scenarios(
    policy: &dyn Responder,
    items: &[&ScenarioItem],
    prompt: impl Fn(&ScenarioItem) -> Prompt,
) -> Result<ScenarioReport> {
    Ok(score_scenarios(items, &scenario_answers(policy, items, prompt)?))
}

/// Greedy responses (raw text, before answer extraction) of `policy` under `prompt(item)`.
pub fn scenario_responses(
    policy: &dyn Responder,
    items: &[&ScenarioItem],
    prompt: impl Fn(&ScenarioItem) -> Prompt,
) -> Result<Vec<String>> {
    let prompts: Vec<Prompt> = items.iter().map(|s| prompt(s)).collect();
    policy.responses(&prompts, SCENARIO_MAX_NEW)
}

/// Greedy answers of `policy` under `prompt(item)` for every item.
fn scenario_answers(
    policy: &dyn Responder,
    items: &[&ScenarioItem],
    prompt: impl Fn(&ScenarioItem) -> Prompt,
) -> Result<Vec<String>> {
    let raw = scenario_responses(policy, items, prompt)?;
    Ok(raw.iter().map(|r| extract_answer(r).unwrap_or_default()).collect())
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentReport {
    pub n: usize,
    pub em: f64,
    /// EM per hop count ("1", "2", "3").
    pub em_by_hops: BTreeMap<String, f64>,
    /// Tool calls per question.
    pub tc: f64,
    /// Tool productivity: EM (points) / TC (AKBE); NaN when no tool call was made.
    pub tp: f64,
    /// Searched iff some hop is missing from PK (world oracle).
    pub boundary_accuracy: f64,
    pub over_search_rate: f64,
    pub under_search_rate: f64,
    /// Fraction of PK-answerable questions on which the agent searched.
    pub pk_search_rate: f64,
}

/// AKBE's TP: EM in points per tool call; NaN when no tool call was made.
pub fn tool_productivity(em: f64, tc: f64) -> f64 {
    if tc > 0.0 {
        100.0 * em / tc
    } else {
        f64::NAN
    }
}

/// One agent outcome: (correct, tool calls) for a question.
pub fn score_agent(questions: &[&Question], outcomes: &[(bool, usize)]) -> AgentReport {
    let n = questions.len().max(1) as f64;
    let em = outcomes.iter().filter(|o| o.0).count() as f64 / n;
    let tc = outcomes.iter().map(|o| o.1).sum::<usize>() as f64 / n;
    let mut by: BTreeMap<String, Count> = BTreeMap::new();
    for (q, o) in questions.iter().zip(outcomes) {
        by.entry(q.hops.to_string()).or_default().add(o.0);
    }
    let frac = |f: &dyn Fn(&Question, usize) -> bool| {
        questions.iter().zip(outcomes).filter(|(q, o)| f(q, o.1)).count() as f64 / n
    };
    let pk: Vec<usize> = (0..questions.len()).filter(|&i| questions[i].pk_answerable).collect();
    AgentReport {
        n: questions.len(),
        em,
        em_by_hops: by.into_iter().map(|(k, c)| (k, c.rate())).collect(),
        tc,
        tp: tool_productivity(em, tc),
        boundary_accuracy: frac(&|q, c| (c > 0) == (q.min_searches > 0)),
        over_search_rate: frac(&|q, c| c > q.min_searches),
        under_search_rate: frac(&|q, c| c < q.min_searches),
        pk_search_rate: pk.iter().filter(|&&i| outcomes[i].1 > 0).count() as f64 / pk.len().max(1) as f64,
    }
}

/// The search agent's greedy trajectories on `questions` (prompt per question), batched.
pub fn agent_trajectories(
    policy: &Policy,
    retriever: &dyn Retriever,
    questions: &[&Question],
    prompt: impl Fn(&Question) -> Prompt,
    cfg: &AgentConfig,
) -> Result<Vec<Trajectory>> {
    let prompts: Vec<Prompt> = questions.iter().map(|q| prompt(q)).collect();
    prompt_trajectories(policy, retriever, &prompts, cfg)
}

/// The search agent's trajectories from any prompts, 64 at a time (row i seeded with i).
pub fn prompt_trajectories(
    policy: &Policy,
    retriever: &dyn Retriever,
    prompts: &[Prompt],
    cfg: &AgentConfig,
) -> Result<Vec<Trajectory>> {
    let tok = policy.tokenizer()?;
    let mut out = vec![];
    for chunk in prompts.chunks(64) {
        let ids: Vec<Vec<u32>> = chunk.iter().map(|p| p.ids(tok)).collect::<Result<_>>()?;
        let mut rngs: Vec<Rng> = (0..ids.len()).map(|i| Rng::new(i as u64)).collect();
        out.extend(rollout(&policy.lm, tok, &ids, retriever, cfg, &mut rngs)?);
    }
    Ok(out)
}

/// A real-data agent suite's figures (no oracle boundary: real questions do not have one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpenAgentReport {
    pub n: usize,
    pub em: f64,
    pub f1: f64,
    pub sub_em: f64,
    /// Tool calls per question.
    pub tc: f64,
    /// EM points per tool call (AKBE); NaN without tool calls.
    pub tp: f64,
    /// Share of questions with an `<answer>`.
    pub answered: f64,
    /// Recall of the supporting passages among everything retrieved for the agent's queries.
    pub support_recall: f64,
}

/// Scores trajectories against gold answers and supporting passage ids.
pub fn score_open_agent(golds: &[Vec<String>], support: &[Vec<String>], trajs: &[Trajectory]) -> OpenAgentReport {
    use knowrl_rl::reward::{f1, sub_exact_match};
    let n = golds.len().max(1) as f64;
    let ans = |t: &Trajectory| t.answer.clone().unwrap_or_default();
    let mean =
        |f: &dyn Fn(&Vec<String>, &Trajectory) -> f64| golds.iter().zip(trajs).map(|(g, t)| f(g, t)).sum::<f64>() / n;
    let em = mean(&|g, t| exact_match(&ans(t), g) as u8 as f64);
    let tc = mean(&|_, t| t.tool_calls() as f64);
    OpenAgentReport {
        n: golds.len(),
        em,
        f1: mean(&|g, t| f1(&ans(t), g)),
        sub_em: mean(&|g, t| sub_exact_match(&ans(t), g) as u8 as f64),
        tc,
        tp: tool_productivity(em, tc),
        answered: mean(&|_, t| t.answer.is_some() as u8 as f64),
        support_recall: issued_query_recall(support, trajs),
    }
}

/// Scores trajectories (one per question) as the agent suite does.
pub fn score_trajectories(questions: &[&Question], trajs: &[Trajectory]) -> AgentReport {
    let outcomes: Vec<(bool, usize)> =
        questions.iter().zip(trajs).map(|(q, t)| (t.is_correct(&q.golden_answers), t.tool_calls())).collect();
    score_agent(questions, &outcomes)
}

/// Runs the search agent greedily on `questions` and scores it.
pub fn agent(
    policy: &Policy,
    retriever: &dyn Retriever,
    questions: &[&Question],
    prompt: impl Fn(&Question) -> Prompt,
    cfg: &AgentConfig,
) -> Result<AgentReport> {
    Ok(score_trajectories(questions, &agent_trajectories(policy, retriever, questions, prompt, cfg)?))
}

/// Recall of the needed passages among everything the agent retrieved for its own queries:
/// per question, |gold ∩ ⋃_t top-m(q_t)| / |gold|, averaged (BRIDGE's "recall@m of the gold
/// passages for the queries the policy actually issues").
pub fn issued_query_recall(gold: &[Vec<String>], trajs: &[Trajectory]) -> f64 {
    let n = gold.len().max(1) as f64;
    gold.iter()
        .zip(trajs)
        .map(|(g, t)| {
            let seen: std::collections::HashSet<&String> = t.retrieved_ids.iter().flatten().collect();
            g.iter().filter(|id| seen.contains(id)).count() as f64 / g.len().max(1) as f64
        })
        .sum::<f64>()
        / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use knowrl_world::questions::Split;

    fn q(hops: usize, pk: bool, min_searches: usize) -> Question {
        Question {
            id: "q".into(),
            question: "?".into(),
            answer: "a".into(),
            golden_answers: vec!["a".into()],
            chain: vec![0; hops],
            hops,
            pk_answerable: pk,
            missing_hops: vec![],
            min_searches,
            split: Split::Test,
        }
    }

    #[test]
    fn issued_query_recall_hand_computed() {
        let t = |ids: &[&[&str]]| Trajectory {
            retrieved_ids: ids.iter().map(|v| v.iter().map(|s| s.to_string()).collect()).collect(),
            ..Default::default()
        };
        let gold = vec![vec!["e1".to_string(), "e2".to_string()], vec!["e3".to_string()]];
        // Question 1 found e1 (not e2) over two searches; question 2 never searched.
        let r = issued_query_recall(&gold, &[t(&[&["e9", "e1"], &["e1", "e7"]]), t(&[])]);
        assert!((r - 0.25).abs() < 1e-12);
    }

    #[test]
    fn open_agent_metrics_hand_computed() {
        let t = |answer: Option<&str>, ids: &[&[&str]]| Trajectory {
            answer: answer.map(String::from),
            retrieved_ids: ids.iter().map(|v| v.iter().map(|s| s.to_string()).collect()).collect(),
            queries: ids.iter().map(|_| "q".to_string()).collect(),
            ..Default::default()
        };
        let golds = vec![vec!["Chief of Protocol".to_string()], vec!["Paris".to_string()]];
        let support = vec![vec!["p1".to_string(), "p2".to_string()], vec!["p3".to_string()]];
        // Q1: right answer after 2 searches that found p1 of {p1, p2}; Q2: "the city of Paris"
        // with no search: sub-EM only; normalised tokens {city, of, paris} vs {paris}: precision
        // 1/3, recall 1, F1 = 0.5.
        let trajs = [t(Some("chief of protocol"), &[&["p9", "p1"], &["p1"]]), t(Some("the city of Paris"), &[])];
        let r = score_open_agent(&golds, &support, &trajs);
        assert_eq!(r.em, 0.5);
        assert_eq!(r.sub_em, 1.0);
        assert_eq!(r.tc, 1.0);
        assert!((r.tp - 50.0).abs() < 1e-12);
        assert!((r.f1 - (1.0 + 0.5) / 2.0).abs() < 1e-12, "{}", r.f1);
        assert!((r.support_recall - 0.25).abs() < 1e-12);
        assert_eq!(r.answered, 1.0);
    }

    #[test]
    fn agent_metrics_hand_computed() {
        // 4 questions: PK 1-hop (needs 0 searches), non-PK 1-hop (1), 2-hop needing 1, 2-hop needing 2.
        let qs = [q(1, true, 0), q(1, false, 1), q(2, false, 1), q(2, false, 2)];
        let refs: Vec<&Question> = qs.iter().collect();
        // Outcomes: correct with 1 call (over-search), correct with 1, wrong with 0 (under), correct with 2.
        let r = score_agent(&refs, &[(true, 1), (true, 1), (false, 0), (true, 2)]);
        assert_eq!(r.em, 0.75);
        assert_eq!(r.tc, 1.0);
        assert!((r.tp - 75.0).abs() < 1e-12); // TP = 75 points / 1 call
        assert_eq!(r.em_by_hops["1"], 1.0);
        assert_eq!(r.em_by_hops["2"], 0.5);
        // Searched iff needed: q0 searched but needs none (✗), q1 ✓, q2 needs but did not (✗), q3 ✓.
        assert_eq!(r.boundary_accuracy, 0.5);
        assert_eq!(r.over_search_rate, 0.25);
        assert_eq!(r.under_search_rate, 0.25);
        assert_eq!(r.pk_search_rate, 1.0);
    }

    fn item(scenario: &str, pk: bool, context_answer: Option<&str>) -> ScenarioItem {
        ScenarioItem {
            id: "i".into(),
            question_id: "q".into(),
            scenario: scenario.into(),
            variant: "qa".into(),
            split: Split::Test,
            question: "?".into(),
            golden_answers: vec!["Paris".into()],
            context_ids: vec![],
            context: vec![],
            context_answer: context_answer.map(str::to_string),
            pk_answerable: pk,
            hops: 1,
        }
    }

    #[test]
    fn scenario_metrics_and_knowledge_classes() {
        let items = [
            item("S1", true, Some("Paris")),  // TITE
            item("S2", true, Some("Lyon")),   // TIFE
            item("S1", false, Some("Paris")), // FITE
            item("S4", false, None),          // FIFE
        ];
        let refs: Vec<&ScenarioItem> = items.iter().collect();
        let r = score_scenarios(&refs, &["Paris".into(), "Lyon".into(), "Paris".into(), "Nice".into()]);
        assert_eq!(r.knowledge["TITE"].rate(), 1.0);
        assert_eq!(r.knowledge["TIFE"].rate(), 0.0); // followed the counterfactual context
        assert_eq!(r.knowledge["FITE"].rate(), 1.0);
        assert_eq!(r.knowledge["FIFE"].rate(), 0.0);
        assert_eq!(r.overall["S1"], Count { correct: 2, n: 2 });
        assert_eq!(r.follows_context["S2"].rate(), 1.0);
        assert_eq!(r.pk_em["S2-qa"].rate(), 0.0);
        assert!(!r.pk_em.contains_key("S4-qa"));
    }

    #[test]
    fn s2p_is_scored_beside_s2_but_not_in_the_knowledge_classes() {
        let items = [item("S2", true, Some("Lyon")), item("S2p", true, Some("Lyon"))];
        let refs: Vec<&ScenarioItem> = items.iter().collect();
        // Follows the cited counterfactual, resists the plain one.
        let r = score_scenarios(&refs, &["Lyon".into(), "Paris".into()]);
        assert_eq!(r.overall["S2"], Count { correct: 0, n: 1 });
        assert_eq!(r.overall["S2p"], Count { correct: 1, n: 1 });
        assert_eq!(r.follows_context["S2p"].rate(), 0.0);
        assert_eq!(r.pk_em["S2p-qa"], Count { correct: 1, n: 1 });
        // Table 4 counts the S2 item only (S2p asks the same question again).
        assert_eq!(r.knowledge["TIFE"], Count { correct: 0, n: 1 });
    }

    #[test]
    fn memory_against_context() {
        let items = [
            item("S1", false, Some("Paris")), // memory Lyon, answered Lyon: memory overrode
            item("S1", false, Some("Paris")), // memory Lyon, answered Paris: context kept
            item("S1", true, Some("Paris")),  // memory agrees with the context: not counted
            item("S1", false, Some("Paris")), // no query-only answer: not counted
            item("S2", true, Some("Lyon")),   // memory Paris, answered paris: memory resisted
            item("S4", false, None),          // the context states nothing: not counted
        ];
        let refs: Vec<&ScenarioItem> = items.iter().collect();
        let answers: Vec<String> = ["Lyon", "Paris", "Paris", "Nice", "paris", "Nice"].map(String::from).to_vec();
        let memory: Vec<String> = ["Lyon", "Lyon", "Paris", "", "Paris", "Rome"].map(String::from).to_vec();
        let m = score_memory(&refs, &answers, &memory);
        assert_eq!(m["S1"], Count { correct: 1, n: 2 });
        assert_eq!(m["S2"], Count { correct: 1, n: 1 });
        assert!(!m.contains_key("S4"));
    }
}
