//! `knowrl world eval`: the shipped policy's calibration on the world's test split (greedy):
//! query-only EM on PK / non-PK questions, EM under each context scenario S1–S5 and S2p, the agent's
//! search rate and EM per hop count, the tiny retriever's recall@3 per hop; whether the policy
//! reads rather than looks up (S1-qa on a world built with another seed, never trained on), and
//! its room to explore (the share of 8-sample groups at temperature 1 whose rewards differ).
//! (Moves into the eval crate with the evaluation harness.)
use anyhow::Result;
use knowrl_engine::{Policy, Rng};
use knowrl_retrieval::Retriever;
use knowrl_rl::agent::AgentConfig;
use knowrl_rl::reward::exact_match;
use knowrl_rl::task::Prompt;
use knowrl_world::questions::{Question, Split};
use knowrl_world::suites::ScenarioItem;
use knowrl_world::{diagnose, prompts};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// World directory: its questions, scenarios, policy/ and encoder/.
    #[arg(long, default_value = "assets/world")]
    pub world: PathBuf,
    /// Write the calibration figures here (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Questions per agent measurement (0 = all of the test split).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// Items per scenario and variant (S1-qa, S1-mr, …; 0 = all of the test split).
    #[arg(long, default_value_t = 0)]
    pub scenario_limit: usize,
    /// Samples per group for the room-to-explore measurement (temperature 1, validation split;
    /// 0 = skip it).
    #[arg(long, default_value_t = 8)]
    pub explore_samples: usize,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
}

/// Reads a jsonl file; a bad line is reported as `file:line`.
pub fn load_jsonl<T: serde::de::DeserializeOwned>(p: &std::path::Path) -> Result<Vec<T>> {
    knowrl_eval::data::load_jsonl(p).map_err(anyhow::Error::msg)
}

use knowrl_run::world_retriever;

fn em_rate(preds: &[String], golds: &[&Vec<String>]) -> f64 {
    if preds.is_empty() {
        return f64::NAN;
    }
    preds.iter().zip(golds).filter(|(p, g)| exact_match(p, g)).count() as f64 / preds.len() as f64
}

/// Answer tokens allowed to a single-turn response: `<answer> name </answer>` takes up to ~16
/// tokens in SmolLM2's vocabulary (world names are made up, ~2.6 tokens a word).
const ANSWER_TOKENS: usize = 24;

/// S1-qa EM on the test split of a world built from `world`'s config with another seed: every
/// name in it is new, so only reading the context answers it.
fn unseen_world_s1(policy: &Policy, world: &std::path::Path) -> Result<(f64, usize)> {
    let mut cfg = knowrl_world::WorldConfig::load(&world.join("config.toml"))?;
    cfg.seed = cfg.seed.wrapping_add(1_000_003);
    let built = knowrl_world::build(&cfg);
    let items: Vec<&ScenarioItem> =
        built.scenarios.iter().filter(|s| s.split == Split::Test && s.scenario == "S1" && s.variant == "qa").collect();
    let prompts: Vec<Prompt> =
        items.iter().map(|s| Prompt::user(prompts::with_context(&s.question, &s.context))).collect();
    let preds = knowrl_eval::greedy_answers(policy, &prompts, ANSWER_TOKENS)?;
    let golds: Vec<&Vec<String>> = items.iter().map(|s| &s.golden_answers).collect();
    Ok((em_rate(&preds, &golds), items.len()))
}

