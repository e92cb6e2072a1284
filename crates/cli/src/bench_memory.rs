//! `knowrl bench memory`: the memory model (`knowrl_engine::memory`) against measured peak RSS,
//! on CPU, with random-init models of real shapes (SmolLM2-135M, Qwen2.5-0.5B) and the run's
//! LoRA: a rollout (rows × tokens through the KV cache) and a training micro-batch (score +
//! backward + AdamW), each in its own process so each peak is its own. Prints the predicted
//! GPU figures of the presets' shapes beside them. Writes bench/results/memory-model.json.
use anyhow::{Context, Result};
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::memory::{estimate, Estimate, Workload};
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{LoadOptions, LoraConfig, Mode, Policy, Rng, SamplingParams};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Shapes to measure (random init): smollm2-135m, qwen2.5-0.5b.
    #[arg(long, num_args = 1.., default_values = ["smollm2-135m", "qwen2.5-0.5b"])]
    pub shapes: Vec<String>,
    /// Rollout rows decoded together and their prompt and new tokens.
    #[arg(long, default_value_t = 32)]
    pub rows: i64,
    #[arg(long, default_value_t = 480)]
    pub prompt_tokens: i64,
    #[arg(long, default_value_t = 16)]
    pub new_tokens: i64,
    /// Training micro-batch: sequences of `train_tokens` tokens.
    #[arg(long, default_value_t = 4)]
    pub micro_batch: i64,
    #[arg(long, default_value_t = 512)]
    pub train_tokens: i64,
    #[arg(long, default_value_t = 16)]
    pub lora_rank: i64,
    #[arg(long, default_value_t = 2)]
    pub bench_threads: i32,
    /// Override the shapes' block count (0 = theirs): two counts separate the per-block
    /// memory from the embedding and LM head's.
    #[arg(long, default_value_t = 0)]
    pub layers: i64,
    #[arg(long, default_value = "bench/results/memory-model.json")]
    pub out: PathBuf,
    /// Internal: run one phase (`rollout` | `train`) of one shape here and print JSON.
    #[arg(long, hide = true)]
    pub worker: Option<String>,
}

/// An architecture's config.json fields (the published ones).
pub fn shape(name: &str) -> Result<DecoderConfig> {
    let v = match name {
        "smollm2-135m" => json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "tie_word_embeddings": true}),
        "qwen2.5-0.5b" => json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "tie_word_embeddings": true}),
        "qwen2.5-3b" => json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
            "num_key_value_heads": 2, "tie_word_embeddings": true}),
        "qwen3-4b" => json!({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2560,
            "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": true}),
        "qwen2.5-7b" => json!({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "tie_word_embeddings": false}),
        _ => anyhow::bail!(
            "--shapes: unknown shape {name:?} (smollm2-135m, qwen2.5-0.5b, qwen2.5-3b, qwen3-4b, qwen2.5-7b)"
        ),
    };
    let mut v = v;
    v["rms_norm_eps"] = json!(1e-6);
    v["max_position_embeddings"] = json!(32768);
    Ok(DecoderConfig::from_value(std::path::Path::new(&format!("{name}/config.json")), v)?)
}

fn workload(a: &Args, cpu: bool, dtype_bytes: i64) -> Workload {
    Workload {
        rollout_rows: a.rows,
        prompt_tokens: a.prompt_tokens,
        rollout_tokens: a.prompt_tokens + a.new_tokens,
        micro_batch: a.micro_batch,
        train_tokens: a.train_tokens,
        lora_rank: Some(a.lora_rank),
        dtype_bytes,
        cpu,
        reference_copy: false,
    }
}

/// The run's LoRA on every linear layer of every block (the presets' targets).
pub fn lora(rank: i64) -> LoraConfig {
    let targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    LoraConfig { rank, alpha: 2.0 * rank as f64, dropout: 0.0, target_modules: targets.map(String::from).to_vec() }
}

