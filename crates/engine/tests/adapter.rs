//! PEFT adapter directories: one knowrl writes loads in `peft` with the same logits (1e-4 of the
//! largest logit), loads back here merged into its base, and a wrong or broken adapter is an
//! error naming the file.
mod common;
use common::*;
use knowrl_engine::weights::read_all;
use knowrl_engine::{adapter, LoadOptions, LoraConfig, Policy};
use serde_json::json;

fn lora() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
    }
}

/// SmolLM2 with a LoRA whose B is non-zero (a fresh adapter is the identity), saved as a PEFT
/// directory in `dir`.
fn trained_adapter(dir: &std::path::Path) -> Policy {
    let base = real_model("smollm2-135m-instruct");
    let p = Policy::load(&base, &LoadOptions { lora: Some(lora()), ..Default::default() }).unwrap();
    tch::manual_seed(11);
    tch::no_grad(|| {
        for (name, mut t) in p.trainable_parameters() {
            if name.contains("lora_B") {
                t.copy_(&(tch::Tensor::randn_like(&t) * 0.02));
            }
        }
    });
    adapter::save(dir, &lora(), &p.trainable_parameters(), &base).unwrap();
    p
}

#[test]
fn an_adapter_loads_in_peft_and_merged_here_with_the_same_logits() {
    tch::set_num_threads(2);
    let tmp = tmpdir("adapter");
    let dir = tmp.join("adapter");
    let unmerged = trained_adapter(&dir);
    for f in [adapter::CONFIG, adapter::WEIGHTS, adapter::BASE] {
        assert!(dir.join(f).is_file(), "{f} not written");
    }
    let merged = Policy::load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(merged.adapter.as_deref(), Some(dir.as_path()));
    let tok = merged.tokenizer().unwrap();
    let prompts =
        vec![tok.encode("The capital of Vobilford is", false).unwrap(), tok.encode("Hello there", false).unwrap()];
    let out = tmp.join("peft.safetensors");
    run_reference(
        &json!([{ "kind": "peft", "base": real_model("smollm2-135m-instruct"), "adapter": dir,
                  "prompts": prompts, "out": out }]),
        &tmp,
    );
    let reference = read_all(&out).unwrap();
    let ours = knowrl_engine::generate::full_logits(&merged.lm, &prompts);
    let lora_path = knowrl_engine::generate::full_logits(&unmerged.lm, &prompts);
    let base = Policy::load(&real_model("smollm2-135m-instruct"), &LoadOptions::default()).unwrap();
    let plain = knowrl_engine::generate::full_logits(&base.lm, &prompts);
    for (i, p) in prompts.iter().enumerate() {
        let n = p.len() as i64;
        let (o, theirs) = (ours.get(i as i64).narrow(0, 0, n), &reference[&format!("logits.{i}")]);
        let scale = theirs.abs().max().double_value(&[]).max(1.0);
        let d = max_abs_diff(&o, theirs);
        println!("prompt {i}: merged vs peft max |Δ| {d:.2e} (max |logit| {scale:.1})");
        assert!(d <= 1e-4 * scale, "merged adapter vs peft: {d}");
        // Merged = the LoRA path it was saved from, and the adapter does change the model.
        assert!(max_abs_diff(&o, &lora_path.get(i as i64).narrow(0, 0, n)) <= 1e-4 * scale);
        assert!(max_abs_diff(&o, &plain.get(i as i64).narrow(0, 0, n)) > 1e-2, "the adapter changed nothing");
    }
    // A run's own LoRA sits on top of the merged adapter: off, it is the merged model.
    let on_top = Policy::load(&dir, &LoadOptions { lora: Some(lora()), ..Default::default() }).unwrap();
    assert_eq!(on_top.trainable_parameters().len(), 30 * 3 * 2);
    let again = knowrl_engine::generate::full_logits(&on_top.lm, &prompts);
    // Not bit-equal: with frozen base weights these few rows take the decode GEMM, with
    // trainable ones libtorch's (another summation order).
    let d = max_abs_diff(&again, &ours);
    assert!(d <= 1e-5 * 30.0, "fresh LoRA on the merged adapter changed the logits by {d}");
}

