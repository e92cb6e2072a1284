//! `knowrl demo`: the main job on the embedded default. Until the synthetic world lands this is
//! a generation smoke test on the real SmolLM2-135M-Instruct (fetched by `make models`).
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory (default: $KNOWRL_MODELS/smollm2-135m-instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("KNOWRL_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".cache/knowrl/models")
    })
}

pub fn run(a: Args) -> Result<()> {
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
    .context("demo generation")
}
