//! A tiny GRPO run on the world: metrics are written per step, checkpoints land atomically, and
//! a run resumed from its step-1 checkpoint ends bit-identical to an uninterrupted one.
mod common;
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;
use common::{agent_tasks, config, policy, retriever};
use knowrl_rl::method::TrainEnv;
use knowrl_rl::trainer::train;

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
        &TrainEnv { policy: &a, reference: None, retriever: &r, dense: None, group: None },
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
        &TrainEnv { policy: &b, reference: None, retriever: &r, dense: None, group: None },
        &tasks,
        &config(&base.join("b"), 1, ""),
        false,
        &|_| {},
    )
    .unwrap();
    // The interrupted run had also logged a step-1 point to TensorBoard after its last checkpoint.
    knowrl_rl::tensorboard::EventWriter::create(&base.join("b"))
        .unwrap()
        .scalars(1, &[("train/reward".into(), 999.0)])
        .unwrap();
    // The interrupted run had also logged evaluations after steps 1 and 2 (step 2 never reached
    // a checkpoint): the resumed run must drop the step-2 row, it will be evaluated again.
    std::fs::write(base.join("b/eval.jsonl"), "{\"step\":1,\"em\":0.1}\n{\"step\":2,\"em\":0.2}\n").unwrap();
    let b2 = load();
    let mb = train(
        &TrainEnv { policy: &b2, reference: None, retriever: &r, dense: None, group: None },
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
    // TensorBoard's own reader sees every step once, with the resumed run's values: the orphaned
    // point is purged by the restart marker.
    let out = base.join("tb.json");
    engine_common::run_reference(
        &serde_json::json!([{ "kind": "tensorboard", "dir": base.join("b"), "out": out }]),
        &base,
    );
    let tb: std::collections::BTreeMap<String, Vec<(i64, f64)>> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let reward = &tb["train/reward"];
    assert_eq!(reward.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 1], "{reward:?}");
    assert_eq!(reward[1].1, mb[0].reward as f32 as f64);
    assert!(tb.contains_key("train/grad_norm") && tb.contains_key("train/ppo_updates"), "{:?}", tb.keys());
    let _ = std::fs::remove_dir_all(&base);
}

