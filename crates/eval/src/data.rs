//! The world's questions and scenario items as RL tasks, with the world's prompt texts (the
//! ones its tiny policy was pretrained on), so training and evaluation see identical prompts.
use knowrl_rl::task::{Prompt, Task};
use knowrl_world::prompts;
use knowrl_world::questions::{Question, Split};
use knowrl_world::suites::ScenarioItem;
use std::path::Path;

/// Reads a jsonl file; a bad line is reported as `file:line: error`.
pub fn load_jsonl<T: serde::de::DeserializeOwned>(p: &Path) -> Result<Vec<T>, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", p.display(), i + 1)))
        .collect()
}

/// An agent-suite task: agent, no-tool and query-only prompts of the question.
pub fn question_task(q: &Question) -> Task {
    Task {
        id: q.id.clone(),
        golden: q.golden_answers.clone(),
        agent: Prompt::user(prompts::agent(&q.question)),
        no_tool: Prompt::user(prompts::no_tool(&q.question)),
        query_only: Prompt::user(prompts::query_only(&q.question)),
        with_context: None,
    }
}

/// A context-suite task (Knowledgeable-R1): the item's question with and without its context;
/// the reward's gold is the true answer, whatever the context says.
pub fn scenario_task(s: &ScenarioItem) -> Task {
    Task {
        id: s.id.clone(),
        golden: s.golden_answers.clone(),
        agent: Prompt::user(prompts::agent(&s.question)),
        no_tool: Prompt::user(prompts::no_tool(&s.question)),
        query_only: Prompt::user(prompts::query_only(&s.question)),
        with_context: Some(Prompt::user(prompts::with_context(&s.question, &s.context))),
    }
}

pub fn questions(world: &Path, split: Split) -> Result<Vec<Question>, String> {
    Ok(load_jsonl::<Question>(&world.join("questions.jsonl"))?.into_iter().filter(|q| q.split == split).collect())
}

pub fn scenario_items(world: &Path, split: Split, scenarios: &[String]) -> Result<Vec<ScenarioItem>, String> {
    Ok(load_jsonl::<ScenarioItem>(&world.join("scenarios.jsonl"))?
        .into_iter()
        .filter(|s| s.split == split && scenarios.contains(&s.scenario))
        .collect())
}

/// The passages a question needs: its chain's subjects' encyclopedia passages ("e{entity}").
pub fn gold_passages(world: &Path, qs: &[&Question]) -> Result<Vec<Vec<String>>, String> {
    let p = world.join("world.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let w: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    qs.iter()
        .map(|q| {
            q.chain
                .iter()
                .map(|&f| {
                    w["facts"][f]["subject"]
                        .as_u64()
                        .map(|s| format!("e{s}"))
                        .ok_or_else(|| format!("{}: fact {f} has no subject", p.display()))
                })
                .collect()
        })
        .collect()
}
