//! Stage 8 of the world-policy candidates (bench/results/world-candidates/stage8.md): trains the
//! world policy's architecture from scratch on copy drills with a warm-up-then-constant schedule
//! and prints the loss every 25 steps. It also writes the initial weights (`OUT/init`), the
//! batches (`OUT/batches.json`) and the trained weights (`OUT/trained`), so that
//! `experiments/tiny-policy/stage8-train-parity.py` can run the same steps in PyTorch.
//!
//! With TASK = `s1`, the drills are instead single-hop S1 items (one gold passage, answer its
//! object) of fresh shadow worlds, a new world every 32 steps; INIT continues from a policy
//! directory (same tokenizer) instead of a random initialisation.
//!
//! Usage: cargo run --release --example copy_parity -- STEPS OUT [copy|s1] [INIT]
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::optim::{AdamW, AdamWConfig, LrSchedule};
use knowrl_engine::{LoadOptions, Policy, Tokenizer};
use knowrl_world::pretrain::{encode, policy_config, sft_loss, PretrainConfig};
use std::path::PathBuf;
use tch::Kind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if !(3..=5).contains(&args.len()) {
        return Err("usage: copy_parity STEPS OUT [copy|s1] [INIT]".into());
    }
    let task = args.get(3).map_or("copy", String::as_str);
    let steps: usize = args[1].parse()?;
    let out = PathBuf::from(&args[2]);
    let tok = Tokenizer::from_dir(std::path::Path::new("assets/world/policy"))?;
    let init = out.join("init");
    std::fs::create_dir_all(&init)?;
    let cfgv = policy_config(&PretrainConfig::default(), tok.vocab_size());
    std::fs::write(init.join("config.json"), serde_json::to_string(&cfgv)?)?;
    let cfg = DecoderConfig::from_value(&init.join("config.json"), cfgv)?;
    let policy = match args.get(4) {
        Some(dir) => Policy::load(std::path::Path::new(dir), &LoadOptions::default())?,
        None => Policy::random(&cfg, &LoadOptions::default(), 7),
    };
    policy.save_weights(&init)?;
    let drills = match task {
        "copy" => knowrl_world::habits::copy_drills(32 * steps, 1),
        "s1" => s1_items(32 * steps),
        other => return Err(format!("TASK: `{other}` is not copy or s1").into()),
    };
    let data: Vec<_> = drills.iter().map(|e| encode(&tok, e)).collect::<Result<_, _>>()?;
    std::fs::write(out.join("batches.json"), serde_json::to_string(&data)?)?;
    let mut opt = AdamW::new(policy.trainable_parameters(), AdamWConfig { weight_decay: 0.01, ..Default::default() });
    let schedule = LrSchedule::WarmupConstant { lr: 3e-3, warmup: 50 };
    for (step, chunk) in data.chunks_exact(32).enumerate() {
        let loss = sft_loss(&policy.lm, chunk);
        opt.zero_grad();
        loss.backward();
        opt.clip_grad_norm(1.0);
        opt.step(schedule.lr_at(step as u64));
        if step % 25 == 0 || step + 1 == steps {
            println!("{step} {:.3}", loss.double_value(&[]));
        }
    }
    policy.export_hf(&out.join("trained"), Kind::Float)?;
    Ok(())
}

/// Single-hop S1 items of fresh shadow worlds (1,024 per world), in order.
fn s1_items(n: usize) -> Vec<knowrl_world::habits::Example> {
    let base = knowrl_world::config::WorldConfig::load(std::path::Path::new("assets/world/config.toml")).unwrap();
    let mut out = vec![];
    for k in 0.. {
        let world = knowrl_world::build(&knowrl_world::config::WorldConfig {
            seed: knowrl_world::pretrain::shadow_seed(base.seed, 1000 + k),
            ..base.clone()
        });
        let items =
            world.scenarios.iter().filter(|s| s.scenario == "S1" && s.variant == "qa" && s.context_answer.is_some());
        for s in items.take(1024) {
            out.push(knowrl_world::habits::context_item(s, s.context_answer.as_deref().unwrap()));
            if out.len() == n {
                return out;
            }
        }
    }
    unreachable!()
}
