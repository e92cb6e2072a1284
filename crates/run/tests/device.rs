//! `[model] device` and `dtype`: a bf16 run on CPU keeps its LoRA and AdamW moments in f32
//! over a bf16 base and trains; a misspelt device is a config error naming the field; a CUDA
//! device on a machine without one fails at load, naming it.
#[path = "../../rl/tests/common/mod.rs"]
mod common;
use std::path::Path;
use tch::Kind;

fn config(out: &Path) -> knowrl_rl::config::TrainConfig {
    let mut c = common::config(out, 2, "");
    c.model.lora = Some(knowrl_engine::LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
    });
    (c.rollout.prompts_per_step, c.rollout.group_size, c.optim.lr) = (4, 4, 5e-2);
    c.reward.name = knowrl_rl::reward::RewardKind::EmFormat;
    c
}

#[test]
fn a_bf16_run_trains_an_f32_adapter_on_a_bf16_base() {
    tch::set_num_threads(1);
    let out = std::env::temp_dir().join(format!("knowrl-run-bf16-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut cfg = config(&out);
    cfg.model.dtype = "bf16".into();
    cfg.validate().unwrap();
    let policy = knowrl_run::load(&cfg).unwrap();
    let kinds = |lora: bool| -> Vec<Kind> {
        policy
            .parameters()
            .iter()
            .filter(|(n, _)| knowrl_engine::layers::is_lora_param(n) == lora)
            .map(|(_, t)| t.kind())
            .collect()
    };
    assert!(kinds(false).iter().all(|k| *k == Kind::BFloat16), "the base is bf16");
    assert!(!kinds(true).is_empty() && kinds(true).iter().all(|k| *k == Kind::Float), "the LoRA is f32");
    let before: Vec<tch::Tensor> = policy.trainable_parameters().iter().map(|(_, t)| t.copy()).collect();
    let tool = knowrl_run::retriever(&cfg).unwrap();
    let m = knowrl_run::train(&policy, &tool, &cfg, false, None, &|_| {}).unwrap();
    assert_eq!(m.len(), 2);
    assert!(m.iter().all(|s| s.loss.is_finite() && s.grad_norm.is_finite()), "{m:?}");
    let moved =
        policy.trainable_parameters().iter().zip(&before).any(|((_, t), b)| t.ne_tensor(b).any().int64_value(&[]) == 1);
    assert!(moved, "the adapter trained");
    let state = knowrl_engine::weights::read_all(&out.join("checkpoints/step-00000002/optimizer.safetensors")).unwrap();
    assert!(!state.is_empty() && state.values().all(|t| t.kind() == Kind::Float), "AdamW moments are f32");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_bad_device_is_named() {
    let mut cfg = config(Path::new("unused"));
    cfg.model.device = "gpu".into();
    let e = cfg.validate().unwrap_err();
    assert!(e.contains("model.device") && e.contains("gpu"), "{e}");
    cfg.model.device = "cpu".into();
    cfg.model.dtype = "fp8".into();
    assert!(cfg.validate().unwrap_err().contains("model.dtype"));
    if !tch::Cuda::is_available() {
        cfg.model.dtype = "f32".into();
        cfg.model.device = "cuda:0".into();
        cfg.validate().unwrap();
        let e = format!("{:#}", knowrl_run::load(&cfg).err().expect("no CUDA here"));
        assert!(e.contains("cuda:0") && e.contains("no CUDA device"), "{e}");
    }
}
