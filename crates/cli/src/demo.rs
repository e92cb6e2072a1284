//! `knowrl demo`: the main job on the embedded default: evaluate the world's shipped policy on
//! the context scenarios S1–S5 and S2p and the agent suite (assets/world), train it briefly with GRPO
//! on the agent suite and show the validation split before/after, then a generation smoke test
//! on the base model, SmolLM2-135M-Instruct (fetched by `make models`).
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory (default: $KNOWRL_MODELS/smollm2-135m-instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// World directory with the pretrained policy and retriever.
    #[arg(long, default_value = "assets/world")]
    pub world: PathBuf,
    /// GRPO steps of the demo run (0 = skip). The other settings are configs/world-grpo.toml's.
    #[arg(long, default_value_t = DEMO_STEPS)]
    pub grpo_steps: u64,
    /// Test questions of the agent evaluation (a third as many items per scenario-variant;
    /// 0 = the whole test split: `knowrl world eval`).
    #[arg(long, default_value_t = 48)]
    pub eval_limit: usize,
    /// Seed of the GRPO run (default: configs/world-grpo.toml's); the demo's seed benchmark runs 1, 2, 3.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Only the GRPO run with its before/after validation (no world evaluation, no generation).
    #[arg(long)]
    pub grpo_only: bool,
}

/// Steps of the demo's GRPO run. The reproductions' baseline stops at 8
/// (bench/results/baseline-sweep.md); at 8 steps seed 3 of the demo's seed benchmark ended where
/// it started (0.620), at 12 every seed gains (0.700 / 0.720 / 0.640, bench/results/demo-seeds.md).
const DEMO_STEPS: u64 = 12;

/// A short GRPO run from configs/world-grpo.toml; agent EM / TC on the validation split before and after.
fn grpo_before_after(world: &std::path::Path, steps: u64, seed: Option<u64>) -> Result<()> {
    use knowrl_rl::task::Prompt;
    let mut cfg = knowrl_rl::config::TrainConfig::load(std::path::Path::new("configs/world-grpo.toml"))?;
    cfg.run.steps = steps;
    cfg.run.seed = seed.unwrap_or(cfg.run.seed);
    println!("\n== GRPO on the world's agent suite ({} steps, seed {}) ==", cfg.run.steps, cfg.run.seed);
    cfg.run.out_dir = PathBuf::from("runs/demo-grpo");
    cfg.run.checkpoint_every = 0;
    // The trainer evaluates the whole validation split once, after the last step (eval.jsonl):
    // that row is the "after" figure, so the demo does not run the same greedy evaluation twice
    // (nor a mid-run one: ~40 s each on 2 cores).
    cfg.run.eval_every = cfg.run.steps;
    cfg.run.eval_limit = 0;
    cfg.model.path = world.join("policy");
    cfg.data.world = world.to_path_buf();
    let qs = knowrl_eval::data::questions(world, knowrl_world::questions::Split::Valid).map_err(anyhow::Error::msg)?;
    let refs: Vec<_> = qs.iter().collect();
    let policy = knowrl_run::load(&cfg)?;
    let retriever = knowrl_run::retriever(&cfg)?;
    let agent = cfg.rollout.agent(0.0);
    let prompt = |q: &knowrl_world::questions::Question| Prompt::user(knowrl_world::prompts::agent(&q.question));
    let figures = |r: &knowrl_eval::AgentReport| [r.em, r.tc, r.tp, r.boundary_accuracy];
    let before = figures(&knowrl_eval::agent(&policy, retriever.as_dyn(), &refs, prompt, &agent)?);
    let m = crate::train::train_with_progress(&policy, &retriever, &cfg, false, "GRPO")?;
    let after = match final_eval(&cfg.run.out_dir.join("eval.jsonl"), cfg.run.steps) {
        Some(row) => row,
        // The periodic evaluation failed (the trainer said why) or did not run: evaluate here.
        None => figures(&knowrl_eval::agent(&policy, retriever.as_dyn(), &refs, prompt, &agent)?),
    };
    println!(
        "| validation split ({} questions, greedy) | EM | TC | TP | boundary acc. |\n|---|---|---|---|---|",
        refs.len()
    );
    for (name, [em, tc, tp, boundary]) in [("pretrained", before), (&*format!("after {} GRPO steps", m.len()), after)] {
        println!("| {name} | {em:.3} | {tc:.2} | {tp:.1} | {boundary:.3} |");
    }
    println!("metrics: runs/demo-grpo/metrics.jsonl (`knowrl report runs/demo-grpo` for plots)");
    Ok(())
}

/// EM, TC, TP and boundary accuracy of the trainer's evaluation after `steps` steps.
fn final_eval(path: &std::path::Path, steps: u64) -> Option<[f64; 4]> {
    let text = std::fs::read_to_string(path).ok()?;
    let row: serde_json::Value = text.lines().rev().find_map(|l| serde_json::from_str(l).ok())?;
    let get = |k: &str| row[k].as_f64();
    (row["step"].as_u64() == Some(steps)).then_some(())?;
    // TP is NaN (null in JSON) when the policy never searched.
    Some([get("em")?, get("tc")?, get("tp").unwrap_or(f64::NAN), get("boundary_accuracy")?])
}

pub fn run(a: Args) -> Result<()> {
    let t0 = std::time::Instant::now();
    let policy = a.world.join("policy");
    let pretrained = policy.join("model.safetensors").exists() || knowrl_engine::adapter::is_adapter_dir(&policy);
    if a.grpo_only {
        anyhow::ensure!(pretrained, "{}: no pretrained policy", a.world.display());
        return grpo_before_after(&a.world, a.grpo_steps, a.seed);
    }
    if pretrained {
        println!("== the world: {} (pretrained policy, greedy, test split) ==", a.world.display());
        crate::world_eval::run(crate::world_eval::EvalArgs {
            world: a.world.clone(),
            out: None,
            limit: a.eval_limit,
            scenario_limit: a.eval_limit / 3,
            explore_samples: 0,
            device: Default::default(),
        })?;
        if a.grpo_steps != 0 {
            grpo_before_after(&a.world, a.grpo_steps, a.seed)?;
        }
    } else {
        println!("{}: no pretrained policy; run `knowrl world build` and `knowrl world pretrain`", a.world.display());
    }
    println!("\n== real model smoke test ==");
    let model = a.model.unwrap_or_else(|| knowrl_engine::adapter::models_dir().join("smollm2-135m-instruct"));
    anyhow::ensure!(
        model.join("config.json").exists(),
        "{} not found: run `make models` first (scripts/fetch-real-models)",
        model.display()
    );
    println!("knowrl demo: batched greedy generation with {}", model.display());
    let questions = [
        "What is the capital of France?",
        "What is the largest planet in the solar system?",
        "Who wrote Romeo and Juliet?",
        "What is 2 + 3?",
    ];
    crate::generate::run(crate::generate::Args {
        model,
        chat: questions.iter().map(|s| s.to_string()).collect(),
        prompt: vec![],
        system: None,
        max_new_tokens: 48,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        stop: vec![],
        seed: 0,
        device: "cpu".into(),
        dtype: "f32".into(),
        json: false,
    })
    .context("demo generation")?;
    println!("demo finished in {:.0}s", t0.elapsed().as_secs_f64());
    Ok(())
}
