//! `knowrl reproduce <method>`: the paper's comparison on the world at an equal budget — the
//! method vs its baseline over several seeds, plus ablation rows — printed in the paper's table
//! layout and written to `bench/results/reproduce-<method>.json` with a Markdown report and SVG
//! plots. A benchmark, not a test: minutes to an hour on 2 CPU cores.
use crate::train::train_with_progress;
use anyhow::Result;
use knowrl_eval::data::{questions, scenario_items};
use knowrl_eval::plot::bar_svg;
use knowrl_eval::{AgentReport, ScenarioReport};
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_rl::akbe::{Category, Signals};
use knowrl_rl::config::{Algorithm, MethodConfig, TrainConfig};
use knowrl_rl::knowledgeable_r1::Beta;
use knowrl_rl::method::StepMetrics;
use knowrl_rl::task::Prompt;
use knowrl_run::load;
use knowrl_world::questions::Split;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The method section of a paper's preset (its arms change it).
macro_rules! section {
    ($f:ident, $variant:ident, $t:ty) => {
        fn $f(c: &mut TrainConfig) -> &mut $t {
            match &mut c.method {
                MethodConfig::$variant(m) => m,
                other => panic!("the preset's method is {}, not {}", other.name(), stringify!($f)),
            }
        }
    };
}
section!(kr1_of, KnowledgeableR1, knowrl_rl::knowledgeable_r1::KnowledgeableR1Config);
section!(akbe_of, Akbe, knowrl_rl::akbe::AkbeConfig);
section!(bridge_of, Bridge, knowrl_rl::bridge::BridgeConfig);

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Knowledgeable-R1 vs GRPO with RAG on S1–S5 (Tables 2–4 layout).
    #[command(name = "knowledgeable-r1")]
    KnowledgeableR1(Args),
    /// GRPO(+AKBE) and DAPO(+AKBE) on the agent suite (Tables 1–3 layout).
    Akbe(Args),
    /// BRIDGE vs GRPO with a fixed retriever, §4.2 pipelines and estimator fidelity.
    Bridge(Args),
}

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Base training config (the method's world config).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seeds for the main rows.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Seeds for the ablation rows (0 = skip them).
    #[arg(long, default_value_t = 1)]
    pub ablation_seeds: u64,
    /// Training steps per run (default: the config's).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Test items per scenario/suite (0 = all of the test split).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// Where the JSON goes (the Markdown report and SVGs go beside it).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(c: Cmd) -> Result<()> {
    match c {
        Cmd::KnowledgeableR1(a) => knowledgeable_r1(a),
        Cmd::Akbe(a) => akbe(a),
        Cmd::Bridge(a) => bridge(a),
    }
}

/// One row of a comparison: a label and the config change that makes it.
struct Arm {
    label: &'static str,
    ablation: bool,
    edit: Box<dyn Fn(&mut TrainConfig)>,
}

fn arm(label: &'static str, ablation: bool, edit: impl Fn(&mut TrainConfig) + 'static) -> Arm {
    Arm { label, ablation, edit: Box::new(edit) }
}

fn base_config(a: &Args, default: &str) -> Result<TrainConfig> {
    let path = a.config.clone().unwrap_or_else(|| PathBuf::from(default));
    let mut cfg = TrainConfig::load(&path)?;
    if let Some(s) = a.steps {
        cfg.run.steps = s;
    }
    cfg.run.checkpoint_every = 0;
    Ok(cfg)
}

/// Evaluates a trained run: its policy, its retriever (BRIDGE adapts it) and its step metrics.
type Evaluate<'a, T> = &'a dyn Fn(&knowrl_engine::Policy, &DenseRetriever, &[StepMetrics]) -> Result<T>;

/// A row: its label, one evaluation per seed, and mean seconds per step per seed.
type Row<T> = (String, Vec<T>, Vec<f64>);

