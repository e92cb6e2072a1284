//! `knowrl bench data-parallel`: the same GRPO steps as 1 process × 2 threads and as 2 ranks ×
//! 1 thread (`knowrl train --nproc 2`, gloo on loopback; NCCL with `--device cuda`), in one run
//! on one machine: seconds
//! per step, the gradient all-reduce's share of the step (and the time ranks wait for each
//! other before it), and how far the two runs' parameters end apart. Writes
//! bench/results/data-parallel.json.
use anyhow::{Context, Result};
use knowrl_rl::config::TrainConfig;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Training config to time (the world's GRPO run by default).
    #[arg(long, default_value = "configs/world-grpo.toml")]
    pub config: PathBuf,
    /// Steps per arm; the first is a warm-up and not counted.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Cores to share: the one process gets them all, each of the 2 ranks half.
    #[arg(long, default_value_t = 2)]
    pub cores: usize,
    #[arg(long, default_value = "bench/results/data-parallel.json")]
    pub out: PathBuf,
    /// `--device cuda`: the 2 ranks talk over NCCL, one GPU each (scripts/gpu-check, 2 GPUs).
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
}

/// The timed steps' mean of a metrics.jsonl figure (`extra.<name>` when not a top-level one;
/// NaN, i.e. null in the JSON, when the rows lack it: one process does no all-reduce).
fn mean_of(rows: &[Value], key: &str) -> f64 {
    let v: Vec<f64> = rows[1..].iter().filter_map(|r| r[key].as_f64().or_else(|| r["extra"][key].as_f64())).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

fn metrics(run: &Path) -> Result<Vec<Value>> {
    let file = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    text.lines().map(|l| Ok(serde_json::from_str(l)?)).collect()
}

fn last_params(run: &Path, steps: u64) -> Result<Vec<(String, tch::Tensor)>> {
    let file = run.join(format!("checkpoints/step-{steps:08}/params.safetensors"));
    let t = tch::Tensor::read_safetensors(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(knowrl_engine::weights::by_name(t))
}

pub fn run(a: Args) -> Result<()> {
    anyhow::ensure!(a.steps >= 2, "--steps must be at least 2 (the first is a warm-up)");
    anyhow::ensure!(a.cores >= 2 && a.cores.is_multiple_of(2), "--cores: an even number, at least 2");
    let scratch = std::env::temp_dir().join(format!("knowrl-bench-dp-{}", std::process::id()));
    let exe = std::env::current_exe()?;
    let mut arms = serde_json::Map::new();
    let mut runs = vec![];
    for (label, threads, nproc) in [("1 process", a.cores, 1usize), ("2 ranks", a.cores / 2, 2)] {
        let mut cfg = TrainConfig::load(&a.config)?;
        a.device.apply(&mut cfg.model);
        cfg.run.steps = a.steps;
        cfg.run.out_dir = scratch.join(label.replace(' ', "-"));
        (cfg.run.eval_every, cfg.run.checkpoint_every) = (0, a.steps);
        let file = scratch.join(format!("{}.toml", label.replace(' ', "-")));
        std::fs::create_dir_all(&scratch)?;
        std::fs::write(&file, toml::to_string(&cfg)?)?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["--threads", &threads.to_string(), "train", "--config", file.to_str().context("path")?]);
        if nproc > 1 {
            cmd.args(["--nproc", &nproc.to_string()]);
        }
        println!("{label} × {threads} thread(s): {} steps of {}", a.steps, a.config.display());
        let t0 = std::time::Instant::now();
        let st = cmd.env("OMP_NUM_THREADS", threads.to_string()).status()?;
        anyhow::ensure!(st.success(), "{label}: training failed ({st})");
        let wall = t0.elapsed().as_secs_f64();
        let rows = metrics(&cfg.run.out_dir)?;
        let step_s = mean_of(&rows, "step_s");
        let (reduce, wait) = (mean_of(&rows, "allreduce_s"), mean_of(&rows, "allreduce_wait_s"));
        if nproc > 1 {
            println!(
                "  {step_s:.2} s/step; all-reduce {reduce:.3} s ({:.1}% of the step), waiting for the slower rank {wait:.3} s",
                100.0 * reduce / step_s
            );
        } else {
            println!("  {step_s:.2} s/step");
        }
        arms.insert(
            label.into(),
            json!({
                "threads_per_process": threads, "processes": nproc, "step_s": step_s, "wall_s": wall,
                "rollout_s": mean_of(&rows, "rollout_s"), "update_s": mean_of(&rows, "update_s"),
                "allreduce_s": reduce, "allreduce_wait_s": wait, "allreduce_fraction": reduce / step_s,
                "rewards": rows.iter().map(|r| r["reward"].clone()).collect::<Vec<_>>(),
            }),
        );
        runs.push(cfg.run.out_dir.clone());
    }
    let (one, two) = (last_params(&runs[0], a.steps)?, last_params(&runs[1], a.steps)?);
    let max_diff = one
        .iter()
        .zip(&two)
        .map(|((_, x), (_, y))| (x - y).abs().max().to_kind(tch::Kind::Double).double_value(&[]))
        .fold(0.0, f64::max);
    let trainable: i64 = one.iter().map(|(_, t)| t.numel() as i64).sum();
    let ratio = arms["2 ranks"]["step_s"].as_f64().unwrap_or(f64::NAN)
        / arms["1 process"]["step_s"].as_f64().unwrap_or(f64::NAN);
    println!("2 ranks / 1 process: {ratio:.2}× the seconds per step; parameters apart by at most {max_diff:.2e}");
    let _ = std::fs::remove_dir_all(&scratch);
    let out = json!({
        "config": a.config, "steps_timed": a.steps - 1, "cores": a.cores, "device": a.device.device,
        "step_s_ratio_2_ranks_vs_1_process": ratio,
        "max_abs_param_diff": max_diff,
        "trainable_parameters": trainable,
        "gradient_bytes_per_update": trainable * 4,
        "arms": arms,
        "machine": crate::bench_env::machine(),
        "notes": "allreduce_s: the bucketed gradient all-reduce (25 MiB buckets) summed over the step's PPO updates; \
                  allreduce_wait_s: the barrier before it, i.e. the slower rank's lead",
    });
    crate::bench_env::write_result(&a.out, &out)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
