//! `knowrl bench engine`: generation and training throughput of the engine, side by side in one
//! run with transformers' `generate` and a plain PyTorch training loop on the same model, the
//! same inputs and the same number of threads. Each measurement runs in its own process so
//! peak RSS is per task. Results: bench/results/engine.json.
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use knowrl_engine::generate::{generate, DecodeSession};
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{LoadOptions, Message, Mode, Policy, Rng, SamplingParams};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::Kind;

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Engine: batched generation (f32, bf16) vs transformers; training step vs PyTorch.
    Engine(EngineArgs),
    /// Retrieval: BM25 vs bm25s, exact dense search vs faiss, encoding vs sentence-transformers.
    Retrieval(crate::bench_retrieval::RetrievalArgs),
    /// One GRPO step (SmolLM2-135M, 4 × 8, 64 tokens) vs TRL's GRPOTrainer.
    Grpo(crate::bench_grpo::Args),
    /// Seconds per RL step of each world config vs its compute floor (step FLOPs ÷ GEMM rate) and its roofline floor (memory-bound calls at the memory bandwidth).
    WorldSpeed(crate::bench_world_speed::Args),
    /// The memory model vs measured peak RSS (random-init SmolLM2-135M / Qwen2.5-0.5B shapes, CPU),
    /// and its predictions for the GPU presets.
    Memory(crate::bench_memory::Args),
    /// What a GPU machine must show (run by scripts/gpu-check): parity, bf16 generation, one
    /// large-shape GRPO step.
    Gpu(crate::bench_gpu::Args),
    /// The same GRPO steps as 1 process × 2 threads and as 2 ranks × 1 thread (gloo):
    /// seconds per step and the gradient all-reduce's share.
    DataParallel(crate::bench_data_parallel::Args),
    /// One measurement in this process (used by `bench engine`; prints JSON).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(clap::Args)]
