//! `knowrl train --config FILE`: RL of a policy on the world with one of the methods (GRPO /
//! DAPO / GSPO on the agent loop, Knowledgeable-R1 on context items, AKBE on the agent loop),
//! with a progress bar; the run itself is composed by `knowrl_run`.
//! Metrics per step go to `<out_dir>/metrics.jsonl`, checkpoints to
//! `<out_dir>/checkpoints/step-N`; `--resume` continues from the latest checkpoint exactly.
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use knowrl_engine::Policy;
use knowrl_rl::config::TrainConfig;
use knowrl_rl::method::StepMetrics;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Training config (TOML; every field is documented in crates/rl/src/sections.rs and the method files).
    #[arg(long)]
    pub config: PathBuf,
    /// Continue from the latest checkpoint in the run's out_dir.
    #[arg(long)]
    pub resume: bool,
    /// Export the trained policy as a plain HF directory here at the end (LoRA merged).
    #[arg(long)]
    pub export: Option<PathBuf>,
    /// Export the run's LoRA as a PEFT adapter directory here at the end (for `peft`, vLLM's
    /// LoRA loading, or `knowrl` itself); on the world policy it holds the knowledge adapter and
    /// the run's LoRA stacked, for the plain base. With `--resume` on a finished run it exports
    /// the latest checkpoint.
    #[arg(long)]
    pub export_adapter: Option<PathBuf>,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
}

use knowrl_run::{load, retriever, SearchTool};

/// Trains with a progress bar; returns the metrics of the steps run.
pub fn train_with_progress(
    policy: &Policy,
    retriever: &SearchTool,
    cfg: &TrainConfig,
    resume: bool,
    label: &str,
) -> Result<Vec<StepMetrics>> {
    let bar = ProgressBar::new(cfg.run.steps);
    bar.set_style(ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}").unwrap());
    bar.set_prefix(label.to_string());
    let metrics = knowrl_run::train(policy, retriever, cfg, resume, &|m| {
        bar.set_position(m.step + 1);
        bar.set_message(format!(
            "reward {:.3} tools {:.2} kl {:.4} {:.1}s/step",
            m.reward, m.tool_calls, m.kl, m.step_s
        ));
    })?;
    bar.finish_and_clear();
    Ok(metrics)
}

pub fn run(a: Args) -> Result<()> {
    let mut cfg = TrainConfig::load(&a.config)?;
    a.device.apply(&mut cfg.model);
    cfg.validate()
        .map_err(|e| knowrl_rl::config::ConfigError(format!("{} with the flags: {e}", a.config.display())))?;
    let policy = load(&cfg)?;
    let retriever = retriever(&cfg)?;
    let metrics = train_with_progress(&policy, &retriever, &cfg, a.resume, "train")?;
    if let Some(out) = a.export {
        policy.export_hf(&out, tch::Kind::Float)?;
        println!("exported {}", out.display());
    }
    if let Some(out) = a.export_adapter {
        policy.export_adapter(&out)?;
        println!("exported the LoRA as a PEFT adapter: {}", out.display());
    }
    if let (Some(first), Some(last)) = (metrics.first(), metrics.last()) {
        println!(
            "reward {:.3} -> {:.3}, tool calls {:.2} -> {:.2}",
            first.reward, last.reward, first.tool_calls, last.tool_calls
        );
    }
    println!("{} steps; metrics in {}", metrics.len(), cfg.run.out_dir.join("metrics.jsonl").display());
    Ok(())
}
