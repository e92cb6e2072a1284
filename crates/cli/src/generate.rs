//! `knowrl generate`: batched generation from an HF model directory.
use anyhow::{Context, Result};
use knowrl_engine::device::parse_placement;
use knowrl_engine::generate::generate;
use knowrl_engine::{LoadOptions, Message, Policy, SamplingParams};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// A user message, rendered with the model's chat template (repeatable: one row each).
    #[arg(long)]
    pub chat: Vec<String>,
    /// A raw prompt, no template (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Optional system message for --chat prompts.
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Stop strings (repeatable), e.g. --stop '</search>'.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Seed of the first row; row i uses seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Print JSON lines (text, tokens, log-probs, finish reason) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let (device, dtype) = parse_placement(&a.device, &a.dtype)?;
    let opts = LoadOptions { device, dtype, lora: None, seed: 0 };
    let policy = Policy::load(&a.model, &opts).with_context(|| format!("loading {}", a.model.display()))?;
    let tok = policy.tokenizer()?;
    let mut prompts = vec![];
    for c in &a.chat {
        let mut msgs = vec![];
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", c));
        prompts.push(tok.encode(&tok.apply_chat_template(&msgs, true)?, false)?);
    }
    for p in &a.prompt {
        prompts.push(tok.encode(p, false)?);
    }
    anyhow::ensure!(!prompts.is_empty(), "give at least one --chat or --prompt");
    let params = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        max_new_tokens: a.max_new_tokens,
        stop: a.stop.clone(),
    };
    let seeds: Vec<u64> = (0..prompts.len() as u64).map(|i| a.seed + i).collect();
    let t0 = std::time::Instant::now();
    let gens = generate(&policy.lm, Some(tok), &prompts, &params, &seeds, &tok.eos_ids, tok.pad_id)?;
    let secs = t0.elapsed().as_secs_f64();
    let n: usize = gens.iter().map(|g| g.tokens.len()).sum();
    for g in &gens {
        let text = tok.decode(&g.tokens, true)?;
        if a.json {
            let j = serde_json::json!({"text": text, "tokens": g.tokens, "logprobs": g.logprobs, "finish": g.finish});
            println!("{j}");
        } else {
            println!("{}", text.trim_end());
            println!("---");
        }
    }
    eprintln!("{n} tokens in {secs:.2}s ({:.1} tok/s)", n as f64 / secs);
    Ok(())
}
