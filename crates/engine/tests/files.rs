//! Bad input gets a clear error naming the file, field or tensor; checkpoints are atomic,
//! checksummed and resume exactly; exports load in transformers with LoRA merged.
mod common;
use common::*;
use knowrl_engine::checkpoint;
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::score::{score, score_packed, score_shared, ScoreRequest};
use knowrl_engine::weights::{read_all, write_atomic};
use knowrl_engine::{EngineError, LoadOptions, LoraConfig, Mode, Policy, Tokenizer};
use serde_json::{json, Value};
use std::path::Path;
use tch::{Kind, Tensor};

fn tiny_config() -> Value {
    json!({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "eos_token_id": 2, "bos_token_id": 1})
}

fn tiny_policy(lora: Option<LoraConfig>) -> Policy {
    let cfg = DecoderConfig::from_value(Path::new("config.json"), tiny_config()).unwrap();
    Policy::random(&cfg, &LoadOptions { lora, ..Default::default() }, 5)
}

/// A random model directory with the SmolLM2 tokenizer files (only the tokenizer matters here).
fn model_dir(tag: &str) -> TmpDir {
    let d = tmpdir(tag);
    let smol = real_model("smollm2-135m-instruct");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(smol.join(f), d.join(f)).unwrap();
    }
    let mut c = tiny_config();
    c["vocab_size"] = json!(49152);
    std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    let cfg = DecoderConfig::from_value(&d.join("config.json"), c).unwrap();
    Policy::random(&cfg, &LoadOptions::default(), 5).save_weights(&d).unwrap();
    d
}