/// Trains every arm for its seeds and evaluates each result with `eval`.
fn run_arms<T>(base: &TrainConfig, arms: &[Arm], a: &Args, method: &str, eval: Evaluate<T>) -> Result<Vec<Row<T>>> {
    let mut out = vec![];
    for arm in arms {
        let seeds = if arm.ablation { a.ablation_seeds } else { a.seeds };
        let (mut evals, mut step_s) = (vec![], vec![]);
        for seed in 1..=seeds {
            let mut cfg = base.clone();
            cfg.run.seed = seed;
            (arm.edit)(&mut cfg);
            cfg.run.out_dir = PathBuf::from(format!("runs/reproduce-{method}/{}-seed{seed}", slug(arm.label)));
            cfg.validate().map_err(anyhow::Error::msg)?;
            let policy = load(&cfg)?;
            let retriever = knowrl_run::retriever(&cfg)?;
            let m = train_with_progress(&policy, &retriever, &cfg, false, &format!("{} seed {seed}", arm.label))?;
            step_s.push(m.iter().map(|x| x.step_s).sum::<f64>() / m.len().max(1) as f64);
            let dense =
                retriever.dense().ok_or_else(|| anyhow::anyhow!("reproduce runs on the world's dense retriever"))?;
            evals.push(eval(&policy, dense, &m)?);
            eprintln!("{}: seed {seed} done", arm.label);
        }
        if seeds > 0 {
            out.push((arm.label.to_string(), evals, step_s));
        }
    }
    Ok(out)
}

fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

/// Mean and sample std.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let s = if v.len() > 1 { (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, s)
}

fn cell(v: &[f64], scale: f64) -> String {
    let (m, s) = mean_std(&v.iter().map(|x| x * scale).collect::<Vec<_>>());
    if v.len() > 1 {
        format!("{m:.1} ± {s:.1}")
    } else {
        format!("{m:.1}")
    }
}

fn sample<T: Clone>(v: Vec<T>, limit: usize) -> Vec<T> {
    if limit == 0 || v.len() <= limit {
        return v;
    }
    let mut rng = knowrl_engine::Rng::new(11);
    let mut v = v;
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v.truncate(limit);
    v
}

fn write_outputs(out: &std::path::Path, json: &Value, markdown: &str, svgs: &[(String, String)]) -> Result<()> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d)?;
    }
    knowrl_engine::fsutil::write_atomic(out, serde_json::to_string_pretty(json)?.as_bytes())?;
    let md = out.with_extension("md");
    knowrl_engine::fsutil::write_atomic(&md, markdown.as_bytes())?;
    for (name, svg) in svgs {
        knowrl_engine::fsutil::write_atomic(&out.with_file_name(name), svg.as_bytes())?;
    }
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}

// ---------------------------------------------------------------- Knowledgeable-R1

