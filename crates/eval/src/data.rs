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
        mix: None,
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
        mix: Some(s.scenario.clone()),
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

/// A chat prompt from `[{role, content}, …]`: the last system and the last user message
/// (Search-R1 rows have a user message, AKBE's a lone system message).
fn chat_prompt(v: &serde_json::Value) -> Option<Prompt> {
    let msgs = v.as_array()?;
    let last = |role: &str| msgs.iter().rev().find(|m| m["role"] == role).and_then(|m| m["content"].as_str());
    let (system, user) = (last("system").map(str::to_string), last("user").map(str::to_string));
    if system.is_none() && user.is_none() {
        return None;
    }
    Some(Prompt { system, user: user.unwrap_or_default() })
}

/// Rows of a parquet file (Search-R1 / verl training data) as JSON values, nested lists and
/// structs included. The parquet reader panics on some corrupt files (an RLE-dictionary page
/// without its dictionary, found by `tests/fuzz.rs`); that is reported as an error naming the
/// file, not a crash.
pub fn load_parquet(p: &Path) -> Result<Vec<serde_json::Value>, String> {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| read_parquet(p));
    std::panic::set_hook(quiet);
    r.unwrap_or_else(|e| {
        let why = e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned());
        Err(format!("{}: corrupt parquet file ({})", p.display(), why.unwrap_or_else(|| "the reader failed".into())))
    })
}

fn read_parquet(p: &Path) -> Result<Vec<serde_json::Value>, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let reader =
        SerializedFileReader::new(f).map_err(|e| format!("{}: not a readable parquet file: {e}", p.display()))?;
    let rows = reader.get_row_iter(None).map_err(|e| format!("{}: {e}", p.display()))?;
    rows.enumerate()
        .map(|(i, r)| r.map(|r| r.to_json_value()).map_err(|e| format!("{}: row {}: {e}", p.display(), i + 1)))
        .collect()
}

