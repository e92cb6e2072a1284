//! `knowrl train --config FILE`: RL (GRPO / DAPO / GSPO) of a policy on the world's agent
//! suite. Metrics per step go to `<out_dir>/metrics.jsonl`, checkpoints to
//! `<out_dir>/checkpoints/step-N`; `--resume` continues from the latest checkpoint exactly.
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use knowrl_engine::{LoadOptions, Policy};
use knowrl_rl::config::TrainConfig;
use knowrl_rl::trainer::{train, Task};
use knowrl_world::questions::{Question, Split};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Training config (TOML; see crates/rl/src/config.rs for every field).
    #[arg(long)]
    pub config: PathBuf,
    /// Continue from the latest checkpoint in the run's out_dir.
    #[arg(long)]
    pub resume: bool,
    /// Export the trained policy as a plain HF directory here at the end.
    #[arg(long)]
    pub export: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let cfg = TrainConfig::load(&a.config).map_err(|e| anyhow::anyhow!(e))?;
    let policy = Policy::load(&cfg.model.path, &LoadOptions { lora: cfg.model.lora.clone(), ..Default::default() })
        .with_context(|| format!("loading {}", cfg.model.path.display()))?;
    let questions: Vec<Question> = crate::world_eval::load_jsonl(&cfg.data.world.join("questions.jsonl"))?;
    let tasks: Vec<Task> = questions
        .into_iter()
        .filter(|q| q.split == Split::Train)
        .map(|q| Task { user: knowrl_world::prompts::agent(&q.question), golden: q.golden_answers })
        .collect();
    let retriever = crate::world_eval::world_retriever(&cfg.data.world)?;
    let bar = ProgressBar::new(cfg.run.steps);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}").unwrap());
    let metrics = train(&policy, &tasks, &retriever, &cfg, a.resume, &|m| {
        bar.set_position(m.step + 1);
        bar.set_message(format!(
            "reward {:.3} tools {:.2} kl {:.4} {:.1}s/step",
            m.reward, m.tool_calls, m.kl, m.step_s
        ));
    })?;
    bar.finish();
    if let Some(out) = a.export {
        policy.export_hf(&out, tch::Kind::Float)?;
        println!("exported {}", out.display());
    }
    println!("{} steps; metrics in {}", metrics.len(), cfg.run.out_dir.join("metrics.jsonl").display());
    Ok(())
}
