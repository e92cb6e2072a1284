//! What the tiny policy is pretrained on, and therefore which habits RL has to fix:
//! - parametric knowledge: statements and query-only answers for PK facts only;
//! - context dominance: it reads answers from context, *including counterfactual context*
//!   (Knowledgeable-R1's failure case);
//! - tool over-use: its agent trajectories search every hop, even for facts it knows (AKBE's);
//! - a no-tool format for PK questions (AKBE's no-tool path).
use crate::corpus::{sentence, PassageKind, WorldPassage};
use crate::prompts;
use crate::questions::{Question, Split};
use crate::world::World;
use crate::Built;
use knowrl_engine::Rng;
use knowrl_retrieval::format::{information_block, PassageStyle};
use knowrl_retrieval::Hit;
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// User message (rendered with the chat template), or None for plain text.
    pub user: Option<String>,
    /// Response segments; `false` marks observation text that is not trained on.
    pub segments: Vec<(String, bool)>,
}

fn hit(p: &WorldPassage) -> Hit {
    Hit { id: p.id.clone(), contents: p.contents.clone(), score: 0.0 }
}

/// "Retrieved" passages for a search on `subject`: its passage plus two distractors
/// (look-alikes first), in a random order, as a top-3 retriever would return them.
fn retrieved<'a>(
    w: &World,
    by_entity: &HashMap<usize, &'a WorldPassage>,
    enc: &[&'a WorldPassage],
    subject: usize,
    rng: &mut Rng,
) -> Vec<&'a WorldPassage> {
    let mut out = vec![by_entity[&subject]];
    for e in &w.entities {
        if out.len() < 3 && (e.lookalike_of == Some(subject) || w.entity(subject).lookalike_of == Some(e.id)) {
            out.push(by_entity[&e.id]);
        }
    }
    while out.len() < 3 {
        let p = enc[rng.below(enc.len())];
        if !out.iter().any(|x| x.id == p.id) {
            out.push(p);
        }
    }
    let gold = rng.below(3);
    out.swap(0, gold);
    out
}

/// The agent trajectory for `q`: one search per hop, then the answer. The first search is the
/// question itself (what Search-R1 agents typically issue first, and what the retriever was
/// trained on); later ones name the bridge entity read from the previous results.
pub fn agent_trajectory(built: &Built, q: &Question, rng: &mut Rng) -> Vec<(String, bool)> {
    trajectory(built, &encyclopedia(built), q, &true_objects(&built.world, q), rng)
}

/// The object of each hop of `q` in the real world.
fn true_objects(w: &World, q: &Question) -> Vec<usize> {
    q.chain.iter().map(|&f| w.facts[f].object).collect()
}

/// The trajectory of `q` in a world where hop k's retrieved passage says its subject's relation
/// points to `objects[k]`: the next search names `objects[k]`, the answer is the last one.
/// `objects` = the chain's true objects is the real world; any other hop's passage is restated.
fn trajectory(
    built: &Built,
    (by_entity, enc): &Encyclopedia,
    q: &Question,
    objects: &[usize],
    rng: &mut Rng,
) -> Vec<(String, bool)> {
    let w = &built.world;
    let mut segs = vec![];
    let mut subject = w.facts[q.chain[0]].subject;
    for (hop, (&f, &object)) in q.chain.iter().zip(objects).enumerate() {
        let query = if hop == 0 { q.question.as_str() } else { w.entity(subject).name.as_str() };
        segs.push((prompts::search(query), true));
        let mut hits: Vec<Hit> = retrieved(w, by_entity, enc, subject, rng).into_iter().map(hit).collect();
        let stated = w.fact(subject, w.facts[f].relation).expect("a chain's subjects have its relations");
        if stated.object != object {
            restate(w, stated.id, object, hits.iter_mut().map(|h| &mut h.contents));
        }
        segs.push((information_block(&hits, PassageStyle::SearchR1), false));
        subject = object;
    }
    segs.push((prompts::answer(&w.entity(*objects.last().unwrap()).name), true));
    segs
}

/// Each entity's encyclopedia passage, and all of them in entity order (a HashMap's iteration
/// order differs between maps, which made the distractors, and so every pretraining run, differ
/// between two calls with one seed).
type Encyclopedia<'a> = (HashMap<usize, &'a WorldPassage>, Vec<&'a WorldPassage>);

