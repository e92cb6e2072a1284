//! Where a search agent's trajectory on a world question first goes wrong. The world knows each
//! hop's subject and its passage (`e{subject}`), so a wrong answer can be traced to the first
//! hop whose subject no search named, the first hop whose passage no search retrieved, or, with
//! every needed passage retrieved, to reading: an answer copied from another passage or one
//! named nowhere in the results (recalled, or made up).
use crate::questions::Question;
use crate::world::World;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Right,
    NoSearch,
    /// No search named this hop's subject (0 = the question's entity, ≥ 1 = a bridge).
    NotSearched(usize),
    /// This hop's subject was searched, but its passage is in no result.
    NotRetrieved(usize),
    /// Every needed passage was retrieved; the answer is stated in the results, elsewhere.
    AnswerFromOtherPassage,
    /// Every needed passage was retrieved; the answer appears nowhere in the results.
    AnswerNotInResults,
}

impl Outcome {
    /// A stable key for reports (`hop2_not_searched`: hops counted from 1).
    pub fn key(self) -> String {
        match self {
            Outcome::Right => "right".into(),
            Outcome::NoSearch => "no_search".into(),
            Outcome::NotSearched(h) => format!("hop{}_not_searched", h + 1),
            Outcome::NotRetrieved(h) => format!("hop{}_not_retrieved", h + 1),
            Outcome::AnswerFromOtherPassage => "answer_from_other_passage".into(),
            Outcome::AnswerNotInResults => "answer_not_in_results".into(),
        }
    }
}

/// Classifies one trajectory: `queries` and `retrieved_ids` per search, `results` the text of its
/// `<information>` blocks, `right` whether its answer matched. A right answer is `Right` even
/// without searching (parametric knowledge); names match case-insensitively, aliases included.
pub fn outcome(
    w: &World,
    q: &Question,
    queries: &[String],
    retrieved_ids: &[Vec<String>],
    results: &str,
    answer: Option<&str>,
    right: bool,
) -> Outcome {
    if right {
        return Outcome::Right;
    }
    if queries.is_empty() {
        return Outcome::NoSearch;
    }
    let queries: Vec<String> = queries.iter().map(|s| s.to_lowercase()).collect();
    for (hop, &f) in q.chain.iter().enumerate() {
        let subject = w.entity(w.facts[f].subject);
        let named = std::iter::once(&subject.name).chain(&subject.aliases).map(|n| n.to_lowercase());
        let names: Vec<String> = named.collect();
        if !queries.iter().any(|x| names.iter().any(|n| x.contains(n.as_str()))) {
            return Outcome::NotSearched(hop);
        }
        let id = format!("e{}", subject.id);
        if !retrieved_ids.iter().flatten().any(|r| *r == id) {
            return Outcome::NotRetrieved(hop);
        }
    }
    match answer.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) if results.to_lowercase().contains(&a.to_lowercase()) => Outcome::AnswerFromOtherPassage,
        _ => Outcome::AnswerNotInResults,
    }
}

/// The text of a trajectory's `<information>` blocks, concatenated.
pub fn results_text(trajectory: &str) -> String {
    trajectory
        .split("<information>")
        .skip(1)
        .filter_map(|s| s.split("</information>").next())
        .collect::<Vec<_>>()
        .join("\n")
}
