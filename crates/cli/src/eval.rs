//! `knowrl eval --model DIR --suite NAME`: evaluates any HF model directory (the world's policy,
//! SmolLM2, a trained checkpoint export) on the world's suites or the real-data samples.
use anyhow::{Context, Result};
use knowrl_engine::Policy;
use knowrl_eval::data::{questions, scenario_items};
use knowrl_eval::real::{load, score_conflict, ConflictRow, FlashRagRow};
use knowrl_rl::reward::{exact_match, extract_answer, f1, sub_exact_match};
use knowrl_rl::task::Prompt;
use knowrl_world::questions::Split;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Suite {
    /// Knowledgeable-R1's S1–S5 on the world's test split (world prompts), and S2p (S2's
    /// counterfactuals stated plainly, without a made-up source).
    WorldScenarios,
    /// The search agent on the world's test split (world prompts and retriever): EM, TC, TP,
    /// oracle boundary accuracy.
    WorldAgent,
    /// ConFiQA QA/MR/MC (SABER sample) with supporting and counterfactual contexts,
    /// Knowledgeable-R1's prompts: correct vs follows-context.
    Confiqa,
    /// Bamboogle (125 questions), query only (direct inference).
    Bamboogle,
    /// NQ test head (17 questions), query only.
    Nq,
    /// HotpotQA (IRCoT's 500-question dev subsample) as a search agent: Search-R1 prompt, BM25
    /// over the pooled paragraphs (4,858): EM, F1, TC, TP, supporting-passage recall.
    Hotpotqa,
}

#[derive(clap::Args)]
pub struct Args {
    /// HF model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long, required_unless_present = "endpoint")]
    pub model: Option<PathBuf>,
    /// Evaluate a served model instead: an OpenAI-compatible base URL (vLLM, SGLang, an API),
    /// e.g. http://localhost:8000/v1; key from $OPENAI_API_KEY. Single-turn suites only
    /// (confiqa, bamboogle, nq, world-scenarios).
    #[arg(long, conflicts_with = "model")]
    pub endpoint: Option<String>,
    /// Model name sent to the endpoint.
    #[arg(long, default_value = "default")]
    pub endpoint_model: String,
    #[arg(long, value_enum)]
    pub suite: Suite,
    /// World directory (world suites).
    #[arg(long, default_value = "assets/world")]
    pub world: PathBuf,
    /// The real-data folder.
    #[arg(long, default_value = "data/real")]
    pub data: PathBuf,
    /// World split: test | valid.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Items to evaluate (0 = all).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
    /// Agent suites: most search calls per question.
    #[arg(long, default_value_t = 4)]
    pub max_turns: usize,
    /// Agent suites: passages per search.
    #[arg(long, default_value_t = 3)]
    pub topk: usize,
    /// Write the figures here (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every item's output here (JSONL). Agent suites: question, gold, text, answer,
    /// queries, retrieved ids. world-scenarios: item id, scenario, variant, question, gold, the
    /// context's answer, PK-answerable, raw response, extracted answer, correct.
    #[arg(long)]
    pub trajectories: Option<PathBuf>,
}

fn dump_trajectories(
    path: &std::path::Path,
    questions: &[String],
    golds: &[Vec<String>],
    trajs: &[knowrl_rl::agent::Trajectory],
) -> Result<()> {
    let rows = questions.iter().zip(golds).zip(trajs).map(|((q, g), t)| {
        json!({"question": q, "golden_answers": g, "text": t.text, "answer": t.answer, "queries": t.queries,
               "retrieved_ids": t.retrieved_ids, "invalid_actions": t.invalid_actions})
    });
    write_jsonl(path, rows, "trajectories")
}

/// One JSON object per line, written atomically; `what` names the file on stderr.
fn write_jsonl(path: &std::path::Path, rows: impl Iterator<Item = Value>, what: &str) -> Result<()> {
    let text: String = rows.map(|r| r.to_string() + "\n").collect();
    knowrl_engine::fsutil::write_atomic(path, text.as_bytes())?;
    eprintln!("{what}: {}", path.display());
    Ok(())
}

fn dump_scenario_responses(
    path: &std::path::Path,
    items: &[&knowrl_world::suites::ScenarioItem],
    raw: &[String],
    answers: &[String],
) -> Result<()> {
    let rows = items.iter().zip(raw.iter().zip(answers)).map(|(s, (text, answer))| {
        json!({"id": s.id, "scenario": s.scenario, "variant": s.variant, "question": s.question,
               "golden_answers": s.golden_answers, "context_answer": s.context_answer,
               "pk_answerable": s.pk_answerable, "text": text, "answer": answer,
               "correct": exact_match(answer, &s.golden_answers)})
    });
    write_jsonl(path, rows, "responses")
}

