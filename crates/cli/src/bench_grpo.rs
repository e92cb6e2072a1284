//! `knowrl bench grpo`: one GRPO step (SmolLM2-135M-Instruct, 4 prompts × 8 samples, 64 new
//! tokens, CPU, same threads) through knowrl's trainer vs TRL's `GRPOTrainer`
//! (scripts/bench/trl_grpo.py), in one run, alternating processes; reports seconds per step, the
//! ratio, and where knowrl's time goes. Writes bench/results/grpo.json.
use anyhow::{Context, Result};
use knowrl_rl::config::TrainConfig;
use knowrl_rl::method::{NoTool, TrainEnv};
use knowrl_rl::task::{Prompt, Task};
use knowrl_rl::trainer::train;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory (default: $KNOWRL_MODELS/smollm2-135m-instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "bench/results/grpo.json")]
    pub out: PathBuf,
    /// Threads for both sides.
    #[arg(long, default_value_t = 2)]
    pub bench_threads: i32,
    /// Steps per process (the first is a warm-up and not counted).
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Alternating rounds of (knowrl, TRL) processes.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Both sides run here (TRL: `use_cpu` off on CUDA, `bf16` for bf16).
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
    /// Internal: run the knowrl side in this process and print JSON.
    #[arg(long, hide = true)]
    pub worker: bool,
}

const QUESTIONS: [(&str, &str); 4] = [
    ("What is the capital of France?", "paris"),
    ("Who wrote Romeo and Juliet?", "shakespeare"),
    ("What is the largest planet in the solar system?", "jupiter"),
    ("In which country is the city of Kyoto?", "japan"),
];

fn config(model: &std::path::Path, steps: u64) -> Result<TrainConfig> {
    let text = format!(
        r#"
[model]
path = "{}"
[data]
world = "assets/world"
[rollout]
prompts_per_step = 4
group_size = 8
max_turns = 1
topk = 1
max_tokens_per_turn = 64
temperature = 1.0
[algorithm]
name = "grpo"
clip_low = 0.2
clip_high = 0.2
kl_coef = 0.0
aggregation = "token_mean"
normalisation = "mean_std"
# Same work as TRL: every row is scored and back-propagated, also those whose group rewards are
# all equal (knowrl skips them by default: same update, less compute).
skip_zero_advantage = false
[reward]
name = "em"
[optim]
lr = 1e-6
weight_decay = 0.0
max_grad_norm = 1.0
# TRL's per_device_train_batch_size = 32: the whole batch in one forward and backward.
micro_batch = 32
[run]
steps = {steps}
seed = 0
out_dir = "{}"
checkpoint_every = 0
"#,
        model.display(),
        std::env::temp_dir().join(format!("knowrl-bench-grpo-{}", std::process::id())).display()
    );
    Ok(toml::from_str(&text)?)
}