fn err_of(dir: &Path) -> String {
    match Policy::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_model_directories_are_named_errors() {
    let d = model_dir("bad");
    assert!(Policy::load(&d, &LoadOptions::default()).is_ok());
    let weights = d.join("model.safetensors");
    let good = read_all(&weights).unwrap();

    // A missing tensor.
    let mut v: Vec<(String, Tensor)> = good.iter().map(|(k, t)| (k.clone(), t.shallow_clone())).collect();
    v.retain(|(k, _)| k != "model.layers.1.mlp.up_proj.weight");
    write_atomic(&weights, &v).unwrap();
    let e = err_of(&d);
    assert!(e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("missing"), "{e}");

    // A tensor of the wrong shape.
    let mut v: Vec<(String, Tensor)> = good.iter().map(|(k, t)| (k.clone(), t.shallow_clone())).collect();
    for (k, t) in v.iter_mut() {
        if k == "model.layers.0.self_attn.q_proj.weight" {
            *t = Tensor::zeros([31, 32], (Kind::Float, tch::Device::Cpu));
        }
    }
    write_atomic(&weights, &v).unwrap();
    let e = err_of(&d);
    assert!(
        e.contains("model.layers.0.self_attn.q_proj.weight") && e.contains("shape mismatch") && e.contains("[31, 32]"),
        "{e}"
    );

    // A tensor the config does not describe (e.g. weights of a model with attention bias).
    let mut v: Vec<(String, Tensor)> = good.iter().map(|(k, t)| (k.clone(), t.shallow_clone())).collect();
    v.push(("model.layers.0.self_attn.q_proj.bias".into(), Tensor::zeros([32], (Kind::Float, tch::Device::Cpu))));
    write_atomic(&weights, &v).unwrap();
    let e = err_of(&d);
    assert!(e.contains("q_proj.bias") && e.contains("unexpected"), "{e}");

    // A truncated safetensors file.
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let e = err_of(&d);
    assert!(e.contains("model.safetensors") && e.contains("safetensors"), "{e}");

    // Unsupported architecture, and a wrongly typed field.
    let mut c = tiny_config();
    c["model_type"] = json!("gpt2");
    std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    let e = err_of(&d);
    assert!(e.contains("config.json") && e.contains("model_type") && e.contains("gpt2"), "{e}");
    let mut c = tiny_config();
    c["hidden_size"] = json!("big");
    std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    let e = err_of(&d);
    assert!(e.contains("hidden_size") && e.contains("integer"), "{e}");
    std::fs::write(d.join("config.json"), "{\"model_type\": \"llama\",\n  oops").unwrap();
    let e = err_of(&d);
    assert!(e.contains("config.json") && e.contains("line 2"), "{e}");

    // A broken tokenizer.json.
    std::fs::write(d.join("tokenizer.json"), "{\"model\": 42}").unwrap();
    match Tokenizer::from_dir(&d) {
        Err(e @ EngineError::Tokenizer { .. }) => {
            assert!(e.to_string().contains("tokenizer.json"), "{e}")
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("broken tokenizer.json loaded"),
    }
    // Not a directory at all.
    let e = err_of(&d.join("nope"));
    assert!(e.contains("nope"), "{e}");
}

fn loss(p: &Policy) -> Tensor {
    let reqs = [
        ScoreRequest { prompt: &[1, 5, 7], response: &[9, 10, 2], loss_mask: None },
        ScoreRequest { prompt: &[1, 3], response: &[11, 12, 13, 2], loss_mask: None },
    ];
    let s = score(&p.lm, &reqs, 1.0, Mode::TRAIN);
    -(&s.logprobs * &s.mask).sum(Kind::Float) / s.mask.sum(Kind::Float)
}

fn train_steps(p: &Policy, opt: &mut AdamW, n: usize) {
    for _ in 0..n {
        opt.zero_grad();
        loss(p).backward();
        opt.clip_grad_norm(1.0);
        opt.step(1e-2);
    }
}

#[test]
fn checkpoints_resume_bit_identically_and_detect_corruption() {
    let root = tmpdir("ckpt");
    let lora = LoraConfig { rank: 2, alpha: 4.0, dropout: 0.0, target_modules: vec!["q_proj".into(), "v_proj".into()] };
    // Run A: 4 steps straight. Run B: 2 steps, checkpoint, fresh process state, load, 2 steps.
    // All three start from one set of weights copied in, not from a seed: the tests of this
    // binary run in parallel and draw from libtorch's process-wide generator.
    let a = tiny_policy(Some(lora.clone()));
    let init: Vec<Tensor> = a.parameters().iter().map(|(_, t)| t.detach().copy()).collect();
    let same_start = || {
        let p = tiny_policy(Some(lora.clone()));
        tch::no_grad(|| p.parameters().iter().zip(&init).for_each(|((_, t), w)| t.shallow_clone().copy_(w)));
        p
    };
    let mut oa = AdamW::new(a.trainable_parameters(), AdamWConfig::default());
    train_steps(&a, &mut oa, 4);

    let b = same_start();
    let mut ob = AdamW::new(b.trainable_parameters(), AdamWConfig::default());
    train_steps(&b, &mut ob, 2);
    let dir = checkpoint::save(&root, 2, &b.trainable_parameters(), &ob, &json!({"rng": [1, 2]}), &[]).unwrap();
    assert_eq!(checkpoint::latest(&root).unwrap().unwrap(), dir);

    let c = same_start();
    let mut oc = AdamW::new(c.trainable_parameters(), AdamWConfig::default());
    let (step, state) = checkpoint::load(&dir, &c.trainable_parameters(), &mut oc).unwrap();
    assert_eq!((step, state), (2, json!({"rng": [1, 2]})));
    train_steps(&c, &mut oc, 2);
    for ((n, x), (_, y)) in a.trainable_parameters().iter().zip(c.trainable_parameters()) {
        assert!(x.equal(&y), "{n} differs after resume");
    }

    // Flip one byte: the checksum names the file.
    let f = dir.join("params.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&f, bytes).unwrap();
    match checkpoint::load(&dir, &c.trainable_parameters(), &mut oc) {
        Err(e @ EngineError::Checksum { .. }) => {
            assert!(e.to_string().contains("params.safetensors"))
        }
        other => panic!("corruption not detected: {:?}", other.err()),
    }
    // No temp directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn lora_export_loads_in_transformers_with_adapters_merged() {
    let root = tmpdir("export");
    let lora =
        LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: vec!["q_proj".into(), "down_proj".into()] };
    let p = tiny_policy(Some(lora));
    tch::no_grad(|| {
        for (n, t) in p.parameters() {
            if n.contains("lora_B") {
                t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Float, t.device())) * 0.2));
            }
        }
    });
    let out = root.join("hf");
    p.export_hf(&out, Kind::Float).unwrap();
    let prompts = vec![vec![1u32, 5, 9, 13, 17], vec![1, 2, 3]];
    run_reference(
        &json!([{"kind": "logits", "model": out, "prompts": prompts, "max_new_tokens": 4, "eos": [2],
                 "out": root.join("ref.safetensors")}]),
        &root,
    );
    let r = read_all(&root.join("ref.safetensors")).unwrap();
    let ours = knowrl_engine::generate::full_logits(&p.lm, &prompts);
    let base_off = tch::no_grad(|| {
        let b = knowrl_engine::score::PackedBatch::new(&prompts, tch::Device::Cpu);
        let h = p.lm.forward_hidden(&b.ids, &b.positions, &b.mask, None, Mode::REFERENCE);
        p.lm.logits(&h)
    });
    for (i, pr) in prompts.iter().enumerate() {
        let o = ours.get(i as i64).narrow(0, 0, pr.len() as i64);
        let d = max_abs_diff(&o, &r[&format!("logits.{i}")]);
        assert!(d < 1e-4, "merged export differs: {d}");
        // And the adapters matter: the reference (adapters off) is different.
        let off = base_off.get(i as i64).narrow(0, 0, pr.len() as i64);
        assert!(max_abs_diff(&off, &r[&format!("logits.{i}")]) > 1e-3);
    }
    assert!(!out.with_extension(format!("tmp{}", std::process::id())).exists());
}

