//! Context-reliability scenarios after Knowledgeable-R1 §4.1.2, each in ConFiQA-like variants:
//! `qa` (single-hop), `mr` (multi-hop reasoning, the last hop's evidence altered) and `mc`
//! (multi-hop with every hop contradicted by a coherent made-up chain).
//!
//! S1 correct context · S2 counterfactual context · S3 self-conflicting (gold and counterfactual
//! together) · S4 irrelevant passages only · S5 partially relevant ("top-k": gold passages mixed
//! with look-alike and same-kind distractors).
//!
//! The world's counterfactual passages cite a made-up source ("A made-up almanac says …"), which
//! a policy can learn to distrust without weighing the context against what it knows; ConFiQA
//! states its counterfactuals plainly. **S2p** is S2 with each counterfactual passage stated
//! plainly (`corpus::plain_counterfactual_contents`): the same questions, answers and passage
//! ids, only the source's wording gone. It is not one of the paper's scenarios (`PAPER_SCENARIOS`).
use crate::corpus::{PassageKind, WorldPassage};
use crate::questions::{Question, Split};
use crate::shuffle;
use crate::world::World;
use knowrl_engine::Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Knowledgeable-R1 §4.1.2's scenarios.
pub const PAPER_SCENARIOS: [&str; 5] = ["S1", "S2", "S3", "S4", "S5"];
/// Every scenario the world builds: the paper's and S2p (S2 stated plainly).
pub const SCENARIOS: [&str; 6] = ["S1", "S2", "S2p", "S3", "S4", "S5"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioItem {
    pub id: String,
    pub question_id: String,
    pub scenario: String,
    pub variant: String,
    pub split: Split,
    pub question: String,
    pub golden_answers: Vec<String>,
    /// The corpus passages the context shows (S2p restates its counterfactual ones plainly).
    pub context_ids: Vec<String>,
    pub context: Vec<String>,
    /// What a reader that trusts the context would answer (None: the context does not decide).
    pub context_answer: Option<String>,
    pub pk_answerable: bool,
    pub hops: usize,
}

/// The counterfactual chain of `q`: from the first subject, follow each hop's counterfactual
/// object. Returns (counterfactual fact ids, final wrong object) when every hop exists and the
/// end differs from the true answer.
fn counterfactual_chain(world: &World, q: &Question) -> Option<(Vec<usize>, usize)> {
    let mut cur = world.facts[q.chain[0]].subject;
    let mut facts = vec![];
    for &fid in &q.chain {
        let f = world.fact(cur, world.facts[fid].relation)?;
        facts.push(f.id);
        cur = f.counterfactual;
    }
    let truth = world.facts[*q.chain.last().unwrap()].object;
    (cur != truth).then_some((facts, cur))
}

pub fn build(
    world: &World,
    questions: &[Question],
    passages: &[WorldPassage],
    seed: u64,
    k: usize,
) -> Vec<ScenarioItem> {
    let mut rng = Rng::new(seed ^ 0x5CE4_A210);
    let by_id: HashMap<&str, &WorldPassage> = passages.iter().map(|p| (p.id.as_str(), p)).collect();
    let entity_passages: Vec<&str> =
        passages.iter().filter(|p| p.kind == PassageKind::Encyclopedia).map(|p| p.id.as_str()).collect();
    let mut out = vec![];
    for q in questions {
        let gold: Vec<String> = q.chain.iter().map(|&f| format!("e{}", world.facts[f].subject)).collect();
        let involved: Vec<usize> =
            q.chain.iter().flat_map(|&f| [world.facts[f].subject, world.facts[f].object]).collect();
        let last = &world.facts[*q.chain.last().unwrap()];
        let variant = if q.hops == 1 { "qa" } else { "mr" };
        let mut push = |scenario: &str, variant: &str, ids: Vec<String>, ctx_answer: Option<usize>| {
            let contents = |id: &String| match by_id[id.as_str()] {
                p if scenario == "S2p" && p.kind == PassageKind::Counterfactual => {
                    crate::corpus::plain_counterfactual_contents(world, &world.facts[p.fact.unwrap()])
                }
                p => p.contents.clone(),
            };
            out.push(ScenarioItem {
                id: format!("{}-{}-{}", q.id, scenario.to_lowercase(), variant),
                question_id: q.id.clone(),
                scenario: scenario.into(),
                variant: variant.into(),
                split: q.split,
                question: q.question.clone(),
                golden_answers: q.golden_answers.clone(),
                context: ids.iter().map(contents).collect(),
                context_ids: ids,
                context_answer: ctx_answer.map(|e| world.entity(e).name.clone()),
                pk_answerable: q.pk_answerable,
                hops: q.hops,
            });
        };
        // S1: the gold passages, in hop order.
        push("S1", variant, gold.clone(), Some(last.object));
        // S2: the last hop's evidence replaced by its counterfactual.
        let mut s2 = gold.clone();
        *s2.last_mut().unwrap() = format!("cf{}", last.id);
        push("S2", variant, s2.clone(), Some(last.counterfactual));
        push("S2p", variant, s2.clone(), Some(last.counterfactual));
        // S3: gold and counterfactual together.
        let mut s3 = gold.clone();
        s3.push(format!("cf{}", last.id));
        shuffle(&mut s3, &mut rng);
        push("S3", variant, s3, None);
        // Multiple conflicts: a coherent counterfactual chain (multi-hop only).
        if q.hops > 1 {
            if let Some((cf, wrong)) = counterfactual_chain(world, q) {
                let ids: Vec<String> = cf.iter().map(|f| format!("cf{f}")).collect();
                push("S2", "mc", ids.clone(), Some(wrong));
                push("S2p", "mc", ids.clone(), Some(wrong));
                let mut both = gold.clone();
                both.extend(ids);
                shuffle(&mut both, &mut rng);
                push("S3", "mc", both, None);
            }
        }
        // S4: passages about entities the question does not involve.
        let mut s4 = vec![];
        while s4.len() < k {
            let id = entity_passages[rng.below(entity_passages.len())];
            let e = by_id[id].entity.unwrap();
            // Irrelevant means it cannot answer: no passage that even names the answer.
            let names_answer = q.golden_answers.iter().any(|g| by_id[id].contents.contains(g.as_str()));
            if !involved.contains(&e) && !names_answer && !s4.iter().any(|x: &String| x == id) {
                s4.push(id.to_string());
            }
        }
        push("S4", variant, s4, None);
        // S5: gold plus distractors up to k: look-alikes of the chain's subjects first, then
        // passages about other entities of the same kinds.
        let mut s5 = gold.clone();
        for &f in &q.chain {
            let s = world.facts[f].subject;
            for e in &world.entities {
                if (e.lookalike_of == Some(s) || world.entity(s).lookalike_of == Some(e.id)) && s5.len() < k {
                    s5.push(format!("e{}", e.id));
                }
            }
        }
        let kinds: Vec<_> = q.chain.iter().map(|&f| world.entity(world.facts[f].subject).kind).collect();
        let mut guard = 0;
        while s5.len() < k && guard < 10_000 {
            guard += 1;
            let id = entity_passages[rng.below(entity_passages.len())];
            let e = by_id[id].entity.unwrap();
            if kinds.contains(&world.entity(e).kind) && !involved.contains(&e) && !s5.iter().any(|x| x == id) {
                s5.push(id.to_string());
            }
        }
        shuffle(&mut s5, &mut rng);
        push("S5", variant, s5, Some(last.object));
    }
    out
}
