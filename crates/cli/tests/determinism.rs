//! Two processes with the same config and seed write the same metrics: a BRIDGE run (fresh
//! LoRA on the policy and on the retriever's query encoder, both drawn from seeded generators;
//! two-state estimator) on the tiny world, twice. Timings and the peak-memory probe differ by
//! nature and are left out. Each run also exports its LoRA as a PEFT adapter (`--export-adapter`).
#[path = "../../rl/tests/common/mod.rs"]
mod common;
use std::path::Path;
use std::process::Command;

/// The rl tests' small tiny-world config, as BRIDGE (two-state) with fresh LoRAs, written as TOML.
fn config(out: &Path) -> String {
    let method = "[method]\nname = \"bridge\"\nk = 4\nestimator = \"two_state\"\nretriever_lr = 0.05\n";
    let mut c = common::config(out, 2, method);
    c.model.lora = Some(knowrl_engine::LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
    });
    (c.algorithm.ppo_mini_batch, c.optim.lr, c.run.seed, c.run.checkpoint_every) = (3, 1e-2, 5, 0);
    toml::to_string(&c).unwrap()
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
