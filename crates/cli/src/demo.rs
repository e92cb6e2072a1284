//! `knowrl demo`: the main job on the embedded default: evaluate the world's shipped policy on
//! the context scenarios S1–S5 and the agent suite (assets/world), then a generation smoke test
//! on the real SmolLM2-135M-Instruct (fetched by `make models`). The RL runs join it with the
//! training issues.
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
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("KNOWRL_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".cache/knowrl/models")
    })
}

pub fn run(a: Args) -> Result<()> {
    let t0 = std::time::Instant::now();
    if a.world.join("policy/model.safetensors").exists() {
        println!("== the world: {} (pretrained policy, greedy, test split) ==", a.world.display());
        crate::world_eval::run(crate::world::EvalArgs { world: a.world.clone(), out: None, limit: 0 })?;
    } else {
        println!("{}: no pretrained policy; run `knowrl world build` and `knowrl world pretrain`", a.world.display());
    }
    println!("\n== real model smoke test ==");
    let model = a.model.unwrap_or_else(|| models_dir().join("smollm2-135m-instruct"));
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
