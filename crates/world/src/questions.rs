//! Questions over the world: single-hop and 2/3-hop compositions, with answers, aliases and the
//! oracle knowledge-boundary labels every method and metric relies on.
use crate::config::WorldConfig;
use crate::world::{Relation, World};
use knowrl_engine::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Valid,
    Test,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub id: String,
    pub question: String,
    pub answer: String,
    /// Every accepted answer (the answer first, then aliases).
    pub golden_answers: Vec<String>,
    /// Fact ids along the chain, first hop first.
    pub chain: Vec<usize>,
    pub hops: usize,
    /// Answerable from parametric knowledge alone: every hop's fact is in PK.
    pub pk_answerable: bool,
    /// Indices into `chain` of the hops missing from PK.
    pub missing_hops: Vec<usize>,
    /// Fewest searches that can answer it: one per hop missing from PK.
    pub min_searches: usize,
    pub split: Split,
}

/// A chain of relations and its question templates (`{}` = the first subject's name).
pub struct Template {
    pub chain: &'static [Relation],
    pub texts: &'static [&'static str],
}

use Relation::*;
pub const TEMPLATES: [Template; 14] = [
    Template {
        chain: &[BornIn],
        texts: &["Where was {} born?", "In which city was {} born?", "What is the birthplace of {}?"],
    },
    Template { chain: &[LocatedIn], texts: &["In which country is {}?", "Which country is {} located in?"] },
    Template { chain: &[Capital], texts: &["What is the capital of {}?", "Which city is the capital of {}?"] },
    Template { chain: &[FoundedBy], texts: &["Who founded {}?", "Who is the founder of {}?"] },
    Template { chain: &[HeadquarteredIn], texts: &["Where is {} headquartered?", "In which city is {} based?"] },
    Template { chain: &[MemberOf], texts: &["Which band is {} a member of?", "Which band does {} play in?"] },
    Template { chain: &[FormedIn], texts: &["In which city was {} formed?", "Where was the band {} formed?"] },
    Template {
        chain: &[BornIn, LocatedIn],
        texts: &["In which country was {} born?", "What is the country of birth of {}?"],
    },
    Template { chain: &[FoundedBy, BornIn], texts: &["Where was the founder of {} born?"] },
    Template { chain: &[HeadquarteredIn, LocatedIn], texts: &["In which country is {} headquartered?"] },
    Template { chain: &[MemberOf, FormedIn], texts: &["In which city was the band of {} formed?"] },
    Template { chain: &[FormedIn, LocatedIn], texts: &["In which country was the band {} formed?"] },
    Template { chain: &[FoundedBy, BornIn, LocatedIn], texts: &["In which country was the founder of {} born?"] },
    Template { chain: &[MemberOf, FormedIn, LocatedIn], texts: &["In which country was the band of {} formed?"] },
];

/// Follows `chain` from `subject`; the fact ids, or None where a hop does not exist.
pub fn follow(world: &World, subject: usize, chain: &[Relation]) -> Option<Vec<usize>> {
    let mut cur = subject;
    let mut facts = vec![];
    for &r in chain {
        let f = world.fact(cur, r)?;
        facts.push(f.id);
        cur = f.object;
    }
    Some(facts)
}

pub fn generate(world: &World, cfg: &WorldConfig) -> Vec<Question> {
    let mut rng = Rng::new(cfg.seed ^ 0x0051_7E57);
    let mut out = vec![];
    for t in TEMPLATES.iter().filter(|t| t.chain.len() <= cfg.max_hops) {
        if !t.chain.iter().all(|r| cfg.has(r.name())) {
            continue;
        }
        for e in world.of_kind(t.chain[0].domain().0) {
            let Some(chain) = follow(world, e, t.chain) else { continue };
            let text = t.texts[rng.below(t.texts.len())].replace("{}", &world.entity(e).name);
            let last = &world.facts[*chain.last().unwrap()];
            let ans = world.entity(last.object);
            let missing: Vec<usize> =
                chain.iter().enumerate().filter(|(_, f)| !world.facts[**f].pk).map(|(i, _)| i).collect();
            out.push(Question {
                id: String::new(),
                question: text,
                answer: ans.name.clone(),
                golden_answers: std::iter::once(ans.name.clone()).chain(ans.aliases.iter().cloned()).collect(),
                hops: chain.len(),
                pk_answerable: missing.is_empty(),
                min_searches: missing.len(),
                missing_hops: missing,
                chain,
                split: Split::Train,
            });
        }
    }
    // Splits by question (a question is in exactly one split), stratified by hop count.
    for hops in 1..=3 {
        let mut idx: Vec<usize> = out.iter().enumerate().filter(|(_, q)| q.hops == hops).map(|(i, _)| i).collect();
        crate::shuffle(&mut idx, &mut rng);
        let n = idx.len() as f64;
        let n_test = (n * cfg.splits.test).round() as usize;
        let n_valid = (n * cfg.splits.valid).round() as usize;
        for (j, &i) in idx.iter().enumerate() {
            out[i].split = if j < n_test {
                Split::Test
            } else if j < n_test + n_valid {
                Split::Valid
            } else {
                Split::Train
            };
        }
    }
    for (i, q) in out.iter_mut().enumerate() {
        q.id = format!("q{i:05}");
    }
    out
}