/// The share of `samples`-sample groups at temperature 1 whose EM rewards are not all equal
/// (a GRPO group with equal rewards has zero advantage: no gradient), on the validation split's
/// agent suite and its S1+S2 context items.
/// The share of 8-sample groups at T = 1 whose rewards are not all equal (validation split), on
/// the agent suite and on the S1+S2 context suite (returned), plus into `report`: the share of
/// Knowledgeable-R1's joint groups (half without the context, half with it) that mix, and the
/// context suite's ceiling for a policy that reads correct contexts right every time (the S2
/// items it knows, the only ones whose with-context answers can disagree).
fn mixed_group_shares(
    policy: &Policy,
    retriever: &dyn Retriever,
    questions: &[Question],
    scenarios: &[ScenarioItem],
    samples: usize,
    report: &mut serde_json::Map<String, Value>,
) -> Result<(f64, f64)> {
    let mixed = |ok: &[bool]| {
        let groups: Vec<&[bool]> = ok.chunks(samples).collect();
        groups.iter().filter(|g| g.iter().any(|&x| x) && g.iter().any(|&x| !x)).count() as f64
            / groups.len().max(1) as f64
    };
    let valid: Vec<&Question> = questions.iter().filter(|q| q.split == Split::Valid).collect();
    let prompts: Vec<Prompt> =
        valid.iter().flat_map(|q| std::iter::repeat_n(Prompt::user(prompts::agent(&q.question)), samples)).collect();
    let trajs = knowrl_eval::prompt_trajectories(policy, retriever, &prompts, &AgentConfig::new(4, 3, 48, 1.0))?;
    let ok: Vec<bool> =
        trajs.iter().enumerate().map(|(i, t)| t.is_correct(&valid[i / samples].golden_answers)).collect();
    let agent = mixed(&ok);
    let items: Vec<&ScenarioItem> =
        scenarios.iter().filter(|s| s.split == Split::Valid && matches!(s.scenario.as_str(), "S1" | "S2")).collect();
    let tok = policy.tokenizer()?;
    let params = knowrl_engine::SamplingParams {
        temperature: 1.0,
        stop: vec!["</answer>".into()],
        ..knowrl_engine::SamplingParams::greedy(ANSWER_TOKENS)
    };
    // Correctness of `samples` answers per item under `prompt`, sampled at T = 1.
    let sampled = |prompt: &dyn Fn(&ScenarioItem) -> String, seed0: u64| -> Result<Vec<bool>> {
        let mut ok = vec![];
        for chunk in items.chunks(8) {
            let ids: Vec<Vec<u32>> = chunk
                .iter()
                .flat_map(|s| std::iter::repeat_n(Prompt::user(prompt(s)), samples))
                .map(|p| p.ids(tok))
                .collect::<Result<_, _>>()?;
            let seeds: Vec<u64> = (0..ids.len() as u64).map(|i| seed0 + i).collect();
            let gens = knowrl_engine::generate::generate(
                &policy.lm,
                Some(tok),
                &ids,
                &params,
                &seeds,
                &tok.eos_ids,
                tok.pad_id,
            )?;
            for (i, g) in gens.iter().enumerate() {
                let text = tok.decode(&g.tokens, true)?;
                let answer = knowrl_rl::reward::extract_answer(&text).unwrap_or_default();
                ok.push(exact_match(&answer, &chunk[i / samples].golden_answers));
            }
        }
        Ok(ok)
    };
    let ok = sampled(&|s| prompts::with_context(&s.question, &s.context), 0)?;
    // Knowledgeable-R1's joint group: half the samples without the context (p), half with it
    // (p′); S2 items the policy knows mix here even when every with-context answer follows
    // the counterfactual context.
    let no_ctx = sampled(&|s| prompts::query_only(&s.question), 1 << 32)?;
    let half = samples / 2;
    let joint: Vec<bool> = (0..items.len())
        .flat_map(|q| {
            let (c, p) = (&ok[q * samples..q * samples + half], &no_ctx[q * samples..q * samples + (samples - half)]);
            c.iter().chain(p).copied().collect::<Vec<_>>()
        })
        .collect();
    let s2_pk = items.iter().filter(|s| s.scenario == "S2" && s.pk_answerable).count();
    report.insert("mixed_group_share_context_bound".into(), json!((s2_pk as f64) / items.len().max(1) as f64));
    report.insert("mixed_group_share_joint".into(), json!(mixed(&joint)));
    Ok((agent, mixed(&ok)))
}

