//! Real-data suites from data/real (samples shipped with the repository; provenance and licences in data/real/README.md) (any HF model directory can be evaluated on them):
//! - ConFiQA (SABER sample): each question with its supporting and its counterfactual context;
//!   scored as "correct" (the true answer) and "follows context" (the answer the context states);
//! - FlashRAG-format QA (Bamboogle, NQ sample): `{"id","question","golden_answers"}`, query-only.
use crate::Count;
use knowrl_rl::reward::{exact_match, sub_exact_match};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One SABER-format row (only the fields used).
#[derive(Debug, Clone, Deserialize)]
pub struct ConflictRow {
    pub qid: String,
    pub dataset: String,
    pub question: String,
    pub ground_truth: Vec<String>,
    pub ck_text: String,
    pub ck_target_answer: String,
    /// "supportive" | "conflicting".
    pub ck_relation: String,
    #[serde(default)]
    pub metadata: serde_json::Value,
}

impl ConflictRow {
    /// Accepted spellings of what the context states (the counterfactual answer's aliases too).
    pub fn context_answers(&self) -> Vec<String> {
        let mut v = vec![self.ck_target_answer.clone()];
        if self.ck_relation == "conflicting" {
            if let Some(a) = self.metadata["cf_answer_aliases"].as_array() {
                v.extend(a.iter().filter_map(|x| x.as_str().map(str::to_string)));
            }
        } else {
            v.extend(self.ground_truth.iter().cloned());
        }
        v
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct FlashRagRow {
    pub id: String,
    pub question: String,
    pub golden_answers: Vec<String>,
}

/// Per dataset and relation: correct (EM and sub-EM vs the true answer) and follows-context.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ConflictReport {
    pub correct_em: BTreeMap<String, Count>,
    pub correct_sub_em: BTreeMap<String, Count>,
    pub follows_context_sub_em: BTreeMap<String, Count>,
    /// Responses containing an `<answer>` tag (small models often ignore the format).
    pub answered: Count,
}

/// Scores one prediction per row; `raw` is the whole response, used when there is no `<answer>`.
pub fn score_conflict(rows: &[ConflictRow], answers: &[Option<String>], raw: &[String]) -> ConflictReport {
    let mut r = ConflictReport::default();
    for ((row, a), text) in rows.iter().zip(answers).zip(raw) {
        r.answered.add(a.is_some());
        let pred = a.clone().unwrap_or_else(|| text.clone());
        let key = format!("{}/{}", row.dataset, row.ck_relation);
        r.correct_em.entry(key.clone()).or_default().add(exact_match(&pred, &row.ground_truth));
        r.correct_sub_em.entry(key.clone()).or_default().add(sub_exact_match(&pred, &row.ground_truth));
        r.follows_context_sub_em.entry(key).or_default().add(sub_exact_match(&pred, &row.context_answers()));
    }
    r
}

pub fn load<T: serde::de::DeserializeOwned>(p: &Path) -> Result<Vec<T>, String> {
    crate::data::load_jsonl(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_scoring_separates_correct_from_following_the_context() {
        let row = |rel: &str, target: &str| ConflictRow {
            qid: "q".into(),
            dataset: "confiqa-qa".into(),
            question: "Who composed it?".into(),
            ground_truth: vec!["Lorne Balfe".into()],
            ck_text: String::new(),
            ck_target_answer: target.into(),
            ck_relation: rel.into(),
            metadata: serde_json::json!({"cf_answer_aliases": ["Petri Rainer Mikael Alanko"]}),
        };
        let rows =
            [row("supportive", "Lorne Balfe"), row("conflicting", "Petri Alanko"), row("conflicting", "Petri Alanko")];
        let answers = [Some("Lorne Balfe".to_string()), Some("Petri Rainer Mikael Alanko".to_string()), None];
        let raw = ["".to_string(), "".to_string(), "I think it was Lorne Balfe.".to_string()];
        let r = score_conflict(&rows, &answers, &raw);
        assert_eq!(r.correct_em["confiqa-qa/supportive"].rate(), 1.0);
        assert_eq!(r.follows_context_sub_em["confiqa-qa/supportive"].rate(), 1.0);
        // Conflicting: one followed the counterfactual (alias), one answered correctly without tags.
        assert_eq!(r.follows_context_sub_em["confiqa-qa/conflicting"], Count { correct: 1, n: 2 });
        assert_eq!(r.correct_sub_em["confiqa-qa/conflicting"], Count { correct: 1, n: 2 });
        assert_eq!(r.correct_em["confiqa-qa/conflicting"], Count { correct: 0, n: 2 });
        assert_eq!(r.answered, Count { correct: 2, n: 3 });
    }
}