/// One phase in this process: resident memory after loading (the model and the optimiser) and
/// the peak over the phase.
fn worker(a: &Args, name: &str, phase: &str) -> Result<Value> {
    tch::set_num_threads(a.bench_threads);
    let mut cfg = shape(name)?;
    if a.layers > 0 {
        cfg.num_layers = a.layers;
    }
    let policy = Policy::random(&cfg, &LoadOptions { lora: Some(lora(a.lora_rank)), ..Default::default() }, 0);
    let mut opt = AdamW::new(policy.trainable_parameters(), AdamWConfig::default());
    // The phase's own peak: from the loaded model's resident memory, not loading's transient peak.
    anyhow::ensure!(crate::rss::reset_peak(), "cannot reset the peak RSS (/proc/self/clear_refs)");
    let loaded = crate::rss::rss_mb();
    let mut rng = Rng::new(7);
    let mut tokens = |n: i64| -> Vec<u32> { (0..n).map(|_| rng.below(cfg.vocab_size as usize) as u32).collect() };
    let t0 = std::time::Instant::now();
    match phase {
        "rollout" => {
            let prompts: Vec<Vec<u32>> = (0..a.rows).map(|_| tokens(a.prompt_tokens)).collect();
            let params =
                SamplingParams { temperature: 1.0, max_new_tokens: a.new_tokens as usize, ..Default::default() };
            let seeds: Vec<u64> = (0..a.rows as u64).collect();
            tch::no_grad(|| knowrl_engine::generate::generate(&policy.lm, None, &prompts, &params, &seeds, &[], 0))?;
        }
        "train" => {
            let seqs: Vec<(Vec<u32>, Vec<u32>)> =
                (0..a.micro_batch).map(|_| (tokens(a.train_tokens / 2), tokens(a.train_tokens / 2))).collect();
            let reqs: Vec<ScoreRequest> =
                seqs.iter().map(|(p, r)| ScoreRequest { prompt: p, response: r, loss_mask: None }).collect();
            let s = score(&policy.lm, &reqs, 1.0, Mode::TRAIN);
            (&s.logprobs * &s.mask).sum(tch::Kind::Float).backward();
            opt.step(1e-5);
        }
        _ => anyhow::bail!("unknown phase {phase}"),
    }
    Ok(json!({"loaded_mb": loaded, "peak_mb": crate::rss::peak_rss_mb(), "seconds": t0.elapsed().as_secs_f64()}))
}

const MB: f64 = 1024.0 * 1024.0;

