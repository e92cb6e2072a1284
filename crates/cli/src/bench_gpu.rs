//! `knowrl bench gpu` (run by `scripts/gpu-check`): what a GPU machine must show, in one short
//! run. Engine parity on the device (bf16 logits against the CPU's f32, SmolLM2-135M-Instruct),
//! generation tokens/s in bf16 at 64 rows, and one GRPO-shaped step (rollout, scoring, backward,
//! AdamW) of a random-init policy of a large shape (default Qwen2.5-7B) with LoRA r16: seconds
//! and the memory model's prediction (the script samples the GPU's memory beside it). Runs the
//! same code on `--device cpu` with a small shape, which is how it is tested without a GPU.
use anyhow::{Context, Result};
use knowrl_engine::memory::{estimate, Workload};
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{LoadOptions, Message, Mode, Policy, Rng, SamplingParams};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Model directory for parity and generation (default: $KNOWRL_MODELS/smollm2-135m-instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Shape of the random-init policy for the step (see `bench memory --shapes`).
    #[arg(long, default_value = "qwen2.5-7b")]
    pub shape: String,
    /// The step's rows (prompts × samples), prompt and new tokens.
    #[arg(long, default_value_t = 32)]
    pub rows: i64,
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: i64,
    #[arg(long, default_value_t = 256)]
    pub new_tokens: i64,
    #[arg(long, default_value_t = 4)]
    pub micro_batch: usize,
    #[arg(long, default_value = "bench/results/gpu-check.json")]
    pub out: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let device = knowrl_engine::device::parse_device(&a.device)?;
    let model = a.model.clone().unwrap_or_else(|| knowrl_engine::adapter::models_dir().join("smollm2-135m-instruct"));
    let on = |dtype| LoadOptions { device, dtype, ..Default::default() };

    // 1. Parity: log-probs of the same prompt and response, f32 on the CPU vs f32 and bf16 on
    // the device (f32 must agree to rounding; bf16 to its 8-bit mantissa).
    let cpu = Policy::load(&model, &LoadOptions::default()).with_context(|| format!("loading {}", model.display()))?;
    let dev_f32 = Policy::load(&model, &on(tch::Kind::Float))?;
    let dev = Policy::load(&model, &on(tch::Kind::BFloat16))?;
    let tok = cpu.tokenizer()?;
    let text = tok.apply_chat_template(&[Message::new("user", "Where was Ada Lovelace born?")], true)?;
    let prompt = tok.encode(&text, false)?;
    let response = tok.encode("Ada Lovelace was born in London, England, in 1815.", false)?;
    let logprobs = |p: &Policy| -> Vec<f32> {
        let req = [ScoreRequest { prompt: &prompt, response: &response, loss_mask: None }];
        let s = tch::no_grad(|| score(&p.lm, &req, 1.0, Mode::EVAL));
        Vec::try_from(s.logprobs.to_kind(tch::Kind::Float).to_device(tch::Device::Cpu).view(-1)).unwrap()
    };
    let reference = logprobs(&cpu);
    let diff_to_reference =
        |got: &[f32]| reference.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) as f64;
    let (diff_f32, diff_bf16) = (diff_to_reference(&logprobs(&dev_f32)), diff_to_reference(&logprobs(&dev)));
    let decode = decode_parity(&cpu, &dev_f32)?;
    drop(dev_f32);
    let mean_ref = reference.iter().sum::<f32>() as f64 / reference.len() as f64;
    println!(
        "parity over {} response tokens (mean log-prob {mean_ref:.3}): max |Δ log-prob| f32 {diff_f32:.2e}, bf16 {diff_bf16:.4}",
        response.len()
    );

    // 2. Generation in bf16 at 64 rows (after a 4-token warm-up: a GPU's first calls load
    // kernels and pick GEMM algorithms, which a run of many steps does once).
    let prompts: Vec<Vec<u32>> = (0..64).map(|_| tok.encode(&text, false)).collect::<Result<_, _>>()?;
    let (gens, gen_s, gen_stats) = timed_generate(&dev, &prompts, 128)?;
    let new_tokens: usize = gens.iter().map(|g| g.tokens.len()).sum();
    let gen_tps = new_tokens as f64 / gen_s;
    println!(
        "generation: {gen_tps:.0} new tokens/s (64 rows, bf16; forward {:.2} s of which launching {:.2} s, sampling {:.2} s)",
        gen_stats.forward_s, gen_stats.launch_s, gen_stats.sample_s
    );
    drop((cpu, dev));

    // 3. One GRPO-shaped step of a large random-init policy with LoRA r16; the update runs twice
    // and the second is the step's time (the first also loads kernels).
    let cfg = crate::bench_memory::shape(&a.shape)?;
    let lora = crate::bench_memory::lora(16);
    let t_load = Instant::now();
    let policy = Policy::random(&cfg, &LoadOptions { lora: Some(lora), ..on(tch::Kind::BFloat16) }, 0);
    let load_s = t_load.elapsed().as_secs_f64();
    let mut opt = AdamW::new(policy.trainable_parameters(), AdamWConfig::default());
    let mut rng = Rng::new(3);
    let prompts: Vec<Vec<u32>> = (0..a.rows)
        .map(|_| (0..a.prompt_tokens).map(|_| rng.below(cfg.vocab_size as usize) as u32).collect())
        .collect();
    let (gens, rollout_s, rollout_stats) = timed_generate(&policy, &prompts, a.new_tokens as usize)?;
    let mut update = || {
        let t2 = Instant::now();
        for chunk in prompts.iter().zip(&gens).collect::<Vec<_>>().chunks(a.micro_batch) {
            let reqs: Vec<ScoreRequest> =
                chunk.iter().map(|(p, g)| ScoreRequest { prompt: p, response: &g.tokens, loss_mask: None }).collect();
            let s = score(&policy.lm, &reqs, 1.0, Mode::TRAIN);
            ((&s.logprobs * &s.mask).sum(tch::Kind::Float) / a.rows as f64).backward();
        }
        opt.clip_grad_norm(1.0);
        opt.step(1e-6);
        opt.zero_grad();
        knowrl_engine::device::synchronize(device);
        t2.elapsed().as_secs_f64()
    };
    let update_first_s = update();
    let update_s = update();
    let predicted = estimate(
        &cfg,
        &Workload {
            rollout_rows: a.rows,
            prompt_tokens: a.prompt_tokens,
            rollout_tokens: a.prompt_tokens + a.new_tokens,
            micro_batch: a.micro_batch as i64,
            train_tokens: a.prompt_tokens + a.new_tokens,
            lora_rank: Some(16),
            dtype_bytes: 2,
            cpu: device == tch::Device::Cpu,
            reference_copy: false,
        },
    );
    println!(
        "step ({}, LoRA r16, bf16): load {load_s:.1} s, rollout {rollout_s:.1} s (forward {:.1} of which launching {:.1}, sampling {:.1}), \
         update {update_s:.1} s (first {update_first_s:.1}); predicted peak {:.1} GB",
        a.shape,
        rollout_stats.forward_s,
        rollout_stats.launch_s,
        rollout_stats.sample_s,
        predicted.peak / 1e9
    );
    let result = json!({
        "device": a.device,
        "parity": {"model": model.file_name().map(|s| s.to_string_lossy().to_string()), "max_abs_logprob_diff": diff_bf16, "max_abs_logprob_diff_f32": diff_f32,
                   "response_tokens": response.len(), "mean_logprob": mean_ref, "reference": "cpu f32", "tested": "bf16 (max_abs_logprob_diff) and f32 on the device"},
        "decode_parity": decode,
        "generation": {"rows": 64, "max_new_tokens": 128, "new_tokens_per_s": gen_tps, "dtype": "bf16",
                       "forward_s": gen_stats.forward_s, "forward_launch_s": gen_stats.launch_s, "sample_s": gen_stats.sample_s,
                       "warm_up": "4 tokens"},
        "grpo_step": {"shape": a.shape, "rows": a.rows, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
                      "micro_batch": a.micro_batch, "load_s": load_s, "rollout_s": rollout_s, "update_s": update_s,
                      "update_first_s": update_first_s, "rollout_forward_s": rollout_stats.forward_s,
                      "rollout_forward_launch_s": rollout_stats.launch_s, "rollout_sample_s": rollout_stats.sample_s,
                      "rollout_forwards": rollout_stats.forwards,
                      "predicted": predicted},
        "two_rank_nccl": "run by scripts/gpu-check on a machine with 2 GPUs (bench/results/data-parallel-nccl.json)",
        "machine": crate::bench_env::machine(),
    });
    crate::bench_env::write_result(&a.out, &result)?;
    println!("wrote {}", a.out.display());
    Ok(())
}