pub struct EngineArgs {
    /// Model directory (default: $KNOWRL_MODELS/smollm2-135m-instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "bench/results/engine.json")]
    pub out: PathBuf,
    /// Threads for both sides.
    #[arg(long, default_value_t = 2)]
    pub bench_threads: i32,
    /// Timed repetitions inside each process (after one warm-up).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// Alternating rounds of (knowrl, peer) processes; the median over rounds is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Python with torch + transformers (default: $KNOWRL_PYTHON or .venv/bin/python).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Device of both sides: cpu, cuda or cuda:N (threads then only drive the host side).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub task: String,
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub inputs: PathBuf,
    #[arg(long)]
    pub repeats: usize,
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

const TASKS: [&str; 3] = ["generate-f32", "generate-bf16", "train-f32"];
const GEN_BATCH: usize = 16;
const GEN_TOKENS: usize = 64;
const TRAIN_BATCH: usize = 8;
const TRAIN_LEN: usize = 256;

pub fn run(c: Cmd) -> Result<()> {
    match c {
        Cmd::Engine(a) => engine(a),
        Cmd::Retrieval(a) => crate::bench_retrieval::run(a),
        Cmd::Grpo(a) => crate::bench_grpo::run(a),
        Cmd::DataParallel(a) => crate::bench_data_parallel::run(a),
        Cmd::WorldSpeed(a) => crate::bench_world_speed::run(a),
        Cmd::Memory(a) => crate::bench_memory::run(a),
        Cmd::Gpu(a) => crate::bench_gpu::run(a),
        Cmd::Worker(a) => {
            let r = worker(&a)?;
            println!("{r}");
            Ok(())
        }
    }
}

/// Identical inputs for both sides: 16 ragged chat prompts, and 8 × 256 training tokens.
fn write_inputs(model: &Path, path: &Path) -> Result<()> {
    let p = Policy::load(model, &LoadOptions::default())?;
    let tok = p.tokenizer()?;
    let topics = [
        "the capital of France",
        "photosynthesis",
        "the French revolution",
        "black holes",
        "the history of the printing press and its effect on literacy in Europe",
        "prime numbers",
        "how vaccines work",
        "the water cycle",
        "the causes of the first world war",
        "plate tectonics",
        "the theory of evolution by natural selection",
        "Shakespeare",
        "quantum entanglement",
        "the Roman empire",
        "how a bill becomes law",
        "machine learning",
    ];
    let gen: Vec<Vec<u32>> = topics
        .iter()
        .map(|t| {
            tok.encode(&tok.apply_chat_template(&[Message::new("user", &format!("Tell me about {t}."))], true)?, false)
        })
        .collect::<Result<_, _>>()?;
    let mut rng = Rng::new(1234);
    let vocab = tok.vocab_size();
    let train: Vec<Vec<u32>> =
        (0..TRAIN_BATCH).map(|_| (0..TRAIN_LEN).map(|_| rng.below(vocab) as u32).collect()).collect();
    std::fs::write(path, json!({"generate": gen, "max_new_tokens": GEN_TOKENS, "train": train}).to_string())?;
    Ok(())
}

fn worker(a: &WorkerArgs) -> Result<Value> {
    if !a.inputs.exists() {
        write_inputs(&a.model, &a.inputs)?;
    }
    let inputs: Value = serde_json::from_str(&std::fs::read_to_string(&a.inputs)?)?;
    let ids = |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs[k].clone()).unwrap() };
    let dtype = if a.task.ends_with("bf16") { Kind::BFloat16 } else { Kind::Float };
    let device = knowrl_engine::device::parse_device(&a.device)?;
    let policy = Policy::load(&a.model, &LoadOptions { device, dtype, ..Default::default() })?;
    let sync = || knowrl_engine::device::synchronize(device);
    let mut secs = vec![];
    let mut breakdown = Value::Null;
    let (unit, count) = if a.task.starts_with("generate") {
        let prompts = ids("generate");
        let params = SamplingParams { temperature: 1.0, max_new_tokens: GEN_TOKENS, ..Default::default() };
        let seeds: Vec<u64> = (0..prompts.len() as u64).collect();
        let warm = SamplingParams { max_new_tokens: 4, ..params.clone() };
        generate(&policy.lm, None, &prompts, &warm, &seeds, &[], 0)?;
        for _ in 0..a.repeats {
            let t0 = Instant::now();
            // eos disabled on both sides so every row produces exactly 64 tokens.
            let mut s = DecodeSession::new(&policy.lm, prompts.len(), 0);
            s.append(&prompts)?;
            let rows: Vec<usize> = (0..prompts.len()).collect();
            let mut rngs: Vec<Rng> = seeds.iter().map(|&x| Rng::new(x)).collect();
            let g = s.generate(&rows, &vec![params.clone(); rows.len()], &mut rngs, None, &[])?;
            sync();
            secs.push(t0.elapsed().as_secs_f64());
            breakdown =
                json!({"forward_s": s.stats.forward_s, "sample_s": s.stats.sample_s, "forwards": s.stats.forwards});
            assert!(g.iter().all(|g| g.tokens.len() == GEN_TOKENS));
        }
        ("tokens", (prompts.len() * GEN_TOKENS) as f64)
    } else {
        let seqs = ids("train");
        let mut opt = AdamW::new(policy.trainable_parameters(), AdamWConfig::default());
        for i in 0..=a.repeats {
            let t0 = Instant::now();
            let reqs: Vec<ScoreRequest> =
                seqs.iter().map(|s| ScoreRequest { prompt: &s[..1], response: &s[1..], loss_mask: None }).collect();
            let s = score(&policy.lm, &reqs, 1.0, Mode::TRAIN);
            let loss = -(&s.logprobs * &s.mask).sum(Kind::Float) / s.mask.sum(Kind::Float);
            opt.zero_grad();
            loss.backward();
            opt.clip_grad_norm(1.0);
            opt.step(1e-5);
            sync();
            if i > 0 {
                secs.push(t0.elapsed().as_secs_f64()); // step 0 is warm-up
            }
        }
        ("tokens", (seqs.len() * TRAIN_LEN) as f64)
    };
    let med = crate::bench_env::median(secs.clone());
    Ok(json!({"task": a.task, "seconds": secs, "median_seconds": med, unit: count,
              "tokens_per_s": count / med, "peak_rss_mb": crate::rss::peak_rss_mb(), "last_run_breakdown": breakdown, "threads": tch::get_num_threads()}))
}

fn run_json(cmd: &mut std::process::Command, what: &str) -> Result<Value> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("");
    serde_json::from_str(last).with_context(|| format!("{what} printed no JSON: {text}"))
}

