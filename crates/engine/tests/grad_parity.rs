//! Gradient parity with PyTorch/transformers in float64 on small random Llama-family models:
//! loss and every parameter gradient (full fine-tuning) or every adapter gradient (LoRA) of the
//! token-mean NLL over masked response tokens. Covers Llama with Llama-3 RoPE scaling and GQA,
//! Qwen2 (q/k/v bias, untied head) and Qwen3 (q/k norm). Also one AdamW step vs torch.optim.
mod common;
use common::*;
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::optim::{decays, AdamW, AdamWConfig};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::weights::{read_all, write_atomic};
use knowrl_engine::{LoadOptions, LoraConfig, Mode, Policy};
use serde_json::{json, Value};
use std::path::Path;
use tch::{Kind, Tensor};

fn config(model_type: &str) -> Value {
    let mut c = json!({
        "model_type": model_type, "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2,
    });
    let o = c.as_object_mut().unwrap();
    match model_type {
        "llama" => {
            o.insert("architectures".into(), json!(["LlamaForCausalLM"]));
            o.insert("tie_word_embeddings".into(), json!(true));
            o.insert("rope_theta".into(), json!(500000.0));
            o.insert(
                "rope_scaling".into(),
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
            );
        }
        "qwen2" => {
            o.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
            o.insert("tie_word_embeddings".into(), json!(false));
            o.insert("rope_theta".into(), json!(1000000.0));
        }
        "qwen3" => {
            o.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
            o.insert("tie_word_embeddings".into(), json!(true));
            o.insert("head_dim".into(), json!(16)); // != hidden/heads, as in real Qwen3
            o.insert("rope_theta".into(), json!(1000000.0));
        }
        _ => unreachable!(),
    }
    c
}

fn batch() -> Vec<(Vec<u32>, Vec<u32>, Vec<bool>)> {
    // Ragged prompts and responses; the middle of the third response is an "observation"
    // (masked out), as in a search-agent trajectory.
    vec![
        (vec![1, 5, 9, 13], vec![20, 21, 22, 2], vec![true; 4]),
        (vec![1, 7], vec![30, 31, 32, 33, 34, 2], vec![true; 6]),
        (
            vec![1, 3, 4, 8, 16, 40, 41],
            vec![50, 51, 60, 61, 62, 52, 2],
            vec![true, true, false, false, false, true, true],
        ),
    ]
}

fn rust_loss(p: &Policy) -> Tensor {
    let b = batch();
    let reqs: Vec<ScoreRequest> =
        b.iter().map(|(pr, r, m)| ScoreRequest { prompt: pr, response: r, loss_mask: Some(m) }).collect();
    let s = score(&p.lm, &reqs, 1.0, Mode::TRAIN);
    -(&s.logprobs * &s.mask).sum(Kind::Double) / s.mask.sum(Kind::Double)
}

fn check_case(model_type: &str, lora: Option<LoraConfig>, dir: &Path) -> Value {
    let cfg = DecoderConfig::from_value(&dir.join("config.json"), config(model_type)).unwrap();
    let opts = LoadOptions { dtype: Kind::Double, lora: lora.clone(), ..Default::default() };
    let p = Policy::random(&cfg, &opts, 7);
    if lora.is_some() {
        // B starts at zero in PEFT; make it non-zero so A receives a gradient too.
        tch::no_grad(|| {
            for (n, t) in p.parameters() {
                if n.contains("lora_B") {
                    t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Double, t.device())) * 0.1));
                }
            }
        });
    }
    // The base weights as a plain HF directory; adapters beside them for the Python side.
    let base: Vec<(String, Tensor)> = p.parameters().into_iter().filter(|(n, _)| !n.contains("lora_")).collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string(&config(model_type)).unwrap()).unwrap();
    write_atomic(&dir.join("model.safetensors"), &base).unwrap();
    let adapters: Vec<(String, Tensor)> = p.parameters().into_iter().filter(|(n, _)| n.contains("lora_")).collect();
    if !adapters.is_empty() {
        write_atomic(&dir.join("adapters.safetensors"), &adapters).unwrap();
    }
    let loss = rust_loss(&p);
    loss.backward();
    let mut grads = vec![("loss".to_string(), loss.detach().reshape([1]))];
    for (n, t) in p.trainable_parameters() {
        grads.push((n, t.grad()));
    }
    for (n, t) in p.parameters() {
        if lora.is_some() && !n.contains("lora_") {
            assert!(!t.grad().defined(), "frozen base parameter {n} received a gradient");
        }
    }
    write_atomic(&dir.join("ours.safetensors"), &grads).unwrap();
    let b: Vec<Value> = batch().iter().map(|(pr, r, m)| json!({"prompt": pr, "response": r, "mask": m})).collect();
    json!({"kind": "grads", "model": dir, "batch": b, "lora": lora, "out": dir.join("ref.safetensors")})
}

