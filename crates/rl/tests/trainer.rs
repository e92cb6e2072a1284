//! A tiny GRPO run on the world: metrics are written per step, checkpoints land atomically, and
//! a run resumed from its step-1 checkpoint ends bit-identical to an uninterrupted one.
mod common;
use common::{agent_tasks, config, policy, retriever};
use knowrl_rl::trainer::{train, TrainEnv};

#[test]
fn grpo_runs_checkpoints_and_resumes_bit_identically() {
    tch::set_num_threads(1);
    let r = retriever();
    let tasks = agent_tasks(50);
    let base = std::env::temp_dir().join(format!("knowrl-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let load = policy;

    let a = load();
    let ma = train(
        &TrainEnv { policy: &a, reference: None, retriever: &r, dense: None },
        &tasks,
        &config(&base.join("a"), 2, ""),
        false,
        &|_| {},
    )
    .unwrap();
    assert_eq!(ma.len(), 2);
    let lines = std::fs::read_to_string(base.join("a/metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    assert!(base.join("a/checkpoints/step-00000002/manifest.json").exists());

    // Interrupted after step 1, resumed by a fresh process state from the checkpoint.
    let b = load();
    train(
        &TrainEnv { policy: &b, reference: None, retriever: &r, dense: None },
        &tasks,
        &config(&base.join("b"), 1, ""),
        false,
        &|_| {},
    )
    .unwrap();
    // The interrupted run had also logged evaluations after steps 1 and 2 (step 2 never reached
    // a checkpoint): the resumed run must drop the step-2 row, it will be evaluated again.
    std::fs::write(base.join("b/eval.jsonl"), "{\"step\":1,\"em\":0.1}\n{\"step\":2,\"em\":0.2}\n").unwrap();
    let b2 = load();
    let mb = train(
        &TrainEnv { policy: &b2, reference: None, retriever: &r, dense: None },
        &tasks,
        &config(&base.join("b"), 2, ""),
        true,
        &|_| {},
    )
    .unwrap();
    assert_eq!(mb.len(), 1, "resumed run does only the remaining step");
    assert_eq!(mb[0].reward, ma[1].reward);
    assert_eq!(mb[0].tool_calls, ma[1].tool_calls);
    for ((n, x), (_, y)) in a.trainable_parameters().iter().zip(b2.trainable_parameters()) {
        assert!(x.equal(&y), "{n} differs after resume");
    }
    // The parameters did move.
    let fresh = load();
    let moved = a.trainable_parameters().iter().zip(fresh.trainable_parameters()).any(|((_, x), (_, y))| !x.equal(&y));
    assert!(moved || ma.iter().all(|m| m.grad_norm == 0.0), "no update although gradients were non-zero");
    let metrics = std::fs::read_to_string(base.join("b/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);
    assert_eq!(std::fs::read_to_string(base.join("b/eval.jsonl")).unwrap(), "{\"step\":1,\"em\":0.1}\n");
    let _ = std::fs::remove_dir_all(&base);
}