fn knowledgeable_r1(a: Args) -> Result<()> {
    let base = base_config(&a, "configs/world-knowledgeable-r1.toml")?;
    let world = base.data.world.clone();
    let all = ["S1", "S2", "S3", "S4", "S5"].map(String::from).to_vec();
    let items = sample(scenario_items(&world, Split::Test, &all).map_err(anyhow::Error::msg)?, a.limit);
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
        // GRPO with RAG at the same number of samples per question: all n from p′, plain group advantages.
        arm("GRPO w/ RAG", false, move |c| {
            kr1_of(c).n_pk = 0;
            kr1_of(c).n_ck = n;
            kr1_of(c).ck_global = false;
        }),
        arm("Knowledgeable-R1", false, |_| {}),
        arm("w/o J_PK", true, |c| kr1_of(c).lambda_pk = 0.0),
        arm("w/o J_RPK", true, |c| kr1_of(c).lambda_rpk = 0.0),
        arm("w/o A_ck-local", true, |c| kr1_of(c).ck_local = false),
        arm("w/o A_ck-global", true, |c| kr1_of(c).ck_global = false),
        arm("fixed β = 0.5", true, |c| kr1_of(c).beta = Beta::Fixed),
    ];
    let t0 = std::time::Instant::now();
    let policy = load(&base)?;
    let baselines = vec![
        ("Query-only prompting".to_string(), vec![knowrl_eval::scenarios(&policy, &refs, query_only)?], vec![]),
        ("RAG prompting".to_string(), vec![knowrl_eval::scenarios(&policy, &refs, rag)?], vec![]),
    ];
    let trained =
        run_arms(&base, &arms, &a, "knowledgeable-r1", &|p, _, _| Ok(knowrl_eval::scenarios(p, &refs, rag)?))?;
    let rows: Vec<Row<ScenarioReport>> = baselines.into_iter().chain(trained).collect();

    let scen = ["S1", "S2", "S3", "S4", "S5"];
    let classes = ["TITE", "TIFE", "FITE", "FIFE"];
    let col = |r: &[ScenarioReport], f: &dyn Fn(&ScenarioReport) -> f64| -> Vec<f64> { r.iter().map(f).collect() };
    let mut md = String::from("# Knowledgeable-R1 on the world (test split, greedy, EM %)\n\n");
    md += &format!(
        "Base config {}; {} steps per run; main rows {} seeds, ablations {} (mean ± std).\n\n",
        a.config.as_ref().map_or("configs/world-knowledgeable-r1.toml".into(), |p| p.display().to_string()),
        base.run.steps,
        a.seeds,
        a.ablation_seeds
    );
    md += "## Table 2 layout: scenarios (all variants)\n\n| method | S1 | S2 | S3 | S4 | S5 | S2 follows context | s/step |\n|---|---|---|---|---|---|---|---|\n";
    let mut table = serde_json::Map::new();
    for (label, r, step_s) in &rows {
        let mut cells = vec![];
        let mut j = serde_json::Map::new();
        for s in scen {
            let v = col(r, &|x| x.overall.get(s).map_or(f64::NAN, |c| c.rate()));
            cells.push(cell(&v, 100.0));
            j.insert(s.into(), json!(v.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
        }
        let follow = col(r, &|x| x.follows_context.get("S2").map_or(f64::NAN, |c| c.rate()));
        j.insert("S2_follows_context".into(), json!(follow.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
        let mut pk = vec![];
        for s in scen {
            let v = col(r, &|x| {
                let (c, n) = x
                    .pk_em
                    .iter()
                    .filter(|(k, _)| k.starts_with(s))
                    .fold((0, 0), |a, (_, c)| (a.0 + c.correct, a.1 + c.n));
                if n == 0 {
                    f64::NAN
                } else {
                    c as f64 / n as f64
                }
            });
            j.insert(format!("{s}_pk"), json!(v.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
            pk.push(v);
        }
        for c in classes {
            let v = col(r, &|x| x.knowledge.get(c).map_or(f64::NAN, |k| k.rate()));
            j.insert(c.into(), json!(v.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
        }
        j.insert("step_s".into(), json!(step_s));
        table.insert(label.clone(), Value::Object(j));
        md += &format!(
            "| {label} | {} | {} | {} |\n",
            cells.join(" | "),
            cell(&follow, 100.0),
            if step_s.is_empty() { "–".into() } else { format!("{:.2}", mean_std(step_s).0) }
        );
    }
    md +=
        "\n## Table 3 layout: PK-answerable subset\n\n| method | S1 | S2 | S3 | S4 | S5 |\n|---|---|---|---|---|---|\n";
    for (label, _, _) in &rows {
        let j = &table[label];
        let cells: Vec<String> = scen.iter().map(|s| cell(&to_vec(&j[format!("{s}_pk")]), 1.0)).collect();
        md += &format!("| {label} | {} |\n", cells.join(" | "));
    }
    md += "\n## Table 4 layout: parametric (T/F I) × contextual (T/F E) knowledge\n\n| method | TITE | TIFE | FITE | FIFE |\n|---|---|---|---|---|\n";
    for (label, _, _) in &rows {
        let j = &table[label];
        let cells: Vec<String> = classes.iter().map(|c| cell(&to_vec(&j[*c]), 1.0)).collect();
        md += &format!("| {label} | {} |\n", cells.join(" | "));
    }
    let mean_of = |label: &str, key: &str| table.get(label).map_or(f64::NAN, |v| mean_std(&to_vec(&v[key])).0);
    let s2_gain = mean_of("Knowledgeable-R1", "S2") - mean_of("GRPO w/ RAG", "S2");
    let s1_delta = mean_of("Knowledgeable-R1", "S1") - mean_of("GRPO w/ RAG", "S1");
    md += &format!(
        "\nKnowledgeable-R1 − GRPO w/ RAG: **S2 {s2_gain:+.1} points** (goal ≥ +10), **S1 {s1_delta:+.1} points** (goal ≥ −2). Total {:.0} s.\n",
        t0.elapsed().as_secs_f64()
    );
    println!("{md}");
    let series: Vec<(String, Vec<f64>)> =
        rows.iter().map(|(l, _, _)| (l.clone(), scen.iter().map(|s| mean_of(l, s)).collect())).collect();
    let svg = bar_svg("EM by scenario (test split)", &scen.map(String::from), &series);
    md += "\n![EM by scenario](reproduce-knowledgeable-r1-scenarios.svg)\n";
    let json = json!({
        "s2_gain_vs_grpo": s2_gain, "s1_delta_vs_grpo": s1_delta,
        "steps": base.run.steps, "seeds": a.seeds, "ablation_seeds": a.ablation_seeds,
        "test_items": items.len(), "seconds": t0.elapsed().as_secs_f64(), "tables": table,
        "config": base,
    });
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("bench/results/reproduce-knowledgeable-r1.json"));
    write_outputs(&out, &json, &md, &[("reproduce-knowledgeable-r1-scenarios.svg".into(), svg)])
}

fn to_vec(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect()).unwrap_or_default()
}

// ---------------------------------------------------------------- AKBE

fn akbe(a: Args) -> Result<()> {
    let base = base_config(&a, "configs/world-akbe.toml")?;
    let world = base.data.world.clone();
    let qs = sample(questions(&world, Split::Test).map_err(anyhow::Error::msg)?, a.limit);
    let refs: Vec<&knowrl_world::questions::Question> = qs.iter().collect();
    let retriever = knowrl_run::world_retriever(&world)?;
    let r = &base.rollout;
    let agent_cfg = r.agent(0.0);
    let eval = |p: &knowrl_engine::Policy| -> Result<AgentReport> {
        Ok(knowrl_eval::agent(
            p,
            &retriever,
            &refs,
            |q| Prompt::user(knowrl_world::prompts::agent(&q.question)),
            &agent_cfg,
        )?)
    };
    let plain = |c: &mut TrainConfig| {
        // The base algorithm alone, at AKBE's with-tool group size.
        c.rollout.group_size = akbe_of(c).n_wt;
        c.method = MethodConfig::default();
    };
    let dapo = |c: &mut TrainConfig| {
        c.algorithm.name = Algorithm::Dapo;
        c.algorithm.clip_high = 0.28;
    };
    let only = |cats: &'static [Category]| move |c: &mut TrainConfig| akbe_of(c).categories = cats.to_vec();
    use Category::*;
    let arms = vec![
        arm("GRPO", false, plain),
        arm("GRPO + AKBE", false, |_| {}),
        arm("DAPO", false, move |c| {
            plain(c);
            dapo(c)
        }),
        arm("DAPO + AKBE", false, dapo),
        arm("w/o Tool-dependent", true, only(&[Efficiency, Hallucination])),
        arm("w/o Efficiency", true, only(&[ToolDependent, Hallucination])),
        arm("w/o Hallucination", true, only(&[ToolDependent, Efficiency])),
        arm("w/ Tool-dependent only", true, only(&[ToolDependent])),
        // The paper's offline variant: signals from a fixed GRPO-trained checkpoint (this seed's
        // GRPO row, trained above), not from the starting policy.
        arm("Offline AKBE (GRPO checkpoint)", true, |c| {
            let ckpt = PathBuf::from(format!("runs/reproduce-akbe/{}-seed{}/checkpoints", slug("GRPO"), c.run.seed));
            let a = akbe_of(c);
            a.signals = Signals::Offline;
            a.signals_checkpoint = Some(ckpt);
        }),
        arm("AKBE, DPO variant (Appendix C)", true, |c| akbe_of(c).objective = knowrl_rl::akbe::Objective::Dpo),
        arm("GRPO + OTC reward", true, move |c| {
            plain(c);
            c.reward.tool_productivity = true;
        }),
        arm("AKBE, with-tool teacher prompt", true, |c| {
            akbe_of(c).teacher_prompt = knowrl_rl::akbe::TeacherPrompt::WithTool
        }),
    ];
    let t0 = std::time::Instant::now();
    let policy = load(&base)?;
    let before = eval(&policy)?;
    let trained = run_arms(&base, &arms, &a, "akbe", &|p, _, _| eval(p))?;
    let rows: Vec<Row<AgentReport>> =
        std::iter::once(("Pretrained policy".to_string(), vec![before], vec![])).chain(trained).collect();
    let mut table = serde_json::Map::new();
    let mut md = String::from("# AKBE on the world's agent suite (test split, greedy)\n\n");
    md += &format!(
        "{} steps per run; main rows {} seeds, ablations {} (mean ± std). EM in %, TC = tool calls per question, TP = EM / TC.\n\n",
        base.run.steps, a.seeds, a.ablation_seeds
    );
    md += "| method | EM | 1-hop | 2-hop | 3-hop | TC | TP | boundary acc. | over-search | under-search | s/step |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (label, r, step_s) in &rows {
        let f = |g: &dyn Fn(&AgentReport) -> f64| -> Vec<f64> { r.iter().map(g).collect() };
        let hop = |h: &'static str| f(&move |x| x.em_by_hops.get(h).copied().unwrap_or(f64::NAN));
        let cols = [
            ("em", f(&|x| x.em), 100.0),
            ("em_1hop", hop("1"), 100.0),
            ("em_2hop", hop("2"), 100.0),
            ("em_3hop", hop("3"), 100.0),
        ];
        let mut j = serde_json::Map::new();
        let mut cells = vec![];
        for (k, v, s) in &cols {
            cells.push(cell(v, *s));
            j.insert(k.to_string(), json!(v.iter().map(|x| x * s).collect::<Vec<_>>()));
        }
        let tc = f(&|x| x.tc);
        let tp = f(&|x| x.tp);
        let (mean_tc, sd_tc) = mean_std(&tc);
        cells.push(format!("{mean_tc:.2} ± {sd_tc:.2}"));
        cells.push(cell(&tp, 1.0));
        for (k, v) in [
            ("boundary_accuracy", f(&|x| x.boundary_accuracy)),
            ("over_search", f(&|x| x.over_search_rate)),
            ("under_search", f(&|x| x.under_search_rate)),
        ] {
            cells.push(cell(&v, 100.0));
            j.insert(k.into(), json!(v.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
        }
        j.insert("tc".into(), json!(tc));
        j.insert("tp".into(), json!(tp));
        j.insert("step_s".into(), json!(step_s));
        cells.push(if step_s.is_empty() { "–".into() } else { format!("{:.2}", mean_std(step_s).0) });
        md += &format!("| {label} | {} |\n", cells.join(" | "));
        table.insert(label.clone(), Value::Object(j));
    }
    let m = |label: &str, key: &str| table.get(label).map_or(f64::NAN, |v| mean_std(&to_vec(&v[key])).0);
    let tc_ratio = m("GRPO + AKBE", "tc") / m("GRPO", "tc");
    let em_delta = m("GRPO + AKBE", "em") - m("GRPO", "em");
    let tp_ratio = m("GRPO + AKBE", "tp") / m("GRPO", "tp");
    let time_ratio = m("GRPO + AKBE", "step_s") / m("GRPO", "step_s");
    md += &format!(
        "\nGRPO + AKBE vs GRPO: **TC × {tc_ratio:.2}** (goal ≤ 0.85), **EM {em_delta:+.1} points** (goal ≥ −0.5), **TP × {tp_ratio:.2}** (goal ≥ 1.15), time per step × {time_ratio:.2}. Total {:.0} s.\n",
        t0.elapsed().as_secs_f64()
    );
    println!("{md}");
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let series = vec![
        ("EM (%)".to_string(), labels.iter().map(|l| m(l, "em")).collect()),
        ("TC × 10".to_string(), labels.iter().map(|l| m(l, "tc") * 10.0).collect()),
        ("TP".to_string(), labels.iter().map(|l| m(l, "tp")).collect()),
    ];
    let short: Vec<String> = labels.iter().map(|l| l.replace(" + AKBE", "+A").chars().take(14).collect()).collect();
    let svg = bar_svg("AKBE: EM, tool calls, tool productivity", &short, &series);
    md += "\n![EM, TC, TP](reproduce-akbe.svg)\n";
    let json = json!({
        "tc_ratio_vs_grpo": tc_ratio, "em_delta_vs_grpo": em_delta, "tp_ratio_vs_grpo": tp_ratio,
        "step_time_ratio_vs_grpo": time_ratio, "steps": base.run.steps, "seeds": a.seeds,
        "ablation_seeds": a.ablation_seeds, "test_questions": qs.len(), "seconds": t0.elapsed().as_secs_f64(),
        "tables": table, "config": base,
    });
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("bench/results/reproduce-akbe.json"));
    write_outputs(&out, &json, &md, &[("reproduce-akbe.svg".into(), svg)])
}

// ---------------------------------------------------------------- BRIDGE

/// What one BRIDGE-family run is judged on.
struct BridgeEval {
    agent: AgentReport,
    /// EM on 2- and 3-hop questions pooled.
    multihop_em: f64,
    /// Needed passages found by the queries the policy issued (top-m).
    recall: f64,
    /// Means over the run's retriever updates (seconds, peak-RSS bytes above the baseline).
    update_s: f64,
    update_peak: f64,
    update_state: f64,
    /// Means of the estimator-fidelity metrics (two-state runs).
    fidelity: Vec<(String, f64)>,
}

/// Mean of a per-step metric over the steps that recorded a finite value.
fn mean_extra(m: &[StepMetrics], key: &str) -> f64 {
    let v: Vec<f64> = m.iter().filter_map(|x| x.extra.get(key).copied()).filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn bridge(a: Args) -> Result<()> {
    use knowrl_rl::bridge::{Estimator, Pipeline};
    let base = base_config(&a, "configs/world-bridge.toml")?;
    let world = base.data.world.clone();
    let qs = sample(questions(&world, Split::Test).map_err(anyhow::Error::msg)?, a.limit);
    let refs: Vec<&knowrl_world::questions::Question> = qs.iter().collect();
    let gold = knowrl_eval::data::gold_passages(&world, &refs).map_err(anyhow::Error::msg)?;
    let r = &base.rollout;
    let agent_cfg = r.agent(0.0);
    let multihop: Vec<usize> = (0..refs.len()).filter(|&i| refs[i].hops >= 2).collect();
    let eval = |p: &knowrl_engine::Policy, ret: &DenseRetriever, m: &[StepMetrics]| -> Result<BridgeEval> {
        let prompt = |q: &knowrl_world::questions::Question| Prompt::user(knowrl_world::prompts::agent(&q.question));
        let trajs = knowrl_eval::agent_trajectories(p, ret, &refs, prompt, &agent_cfg)?;
        let report = knowrl_eval::score_trajectories(&refs, &trajs);
        let ok = |i: usize| trajs[i].is_correct(&refs[i].golden_answers);
        let fidelity = ["fidelity_cos_bridge", "fidelity_cos_drop", "fidelity_relerr_bridge", "fidelity_relerr_drop"]
            .iter()
            .map(|k| (k.to_string(), mean_extra(m, k)))
            .collect();
        Ok(BridgeEval {
            agent: report,
            multihop_em: multihop.iter().filter(|&&i| ok(i)).count() as f64 / multihop.len().max(1) as f64,
            recall: knowrl_eval::issued_query_recall(&gold, &trajs),
            update_s: mean_extra(m, "retriever_update_s"),
            update_peak: mean_extra(m, "retriever_update_peak_bytes"),
            update_state: mean_extra(m, "retriever_state_bytes"),
            fidelity,
        })
    };
    let steps = base.run.steps;
    let phase = (steps / 2).max(1);
    let pipeline = |p: Pipeline| move |c: &mut TrainConfig| bridge_of(c).pipeline = p;
    let arms = vec![
        arm("GRPO (fixed retriever)", false, pipeline(Pipeline::Fixed)),
        arm("BRIDGE", false, |_| {}),
        // Sequential pipelines get the retriever phase on top of the same policy RL budget.
        arm("RAG-then-RL", true, move |c| {
            bridge_of(c).pipeline = Pipeline::RagThenRl;
            bridge_of(c).phase_steps = phase;
            c.run.steps = steps + phase;
        }),
        arm("RL-then-RAG", true, move |c| {
            bridge_of(c).pipeline = Pipeline::RlThenRag;
            bridge_of(c).phase_steps = phase;
            c.run.steps = steps + phase;
        }),
        arm("Decoupled-RL", true, pipeline(Pipeline::DecoupledRl)),
        arm("Decoupled-RAG", true, pipeline(Pipeline::DecoupledRag)),
        // Estimator rows measure fidelity, time and memory per retriever update: a few steps each
        // (their policy-side RAG terms teacher-force every candidate of every turn with gradients,
        // ~10x a BRIDGE step), so their EM is not a like-for-like training comparison.
        arm("BRIDGE, Drop estimator (6 steps)", true, move |c| {
            bridge_of(c).estimator = Estimator::Drop;
            c.run.steps = steps.min(6);
        }),
        arm("BRIDGE, two-state estimator (6 steps)", true, move |c| {
            bridge_of(c).estimator = Estimator::TwoState;
            bridge_of(c).fidelity_every = 2;
            c.run.steps = steps.min(6);
        }),
    ];
    let t0 = std::time::Instant::now();
    let policy = load(&base)?;
    let fixed = knowrl_run::retriever(&base)?;
    let before = eval(&policy, fixed.dense().expect("the world's retriever is dense"), &[])?;
    let trained = run_arms(&base, &arms, &a, "bridge", &eval)?;
    let rows: Vec<Row<BridgeEval>> =
        std::iter::once(("Pretrained policy".to_string(), vec![before], vec![])).chain(trained).collect();
    let mut table = serde_json::Map::new();
    let mut md = String::from("# BRIDGE on the world's agent suite (test split, greedy)\n\n");
    md += &format!(
        "{steps} policy steps per run; main rows {} seeds, ablations {} (mean ± std). EM in %; recall = needed passages among the top-m results of the policy's own queries.\n\n",
        a.seeds, a.ablation_seeds
    );
    md += "| method | EM | 1-hop | 2-hop | 3-hop | multi-hop | recall@m | TC | s/step |\n|---|---|---|---|---|---|---|---|---|\n";
    for (label, r, step_s) in &rows {
        let f = |g: &dyn Fn(&BridgeEval) -> f64| -> Vec<f64> { r.iter().map(g).collect() };
        let hop = |h: &'static str| f(&move |x| x.agent.em_by_hops.get(h).copied().unwrap_or(f64::NAN));
        let cols: Vec<(&str, Vec<f64>)> = vec![
            ("em", f(&|x| x.agent.em)),
            ("em_1hop", hop("1")),
            ("em_2hop", hop("2")),
            ("em_3hop", hop("3")),
            ("multihop_em", f(&|x| x.multihop_em)),
            ("recall", f(&|x| x.recall)),
        ];
        let mut j = serde_json::Map::new();
        let mut cells = vec![];
        for (k, v) in &cols {
            cells.push(cell(v, 100.0));
            j.insert(k.to_string(), json!(v.iter().map(|x| x * 100.0).collect::<Vec<_>>()));
        }
        let tc = f(&|x| x.agent.tc);
        cells.push(format!("{:.2}", mean_std(&tc).0));
        cells.push(if step_s.is_empty() { "–".into() } else { format!("{:.2}", mean_std(step_s).0) });
        j.insert("tc".into(), json!(tc));
        j.insert("step_s".into(), json!(step_s));
        j.insert("update_s".into(), json!(f(&|x| x.update_s)));
        j.insert("update_peak_bytes".into(), json!(f(&|x| x.update_peak)));
        j.insert("update_state_bytes".into(), json!(f(&|x| x.update_state)));
        for (k, _) in &r[0].fidelity {
            j.insert(k.clone(), json!(f(&|x| x.fidelity.iter().find(|(n, _)| n == k).map_or(f64::NAN, |p| p.1))));
        }
        md += &format!("| {label} | {} |\n", cells.join(" | "));
        table.insert(label.clone(), Value::Object(j));
    }
    let m = |label: &str, key: &str| table.get(label).map_or(f64::NAN, |v| mean_std(&to_vec(&v[key])).0);
    let gain = m("BRIDGE", "multihop_em") - m("GRPO (fixed retriever)", "multihop_em");
    let recall_gain = m("BRIDGE", "recall") - m("GRPO (fixed retriever)", "recall");
    let two = "BRIDGE, two-state estimator (6 steps)";
    let mem_ratio = m("BRIDGE", "update_state_bytes") / m(two, "update_state_bytes");
    let rss_ratio = m("BRIDGE", "update_peak_bytes") / m(two, "update_peak_bytes");
    let time_ratio = m("BRIDGE", "update_s") / m(two, "update_s");
    md += &format!(
        "\n## Estimator fidelity (vs the two-state estimator, on the two-state run's batches; cosine over those with an RL gradient)\n\n| estimator | cosine | relative error |\n|---|---|---|\n| BRIDGE | {:.3} | {:.3} |\n| Drop | {:.3} | {:.3} |\n",
        m(two, "fidelity_cos_bridge"), m(two, "fidelity_relerr_bridge"), m(two, "fidelity_cos_drop"), m(two, "fidelity_relerr_drop")
    );
    md += &format!(
        "\n## Retriever update cost\n\n| run | s / update | state held (KB) | peak RSS above baseline (MB) |\n|---|---|---|---|\n| BRIDGE (single state) | {:.3} | {:.1} | {:.2} |\n| two-state | {:.3} | {:.1} | {:.2} |\n\nState held = adapter values + gradients + Adam moments (+ the second state and its ρ for two-state) + retrieval logs. The RSS peak is measured (VmHWM reset per update) but on the world's 96-d encoder the update allocates less than the allocator's granularity, so the state bytes are the comparable figure here.\n",
        m("BRIDGE", "update_s"), m("BRIDGE", "update_state_bytes") / 1e3, m("BRIDGE", "update_peak_bytes") / 1e6,
        m(two, "update_s"), m(two, "update_state_bytes") / 1e3, m(two, "update_peak_bytes") / 1e6
    );
    md += &format!(
        "\nBRIDGE vs GRPO with the fixed retriever: **multi-hop EM {gain:+.1} points** (goal ≥ +3), recall@m {recall_gain:+.1} points; retriever update memory × {mem_ratio:.2} of two-state (goal ≤ 0.6), time × {time_ratio:.2}. Total {:.0} s.\n",
        t0.elapsed().as_secs_f64()
    );
    println!("{md}");
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let series = vec![
        ("multi-hop EM (%)".to_string(), labels.iter().map(|l| m(l, "multihop_em")).collect()),
        ("recall@m (%)".to_string(), labels.iter().map(|l| m(l, "recall")).collect()),
    ];
    let short: Vec<String> = labels.iter().map(|l| l.chars().take(14).collect()).collect();
    let svg = bar_svg("BRIDGE: multi-hop EM and recall of needed passages", &short, &series);
    md += "\n![multi-hop EM and recall](reproduce-bridge.svg)\n";
    let json = json!({
        "multihop_em_gain_vs_grpo": gain, "recall_gain_vs_grpo": recall_gain,
        "update_memory_ratio_vs_two_state": mem_ratio, "update_rss_ratio_vs_two_state": rss_ratio, "update_time_ratio_vs_two_state": time_ratio,
        "steps": steps, "seeds": a.seeds, "ablation_seeds": a.ablation_seeds, "test_questions": qs.len(),
        "seconds": t0.elapsed().as_secs_f64(), "tables": table, "config": base,
    });
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("bench/results/reproduce-bridge.json"));
    write_outputs(&out, &json, &md, &[("reproduce-bridge.svg".into(), svg)])
}