pub fn run(a: Args) -> Result<()> {
    if let Some(spec) = &a.worker {
        let (name, phase) = spec.split_once(':').context("--worker SHAPE:PHASE")?;
        println!("{}", worker(&a, name, phase)?);
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut measured = serde_json::Map::new();
    for name in &a.shapes {
        let cfg = shape(name)?;
        let e: Estimate = estimate(&cfg, &workload(&a, true, 4));
        let mut phases = serde_json::Map::new();
        for (phase, predicted) in
            [("rollout", e.kv_cache + e.prefill + e.merged_adapters), ("train", e.activations + e.logits)]
        {
            eprintln!("{name}: {phase}");
            let out = std::process::Command::new(&exe)
                .args(["bench", "memory", "--worker", &format!("{name}:{phase}")])
                .args(["--rows", &a.rows.to_string(), "--prompt-tokens", &a.prompt_tokens.to_string()])
                .args(["--new-tokens", &a.new_tokens.to_string(), "--micro-batch", &a.micro_batch.to_string()])
                .args(["--train-tokens", &a.train_tokens.to_string(), "--lora-rank", &a.lora_rank.to_string()])
                .args(["--bench-threads", &a.bench_threads.to_string()])
                .output()?;
            anyhow::ensure!(out.status.success(), "{name} {phase}: {}", String::from_utf8_lossy(&out.stderr));
            let r: Value = serde_json::from_slice(out.stdout.trim_ascii()).context("worker output")?;
            let grown = r["peak_mb"].as_f64().unwrap_or(0.0) - r["loaded_mb"].as_f64().unwrap_or(0.0);
            let predicted_mb = predicted / MB;
            println!(
                "{name:>13} {phase:<8} measured +{grown:7.0} MB over the loaded model, predicted +{predicted_mb:7.0} MB ({:.2}x); loaded {:.0} MB, predicted weights + optimiser {:.0} MB",
                grown / predicted_mb,
                r["loaded_mb"].as_f64().unwrap_or(0.0),
                (e.weights + e.optimiser) / MB
            );
            phases.insert(
                phase.into(),
                json!({"measured_mb": grown, "predicted_mb": predicted_mb, "measured_over_predicted": grown / predicted_mb,
                       "loaded_mb": r["loaded_mb"], "seconds": r["seconds"]}),
            );
        }
        phases.insert("predicted_weights_and_optimiser_mb".into(), json!((e.weights + e.optimiser) / MB));
        measured.insert(name.clone(), Value::Object(phases));
    }
    // The GPU presets on one GPU in bf16 (the same model, no measurement): their micro-batch,
    // rollout rows (`max_rows`) and token budgets, a 512-token prompt, with their own LoRA
    // rank 16 or as a full fine-tune.
    let gpu = [
        ("configs/presets/knowledgeable-r1-qwen2.5-7b.toml", "qwen2.5-7b"),
        ("configs/presets/akbe-qwen3-4b.toml", "qwen3-4b"),
        ("configs/presets/bridge-qwen2.5-3b.toml", "qwen2.5-3b"),
    ];
    let mut presets = serde_json::Map::new();
    for (file, name) in gpu {
        let c = knowrl_rl::config::TrainConfig::load(std::path::Path::new(file))?;
        let r = &c.rollout;
        let response = r.max_turns * r.max_tokens_per_turn + (r.max_turns - 1) * r.max_observation_tokens;
        let tokens = 512 + response as i64;
        let rows = (r.prompts_per_step * r.group_size) as i64;
        let rows = if r.max_rows == 0 { rows } else { rows.min(r.max_rows as i64) };
        let cfg = shape(name)?;
        for lora_rank in [Some(16), None] {
            let w = Workload {
                rollout_rows: rows,
                prompt_tokens: 512,
                rollout_tokens: tokens,
                micro_batch: c.optim.micro_batch as i64,
                train_tokens: tokens,
                lora_rank,
                dtype_bytes: 2,
                cpu: false,
                reference_copy: lora_rank.is_none() && c.algorithm.kl_coef > 0.0,
            };
            let e = estimate(&cfg, &w);
            let key = format!("{file} ({})", lora_rank.map_or("full fine-tune".into(), |r| format!("LoRA r{r}")));
            println!(
                "{key}: peak {:.1} GB = weights {:.1} + optimiser {:.1} + reference {:.1} + max(KV cache {:.1} + prefill {:.1}, activations {:.1} + logits {:.1}); micro-batch {} × {tokens} tokens, {rows} rows decoded together",
                e.peak / 1e9, e.weights / 1e9, e.optimiser / 1e9, e.reference / 1e9, e.kv_cache / 1e9, e.prefill / 1e9, e.activations / 1e9, e.logits / 1e9, w.micro_batch
            );
            presets.insert(key, json!({"estimate": e, "workload": format!("{w:?}"), "fits_141_gb": e.peak < 141e9}));
        }
    }
    let result = json!({
        "setting": {"rows": a.rows, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
                    "micro_batch": a.micro_batch, "train_tokens": a.train_tokens, "lora_rank": a.lora_rank,
                    "device": "cpu", "dtype": "f32", "threads": a.bench_threads},
        "measured_cpu": measured,
        "predicted_gpu_bf16": presets,
        "machine": crate::bench_env::machine(),
    });
    crate::bench_env::write_result(&a.out, &result)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
