//! The embedded default of knowrl: a synthetic knowledge world where every question's
//! knowledge boundary is known exactly (which facts the policy was pretrained on, which hops
//! are missing, how many searches are needed), with a corpus and Knowledgeable-R1-style
//! context-reliability scenarios.
pub mod config;
pub mod corpus;
pub mod diagnose;
pub mod habits;
pub mod implant;
pub mod names;
pub mod pretrain;
pub mod prompts;
pub mod questions;
pub mod suites;
pub mod world;

use serde::Serialize;
use std::path::Path;

pub use config::WorldConfig;

pub struct Built {
    pub config: WorldConfig,
    pub world: world::World,
    pub questions: Vec<questions::Question>,
    pub passages: Vec<corpus::WorldPassage>,
    pub scenarios: Vec<suites::ScenarioItem>,
}

pub fn build(config: &WorldConfig) -> Built {
    let world = world::generate(config);
    let questions = questions::generate(&world, config);
    let passages = corpus::build(&world, config.seed, config.filler_passages);
    let scenarios = suites::build(&world, &questions, &passages, config.seed, config.context_size);
    Built { config: config.clone(), world, questions, passages, scenarios }
}

/// Fisher–Yates shuffle with the world's generator (one `below` draw per position, last first).
pub(crate) fn shuffle<T>(v: &mut [T], rng: &mut knowrl_engine::Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}

fn jsonl<T: Serialize>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|x| serde_json::to_string(&x).unwrap() + "\n").collect()
}

impl Built {
    /// Writes the world directory (each file atomically):
    /// `config.toml`, `world.json` (entities, facts, PK labels), `corpus.jsonl` (the search
    /// corpus, Search-R1 format: encyclopedia + filler), `passages.jsonl` (every passage with
    /// its kind, counterfactual ones included), `questions.jsonl`, `scenarios.jsonl`.
    pub fn write(&self, dir: &Path) -> knowrl_engine::Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| knowrl_engine::EngineError::io(dir, e))?;
        let put = |name: &str, text: String| knowrl_engine::fsutil::write_atomic(&dir.join(name), text.as_bytes());
        put("config.toml", toml::to_string(&self.config).expect("config serialises"))?;
        put("world.json", serde_json::to_string(&self.world).unwrap())?;
        let search = self.passages.iter().filter(|p| p.kind != corpus::PassageKind::Counterfactual);
        put("corpus.jsonl", jsonl(search.map(|p| serde_json::json!({"id": p.id, "contents": p.contents}))))?;
        put("passages.jsonl", jsonl(&self.passages))?;
        put("questions.jsonl", jsonl(&self.questions))?;
        put("scenarios.jsonl", jsonl(&self.scenarios))?;
        Ok(())
    }
}