fn encyclopedia(built: &Built) -> Encyclopedia<'_> {
    let by_entity: HashMap<usize, &WorldPassage> =
        built.passages.iter().filter(|p| p.kind == PassageKind::Encyclopedia).map(|p| (p.entity.unwrap(), p)).collect();
    let mut enc: Vec<&WorldPassage> = by_entity.values().copied().collect();
    enc.sort_by_key(|p| p.entity);
    (by_entity, enc)
}

/// A 1-hop question's trajectory with one needless search: the question, then a search on a
/// name read in its results (the answer itself, or another entity a passage mentions), then the
/// answer *from the first results*. A redundant search costs a call, not the answer: without
/// this, the v2 policy answered from the last passage read, and at temperature 1 its 1-hop
/// trajectories that searched twice were right 18 times in 36 against 52 in 55 with one search,
/// so GRPO learned to drop every second search, the needed 2-hop ones included
/// (bench/results/world-v2-candidates). `None` when the first results name no other entity.
pub fn detour_trajectory(built: &Built, q: &Question, rng: &mut Rng) -> Option<Vec<(String, bool)>> {
    assert_eq!(q.hops, 1, "detours are for 1-hop questions");
    let w = &built.world;
    let book = encyclopedia(built);
    let mut segs = trajectory(built, &book, q, &true_objects(w, q), rng);
    let (by_entity, enc) = &book;
    let subject = w.facts[q.chain[0]].subject;
    let named: Vec<usize> = w
        .entities
        .iter()
        .filter(|e| e.id != subject && by_entity.contains_key(&e.id) && segs[1].0.contains(&e.name))
        .map(|e| e.id)
        .collect();
    if named.is_empty() {
        return None;
    }
    let detour = named[rng.below(named.len())];
    let hits: Vec<Hit> = retrieved(w, by_entity, enc, detour, rng).into_iter().map(hit).collect();
    segs.insert(2, (prompts::search(&w.entity(detour).name), true));
    segs.insert(3, (information_block(&hits, PassageStyle::SearchR1), false));
    Some(segs)
}

/// Bridge-copying practice on the real world's names: train-split multi-hop questions (any,
/// PK or not) whose every retrieved hop names a random entity of the right kind, a coherent
/// made-up chain, so each bridge search must copy the name just read and the answer is the last
/// made-up object. In the shipped policy's 2-hop test trajectories, 77 of 115 second searches
/// named another city than the one its first search had retrieved: real-world trajectories
/// (PK questions only) can be written from memory, and shadow worlds give few bridges. No target
/// states a true fact: hop 0's made-up object differs from the truth, later subjects are made up.
pub fn counterfactual_chains(built: &Built, n: usize, seed: u64) -> Vec<Example> {
    let mut rng = Rng::new(seed ^ 0x0C0F_C4A1);
    let w = &built.world;
    let mut questions: Vec<&Question> =
        built.questions.iter().filter(|q| q.split == Split::Train && q.hops > 1).collect();
    crate::shuffle(&mut questions, &mut rng);
    let (by_kind, book) = (by_kind(w), encyclopedia(built));
    let mut out = vec![];
    for q in questions.iter().cycle().take(n) {
        let Some(objects) = made_up_chain(w, &by_kind, q, &mut rng) else { continue };
        out.push(Example {
            user: Some(prompts::agent(&q.question)),
            segments: trajectory(built, &book, q, &objects, &mut rng),
        });
    }
    out
}

/// For each hop of `q`, an entity of the kind of its true object, other than the object its
/// (possibly made-up) subject really has, and one that has the next hop's relation, so the chain
/// can go on from it. None if some hop has no such entity.
fn made_up_chain(
    w: &World,
    by_kind: &HashMap<crate::world::Kind, Vec<usize>>,
    q: &Question,
    rng: &mut Rng,
) -> Option<Vec<usize>> {
    let mut subject = w.facts[q.chain[0]].subject;
    let mut objects = vec![];
    for (hop, &f) in q.chain.iter().enumerate() {
        let relation = w.facts[f].relation;
        let truth = w.fact(subject, relation)?.object;
        let next = q.chain.get(hop + 1).map(|&g| w.facts[g].relation);
        let candidates: Vec<usize> = by_kind[&w.entity(truth).kind]
            .iter()
            .copied()
            .filter(|&e| e != truth && next.is_none_or(|r| w.fact(e, r).is_some()))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        subject = candidates[rng.below(candidates.len())];
        objects.push(subject);
    }
    Some(objects)
}

