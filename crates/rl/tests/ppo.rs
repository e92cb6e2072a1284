//! PPO's mini-batched update (`[algorithm] ppo_mini_batch`, `ppo_epochs`): with one mini-batch
//! it is the single update of earlier versions, bit for bit; with several, the adapters after
//! the step equal a PyTorch loop (float64, same weights, rows and mini-batches: π_old scored
//! once, clipped surrogate, token-mean per mini-batch, clip_grad_norm_, torch.optim.AdamW; with
//! one epoch the first mini-batch takes its π_old from its own forward); and
//! from the second mini-batch on the ratio leaves 1 and the clip acts.
mod common;
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;
use engine_common::{run_reference, tmpdir};
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::weights::{read_all, write_atomic};
use knowrl_engine::{LoadOptions, LoraConfig, Policy};
use knowrl_rl::config::TrainConfig;
use knowrl_rl::method::StepOutput;
use knowrl_rl::trainer::{mini_batches, update_policy};
use knowrl_rl::update::{pg_backward, LossTerm, Normaliser, PgRow, Sequence};
use serde_json::json;
use std::path::Path;
use tch::{Kind, Tensor};

fn lora() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: ["q_proj", "v_proj", "up_proj"].map(String::from).to_vec(),
    }
}

/// A random float64 Llama with a LoRA whose B is non-zero, saved for the Python side. Serialised:
/// libtorch's seed is process-wide, and the tests of this file run on parallel threads.
fn tiny_policy(dir: &Path) -> Policy {
    static SEED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = SEED.lock().unwrap();
    let config = json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 61,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": true, "rope_theta": 10000.0,
    });
    let cfg = DecoderConfig::from_value(&dir.join("config.json"), config.clone()).unwrap();
    let p = Policy::random(&cfg, &LoadOptions { dtype: Kind::Double, lora: Some(lora()), ..Default::default() }, 11);
    tch::no_grad(|| {
        for (n, t) in p.parameters() {
            if n.contains("lora_B") {
                t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Double, t.device())) * 0.1));
            }
        }
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (base, adapters): (Vec<_>, Vec<_>) = p.parameters().into_iter().partition(|(n, _)| !n.contains("lora_"));
    write_atomic(&dir.join("model.safetensors"), &base).unwrap();
    write_atomic(&dir.join("adapters.safetensors"), &adapters).unwrap();
    p
}

/// Eight rows over two prompts, ragged, one with a masked observation, one with A = 0.
fn rows() -> Vec<PgRow> {
    let (p1, p2) = (vec![1, 5, 9, 13], vec![1, 7, 8]);
    let r = |p: &Vec<u32>, resp: &[u32], mask: Option<Vec<bool>>, a: f64| {
        let mask = mask.unwrap_or(vec![true; resp.len()]);
        PgRow::new(Sequence { prompt: p.clone(), response: resp.to_vec(), loss_mask: mask }, a, 1.0)
    };
    vec![
        r(&p1, &[20, 21, 22, 2], None, 1.5),
        r(&p1, &[30, 31, 2], None, -0.8),
        r(&p1, &[20, 40, 41, 42, 43, 22, 2], Some(vec![true, false, false, false, false, true, true]), 0.9),
        r(&p1, &[33, 2], None, 0.0),
        r(&p2, &[50, 51, 52, 53, 2], None, 1.2),
        r(&p2, &[54, 2], None, -1.4),
        r(&p2, &[50, 51, 55, 2], None, 0.6),
        r(&p2, &[56, 57, 58, 2], None, -0.5),
    ]
}

fn config(mini_batch: usize, epochs: usize, lr: f64) -> TrainConfig {
    let mut c = common::config(&std::env::temp_dir().join("knowrl-ppo-unused"), 1, "");
    (c.algorithm.ppo_mini_batch, c.algorithm.ppo_epochs) = (mini_batch, epochs);
    (c.optim.lr, c.optim.max_grad_norm, c.optim.micro_batch) = (lr, 1.0, 3);
    c
}

fn optimiser(p: &Policy) -> AdamW {
    let params = p.trainable_parameters();
    AdamW::new(params.into_iter().collect(), AdamWConfig { weight_decay: 0.0, ..Default::default() })
}

fn adapters(p: &Policy) -> Vec<(String, Tensor)> {
    p.trainable_parameters().into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
}