/// The KV-cached decode on the device against its own uncached scoring (f32): 5 ragged chat
/// prompts, one of them twice (so the shared prefill copies cache rows), 24 sampled tokens each
/// (temperature 1, eos off, the same per-row seeds as the CPU's run). Scoring has no cache, so
/// equal log-probs check the cache, its masks and positions.
fn decode_parity(cpu: &Policy, dev: &Policy) -> Result<serde_json::Value> {
    let tok = cpu.tokenizer()?;
    let questions =
        ["Hi.", "Where was Ada Lovelace born?", "Name three rivers in Europe, please, briefly.", "2+2?", "Hi."];
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| tok.encode(&tok.apply_chat_template(&[Message::new("user", q)], true)?, false))
        .collect::<Result<_, _>>()?;
    let params = SamplingParams { temperature: 1.0, max_new_tokens: 24, ..Default::default() };
    let seeds: Vec<u64> = (0..prompts.len() as u64).collect();
    let run =
        |p: &Policy| tch::no_grad(|| knowrl_engine::generate::generate(&p.lm, None, &prompts, &params, &seeds, &[], 0));
    let (on_cpu, on_dev) = (run(cpu)?, run(dev)?);
    let mut max_diff = 0f64;
    for (p, g) in prompts.iter().zip(&on_dev) {
        let req = [ScoreRequest { prompt: p, response: &g.tokens, loss_mask: None }];
        let s = tch::no_grad(|| score(&dev.lm, &req, 1.0, Mode::EVAL));
        let scored = Vec::<f32>::try_from(s.logprobs.to_kind(tch::Kind::Float).to_device(tch::Device::Cpu).view(-1))?;
        for (a, b) in scored.iter().zip(&g.logprobs) {
            max_diff = max_diff.max((a - b).abs() as f64);
        }
    }
    let same_tokens = on_cpu.iter().zip(&on_dev).filter(|(a, b)| a.tokens == b.tokens).count();
    println!(
        "decode parity (f32, KV cache vs uncached scoring on the device): max |Δ log-prob| {max_diff:.2e}; \
         {same_tokens}/{} rows sample the same tokens as the CPU",
        prompts.len()
    );
    Ok(json!({"max_abs_logprob_diff_cached_vs_scored": max_diff, "rows_same_tokens_as_cpu": same_tokens,
              "rows": prompts.len(), "new_tokens": 24}))
}

/// Samples `new_tokens` per row (temperature 1, eos off) after a 4-token warm-up: the outputs,
/// seconds and the session's forward / sampling split.
fn timed_generate(
    p: &Policy,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<(Vec<knowrl_engine::generate::Generation>, f64, knowrl_engine::generate::DecodeStats)> {
    let run = |n: usize| -> Result<_> {
        let params = SamplingParams { temperature: 1.0, max_new_tokens: n, ..Default::default() };
        let t0 = Instant::now();
        let mut s = knowrl_engine::generate::DecodeSession::new(&p.lm, prompts.len(), 0);
        let rows: Vec<usize> = (0..prompts.len()).collect();
        let mut rngs: Vec<Rng> = rows.iter().map(|&r| Rng::new(r as u64)).collect();
        let gens = tch::no_grad(|| -> Result<_> {
            s.append(prompts)?;
            Ok(s.generate(&rows, &vec![params; rows.len()], &mut rngs, None, &[])?)
        })?;
        knowrl_engine::device::synchronize(p.lm.device());
        Ok((gens, t0.elapsed().as_secs_f64(), s.stats.clone()))
    };
    run(4)?;
    run(new_tokens)
}