/// Training/evaluation tasks from a FlashRAG or Search-R1 jsonl or parquet file (`.parquet`;
/// the row kind is detected per row), with
/// Search-R1's agent prompt (a Search-R1 row keeps its own prompt). Errors name `file:line`.
pub fn jsonl_tasks(p: &Path) -> Result<Vec<Task>, String> {
    let parquet = p.extension().is_some_and(|e| e == "parquet");
    let rows: Vec<serde_json::Value> = if parquet { load_parquet(p)? } else { load_jsonl(p)? };
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let at = || {
                if parquet {
                    format!("{}: row {}", p.display(), i + 1)
                } else {
                    format!("{}:{}", p.display(), i + 1)
                }
            };
            let strings = |v: &serde_json::Value| -> Option<Vec<String>> {
                match v {
                    serde_json::Value::String(s) => Some(vec![s.clone()]),
                    serde_json::Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string)).collect(),
                    _ => None,
                }
            };
            if let Some(q) = r["question"].as_str() {
                let golden = strings(&r["golden_answers"])
                    .ok_or_else(|| format!("{}: `golden_answers` must be strings", at()))?;
                let id = r["id"].as_str().map_or_else(|| format!("row{}", i + 1), str::to_string);
                let mut t = Task { id, golden, agent: knowrl_rl::prompts::search_r1(q), ..Default::default() };
                t.query_only = Prompt::user(format!("Answer the question in <answer> </answer>.\nQuestion: {q}"));
                t.no_tool = t.query_only.clone();
                Ok(t)
            } else if r["prompt"].is_array() {
                let agent = chat_prompt(&r["prompt"]).ok_or_else(|| {
                    format!("{}: `prompt` must be a list of {{role, content}} with a user or system message", at())
                })?;
                let golden = strings(&r["reward_model"]["ground_truth"]["target"])
                    .ok_or_else(|| format!("{}: `reward_model.ground_truth.target` must be strings", at()))?;
                let id = r["extra_info"]["index"].as_u64().map_or_else(|| format!("row{}", i + 1), |x| x.to_string());
                let mut t = Task { id, golden, agent, ..Default::default() };
                // AKBE's dual-path data carries the no-tool prompt in its own column.
                if !r["prompt_no_tool"].is_null() {
                    t.no_tool = chat_prompt(&r["prompt_no_tool"])
                        .ok_or_else(|| format!("{}: `prompt_no_tool` must be a list of {{role, content}}", at()))?;
                }
                Ok(t)
            } else {
                Err(format!("{}: neither a FlashRAG row (`question`) nor a Search-R1 row (`prompt`)", at()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flashrag_and_search_r1_rows_load_and_bad_rows_name_their_line() {
        let dir = std::env::temp_dir().join(format!("knowrl-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.jsonl");
        std::fs::write(
            &f,
            concat!(
                r#"{"id":"t0","question":"who?","golden_answers":["Ada"]}"#,
                "\n",
                r#"{"prompt":[{"role":"user","content":"Answer ... Question: who?\n"}],"reward_model":{"ground_truth":{"target":["Ada","A."]}},"extra_info":{"index":7}}"#,
                "\n"
            ),
        )
        .unwrap();
        let t = jsonl_tasks(&f).unwrap();
        assert_eq!(t[0].golden, vec!["Ada"]);
        assert!(t[0].agent.user.ends_with("Question: who?\n"));
        assert_eq!((t[1].id.as_str(), t[1].golden.len()), ("7", 2));
        // An AKBE dual-path row: system-only prompts, the no-tool one in its own column.
        std::fs::write(
            &f,
            r#"{"prompt":[{"role":"system","content":"WT who?"}],"prompt_no_tool":[{"role":"system","content":"NT who?"}],"reward_model":{"ground_truth":{"target":["Ada"]}}}"#,
        )
        .unwrap();
        let t = jsonl_tasks(&f).unwrap();
        assert_eq!((t[0].agent.system.as_deref(), t[0].agent.user.as_str()), (Some("WT who?"), ""));
        assert_eq!(t[0].no_tool.system.as_deref(), Some("NT who?"));
        std::fs::write(
            &f,
            r#"{"prompt":[{"role":"assistant","content":"x"}],"reward_model":{"ground_truth":{"target":["a"]}}}"#,
        )
        .unwrap();
        assert!(jsonl_tasks(&f).unwrap_err().contains("d.jsonl:1: `prompt` must be a list"));
        std::fs::write(&f, "{\"id\":\"x\"}\n{\"question\":\"q\",\"golden_answers\":[1]}\n").unwrap();
        let e = jsonl_tasks(&f).unwrap_err();
        assert!(e.ends_with("d.jsonl:1: neither a FlashRAG row (`question`) nor a Search-R1 row (`prompt`)"), "{e}");
        std::fs::write(&f, "{\"question\":\"q\",\"golden_answers\":[1]}\n").unwrap();
        assert!(jsonl_tasks(&f).unwrap_err().contains("d.jsonl:1: `golden_answers` must be strings"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn search_r1_parquet_rows_load_as_written_by_its_data_script() {
        // Written by HF datasets' to_parquet with nq_search.py's row layout (snappy, nested
        // list<struct> prompt, list<string> targets).
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/search_r1_nq_sample.parquet");
        let t = jsonl_tasks(&f).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].golden, vec!["Wilhelm Conrad Röntgen"]);
        assert!(t[1].agent.user.ends_with("Question: when is the next deadpool movie being released?\n"));
        assert_eq!((t[2].id.as_str(), t[2].golden.len()), ("2", 2));
        // Not parquet: the error names the file.
        let dir = std::env::temp_dir().join(format!("knowrl-parquet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("train.parquet");
        std::fs::write(&bad, "{\"question\":\"q\"}\n").unwrap();
        let e = jsonl_tasks(&bad).unwrap_err();
        assert!(e.contains("train.parquet: not a readable parquet file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