/// Rows with A = 0 or λ = 0 are not scored without a KL term, and the gradient is the same as
/// scoring them (the loss is divided by the whole batch's tokens either way).
#[test]
fn zero_advantage_rows_are_skipped_with_the_same_gradient() {
    use knowrl_rl::update::{pg_backward, Normaliser, PgRow, Sequence};
    tch::set_num_threads(1);
    let policy = policy();
    let tok = policy.tokenizer().unwrap();
    let prompt =
        |q: &str| tok.encode(&format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"), false).unwrap();
    let response = |a: &str| tok.encode(&format!("<answer> {a} </answer>"), false).unwrap();
    let row = |q: &str, a: &str, advantage: f64, weight: f64| {
        let response = response(a);
        let seq = Sequence { prompt: prompt(q), loss_mask: vec![true; response.len()], response: response.clone() };
        PgRow::new(seq, advantage, weight)
    };
    let rows = vec![
        // A group with unequal rewards, one whose samples all scored the same, a zero-weight row.
        row("Who founded Vobilford?", "Draitekir", 1.2, 1.0),
        row("Who founded Vobilford?", "Zaibabriholm", -1.2, 1.0),
        row("Where was Draitekir born?", "Vobilford", 0.0, 1.0),
        row("Where was Draitekir born?", "Thaishisilholm", 0.0, 1.0),
        row("Where was Draitekir born?", "Vobilford", 0.0, 1.0),
        row("In which country is Vobilford?", "Draitekir", 0.7, 0.0),
    ];
    let norm = Normaliser::of(&rows);
    let grads = |skip: bool, kl: f64| {
        let mut cfg = config(&std::env::temp_dir().join("knowrl-skip-unused"), 1, "").algorithm;
        (cfg.skip_zero_advantage, cfg.kl_coef) = (skip, kl);
        let params = policy.trainable_parameters();
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let st = pg_backward(&policy, None, &rows, norm, &cfg, 1.0, 4);
        let g: Vec<tch::Tensor> = params.iter().map(|(_, p)| p.grad().copy()).collect();
        (st, g)
    };
    let (full, g_full) = grads(false, 0.0);
    let (skipped, g_skip) = grads(true, 0.0);
    assert_eq!((full.skipped_rows, skipped.skipped_rows), (0, 4));
    assert!((full.loss - skipped.loss).abs() < 1e-6, "{} vs {}", full.loss, skipped.loss);
    let mut nonzero = 0;
    for (a, b) in g_full.iter().zip(&g_skip) {
        // f32 sums over other batch compositions: equal up to rounding (a wrong normaliser
        // would scale them by the skipped rows' share of tokens).
        let (diff, norm) = ((a - b).norm().double_value(&[]), a.norm().double_value(&[]));
        assert!(diff <= 1e-4 * norm + 1e-6, "gradients differ: |Δ| {diff} vs |g| {norm}");
        nonzero += (a.abs().max().double_value(&[]) > 0.0) as usize;
    }
    assert!(nonzero > 0, "the surviving rows must carry a gradient");
    // With a KL term every row has a gradient: nothing is skipped.
    assert_eq!(grads(true, 0.1).0.skipped_rows, 0);
}

/// BRIDGE carries state of its own (the retriever's query LoRA, its AdamW moments, the two-state
/// estimator's second retriever): a run resumed from its step-2 checkpoint, with a fresh policy
/// and a fresh retriever, ends bit-identical to an uninterrupted one, retriever included.
#[test]
fn bridge_resumes_bit_identically_with_its_retriever_state() {
    tch::set_num_threads(1);
    let lora = knowrl_engine::LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["query".into(), "value".into()],
    };
    let tasks = agent_tasks(50);
    let base = std::env::temp_dir().join(format!("knowrl-train-bridge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let method = "[method]\nname = \"bridge\"\nk = 4\nestimator = \"two_state\"\nretriever_lr = 0.05\n";
    let run = |dir: &str, steps: u64, resume: bool| {
        let p = policy();
        let r = common::retriever_with(Some(lora.clone()));
        let env = TrainEnv { policy: &p, reference: None, retriever: &r, dense: Some(&r), group: None };
        let m = train(&env, &tasks, &config(&base.join(dir), steps, method), resume, &|_| {}).unwrap();
        let adapter: Vec<tch::Tensor> =
            r.encoder.lock().unwrap().adapter_parameters().into_iter().map(|(_, t)| t).collect();
        (p, adapter, m)
    };
    let (pa, ra, ma) = run("a", 3, false);
    assert!(ma.iter().all(|m| m.extra["retrieval_turns"] > 0.0), "the tiny policy searches");
    run("b", 2, false);
    let (pb, rb, mb) = run("b", 3, true);
    assert_eq!(mb.len(), 1, "resumed run does only the remaining step");
    for k in ["retriever_j_rl", "retriever_l_rag", "policy_l_rag_0", "policy_l_rag_1"] {
        assert_eq!(mb[0].extra[k], ma[2].extra[k], "{k} differs after resume");
    }
    for ((n, x), (_, y)) in pa.trainable_parameters().iter().zip(pb.trainable_parameters()) {
        assert!(x.equal(&y), "policy {n} differs after resume");
    }
    let fresh = common::retriever_with(Some(lora.clone()));
    let init: Vec<tch::Tensor> =
        fresh.encoder.lock().unwrap().adapter_parameters().into_iter().map(|(_, t)| t).collect();
    assert!(ra.iter().zip(&init).any(|(a, i)| !a.equal(i)), "the retriever adapter never moved");
    for (a, b) in ra.iter().zip(&rb) {
        assert!(a.equal(b), "retriever adapter differs after resume");
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// The trainer owns eval.jsonl: it calls the evaluator every `run.eval_every` steps, appends
/// `{"step": done, …}`, starts the file afresh on a new run, and skips a failed evaluation.
#[test]
fn periodic_evaluations_are_appended_by_the_trainer() {
    tch::set_num_threads(1);
    let r = retriever();
    let tasks = agent_tasks(50);
    let dir = std::env::temp_dir().join(format!("knowrl-train-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("eval.jsonl"), "{\"step\":7,\"em\":0.9}\n").unwrap(); // a previous run's
    let mut cfg = config(&dir, 3, "");
    cfg.run.eval_every = 1;
    let p = policy();
    let calls = std::cell::Cell::new(0);
    let evaluate = |_: &knowrl_engine::Policy| {
        calls.set(calls.get() + 1);
        if calls.get() == 2 {
            return Err("the evaluator broke".to_string());
        }
        Ok(serde_json::json!({"em": 0.25 * calls.get() as f64}))
    };
    let env = TrainEnv { policy: &p, reference: None, retriever: &r, dense: None, group: None };
    knowrl_rl::trainer::train_with_eval(&env, &tasks, &cfg, false, &|_| {}, Some(&evaluate)).unwrap();
    assert_eq!(calls.get(), 3);
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("eval.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows, vec![serde_json::json!({"step": 1, "em": 0.25}), serde_json::json!({"step": 3, "em": 0.75})]);
    let _ = std::fs::remove_dir_all(&dir);
}
