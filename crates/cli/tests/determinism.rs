//! Two processes with the same config and seed write the same metrics: a BRIDGE run (fresh
//! LoRA on the policy and on the retriever's query encoder, both drawn from seeded generators;
//! two-state estimator) on the tiny world, twice. Timings and the peak-memory probe differ by
//! nature and are left out. Each run also exports its LoRA as a PEFT adapter (`--export-adapter`).
use std::path::Path;
use std::process::Command;

fn config(out: &Path) -> String {
    let world = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world");
    format!(
        r#"
[model]
path = "{policy}"
lora = {{ rank = 4, alpha = 8.0, target_modules = ["q_proj", "v_proj"] }}
[data]
world = "{world}"
[rollout]
prompts_per_step = 2
group_size = 3
max_turns = 2
topk = 2
max_tokens_per_turn = 12
temperature = 1.0
[algorithm]
name = "grpo"
clip_low = 0.2
clip_high = 0.2
aggregation = "token_mean"
normalisation = "mean_std"
ppo_mini_batch = 3
[method]
name = "bridge"
k = 4
estimator = "two_state"
retriever_lr = 0.05
[optim]
lr = 1e-2
weight_decay = 0.0
max_grad_norm = 1.0
micro_batch = 4
[run]
steps = 2
seed = 5
out_dir = "{out}"
checkpoint_every = 0
"#,
        policy = world.join("policy").display(),
        world = world.display(),
        out = out.display()
    )
}

/// metrics.jsonl without the keys that measure time or memory.
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let strip = |m: &mut serde_json::Map<String, serde_json::Value>| {
                m.retain(|k, _| !k.ends_with("_s") && k != "retriever_update_peak_bytes")
            };
            strip(v.as_object_mut().unwrap());
            strip(v["extra"].as_object_mut().unwrap());
            v
        })
        .collect()
}

#[test]
fn two_processes_with_the_same_seed_write_the_same_metrics() {
    let base = std::env::temp_dir().join(format!("knowrl-determinism-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let mut runs = vec![];
    for name in ["a", "b"] {
        let out = base.join(name);
        std::fs::create_dir_all(&out).unwrap();
        let file = base.join(format!("{name}.toml"));
        std::fs::write(&file, config(&out)).unwrap();
        let adapter = base.join(format!("{name}-adapter"));
        let st = Command::new(env!("CARGO_BIN_EXE_knowrl"))
            .args(["train", "--config", file.to_str().unwrap(), "--export-adapter", adapter.to_str().unwrap()])
            .env("OMP_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
        runs.push(metrics(&out));
        // The run's LoRA as a PEFT adapter directory, for the tiny policy as its base.
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!((cfg["peft_type"].as_str(), cfg["r"].as_i64()), (Some("LORA"), Some(4)));
        assert!(adapter.join("adapter_model.safetensors").is_file() && adapter.join("knowrl_base.json").is_file());
    }
    assert_eq!(runs[0].len(), 2);
    assert!(runs[0][1]["extra"]["retriever_l_rag"].as_f64().is_some(), "the retriever was updated");
    assert_eq!(runs[0], runs[1]);
    let _ = std::fs::remove_dir_all(&base);
}