pub fn run(a: EvalArgs) -> Result<()> {
    let t0 = std::time::Instant::now();
    let questions: Vec<Question> = load_jsonl(&a.world.join("questions.jsonl"))?;
    let scenarios: Vec<ScenarioItem> = load_jsonl(&a.world.join("scenarios.jsonl"))?;
    let policy = Policy::load(&a.world.join("policy"), &a.device.load_options()?)?;
    let test: Vec<&Question> = questions.iter().filter(|q| q.split == Split::Test).collect();
    let mut report = serde_json::Map::new();

    // Query-only, single hop.
    let single: Vec<&Question> = test.iter().copied().filter(|q| q.hops == 1).collect();
    let preds = knowrl_eval::greedy_answers(
        &policy,
        &single.iter().map(|q| Prompt::user(prompts::query_only(&q.question))).collect::<Vec<_>>(),
        ANSWER_TOKENS,
    )?;
    let by = |pk: bool| {
        let (p, g): (Vec<String>, Vec<&Vec<String>>) = single
            .iter()
            .zip(&preds)
            .filter(|(q, _)| q.pk_answerable == pk)
            .map(|(q, p)| (p.clone(), &q.golden_answers))
            .unzip();
        em_rate(&p, &g)
    };
    report.insert("pk_query_only_em".into(), json!(by(true)));
    report.insert("nonpk_query_only_em".into(), json!(by(false)));

    // Context scenarios S1–S5 and S2p (EM against the true answer).
    let mut items: Vec<&ScenarioItem> = scenarios.iter().filter(|s| s.split == Split::Test).collect();
    if a.scenario_limit > 0 {
        // The first `scenario_limit` of each scenario-variant, in file order (deterministic).
        let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
        items.retain(|s| {
            let n = seen.entry((s.scenario.clone(), s.variant.clone())).or_default();
            *n += 1;
            *n <= a.scenario_limit
        });
    }
    let preds = knowrl_eval::greedy_answers(
        &policy,
        &items.iter().map(|s| Prompt::user(prompts::with_context(&s.question, &s.context))).collect::<Vec<_>>(),
        ANSWER_TOKENS,
    )?;
    let mut table: BTreeMap<String, (usize, usize, usize, usize)> = BTreeMap::new();
    for (s, p) in items.iter().zip(&preds) {
        let ok = exact_match(p, &s.golden_answers) as usize;
        let e = table.entry(format!("{}-{}", s.scenario, s.variant)).or_default();
        e.0 += ok;
        e.1 += 1;
        if s.pk_answerable {
            e.2 += ok;
            e.3 += 1;
        }
    }
    let rate = |x: usize, n: usize| if n == 0 { f64::NAN } else { x as f64 / n as f64 };
    let sum = |pfx: &str, pk: bool| {
        let (x, n) = table.iter().filter(|(k, _)| k.starts_with(pfx)).fold((0, 0), |(x, n), (_, v)| {
            if pk {
                (x + v.2, n + v.3)
            } else {
                (x + v.0, n + v.1)
            }
        });
        rate(x, n)
    };
    report.insert("s1_em".into(), json!(sum("S1-", false)));
    let pk_qa = |scenario: &str| {
        let v = table.get(&format!("{scenario}-qa")).copied().unwrap_or_default();
        json!(rate(v.2, v.3))
    };
    report.insert("s2_pk_em".into(), pk_qa("S2"));
    // The same counterfactuals stated plainly (no made-up source): no target, a check that
    // context dominance does not hang on the source's wording.
    report.insert("s2p_pk_em".into(), pk_qa("S2p"));
    let scen: Value = table
        .iter()
        .map(|(k, v)| (k.clone(), json!({"em": rate(v.0, v.1), "n": v.1, "pk_em": rate(v.2, v.3), "pk_n": v.3})))
        .collect::<serde_json::Map<_, _>>()
        .into();

    let retriever = world_retriever(&a.world)?;
    let world: knowrl_world::world::World =
        serde_json::from_str(&std::fs::read_to_string(a.world.join("world.json"))?)?;
    let subject_of = |fact: usize| world.facts[fact].subject;
    let name_of = |e: usize| world.entity(e).name.clone();
    // First-hop query: the question (h_0); later hops: the bridge entity, as the agent searches it.
    let recall = |hop: usize| -> Result<f64> {
        let qs: Vec<&Question> = test.iter().copied().filter(|q| q.hops > hop).collect();
        let queries: Vec<String> =
            qs.iter().map(|q| if hop == 0 { q.question.clone() } else { name_of(subject_of(q.chain[hop])) }).collect();
        let res = retriever.search(&queries, 3)?;
        Ok(qs
            .iter()
            .zip(&res)
            .filter(|(q, hits)| hits.iter().any(|h| h.id == format!("e{}", subject_of(q.chain[hop]))))
            .count() as f64
            / qs.len().max(1) as f64)
    };
    report.insert("retriever_recall3_hop1".into(), json!(recall(0)?));
    report.insert("retriever_recall3_hop2".into(), json!(recall(1)?));

    // The agent (greedy, up to 4 turns, top-3).
    let mut agent_qs: Vec<&Question> = test.clone();
    if a.limit > 0 && agent_qs.len() > a.limit {
        let mut rng = Rng::new(5);
        for i in (1..agent_qs.len()).rev() {
            agent_qs.swap(i, rng.below(i + 1));
        }
        agent_qs.truncate(a.limit);
    }
    let cfg = AgentConfig::new(4, 3, 48, 0.0);
    let trajs = knowrl_eval::agent_trajectories(
        &policy,
        &retriever,
        &agent_qs,
        |q| Prompt::user(prompts::agent(&q.question)),
        &cfg,
    )?;
    let agent_rows: Vec<(&Question, bool, usize)> =
        agent_qs.iter().zip(&trajs).map(|(q, t)| (*q, t.is_correct(&q.golden_answers), t.tool_calls())).collect();
    let pk: Vec<_> = agent_rows.iter().filter(|r| r.0.pk_answerable).collect();
    report.insert(
        "agent_pk_search_rate".into(),
        json!(pk.iter().filter(|r| r.2 > 0).count() as f64 / pk.len().max(1) as f64),
    );
    let em_hops = |h: usize| {
        let v: Vec<_> = agent_rows.iter().filter(|r| r.0.hops == h).collect();
        v.iter().filter(|r| r.1).count() as f64 / v.len().max(1) as f64
    };
    report.insert("agent_2hop_em".into(), json!(em_hops(2)));
    let n = agent_rows.len().max(1) as f64;
    let mut agent = json!({
        "n": agent_rows.len(), "em": agent_rows.iter().filter(|r| r.1).count() as f64 / n,
        "em_1hop": em_hops(1), "em_2hop": em_hops(2), "em_3hop": em_hops(3),
        "tool_calls_per_question": agent_rows.iter().map(|r| r.2).sum::<usize>() as f64 / n,
        "over_search_rate": agent_rows.iter().filter(|r| r.2 > r.0.min_searches).count() as f64 / n,
        "under_search_rate": agent_rows.iter().filter(|r| r.2 < r.0.min_searches).count() as f64 / n,
    });
    // Where wrong answers first go wrong, per hop count: the subject not searched, its passage
    // not retrieved, or the answer misread (knowrl_world::diagnose).
    let mut funnel: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for (r, t) in agent_rows.iter().zip(&trajs) {
        let results = diagnose::results_text(&t.text);
        let o = diagnose::outcome(&world, r.0, &t.queries, &t.retrieved_ids, &results, t.answer.as_deref(), r.1);
        *funnel.entry(format!("{}hop", r.0.hops)).or_default().entry(o.key()).or_default() += 1;
    }
    agent["outcomes"] = json!(funnel);
    let (unseen, unseen_n) = unseen_world_s1(&policy, &a.world)?;
    report.insert("unseen_world_s1_em".into(), json!(unseen));
    report.insert("unseen_world_s1_n".into(), json!(unseen_n));
    if a.explore_samples > 1 {
        let (agent_share, context_share) =
            mixed_group_shares(&policy, &retriever, &questions, &scenarios, a.explore_samples, &mut report)?;
        report.insert("mixed_group_share_agent".into(), json!(agent_share));
        report.insert("mixed_group_share_context".into(), json!(context_share));
    }
    report.insert("scenarios".into(), scen.clone());
    report.insert("agent".into(), agent.clone());
    report.insert("seconds".into(), json!(t0.elapsed().as_secs_f64()));

    println!("| scenario | EM | n | EM (PK-answerable) | n |\n|---|---|---|---|---|");
    for (k, v) in scen.as_object().unwrap() {
        println!(
            "| {k} | {:.3} | {} | {:.3} | {} |",
            v["em"].as_f64().unwrap_or(f64::NAN),
            v["n"],
            v["pk_em"].as_f64().unwrap_or(f64::NAN),
            v["pk_n"]
        );
    }
    println!(
        "\nagent (test split): {}",
        json!({"em": agent["em"], "em_1hop": agent["em_1hop"],
        "em_2hop": agent["em_2hop"], "em_3hop": agent["em_3hop"], "tool_calls_per_question": agent["tool_calls_per_question"]})
    );
    for (hops, counts) in &funnel {
        let row: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("  {hops}: {}", row.join(", "));
    }
    println!("\ncalibration:");
    for k in [
        "pk_query_only_em",
        "nonpk_query_only_em",
        "s1_em",
        "s2_pk_em",
        "s2p_pk_em",
        "agent_pk_search_rate",
        "agent_2hop_em",
        "retriever_recall3_hop1",
        "retriever_recall3_hop2",
        "unseen_world_s1_em",
        "mixed_group_share_agent",
        "mixed_group_share_context",
        "mixed_group_share_context_bound",
        "mixed_group_share_joint",
    ] {
        // The explore shares are absent when `--explore-samples 0` skips them.
        if let Some(v) = report.get(k) {
            println!("  {k:<24} {:.3}", v.as_f64().unwrap_or(f64::NAN));
        }
    }
    if let Some(out) = a.out {
        if let Some(d) = out.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&out, serde_json::to_string_pretty(&Value::Object(report))?)?;
        println!("wrote {}", out.display());
    }
    eprintln!("evaluated in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
