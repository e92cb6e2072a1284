//! `knowrl bench gpu` on the CPU (how it is tested without a GPU): the same code as on CUDA, so
//! on the CPU the device's f32 must equal the reference exactly, and the cached decode must
//! agree with uncached scoring and sample the reference's tokens.
use std::process::Command;

#[test]
fn bench_gpu_on_the_cpu_checks_parity_and_decode_and_writes_its_keys() {
    let model = knowrl_engine::adapter::models_dir().join("smollm2-135m-instruct");
    let out = std::env::temp_dir().join(format!("knowrl-bench-gpu-{}.json", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_knowrl"))
        .args(["bench", "gpu", "--device", "cpu", "--shape", "smollm2-135m", "--rows", "4"])
        .args(["--prompt-tokens", "16", "--new-tokens", "8", "--model"])
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(r["parity"]["max_abs_logprob_diff_f32"].as_f64(), Some(0.0), "{r}");
    let bf16 = r["parity"]["max_abs_logprob_diff"].as_f64().unwrap();
    assert!(bf16 > 0.0 && bf16 < 1.0, "bf16 should differ from f32, a little: {bf16}");
    let d = &r["decode_parity"];
    assert!(d["max_abs_logprob_diff_cached_vs_scored"].as_f64().unwrap() < 1e-3, "{d}");
    assert_eq!(d["rows_same_tokens_as_cpu"], d["rows"], "{d}");
    for k in
        ["rollout_s", "update_s", "update_first_s", "rollout_forward_s", "rollout_forward_launch_s", "rollout_sample_s"]
    {
        assert!(r["grpo_step"][k].as_f64().unwrap() > 0.0, "{k}: {r}");
    }
    let step = &r["grpo_step"];
    assert!(step["rollout_forward_launch_s"].as_f64() <= step["rollout_forward_s"].as_f64(), "{step}");
    assert!(r["generation"]["new_tokens_per_s"].as_f64().unwrap() > 0.0);
}