/// The same practice in the S1 format: train-split correct-context items (single- and multi-hop,
/// gold passages in hop order) whose last-hop sentence names a random other object of the right
/// kind, which is the trained answer; a new draw per call. The world's S2 items cannot do this:
/// each states one fixed counterfactual in a short "made-up source" passage, so a policy can
/// memorise them, and S1 items of non-PK questions are not trained (`pk_only_targets`): the
/// shipped policy read 29 of its 32 S1 test misses on non-PK questions as a popular name from
/// memory ("Thaishisilholm" for "Zaibabriholm").
///
/// `scenario` "S5" draws partially-relevant items instead (gold plus look-alike and same-kind
/// distractors): the same practice where the right passage must first be found.
pub fn counterfactual_context(built: &Built, scenario: &str, n: usize, seed: u64) -> Vec<Example> {
    let mut rng = Rng::new(seed ^ 0x0C0F_C7E7 ^ if scenario == "S1" { 0 } else { 0x55 });
    let w = &built.world;
    let question: HashMap<&str, &Question> = built.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    let mut items: Vec<_> =
        built.scenarios.iter().filter(|s| s.split == Split::Train && s.scenario == scenario).collect();
    crate::shuffle(&mut items, &mut rng);
    let by_kind = by_kind(w);
    let mut out = vec![];
    for s in items.iter().cycle().take(n) {
        let last = *question[s.question_id.as_str()].chain.last().unwrap();
        let Some(o) = made_up_object(w, &by_kind, last, &mut rng) else { continue };
        let mut context = s.context.clone();
        restate(w, last, o, context.iter_mut());
        out.push(Example {
            user: Some(prompts::with_context(&s.question, &context)),
            segments: vec![(prompts::answer(&w.entity(o).name), true)],
        });
    }
    out
}

/// Entity ids by kind.
fn by_kind(w: &World) -> HashMap<crate::world::Kind, Vec<usize>> {
    let mut by_kind: HashMap<_, Vec<usize>> = HashMap::new();
    w.entities.iter().for_each(|e| by_kind.entry(e.kind).or_default().push(e.id));
    by_kind
}

/// A random entity of the kind of `fact`'s object, other than that object (None if it has no
/// kin).
fn made_up_object(
    w: &World,
    by_kind: &HashMap<crate::world::Kind, Vec<usize>>,
    fact: usize,
    rng: &mut Rng,
) -> Option<usize> {
    let truth = w.facts[fact].object;
    let others: Vec<usize> = by_kind[&w.entity(truth).kind].iter().copied().filter(|&e| e != truth).collect();
    (!others.is_empty()).then(|| others[rng.below(others.len())])
}

/// Rewrites the passage among `texts` that states `fact` to state `object` instead.
fn restate<'a>(w: &World, fact: usize, object: usize, mut texts: impl Iterator<Item = &'a mut String>) {
    let f = &w.facts[fact];
    let (said, made_up) = (sentence(w, f.subject, f.relation, f.object), sentence(w, f.subject, f.relation, object));
    let gold = texts.find(|t| t.contains(&said)).expect("the subject's passage states its fact");
    *gold = gold.replace(&said, &made_up);
}

/// A context-reading item: the scenario item's question and passages, answered with `answer`.
pub fn context_item(s: &crate::suites::ScenarioItem, answer: &str) -> Example {
    Example {
        user: Some(prompts::with_context(&s.question, &s.context)),
        segments: vec![(prompts::answer(answer), true)],
    }
}

/// Reading practice from a *shadow* world (same config, another seed): every name and fact is
/// new to the policy, so the only way to answer is to read the context or the search results —
/// copying, not recall. `contexts` S1/S2/S5 items and `agent` search trajectories, drawn at random
/// from all of its splits (none of its questions exist in the real world); `agent` may exceed the
/// world's question count.
pub fn reading_examples(shadow: &Built, contexts: usize, agent: usize, seed: u64) -> Vec<Example> {
    let mut rng = Rng::new(seed ^ 0x05AD_0111);
    let mut items: Vec<_> =
        shadow.scenarios.iter().filter(|s| matches!(s.scenario.as_str(), "S1" | "S2" | "S5")).collect();
    let mut questions: Vec<&Question> = shadow.questions.iter().collect();
    crate::shuffle(&mut items, &mut rng);
    crate::shuffle(&mut questions, &mut rng);
    let mut out = vec![];
    for s in items.into_iter().filter(|s| s.context_answer.is_some()).take(contexts) {
        out.push(context_item(s, s.context_answer.as_deref().unwrap()));
    }
    // More trajectories than questions revisit them with other distractors and orders.
    for q in questions.iter().cycle().take(agent) {
        out.push(Example { user: Some(prompts::agent(&q.question)), segments: agent_trajectory(shadow, q, &mut rng) });
    }
    out
}