#[test]
fn sharded_checkpoints_load_like_single_files() {
    let d = model_dir("sharded");
    let single = Policy::load(&d, &LoadOptions::default()).unwrap();
    let all = read_all(&d.join("model.safetensors")).unwrap();
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)] {
        let v: Vec<(String, Tensor)> = part.iter().map(|n| (n.to_string(), all[*n].shallow_clone())).collect();
        write_atomic(&d.join(file), &v).unwrap();
        for n in part.iter() {
            map.insert(n.to_string(), json!(file));
        }
    }
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors.index.json"), json!({"metadata": {}, "weight_map": map}).to_string())
        .unwrap();
    let sharded = Policy::load(&d, &LoadOptions::default()).unwrap();
    for ((n, x), (_, y)) in single.parameters().iter().zip(sharded.parameters()) {
        assert!(x.equal(&y), "{n}");
    }
}

#[test]
fn gradient_accumulation_over_micro_batches_equals_the_full_batch() {
    // Token-mean over the whole batch = Σ_micro (Σ masked log-probs of the micro-batch) / total
    // tokens, so each micro-batch's loss is scaled by its share before `backward`.
    let p = tiny_policy(None);
    let reqs = [
        ScoreRequest { prompt: &[1, 5, 7], response: &[9, 10, 2], loss_mask: None },
        ScoreRequest { prompt: &[1, 3], response: &[11, 12, 13, 2], loss_mask: None },
        ScoreRequest { prompt: &[1, 4, 4, 4], response: &[20, 2], loss_mask: Some(&[true, false]) },
    ];
    let full = score(&p.lm, &reqs, 1.0, Mode::TRAIN);
    let total = full.mask.sum(Kind::Float);
    (-(&full.logprobs * &full.mask).sum(Kind::Float) / &total).backward();
    let want: Vec<Tensor> = p.trainable_parameters().iter().map(|(_, t)| t.grad().copy()).collect();
    let mut opt = AdamW::new(p.trainable_parameters(), AdamWConfig::default());
    opt.zero_grad();
    for micro in reqs.chunks(2) {
        let s = score(&p.lm, micro, 1.0, Mode::TRAIN);
        (-(&s.logprobs * &s.mask).sum(Kind::Float) / &total).backward();
    }
    for ((n, t), w) in p.trainable_parameters().iter().zip(&want) {
        let d = max_abs_diff(&t.grad(), w);
        assert!(d < 1e-6, "{n}: {d}");
    }
}

/// A scoring path: [`score_packed`] or [`score_shared`].
type ScoreFn = fn(&knowrl_engine::models::llama::DecoderLm, &[ScoreRequest], f64, Mode) -> knowrl_engine::score::Scored;

/// Scores `reqs` with `f` in training mode and back-propagates `loss` of the scores: the scores,
/// every trainable parameter's gradient, and the shared work the call counted (FLOPs).
fn scored_with_grads(
    p: &Policy,
    reqs: &[ScoreRequest],
    temperature: f64,
    f: ScoreFn,
    loss: fn(&knowrl_engine::score::Scored) -> Tensor,
) -> (knowrl_engine::score::Scored, Vec<Tensor>, f64) {
    let mut opt = AdamW::new(p.trainable_parameters(), AdamWConfig::default());
    opt.zero_grad();
    let flops = knowrl_engine::flops::snapshot().shared;
    let s = f(&p.lm, reqs, temperature, Mode::TRAIN);
    let shared = knowrl_engine::flops::snapshot().shared - flops;
    loss(&s).backward();
    let grads: Vec<Tensor> = p.trainable_parameters().iter().map(|(_, t)| t.grad().copy()).collect();
    (s, grads, shared)
}

/// Both paths' scores and gradients agree to 1e-5.
fn assert_same_scores_and_grads(
    p: &Policy,
    (want, want_g): (&knowrl_engine::score::Scored, &[Tensor]),
    (got, got_g): (&knowrl_engine::score::Scored, &[Tensor]),
) {
    assert_eq!(want.logprobs.size(), got.logprobs.size());
    assert!(max_abs_diff(&want.logprobs, &got.logprobs) < 1e-5, "{}", max_abs_diff(&want.logprobs, &got.logprobs));
    assert!(max_abs_diff(&want.entropy, &got.entropy) < 1e-5);
    assert!(want.mask.equal(&got.mask));
    for ((n, _), (w, g)) in p.trainable_parameters().iter().zip(want_g.iter().zip(got_g)) {
        let d = max_abs_diff(w, g);
        assert!(d < 1e-5, "{n}: {d}");
    }
}