#[test]
fn one_mini_batch_is_the_single_update_and_several_match_pytorch() {
    tch::set_num_threads(1);
    let root = tmpdir("ppo");
    let start = tiny_policy(&root);
    let initial = adapters(&start);

    // One mini-batch, one epoch: exactly the update every earlier version made.
    let single = |cfg: &TrainConfig| {
        let p = tiny_policy(&root);
        let mut opt = optimiser(&p);
        let mut out = StepOutput { terms: vec![LossTerm::Pg { rows: rows(), normaliser: None }], ..Default::default() };
        let st = update_policy(None, &p, None, &mut opt, &mut out, cfg, 5).unwrap();
        (adapters(&p), st)
    };
    let (ours, st) = single(&config(0, 1, 1e-2));
    assert_eq!(st.per_update.len(), 1);
    let p = tiny_policy(&root);
    let mut opt = optimiser(&p);
    opt.zero_grad();
    let cfg = config(0, 1, 1e-2);
    let batch = rows();
    pg_backward(&p, None, &batch, Normaliser::of(&batch), &cfg.algorithm, 1.0, cfg.optim.micro_batch);
    opt.clip_grad_norm(cfg.optim.max_grad_norm);
    opt.step(cfg.optim.lr);
    for ((n, a), (_, b)) in ours.iter().zip(adapters(&p)) {
        assert!(a.equal(&b), "{n}: one mini-batch differs from the single update");
    }

    // Several mini-batches against PyTorch (which scores π_old for every row): 8 rows in batches
    // of 3 (3 + 3 + 2). Two epochs: six optimiser steps with π_old fixed. One epoch: three, where
    // the first mini-batch's π_old is its own detached log-probs instead of a separate pass.
    for epochs in [2, 1] {
        let (size, lr, seed) = (3, 1e-2, 5);
        let cfg = config(size, epochs, lr);
        let (ours, st) = {
            let p = tiny_policy(&root);
            let mut opt = optimiser(&p);
            let mut out =
                StepOutput { terms: vec![LossTerm::Pg { rows: rows(), normaliser: None }], ..Default::default() };
            let st = update_policy(None, &p, None, &mut opt, &mut out, &cfg, seed).unwrap();
            (adapters(&p), st)
        };
        assert_eq!(st.per_update.len(), 3 * epochs);
        let batches: Vec<Vec<usize>> = (0..epochs).flat_map(|e| mini_batches(8, size, seed, e)).collect();
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 2].repeat(epochs));
        if epochs == 2 {
            assert_ne!(batches[0], batches[3], "each epoch deals the rows in a new order");
        }
        let rows_json: Vec<_> = rows()
            .iter()
            .map(|r| json!({"prompt": r.seq.prompt, "response": r.seq.response, "mask": r.seq.loss_mask, "advantage": r.advantage}))
            .collect();
        let out = root.join(format!("ref-{epochs}.safetensors"));
        run_reference(
            &json!([{"kind": "ppo", "model": root.to_str().unwrap(), "lora": lora(), "rows": rows_json,
                     "minibatches": batches, "clip_low": 0.2, "clip_high": 0.2, "lr": lr,
                     "max_grad_norm": 1.0, "out": out}]),
            &root,
        );
        let reference = read_all(&out).unwrap();
        assert_eq!(reference.len(), ours.len());
        let (mut worst, mut moved) = (0f64, 0f64);
        for ((n, a), (_, a0)) in ours.iter().zip(&initial) {
            let d = (a - &reference[n]).abs().max().double_value(&[]);
            worst = worst.max(d);
            moved = moved.max((a - a0).abs().max().double_value(&[]));
        }
        println!(
            "{epochs} epoch(s), {} PPO steps: max |Δθ| {moved:.3e}, max |θ_knowrl − θ_torch| {worst:.3e}",
            3 * epochs
        );
        assert!(moved > 1e-2, "the update must move the adapters ({moved})");
        assert!(worst < 1e-5, "adapters differ from PyTorch's by {worst}");
    }
}

#[test]
fn the_ratio_leaves_one_after_the_first_mini_batch_and_the_clip_acts() {
    tch::set_num_threads(1);
    let root = tmpdir("ppo-clip");
    let p = tiny_policy(&root);
    // Every row twice, so the second mini-batch scores responses the first one just pushed up
    // (or down) with a large step.
    let twice: Vec<PgRow> = rows().into_iter().chain(rows()).collect();
    let mut out = StepOutput { terms: vec![LossTerm::Pg { rows: twice, normaliser: None }], ..Default::default() };
    let mut opt = optimiser(&p);
    let st = update_policy(None, &p, None, &mut opt, &mut out, &config(8, 1, 5e-2), 1).unwrap();
    let [(first, _), (second, _)] = st.per_update[..] else { panic!("{} updates, want 2", st.per_update.len()) };
    assert!(first.ppo_kl.abs() < 1e-9, "first mini-batch: π = π_old, got ppo_kl {}", first.ppo_kl);
    assert_eq!(first.clip_frac, 0.0);
    assert!(second.ppo_kl.abs() > 1e-3, "second mini-batch: ratio still 1 (ppo_kl {})", second.ppo_kl);
    assert!(second.clip_frac > 0.0, "second mini-batch: the clip never acted");
    // π_old was scored for the second mini-batch only: the first one's is its own detached
    // log-probs, taken before any optimiser step.
    let first_rows = &mini_batches(16, 8, 1, 0)[0];
    for (j, r) in out.pg_rows().iter().enumerate().filter(|(_, r)| r.advantage != 0.0) {
        let want = if first_rows.contains(&j) { 0 } else { r.seq.response.len() };
        assert_eq!(r.old_logprobs.len(), want, "row {j}");
    }
}