fn engine(a: EngineArgs) -> Result<()> {
    let model = a.model.unwrap_or_else(|| knowrl_engine::adapter::models_dir().join("smollm2-135m-instruct"));
    anyhow::ensure!(model.join("config.json").exists(), "{} not found: run `make models`", model.display());
    let python = a
        .python
        .or_else(|| std::env::var_os("KNOWRL_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| ".venv/bin/python".into());
    let peer_script = PathBuf::from("bench/peers/engine_peer.py");
    anyhow::ensure!(peer_script.exists(), "run from the repository root ({} not found)", peer_script.display());
    let tmp = std::env::temp_dir().join(format!("knowrl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let inputs = tmp.join("inputs.json");
    write_inputs(&model, &inputs)?;
    let exe = std::env::current_exe()?;
    let bar = ProgressBar::new((TASKS.len() * 2 * a.rounds) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]").unwrap());
    let mut results = serde_json::Map::new();
    for task in TASKS {
        // Rounds alternate knowrl and the peer, so a noisy neighbour hits both sides alike.
        let (mut ours, mut peer) = (vec![], vec![]);
        for round in 0..a.rounds {
            bar.set_message(format!("{task}: knowrl, round {}", round + 1));
            ours.push(run_json(
                std::process::Command::new(&exe)
                    .args(["--threads", &a.bench_threads.to_string(), "bench", "worker", "--task", task])
                    .arg("--model")
                    .arg(&model)
                    .arg("--inputs")
                    .arg(&inputs)
                    .args(["--repeats", &a.repeats.to_string(), "--device", &a.device]),
                &format!("knowrl worker {task}"),
            )?);
            bar.inc(1);
            bar.set_message(format!("{task}: peer, round {}", round + 1));
            peer.push(run_json(
                std::process::Command::new(&python)
                    .arg(&peer_script)
                    .args([
                        "--task",
                        task,
                        "--threads",
                        &a.bench_threads.to_string(),
                        "--repeats",
                        &a.repeats.to_string(),
                        "--device",
                        &a.device,
                    ])
                    .arg("--model")
                    .arg(&model)
                    .arg("--inputs")
                    .arg(&inputs)
                    .env("HF_HUB_OFFLINE", "1"),
                &format!("peer {task}"),
            )?);
            bar.inc(1);
        }
        let summary = |runs: &[Value]| {
            let tps: Vec<f64> = runs.iter().map(|r| r["tokens_per_s"].as_f64().unwrap()).collect();
            let rss = runs.iter().map(|r| r["peak_rss_mb"].as_f64().unwrap()).fold(0.0, f64::max);
            json!({"tokens_per_s": crate::bench_env::median(tps.clone()), "tokens_per_s_rounds": tps, "peak_rss_mb": rss, "runs": runs})
        };
        let (o, p) = (summary(&ours), summary(&peer));
        let ratio = o["tokens_per_s"].as_f64().unwrap() / p["tokens_per_s"].as_f64().unwrap();
        results.insert(task.into(), json!({"knowrl": o, "peer": p, "speedup": ratio}));
    }
    bar.finish_and_clear();
    let g = results["generate-f32"]["speedup"].as_f64().unwrap();
    let gb = results["generate-bf16"]["speedup"].as_f64().unwrap();
    let t = results["train-f32"]["speedup"].as_f64().unwrap();
    let report = json!({
        "generation_speedup": g,
        "generation_speedup_bf16": gb,
        "training_speedup": t,
        "model": model.file_name().map(|s| s.to_string_lossy().to_string()),
        "settings": {"generate": format!("{GEN_BATCH} ragged chat prompts, {GEN_TOKENS} new tokens, temperature 1.0, eos off"),
                     "train": format!("micro-batch {TRAIN_BATCH} x {TRAIN_LEN} tokens, fwd+bwd+clip+AdamW, f32"),
                     "threads": a.bench_threads, "device": a.device, "repeats": a.repeats, "rounds": a.rounds,
                     "peers": format!("generate() and a plain PyTorch loop: {}", results["generate-f32"]["peer"]["runs"][0]["versions"].as_str().unwrap_or("?"))},
        "machine": crate::bench_env::machine(),
        "tasks": results,
    });
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&report)?)?;
    println!("| task | knowrl tok/s | peer tok/s | ratio | knowrl peak RSS MB | peer peak RSS MB |");
    println!("|---|---|---|---|---|---|");
    for task in TASKS {
        let r = &report["tasks"][task];
        println!(
            "| {task} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.0} |",
            r["knowrl"]["tokens_per_s"].as_f64().unwrap(),
            r["peer"]["tokens_per_s"].as_f64().unwrap(),
            r["speedup"].as_f64().unwrap(),
            r["knowrl"]["peak_rss_mb"].as_f64().unwrap(),
            r["peer"]["peak_rss_mb"].as_f64().unwrap()
        );
    }
    println!("wrote {}", a.out.display());
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