#[test]
fn shared_prefix_scoring_matches_packed_scoring_values_and_gradients() {
    // Two prompts of different lengths, each shared by several rows; ragged responses, an
    // empty one, a loss mask: the prompt-once path must give the same log-probs, entropies
    // and parameter gradients as running every row in full.
    let p = tiny_policy(None);
    let (a, b): (&[u32], &[u32]) = (&[1, 5, 7, 8], &[1, 3]);
    let reqs = [
        ScoreRequest { prompt: a, response: &[9, 10, 2], loss_mask: None },
        ScoreRequest { prompt: b, response: &[11, 12, 13, 2], loss_mask: None },
        ScoreRequest { prompt: a, response: &[20, 2], loss_mask: Some(&[true, false]) },
        ScoreRequest { prompt: a, response: &[], loss_mask: None },
        ScoreRequest { prompt: b, response: &[4, 4, 4, 4, 4, 2], loss_mask: None },
    ];
    let loss: fn(&knowrl_engine::score::Scored) -> Tensor =
        |s| (&s.logprobs * &s.mask).sum(Kind::Float) + s.logprobs.select(0, 1).sum(Kind::Float);
    let (want, want_g, _) = scored_with_grads(&p, &reqs, 0.7, score_packed, loss);
    let (got, got_g, _) = scored_with_grads(&p, &reqs, 0.7, score_shared, loss);
    assert_same_scores_and_grads(&p, (&want, &want_g), (&got, &got_g));
    assert!(want.logprobs.abs().sum(Kind::Float).double_value(&[]) > 1.0);
    // `score` picks the shared path here and returns the same numbers.
    let s = score(&p.lm, &reqs, 0.7, Mode::EVAL);
    assert!(max_abs_diff(&s.logprobs, &want.logprobs) < 1e-5);
}

#[test]
fn rows_sharing_an_observation_score_as_packed_values_and_gradients() {
    // Agent rows of one prompt: two share the first turn and its observation, two more share
    // up to their second observation, one shares nothing past the prompt. Their shared prefixes
    // reach into the responses (loss tokens included); log-probs, entropies and gradients must
    // equal running every row in full.
    let p = tiny_policy(None);
    let (a, b): (&[u32], &[u32]) = (&[1, 5, 7, 8], &[1, 3]);
    let (t, f) = (true, false);
    let reqs = [
        ScoreRequest { prompt: a, response: &[9, 30, 31, 10, 2], loss_mask: Some(&[t, f, f, t, t]) },
        ScoreRequest { prompt: a, response: &[9, 30, 31, 12, 13, 2], loss_mask: Some(&[t, f, f, t, t, t]) },
        ScoreRequest { prompt: a, response: &[9, 30, 31, 10, 40, 41, 14], loss_mask: Some(&[t, f, f, t, f, f, t]) },
        ScoreRequest {
            prompt: a,
            response: &[9, 30, 31, 10, 40, 41, 15, 2],
            loss_mask: Some(&[t, f, f, t, f, f, t, t]),
        },
        ScoreRequest { prompt: b, response: &[11, 2], loss_mask: None },
        ScoreRequest { prompt: b, response: &[11, 50, 2], loss_mask: Some(&[t, f, t]) },
        ScoreRequest { prompt: a, response: &[16, 30, 2], loss_mask: Some(&[t, f, t]) },
    ];
    let loss: fn(&knowrl_engine::score::Scored) -> Tensor = |s| (&s.logprobs * &s.mask).sum(Kind::Float);
    let (want, want_g, _) = scored_with_grads(&p, &reqs, 0.9, score_packed, loss);
    let (got, got_g, shared) = scored_with_grads(&p, &reqs, 0.9, score_shared, loss);
    assert!(shared > 0.0, "the repeated prefixes count as shared work");
    assert_same_scores_and_grads(&p, (&want, &want_g), (&got, &got_g));
}

#[test]
fn devices_and_dtypes_parse_with_clear_errors() {
    use knowrl_engine::device::{parse_device, parse_dtype};
    assert_eq!(parse_device("cpu").unwrap(), tch::Device::Cpu);
    assert_eq!(parse_dtype("bf16").unwrap(), Kind::BFloat16);
    assert!(parse_device("tpu").unwrap_err().to_string().contains("tpu"));
    assert!(parse_dtype("int3").unwrap_err().to_string().contains("int3"));
    if !tch::Cuda::is_available() {
        assert!(parse_device("cuda:0").unwrap_err().to_string().contains("no CUDA device"));
    }
    // The pinned-memory transfer helper is the identity on CPU.
    let t = Tensor::from_slice(&[1i64, 2, 3]);
    assert!(knowrl_engine::device::to_device(t.copy(), tch::Device::Cpu).equal(&t));
}
