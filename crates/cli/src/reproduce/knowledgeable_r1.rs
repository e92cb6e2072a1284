//! `knowrl reproduce knowledgeable-r1`: Knowledgeable-R1 vs GRPO with RAG on S1–S5 (and S2p) and the ablations, in the layouts of Tables 2–4.
use super::*;
use knowrl_eval::data::scenario_items;
use knowrl_eval::plot::bar_svg;
use knowrl_eval::ScenarioReport;
use knowrl_rl::knowledgeable_r1::Beta;
use knowrl_rl::task::Prompt;
use knowrl_world::questions::Split;
use knowrl_world::suites::{ScenarioItem, SCENARIOS};
use serde_json::json;

/// Seconds per step on 2 cores (8 questions × 8 one-turn answers; world v2, AMD EPYC, measured
/// 24.9 in bench/results/world-v2-speed.json), for the first estimate.
const KR1_STEP_S: f64 = 25.0;
const M: &str = "knowledgeable-r1";
/// The scenarios whose context states an answer (S3's states two, S4's none).
const MEMORY_SCENARIOS: [&str; 4] = ["S1", "S2", "S2p", "S5"];

/// The test items: all of them, or under `--limit` a sample of the paper's five scenarios (the
/// same sample as before S2p existed) plus the S2p twin of each sampled S2 item, so that S2 and
/// S2p are compared on the same questions.
fn test_items(all: Vec<ScenarioItem>, limit: usize) -> Vec<ScenarioItem> {
    if limit == 0 {
        return all;
    }
    let (plain, paper): (Vec<ScenarioItem>, Vec<ScenarioItem>) = all.into_iter().partition(|s| s.scenario == "S2p");
    let mut items = sample(paper, limit);
    let twin_of = |p: &ScenarioItem| {
        items.iter().any(|s| s.scenario == "S2" && s.question_id == p.question_id && s.variant == p.variant)
    };
    let twins: Vec<ScenarioItem> = plain.into_iter().filter(twin_of).collect();
    items.extend(twins);
    items
}

