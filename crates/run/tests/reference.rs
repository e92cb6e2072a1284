//! Offline AKBE's frozen policy is the checkpoint it names: after a GRPO run on the tiny world,
//! `knowrl_run::reference` on an AKBE config whose `signals_checkpoint` is that run's
//! checkpoints directory holds the run's trained parameters (not the starting ones); without the
//! checkpoint it is the starting policy.
use std::path::Path;

fn config(out: &Path, method: &str) -> knowrl_rl::config::TrainConfig {
    let world = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world");
    let text = format!(
        r#"
[model]
path = "{policy}"
[data]
world = "{world}"
[rollout]
prompts_per_step = 8
group_size = 4
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
[optim]
lr = 5e-2
weight_decay = 0.0
max_grad_norm = 1.0
micro_batch = 4
[run]
steps = 2
seed = 2
out_dir = "{out}"
checkpoint_every = 0
[reward]
name = "em_format"      # -1 without an answer: groups differ even when no answer is right
{method}
"#,
        policy = world.join("policy").display(),
        world = world.display(),
        out = out.display()
    );
    let c: knowrl_rl::config::TrainConfig = toml::from_str(&text).unwrap();
    c.validate().unwrap();
    c
}

#[test]
fn offline_akbe_loads_the_checkpoint_it_names() {
    tch::set_num_threads(1);
    let base = std::env::temp_dir().join(format!("knowrl-run-reference-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let grpo = config(&base.join("grpo"), "");
    let policy = knowrl_run::load(&grpo).unwrap();
    let tool = knowrl_run::retriever(&grpo).unwrap();
    let m = knowrl_run::train(&policy, &tool, &grpo, false, &|_| {}).unwrap();
    assert!(m.iter().any(|s| s.grad_norm > 0.0), "the GRPO run must move the policy");
    let ckpt = base.join("grpo/checkpoints");
    let offline = format!(
        "[method]\nname = \"akbe\"\nn_wt = 3\nn_nt = 2\nsignals = \"offline\"\nsignals_checkpoint = \"{}\"\n",
        ckpt.display()
    );
    let frozen = knowrl_run::reference(&config(&base.join("akbe"), &offline)).unwrap().expect("a frozen policy");
    let start =
        knowrl_run::reference(&config(&base.join("akbe0"), "[method]\nname = \"akbe\"\nsignals = \"offline\"\n"))
            .unwrap()
            .expect("the starting policy");
    let (trained, frozen, start) =
        (policy.trainable_parameters(), frozen.trainable_parameters(), start.trainable_parameters());
    assert_eq!(trained.len(), frozen.len());
    for ((n, a), (_, b)) in trained.iter().zip(&frozen) {
        assert!(a.equal(b), "{n}: the frozen policy is not the checkpoint's");
    }
    assert!(trained.iter().zip(&start).any(|((_, a), (_, b))| !a.equal(b)), "the checkpoint equals the start");
    let _ = std::fs::remove_dir_all(&base);
}