#[test]
fn gradients_match_pytorch_in_float64() {
    tch::set_num_threads(2);
    let root = tmpdir("grads");
    let lora = lora_on_every_projection(4);
    let mut jobs = vec![];
    let mut dirs = vec![];
    for mt in ["llama", "qwen2", "qwen3"] {
        for l in [None, Some(lora.clone())] {
            let d = root.join(format!("{mt}-{}", if l.is_some() { "lora" } else { "full" }));
            jobs.push(check_case(mt, l, &d));
            dirs.push(d);
        }
    }
    run_reference(&Value::Array(jobs), &root);
    for d in dirs {
        let ours = read_all(&d.join("ours.safetensors")).unwrap();
        let theirs = read_all(&d.join("ref.safetensors")).unwrap();
        let mut names: Vec<&String> = ours.keys().collect();
        names.sort();
        let theirs_names: std::collections::BTreeSet<&String> = theirs.keys().collect();
        assert_eq!(names.iter().copied().collect::<std::collections::BTreeSet<_>>(), theirs_names, "{}", d.display());
        let mut worst = (0.0f64, String::new());
        for n in names {
            let (a, b) = (&ours[n], &theirs[n]);
            let rel = (a - b).norm().double_value(&[]) / b.norm().double_value(&[]).max(1e-30);
            assert!(b.abs().max().double_value(&[]) > 0.0, "{n}: reference gradient is all zero in {}", d.display());
            if rel > worst.0 {
                worst = (rel, n.clone());
            }
        }
        println!("{}: {} tensors, worst relative error {:.2e} ({})", d.display(), ours.len(), worst.0, worst.1);
        assert!(worst.0 <= 1e-5, "{}: {} relative error {}", d.display(), worst.1, worst.0);
    }
}

#[test]
fn adamw_matches_torch_optim() {
    let root = tmpdir("adamw");
    tch::manual_seed(3);
    let names = ["model.layers.0.mlp.up_proj.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"];
    let params: Vec<(String, Tensor)> = names
        .iter()
        .map(|n| (n.to_string(), Tensor::randn([5, 3], (Kind::Double, tch::Device::Cpu)).set_requires_grad(true)))
        .collect();
    let grads: Vec<Tensor> = params.iter().map(|_| Tensor::randn([5, 3], (Kind::Double, tch::Device::Cpu))).collect();
    let mut saved = vec![];
    for ((n, p), g) in params.iter().zip(&grads) {
        saved.push((format!("param.{n}"), p.detach().copy()));
        saved.push((format!("grad.{n}"), g.copy()));
    }
    write_atomic(&root.join("in.safetensors"), &saved).unwrap();
    let mut opt = AdamW::new(
        params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect(),
        AdamWConfig { weight_decay: 0.1, ..Default::default() },
    );
    for _ in 0..3 {
        opt.zero_grad();
        // d/dp Σ p·g = g: sets each gradient to the fixed g through autograd.
        let loss: Tensor = params.iter().zip(&grads).map(|((_, p), g)| (p * g).sum(Kind::Double)).sum();
        loss.backward();
        opt.step(0.05);
    }
    run_reference(
        &json!([{"kind": "adamw", "tensors": root.join("in.safetensors"), "names": names,
                 "decay": names.iter().map(|n| decays(n)).collect::<Vec<_>>(), "weight_decay": 0.1,
                 "lr": 0.05, "steps": 3, "out": root.join("out.safetensors")}]),
        &root,
    );
    let reference = read_all(&root.join("out.safetensors")).unwrap();
    for (n, p) in &params {
        let d = max_abs_diff(p, &reference[n]);
        assert!(d < 1e-12, "{n}: {d}");
    }
}