#[test]
fn a_broken_or_mismatched_adapter_names_its_file() {
    tch::set_num_threads(2);
    let tmp = tmpdir("adapter-bad");
    let good = tmp.join("good");
    drop(trained_adapter(&good));
    let copy = |name: &str| {
        let d = tmp.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in [adapter::CONFIG, adapter::WEIGHTS, adapter::BASE] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };
    let err =
        |d: &std::path::Path| Policy::load(d, &LoadOptions::default()).err().expect("loaded a bad adapter").to_string();

    let missing = copy("missing");
    std::fs::remove_file(missing.join(adapter::WEIGHTS)).unwrap();
    let e = err(&missing);
    assert!(e.contains("adapter_model.safetensors"), "{e}");

    let truncated = copy("truncated");
    let bytes = std::fs::read(truncated.join(adapter::WEIGHTS)).unwrap();
    std::fs::write(truncated.join(adapter::WEIGHTS), &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&truncated);
    assert!(e.contains("adapter_model.safetensors") && e.contains("safetensors"), "{e}");

    let other_base = copy("other-base");
    let rec = json!({"base": "smollm2-135m-instruct", "sha256": "0".repeat(64)});
    std::fs::write(other_base.join(adapter::BASE), rec.to_string()).unwrap();
    let e = err(&other_base);
    assert!(e.contains(adapter::BASE) && e.contains("sha256") && e.contains("another base"), "{e}");

    // An adapter of another model size: tensors shaped for a 64-wide model on SmolLM2 (576).
    let other_size = copy("other-size");
    let small: Vec<(String, tch::Tensor)> = (0..30)
        .flat_map(|i| {
            let m = format!("base_model.model.model.layers.{i}.self_attn.q_proj");
            [
                (format!("{m}.lora_A.weight"), tch::Tensor::zeros([4, 64], tch::kind::FLOAT_CPU)),
                (format!("{m}.lora_B.weight"), tch::Tensor::zeros([64, 4], tch::kind::FLOAT_CPU)),
            ]
        })
        .collect();
    knowrl_engine::weights::write_atomic(&other_size.join(adapter::WEIGHTS), &small).unwrap();
    let e = err(&other_size);
    assert!(e.contains("adapter_model.safetensors") && e.contains("another model size"), "{e}");

    let bad_config = copy("bad-config");
    std::fs::write(bad_config.join(adapter::CONFIG), r#"{"peft_type": "LORA", "r": "four"}"#).unwrap();
    let e = err(&bad_config);
    assert!(e.contains(adapter::CONFIG) && e.contains("`r`"), "{e}");
}

/// A run's LoRA on top of a knowledge adapter exports as one PEFT adapter for the plain base
/// (both stacked, different targets and ranks): peft applies it with the same logits as the
/// trained policy, and it loads back here the same.
#[test]
fn a_run_lora_on_an_adapter_exports_stacked_for_peft() {
    tch::set_num_threads(2);
    let tmp = tmpdir("adapter-export");
    let knowledge = tmp.join("knowledge");
    trained_adapter(&knowledge);
    let run = LoraConfig { rank: 2, alpha: 4.0, dropout: 0.0, target_modules: vec!["q_proj".into(), "up_proj".into()] };
    let trained = Policy::load(&knowledge, &LoadOptions { lora: Some(run), seed: 3, ..Default::default() }).unwrap();
    tch::manual_seed(12);
    tch::no_grad(|| {
        for (name, mut t) in trained.trainable_parameters() {
            if name.contains("lora_B") {
                t.copy_(&(tch::Tensor::randn_like(&t) * 0.02));
            }
        }
    });
    let out = tmp.join("exported");
    trained.export_adapter(&out).unwrap();
    let (cfg, _) = adapter::read_lora(&out).unwrap();
    assert_eq!((cfg.rank, cfg.target_modules.len()), (6, 4), "ranks 4 + 2, targets q/v/down ∪ q/up");
    let tok = trained.tokenizer().unwrap();
    let prompts = vec![tok.encode("The capital of Vobilford is", false).unwrap()];
    let want = knowrl_engine::generate::full_logits(&trained.lm, &prompts);
    let scale = want.abs().max().double_value(&[]).max(1.0);
    let peft_out = tmp.join("peft.safetensors");
    run_reference(
        &json!([{ "kind": "peft", "base": real_model("smollm2-135m-instruct"), "adapter": out,
                  "prompts": prompts, "out": peft_out }]),
        &tmp,
    );
    let theirs = &read_all(&peft_out).unwrap()["logits.0"];
    let n = prompts[0].len() as i64;
    let d = max_abs_diff(&want.get(0).narrow(0, 0, n), theirs);
    println!("trained policy vs peft on the exported adapter: max |Δ| {d:.2e} (max |logit| {scale:.1})");
    assert!(d <= 1e-4 * scale, "{d}");
    let back = Policy::load(&out, &LoadOptions::default()).unwrap();
    let d = max_abs_diff(&knowrl_engine::generate::full_logits(&back.lm, &prompts), &want);
    assert!(d <= 1e-4 * scale, "exported adapter loaded here: {d}");
    // The run's own LoRA matters: the knowledge adapter alone gives other logits.
    let alone = Policy::load(&knowledge, &LoadOptions::default()).unwrap();
    assert!(max_abs_diff(&knowrl_engine::generate::full_logits(&alone.lm, &prompts), &want) > 1e-3);
}
