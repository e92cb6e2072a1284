//! `knowrl train --config FILE`: RL of a policy on the world with one of the methods (GRPO /
//! DAPO / GSPO on the agent loop, Knowledgeable-R1 on context items, AKBE on the agent loop),
//! with a progress bar; the run itself is composed by `knowrl_run`.
//! Metrics per step go to `<out_dir>/metrics.jsonl`, checkpoints to
//! `<out_dir>/checkpoints/step-N`; `--resume` continues from the latest checkpoint exactly.
//! Data parallel: under torchrun's environment the process is one rank of several, and
//! `--nproc N` starts N local ranks of the same command itself (`launch`).
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
    /// Start N local ranks of this command (data parallel over gloo on loopback; torchrun's
    /// RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are set for each). Pair with the global
    /// `--threads` to give each rank its share of the cores.
    #[arg(long, value_name = "N")]
    pub nproc: Option<usize>,
    /// Seconds the ranks wait for each other (at the rendezvous and in every collective)
    /// before giving up with an error; rank 0's periodic evaluation must fit in it.
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub dist_timeout: u64,
}

use knowrl_dist::ProcessGroup;
use knowrl_run::{load, retriever, SearchTool};

/// Trains with a progress bar; returns the metrics of the steps run.
pub fn train_with_progress(
    policy: &Policy,
    retriever: &SearchTool,
    cfg: &TrainConfig,
    resume: bool,
    label: &str,
) -> Result<Vec<StepMetrics>> {
    train_ranked(policy, retriever, cfg, resume, label, None)
}

/// [`train_with_progress`] as one rank of `group` (the bar is rank 0's alone).
fn train_ranked(
    policy: &Policy,
    retriever: &SearchTool,
    cfg: &TrainConfig,
    resume: bool,
    label: &str,
    group: Option<&ProcessGroup>,
) -> Result<Vec<StepMetrics>> {
    let lead = group.is_none_or(|g| g.rank() == 0);
    let bar = if lead { ProgressBar::new(cfg.run.steps) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}").unwrap());
    bar.set_prefix(label.to_string());
    let metrics = knowrl_run::train(policy, retriever, cfg, resume, group, &|m| {
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
    if let Some(n) = a.nproc {
        return launch(n);
    }
    let mut cfg = TrainConfig::load(&a.config)?;
    a.device.apply(&mut cfg.model);
    cfg.validate()
        .map_err(|e| knowrl_rl::config::ConfigError(format!("{} with the flags: {e}", a.config.display())))?;
    let ranks = knowrl_dist::Rendezvous::from_env()?.filter(|r| r.world_size > 1);
    if let Some(r) = &ranks {
        // Decided before the rendezvous, which picks NCCL for CUDA runs.
        if cfg.model.device == "auto" {
            cfg.model.device = if tch::Cuda::is_available() { "cuda" } else { "cpu" }.into();
        }
        let own = format!("cuda:{}", r.local_rank);
        anyhow::ensure!(
            !cfg.model.device.starts_with("cuda:") || cfg.model.device == own,
            "model.device = {:?} under data parallel: each rank uses its own GPU; write \"cuda\" (rank {} is on {own})",
            cfg.model.device,
            r.rank
        );
    }
    let group = knowrl_run::join_ranks(&cfg, std::time::Duration::from_secs(a.dist_timeout))?;
    if let (Some(g), Some(r)) = (&group, &ranks) {
        let backend = if cfg.model.device.starts_with("cuda") { "NCCL" } else { "gloo" };
        if g.rank() == 0 {
            eprintln!("data parallel: {} ranks over {backend}", g.size());
        }
        // One GPU per local rank: `cuda` means this rank's.
        if cfg.model.device == "cuda" {
            cfg.model.device = format!("cuda:{}", r.local_rank);
        }
    }
    let policy = load(&cfg)?;
    let retriever = retriever(&cfg)?;
    let metrics = train_ranked(&policy, &retriever, &cfg, a.resume, "train", group.as_ref())?;
    if group.as_ref().is_some_and(|g| g.rank() != 0) {
        return Ok(());
    }
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

/// `--nproc N`: this same command line (without `--nproc`) as N child processes on loopback,
/// with torchrun's variables set. Returns once all exited; the first rank to fail decides the
/// exit status, and ranks still running after it are stopped once they had time to see the
/// failure (they normally exit with it on their own, at their next collective).
fn launch(n: usize) -> Result<()> {
    anyhow::ensure!(n >= 1, "--nproc: at least 1 rank");
    let port = knowrl_dist::free_port()?;
    let exe = std::env::current_exe()?;
    let mut args: Vec<String> = vec![];
    let mut skip = false;
    for arg in std::env::args().skip(1) {
        if std::mem::take(&mut skip) {
            continue;
        }
        if arg == "--nproc" {
            skip = true;
        } else if !arg.starts_with("--nproc=") {
            args.push(arg);
        }
    }
    let mut ranks = Ranks(vec![]);
    for rank in 0..n {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        // A rank dies with the launcher (killed by a scheduler, Ctrl-C), never trains on alone.
        // SAFETY: prctl is async-signal-safe and touches only the child being started.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        ranks.0.push(cmd.spawn()?);
    }
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; n];
    let mut failed: Option<(usize, std::time::Instant)> = None;
    while status.iter().any(Option::is_none) {
        for (rank, child) in ranks.0.iter_mut().enumerate() {
            if status[rank].is_none() {
                if let Some(s) = child.try_wait()? {
                    status[rank] = Some(s);
                    if !s.success() && failed.is_none() {
                        failed = Some((rank, std::time::Instant::now()));
                    }
                }
            }
        }
        if failed.is_some_and(|(_, at)| at.elapsed() > std::time::Duration::from_secs(30)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    match failed {
        Some((rank, _)) => {
            let all: Vec<String> = status
                .iter()
                .enumerate()
                .map(|(r, s)| format!("rank {r}: {}", s.map_or("stopped".into(), |s| s.to_string())))
                .collect();
            anyhow::bail!("rank {rank} of {n} failed first; the run stopped ({})", all.join(", "))
        }
        None => Ok(()),
    }
}

/// The launched ranks; any still running when the launcher returns (an error, a straggler
/// after another rank failed) are killed.
struct Ranks(Vec<std::process::Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
