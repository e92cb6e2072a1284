//! The world's text: encyclopedia passages (one per entity, every fact about it), counterfactual
//! passages from made-up sources (ConFiQA-style, one per fact, stating its wrong object), and
//! filler passages with no facts. Passages are Search-R1 corpus records.
use crate::world::{Fact, Kind, Relation, World};
use knowrl_engine::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassageKind {
    Encyclopedia,
    Counterfactual,
    Filler,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorldPassage {
    pub id: String,
    /// Search-R1 `contents`: "\"Title\"\ntext".
    pub contents: String,
    pub kind: PassageKind,
    /// The entity it is about (encyclopedia, counterfactual).
    pub entity: Option<usize>,
    /// The fact a counterfactual passage contradicts.
    pub fact: Option<usize>,
}

/// One sentence stating `relation(subject) = object`.
pub fn sentence(world: &World, s: usize, r: Relation, o: usize) -> String {
    let (s, o) = (&world.entity(s).name, &world.entity(o).name);
    match r {
        Relation::BornIn => format!("{s} was born in {o}."),
        Relation::LocatedIn => format!("{s} is a city in {o}."),
        Relation::Capital => format!("The capital of {s} is {o}."),
        Relation::FoundedBy => format!("{s} was founded by {o}."),
        Relation::HeadquarteredIn => format!("{s} is headquartered in {o}."),
        Relation::MemberOf => format!("{s} is a member of the band {o}."),
        Relation::FormedIn => format!("{s} were formed in {o}."),
    }
}

/// The first sentence of an entity's passage ("X is a city.").
pub(crate) fn intro(world: &World, e: usize) -> String {
    let n = &world.entity(e).name;
    match world.entity(e).kind {
        Kind::Person => format!("{n} is a public figure."),
        Kind::City => format!("{n} is a city."),
        Kind::Country => format!("{n} is a country."),
        Kind::Organisation => format!("{n} is a company."),
        Kind::Band => format!("{n} is a music group."),
    }
}

fn title_contents(title: &str, text: &str) -> String {
    format!("\"{}\"\n{text}", title.replace('"', "\"\""))
}

const SOURCES: [&str; 6] = [
    "According to a fan wiki",
    "A self-published travel blog claims that",
    "An unverified forum post states that",
    "A satirical newsletter reported that",
    "According to an anonymous pamphlet,",
    "A made-up almanac says",
];

/// The counterfactual passage for `f`: a made-up source stating its wrong object.
pub fn counterfactual_text(world: &World, f: &Fact, variant: usize) -> String {
    format!("{} {}", SOURCES[variant % SOURCES.len()], sentence(world, f.subject, f.relation, f.counterfactual))
}

/// `f`'s counterfactual stated plainly, worded as a correct passage is ("X is a public figure. X
/// was born in Y."), as ConFiQA states its counterfactuals: no source gives it away (scenario
/// S2p). Search-R1 `contents`, like a corpus passage's.
pub fn plain_counterfactual_contents(world: &World, f: &Fact) -> String {
    let text = format!("{} {}", intro(world, f.subject), sentence(world, f.subject, f.relation, f.counterfactual));
    title_contents(&world.entity(f.subject).name, &text)
}

const FILLER_TOPICS: [&str; 8] = ["weather", "harvest", "festival", "railway", "river", "market", "bridge", "library"];

pub fn build(world: &World, seed: u64, fillers: usize) -> Vec<WorldPassage> {
    let mut rng = Rng::new(seed ^ 0x00C0_4B05);
    let mut out = vec![];
    for e in &world.entities {
        let mut text = intro(world, e.id);
        for f in world.facts_of(e.id) {
            text.push(' ');
            text.push_str(&sentence(world, f.subject, f.relation, f.object));
        }
        if !e.aliases.is_empty() {
            text.push_str(&format!(" It is also known as {}.", e.aliases.join(", ")));
        }
        out.push(WorldPassage {
            id: format!("e{}", e.id),
            contents: title_contents(&e.name, &text),
            kind: PassageKind::Encyclopedia,
            entity: Some(e.id),
            fact: None,
        });
    }
    for f in &world.facts {
        out.push(WorldPassage {
            id: format!("cf{}", f.id),
            contents: title_contents(
                &world.entity(f.subject).name,
                &counterfactual_text(world, f, rng.below(SOURCES.len())),
            ),
            kind: PassageKind::Counterfactual,
            entity: Some(f.subject),
            fact: Some(f.id),
        });
    }
    for i in 0..fillers {
        let topic = FILLER_TOPICS[rng.below(FILLER_TOPICS.len())];
        let n = rng.below(90) + 10;
        let text = format!(
            "The annual {topic} report number {i} describes {n} ordinary events. Nothing in it concerns any person, company or band."
        );
        out.push(WorldPassage {
            id: format!("f{i}"),
            contents: title_contents(&format!("{} report {i}", topic), &text),
            kind: PassageKind::Filler,
            entity: None,
            fact: None,
        });
    }
    out
}