fn worker(model: &std::path::Path, steps: u64, device: &crate::device_args::DeviceArgs) -> Result<Value> {
    let mut cfg = config(model, steps)?;
    device.apply(&mut cfg.model);
    let policy = knowrl_run::load(&cfg)?;
    // The same 4 questions every step (the trainer draws them at random: cycle them 4 at a time).
    let tasks: Vec<Task> = QUESTIONS
        .iter()
        .map(|(q, a)| Task {
            id: q.to_string(),
            golden: vec![a.to_string()],
            agent: Prompt::user(*q),
            ..Default::default()
        })
        .collect();
    let env = TrainEnv { policy: &policy, reference: None, retriever: &NoTool, dense: None, group: None };
    let m = train(&env, &tasks, &cfg, false, &|_| {})?;
    let _ = std::fs::remove_dir_all(&cfg.run.out_dir);
    let timed = &m[1.min(m.len() - 1)..];
    let mean =
        |f: &dyn Fn(&knowrl_rl::method::StepMetrics) -> f64| timed.iter().map(f).sum::<f64>() / timed.len() as f64;
    Ok(json!({
        // Mean, not median: completions differ in length from step to step, and a step's time
        // follows them.
        "seconds_per_step": mean(&|x| x.step_s),
        "all_steps": m.iter().map(|x| x.step_s).collect::<Vec<_>>(),
        "mean_completion_tokens": mean(&|x| x.response_len),
        "breakdown_s": {
            "generation": mean(&|x| x.rollout_s),
            "scoring": mean(&|x| x.extra["score_s"]),
            "backward": mean(&|x| x.extra["backward_s"]),
            "optimiser_and_rest": mean(&|x| x.update_s - x.extra["score_s"] - x.extra["backward_s"]),
            "retrieval": 0.0,
        },
    }))
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.clone().unwrap_or_else(|| knowrl_engine::adapter::models_dir().join("smollm2-135m-instruct"));
    anyhow::ensure!(model.join("config.json").exists(), "{} not found: run `make models`", model.display());
    if a.worker {
        tch::set_num_threads(a.bench_threads);
        println!("{}", worker(&model, a.steps, &a.device)?);
        return Ok(());
    }
    let python = a.python.clone().unwrap_or_else(|| PathBuf::from(".venv/bin/python"));
    let exe = std::env::current_exe()?;
    let device = a.device.device.clone().unwrap_or_else(|| "cpu".into());
    let dtype = a.device.dtype.clone().unwrap_or_else(|| "f32".into());
    let (mut ours, mut trl) = (vec![], vec![]);
    for round in 0..a.rounds {
        eprintln!("round {}/{}: knowrl", round + 1, a.rounds);
        let out = std::process::Command::new(&exe)
            .args([
                "bench",
                "grpo",
                "--worker",
                "--bench-threads",
                &a.bench_threads.to_string(),
                "--steps",
                &a.steps.to_string(),
            ])
            .arg("--model")
            .arg(&model)
            .args(["--device", &device, "--dtype", &dtype])
            .output()?;
        anyhow::ensure!(out.status.success(), "knowrl worker failed: {}", String::from_utf8_lossy(&out.stderr));
        ours.push(serde_json::from_slice::<Value>(out.stdout.trim_ascii()).context("knowrl worker output")?);
        eprintln!("round {}/{}: TRL GRPOTrainer", round + 1, a.rounds);
        let out = std::process::Command::new(&python)
            .arg("scripts/bench/trl_grpo.py")
            .arg(&model)
            .args([a.steps.to_string(), a.bench_threads.to_string(), device.clone(), dtype.clone()])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "TRL side failed (install it with `scripts/setup --bench`): {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
        let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").to_string();
        trl.push(serde_json::from_str::<Value>(&line).context("TRL output")?);
    }
    // The median round (of two, the slower), as an index so its breakdown goes with its time.
    let median = |v: &[Value]| {
        let mut i: Vec<usize> = (0..v.len()).collect();
        i.sort_by(|&a, &b| v[a]["seconds_per_step"].as_f64().partial_cmp(&v[b]["seconds_per_step"].as_f64()).unwrap());
        i[i.len() / 2]
    };
    let (mk, mt) = (median(&ours), median(&trl));
    let seconds = |r: &Value| r["seconds_per_step"].as_f64().unwrap();
    let (k, t) = (seconds(&ours[mk]), seconds(&trl[mt]));
    // Each round's TRL time over the knowrl time measured just before it: a neighbour's load
    // that comes and goes shows as a spread here, not as a different headline.
    let per_round: Vec<f64> = ours.iter().zip(&trl).map(|(o, r)| seconds(r) / seconds(o)).collect();
    let result = json!({
        "trl_speedup": t / k,
        "trl_speedup_per_round": per_round,
        "knowrl_seconds_per_step": k,
        "trl_seconds_per_step": t,
        "knowrl_breakdown_s": ours[mk]["breakdown_s"],
        "setting": {"model": model.file_name().map(|s| s.to_string_lossy().to_string()), "prompts": 4, "samples_per_prompt": 8,
                    "max_new_tokens": 64, "temperature": 1.0, "kl": 0.0, "micro_batch": 32, "threads": a.bench_threads, "steps_per_process": a.steps,
                    "rounds": a.rounds, "device": device, "dtype": dtype},
        "knowrl": ours,
        "trl": trl,
        "machine": crate::bench_env::machine(),
    });
    crate::bench_env::write_result(&a.out, &result)?;
    println!(
        "GRPO step: knowrl {k:.2} s vs TRL {t:.2} s → {:.2}x (per round {}; breakdown {}); wrote {}",
        t / k,
        per_round.iter().map(|r| format!("{r:.2}x")).collect::<Vec<_>>().join(" "),
        ours[mk]["breakdown_s"],
        a.out.display()
    );
    Ok(())
}
