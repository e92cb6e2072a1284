//! Offline AKBE's frozen policy is the checkpoint it names: after a GRPO run on the tiny world,
//! `knowrl_run::reference` on an AKBE config whose `signals_checkpoint` is that run's
//! checkpoints directory holds the run's trained parameters (not the starting ones); without the
//! checkpoint it is the starting policy.
#[path = "../../rl/tests/common/mod.rs"]
mod common;
use std::path::Path;

/// The rl tests' small tiny-world config with 8 questions × 4 samples, lr 5e-2 and the
/// format-aware reward (−1 without an answer: groups differ even when no answer is right).
fn config(out: &Path, method: &str) -> knowrl_rl::config::TrainConfig {
    let mut c = common::config(out, 2, method);
    (c.rollout.prompts_per_step, c.rollout.group_size, c.optim.lr) = (8, 4, 5e-2);
    (c.run.seed, c.run.checkpoint_every) = (2, 0);
    c.reward.name = knowrl_rl::reward::RewardKind::EmFormat;
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
    let m = knowrl_run::train(&policy, &tool, &grpo, false, None, &|_| {}).unwrap();
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