pub fn run(a: Args) -> Result<()> {
    let base = base_config(&a, "configs/world-knowledgeable-r1.toml")?;
    let world = base.data.world.clone();
    let all = SCENARIOS.map(String::from).to_vec();
    let items = test_items(scenario_items(&world, Split::Test, &all).map_err(anyhow::Error::msg)?, a.limit);
    let refs: Vec<&knowrl_world::suites::ScenarioItem> = items.iter().collect();
    let rag = |s: &knowrl_world::suites::ScenarioItem| {
        Prompt::user(knowrl_world::prompts::with_context(&s.question, &s.context))
    };
    let query_only =
        |s: &knowrl_world::suites::ScenarioItem| Prompt::user(knowrl_world::prompts::query_only(&s.question));
    let n = {
        let mut b = base.clone();
        let k = kr1_of(&mut b);
        k.n_pk + k.n_ck
    };
    let arms = vec![
        // Step costs relative to Knowledgeable-R1's, measured at 48 steps on an Intel Xeon (2
        // cores, seed 1): GRPO w/ RAG 3.6 s vs 17.2 (one prompt, no RPK scoring), w/o J_PK 9.9,
        // w/o J_RPK 12.5, the other ablations 15–17.
        // GRPO with RAG at the same number of samples per question: all n from p′, plain group advantages.
        arm("GRPO w/ RAG", false, move |c| {
            kr1_of(c).n_pk = 0;
            kr1_of(c).n_ck = n;
            kr1_of(c).ck_global = false;
        })
        .costing(0.2),
        arm("Knowledgeable-R1", false, |_| {}),
        arm("w/o J_PK", true, |c| kr1_of(c).lambda_pk = 0.0).costing(0.6),
        arm("w/o J_RPK", true, |c| kr1_of(c).lambda_rpk = 0.0).costing(0.7),
        arm("w/o A_ck-local", true, |c| kr1_of(c).ck_local = false),
        arm("w/o A_ck-global", true, |c| kr1_of(c).ck_global = false),
        arm("fixed β = 0.5", true, |c| kr1_of(c).beta = Beta::Fixed),
    ];
    let t0 = std::time::Instant::now();
    let policy = load(&base)?;
    let (trained, arms_json) = run_arms(&base, &arms, &a, M, KR1_STEP_S, &|p, _, _| {
        Ok(knowrl_eval::scenarios_vs_memory(p, &refs, rag, query_only)?)
    })?;
    let baselines = vec![
        (
            "Query-only prompting".to_string(),
            vec![untrained(M, "Query-only prompting", &a, || Ok(knowrl_eval::scenarios(&policy, &refs, query_only)?))?],
            vec![],
        ),
        (
            "RAG prompting".to_string(),
            vec![untrained(M, "RAG prompting", &a, || {
                Ok(knowrl_eval::scenarios_vs_memory(&policy, &refs, rag, query_only)?)
            })?],
            vec![],
        ),
    ];
    let rows: Vec<Row<ScenarioReport>> = baselines.into_iter().chain(trained).collect();

    let scen = SCENARIOS;
    let classes = ["TITE", "TIFE", "FITE", "FIFE"];
    let mut md = String::from("# Knowledgeable-R1 on the world (test split, greedy, EM %)\n\n");
    md += &format!(
        "Base config {}; {} steps per run; main rows {} seeds, ablations {} (mean ± std).\n\n",
        a.config.as_ref().map_or("configs/world-knowledgeable-r1.toml".into(), |p| p.display().to_string()),
        base.run.steps,
        a.seeds,
        a.ablation_seeds
    );
    let pct = |k: &str, h: &'static str| col(k, h, 100.0, 1);
    let mut scenarios = Table::new(
        scen.iter()
            .map(|s| pct(s, s))
            .chain([
                pct("S2_follows_context", "S2 follows context"),
                pct("S2p_follows_context", "S2p follows context"),
                col("step_s", "s/step", 1.0, 2),
            ])
            .collect(),
    );
    let mut pk_subset = Table::new(scen.iter().map(|s| pct(&format!("{s}_pk"), s)).collect());
    let mut knowledge = Table::new(classes.iter().map(|c| pct(c, c)).collect());
    // Why S1 moves: how often the answer is the policy's own query-only one where that differs
    // from what the context states (rows evaluated before this diagnostic show NaN).
    let mut memory =
        Table::new(MEMORY_SCENARIOS.iter().map(|s| col(&format!("{s}_memory"), s, 100.0, 1)).collect::<Vec<_>>());
    for (label, r, step_s) in &rows {
        if label != "Query-only prompting" {
            memory.push(
                label,
                MEMORY_SCENARIOS
                    .iter()
                    .map(|s| r.iter().map(|x| x.follows_memory.get(*s).map_or(f64::NAN, |c| c.rate())).collect())
                    .collect(),
            );
        }
        let per_scenario = |f: &dyn Fn(&ScenarioReport, &str) -> f64| -> Vec<Vec<f64>> {
            scen.iter().map(|s| r.iter().map(|x| f(x, s)).collect()).collect()
        };
        let mut values = per_scenario(&|x, s| x.overall.get(s).map_or(f64::NAN, |c| c.rate()));
        for s in ["S2", "S2p"] {
            values.push(r.iter().map(|x| x.follows_context.get(s).map_or(f64::NAN, |c| c.rate())).collect());
        }
        values.push(step_s.clone());
        scenarios.push(label, values);
        // PK-answerable items of every variant of a scenario, pooled.
        pk_subset.push(
            label,
            per_scenario(&|x, s| {
                let (c, n) = x
                    .pk_em
                    .iter()
                    .filter(|(k, _)| k.starts_with(&format!("{s}-")))
                    .fold((0, 0), |a, (_, c)| (a.0 + c.correct, a.1 + c.n));
                if n == 0 {
                    f64::NAN
                } else {
                    c as f64 / n as f64
                }
            }),
        );
        knowledge.push(
            label,
            classes
                .iter()
                .map(|c| r.iter().map(|x| x.knowledge.get(*c).map_or(f64::NAN, |k| k.rate())).collect())
                .collect(),
        );
    }
    md += "## Table 2 layout: scenarios (all variants)\n\n";
    md += "S2p is not one of the paper's scenarios: S2's items with each counterfactual passage stated plainly, as ConFiQA states them, where the world's S2 passages cite a made-up source.\n\n";
    md += &scenarios.markdown();
    md += "\n## Table 3 layout: PK-answerable subset\n\n";
    md += &pk_subset.markdown();
    md += "\n## Table 4 layout: parametric (T/F I) × contextual (T/F E) knowledge\n\n";
    md += &knowledge.markdown();
    md += "\n## Diagnostic: answers from memory against the context\n\n";
    md += "Share of items answered with the policy's own query-only answer, over those whose query-only answer is non-empty and differs from what the context states. On S1 that memory is wrong (the context is right); on S2 and S2p it resists a counterfactual context; S5's context mixes the gold passages with distractors.\n\n";
    md += &memory.markdown();
    let mut table = serde_json::Map::new();
    for t in [&scenarios, &pk_subset, &knowledge, &memory] {
        t.json_into(&mut table);
    }
    let mean_of = |label: &str, key: &str| scenarios.mean(label, key);
    let s2_gain = mean_of("Knowledgeable-R1", "S2") - mean_of("GRPO w/ RAG", "S2");
    let s1_delta = mean_of("Knowledgeable-R1", "S1") - mean_of("GRPO w/ RAG", "S1");
    // The same gain where the counterfactual does not cite a made-up source (ConFiQA's wording).
    let s2p_gain = mean_of("Knowledgeable-R1", "S2p") - mean_of("GRPO w/ RAG", "S2p");
    let (wall, wall_json) = wall_line(&arms_json, t0);
    md += "\n";
    md += &scenarios.headline("Knowledgeable-R1 − GRPO w/ RAG", &["GRPO w/ RAG", "Knowledgeable-R1"], || {
        format!(
            "**S2 {s2_gain:+.1} points** (goal ≥ +10), **S1 {s1_delta:+.1} points** (goal ≥ −2); \
             S2p (the counterfactuals stated plainly, no made-up source) {s2p_gain:+.1} points."
        )
    });
    md += &format!(" {wall}\n");
    println!("{md}");
    let series: Vec<(String, Vec<f64>)> =
        rows.iter().map(|(l, _, _)| (l.clone(), scen.iter().map(|s| mean_of(l, s)).collect())).collect();
    let svg = bar_svg("EM by scenario (test split)", &scen.map(String::from), &series);
    let json = json!({
        "s2_gain_vs_grpo": s2_gain, "s1_delta_vs_grpo": s1_delta, "s2_plain_gain_vs_grpo": s2p_gain,
        "steps": base.run.steps, "seeds": a.seeds, "ablation_seeds": a.ablation_seeds,
        "test_items": items.len(), "seconds": wall_json["seconds"], "sitting_seconds": wall_json["sitting_seconds"], "tables": table,
        "config": base,
        "arms": arms_json,
    });
    let out = out_path(&a, M);
    write_outputs(&out, &json, &md, &[Figure { suffix: "-scenarios", alt: "EM by scenario", svg }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_sample_keeps_the_paper_scenarios_draw_and_pairs_s2p_with_s2() {
        let world = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world");
        let all = scenario_items(&world, Split::Test, &SCENARIOS.map(String::from)).unwrap();
        let paper: Vec<ScenarioItem> = all.iter().filter(|s| s.scenario != "S2p").cloned().collect();
        assert_eq!(test_items(all.clone(), 0).len(), all.len());
        let items = test_items(all, 40);
        let ids = |v: &[ScenarioItem]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&items[..40]), ids(&sample(paper, 40)), "the paper scenarios' sample changed");
        let twins = |name: &str| {
            let mut v: Vec<_> =
                items.iter().filter(|s| s.scenario == name).map(|s| (&s.question_id, &s.variant)).collect();
            v.sort();
            v
        };
        let (s2, s2p) = (twins("S2"), twins("S2p"));
        assert!(!s2.is_empty());
        assert_eq!(s2p, s2, "every sampled S2 item and only those has its S2p twin");
    }
}