fn take<T>(mut v: Vec<T>, limit: usize) -> Vec<T> {
    if limit > 0 {
        v.truncate(limit);
    }
    v
}

fn split(s: &str) -> Result<Split> {
    match s {
        "test" => Ok(Split::Test),
        "valid" => Ok(Split::Valid),
        "train" => Ok(Split::Train),
        _ => anyhow::bail!("--split {s:?}: expected test, valid or train"),
    }
}

pub fn run(a: Args) -> Result<()> {
    let t0 = std::time::Instant::now();
    let world_split = split(&a.split)?;
    let agent_suite = matches!(a.suite, Suite::WorldAgent | Suite::Hotpotqa);
    let (local, served) = match (&a.model, &a.endpoint) {
        (Some(m), _) => (
            Some(Policy::load(m, &a.device.load_options()?).with_context(|| format!("loading {}", m.display()))?),
            None,
        ),
        (None, Some(url)) => {
            if agent_suite {
                // Bad usage: exit code 2, like clap's own errors.
                eprintln!(
                    "error: --suite {:?} needs --model: agent rollouts append observations mid-response, which a chat endpoint cannot do",
                    a.suite
                );
                std::process::exit(2);
            }
            let key = std::env::var("OPENAI_API_KEY").ok();
            (
                None,
                Some(
                    knowrl_eval::endpoint::ChatEndpoint::new(url, &a.endpoint_model, key)
                        .map_err(anyhow::Error::msg)?,
                ),
            )
        }
        (None, None) => unreachable!("clap requires --model or --endpoint"),
    };
    let responder: &dyn knowrl_eval::Responder = match (&local, &served) {
        (Some(p), _) => p,
        (None, Some(e)) => e,
        _ => unreachable!(),
    };
    let report: Value = match a.suite {
        Suite::WorldScenarios => {
            let all = knowrl_world::suites::SCENARIOS.map(String::from);
            let items = take(scenario_items(&a.world, world_split, &all).map_err(anyhow::Error::msg)?, a.limit);
            let refs: Vec<_> = items.iter().collect();
            let raw = knowrl_eval::scenario_responses(responder, &refs, |s| {
                Prompt::user(knowrl_world::prompts::with_context(&s.question, &s.context))
            })?;
            let answers: Vec<String> = raw.iter().map(|r| extract_answer(r).unwrap_or_default()).collect();
            if let Some(path) = &a.trajectories {
                dump_scenario_responses(path, &refs, &raw, &answers)?;
            }
            let r = knowrl_eval::score_scenarios(&refs, &answers);
            println!("| scenario | EM | n |\n|---|---|---|");
            for (k, c) in &r.overall {
                println!("| {k} | {:.3} | {} |", c.rate(), c.n);
            }
            println!("\n| knowledge | EM | n |\n|---|---|---|");
            for (k, c) in &r.knowledge {
                println!("| {k} | {:.3} | {} |", c.rate(), c.n);
            }
            serde_json::to_value(&r)?
        }
        Suite::WorldAgent => {
            let policy = local.as_ref().expect("checked above");
            let qs = take(questions(&a.world, world_split).map_err(anyhow::Error::msg)?, a.limit);
            let refs: Vec<_> = qs.iter().collect();
            let retriever = knowrl_run::world_retriever(&a.world)?;
            let cfg = knowrl_rl::agent::AgentConfig::new(a.max_turns, a.topk, 48, 0.0);
            let trajs = knowrl_eval::agent_trajectories(
                policy,
                &retriever,
                &refs,
                |q| Prompt::user(knowrl_world::prompts::agent(&q.question)),
                &cfg,
            )?;
            if let Some(path) = &a.trajectories {
                let golds: Vec<Vec<String>> = refs.iter().map(|q| q.golden_answers.clone()).collect();
                let qtexts: Vec<String> = refs.iter().map(|q| q.question.clone()).collect();
                dump_trajectories(path, &qtexts, &golds, &trajs)?;
            }
            let r = knowrl_eval::score_trajectories(&refs, &trajs);
            println!(
                "EM {:.3}  TC {:.2}  TP {:.1}  boundary accuracy {:.3}  over-search {:.3}  under-search {:.3}  (n = {})",
                r.em, r.tc, r.tp, r.boundary_accuracy, r.over_search_rate, r.under_search_rate, r.n
            );
            serde_json::to_value(&r)?
        }
        Suite::Confiqa => {
            let dir = a.data.join("confiqa_saber_sample");
            let mut rows: Vec<ConflictRow> = vec![];
            for f in ["confiqa-qa.jsonl", "confiqa-mr.jsonl", "confiqa-mc.jsonl"] {
                rows.extend(take(load::<ConflictRow>(&dir.join(f)).map_err(anyhow::Error::msg)?, a.limit));
            }
            let prompts: Vec<Prompt> =
                rows.iter().map(|r| knowrl_rl::prompts::knowledgeable_r1(&r.question, &r.ck_text).1).collect();
            let raw = responder.responses(&prompts, a.max_new_tokens)?;
            let answers: Vec<Option<String>> = raw.iter().map(|r| extract_answer(r)).collect();
            let r = score_conflict(&rows, &answers, &raw);
            println!("| dataset / context | correct (EM) | correct (sub-EM) | follows context (sub-EM) | n |\n|---|---|---|---|---|");
            for (k, c) in &r.correct_em {
                println!(
                    "| {k} | {:.3} | {:.3} | {:.3} | {} |",
                    c.rate(),
                    r.correct_sub_em[k].rate(),
                    r.follows_context_sub_em[k].rate(),
                    c.n
                );
            }
            println!("responses with an <answer> tag: {:.3}", r.answered.rate());
            serde_json::to_value(&r)?
        }
        Suite::Bamboogle | Suite::Nq => {
            let file = if a.suite == Suite::Bamboogle {
                a.data.join("bamboogle/test.jsonl")
            } else {
                a.data.join("flashrag_samples/nq_test_head17.jsonl")
            };
            let rows = take(load::<FlashRagRow>(&file).map_err(anyhow::Error::msg)?, a.limit);
            let prompts: Vec<Prompt> = rows
                .iter()
                .map(|r| Prompt::user(format!("Answer the question in <answer> </answer>.\nQuestion: {}", r.question)))
                .collect();
            let raw = responder.responses(&prompts, a.max_new_tokens)?;
            let n = rows.len().max(1) as f64;
            let pred = |i: usize| extract_answer(&raw[i]).unwrap_or_else(|| raw[i].clone());
            let em = (0..rows.len()).filter(|&i| exact_match(&pred(i), &rows[i].golden_answers)).count() as f64 / n;
            let sub =
                (0..rows.len()).filter(|&i| sub_exact_match(&pred(i), &rows[i].golden_answers)).count() as f64 / n;
            let f = (0..rows.len()).map(|i| f1(&pred(i), &rows[i].golden_answers)).sum::<f64>() / n;
            println!("EM {em:.3}  sub-EM {sub:.3}  F1 {f:.3}  (n = {})", rows.len());
            json!({"em": em, "sub_em": sub, "f1": f, "n": rows.len()})
        }
        Suite::Hotpotqa => {
            use knowrl_retrieval::{bm25::Bm25, corpus::Corpus};
            let file = a.data.join("hotpotqa_ircot/dev_subsampled.jsonl");
            let (passages, qs) = knowrl_retrieval::corpus::hotpotqa_ircot(&file)?;
            let qs = take(qs, a.limit);
            let dir = std::env::temp_dir().join(format!("knowrl-hotpotqa-bm25-{}", std::process::id()));
            let bm25 = Bm25::build(&dir, std::sync::Arc::new(Corpus::Memory(passages)), |_| {})?;
            let prompts: Vec<Prompt> = qs.iter().map(|q| knowrl_rl::prompts::search_r1(&q.question)).collect();
            let cfg = knowrl_rl::agent::AgentConfig::new(a.max_turns, a.topk, a.max_new_tokens, 0.0);
            let policy = local.as_ref().expect("checked above");
            let trajs = knowrl_eval::prompt_trajectories(policy, &bm25, &prompts, &cfg);
            let _ = std::fs::remove_dir_all(&dir);
            let trajs = trajs?;
            let golds: Vec<Vec<String>> = qs.iter().map(|q| q.answers.clone()).collect();
            if let Some(path) = &a.trajectories {
                let qtexts: Vec<String> = qs.iter().map(|q| q.question.clone()).collect();
                dump_trajectories(path, &qtexts, &golds, &trajs)?;
            }
            let support: Vec<Vec<String>> = qs.iter().map(|q| q.supporting.clone()).collect();
            let r = knowrl_eval::score_open_agent(&golds, &support, &trajs);
            println!(
                "EM {:.3}  F1 {:.3}  sub-EM {:.3}  TC {:.2}  TP {:.1}  answered {:.3}  support recall {:.3}  (n = {})",
                r.em, r.f1, r.sub_em, r.tc, r.tp, r.answered, r.support_recall, r.n
            );
            serde_json::to_value(&r)?
        }
    };
    if let Some(out) = a.out {
        if let Some(d) = out.parent() {
            std::fs::create_dir_all(d)?;
        }
        knowrl_engine::fsutil::write_atomic(&out, serde_json::to_string_pretty(&report)?.as_bytes())?;
        println!("wrote {}", out.display());
    }
    eprintln!("evaluated in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
