//! A tiny GRPO run on the world: metrics are written per step, checkpoints land atomically, and
//! a run resumed from its step-1 checkpoint ends bit-identical to an uninterrupted one.
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, Policy};
use knowrl_retrieval::corpus::{read_corpus, Corpus};
use knowrl_retrieval::dense::{DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use knowrl_rl::config::TrainConfig;
use knowrl_rl::trainer::{train, Task};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn world() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/world")
}

fn retriever() -> DenseRetriever {
    let (passages, _) = read_corpus(&world().join("corpus.jsonl"), false).unwrap();
    let enc = Encoder::load(&world().join("encoder"), &LoadOptions::default()).unwrap();
    let texts: Vec<&str> = passages.iter().map(|p| p.contents.as_str()).collect();
    let v: Vec<tch::Tensor> = texts.chunks(256).map(|c| enc.embed_passages(c).unwrap()).collect();
    DenseRetriever::new(
        enc,
        DenseIndex::Flat(FlatIndex::from_tensor(&tch::Tensor::cat(&v, 0), VecDtype::F32)),
        Arc::new(Corpus::Memory(passages)),
    )
}

fn tasks() -> Vec<Task> {
    let text = std::fs::read_to_string(world().join("questions.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<knowrl_world::questions::Question>(l).unwrap())
        .filter(|q| q.split == knowrl_world::questions::Split::Train)
        .take(50)
        .map(|q| Task { user: knowrl_world::prompts::agent(&q.question), golden: q.golden_answers })
        .collect()
}

fn config(out: &Path, steps: u64) -> TrainConfig {
    let text = format!(
        r#"
[model]
path = "{}"
[data]
world = "{}"
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
kl_coef = 0.0
aggregation = "token_mean"
normalisation = "mean_std"
[optim]
lr = 1e-3
weight_decay = 0.0
max_grad_norm = 1.0
micro_batch = 4
[run]
steps = {steps}
seed = 3
out_dir = "{}"
checkpoint_every = 1
"#,
        world().join("policy").display(),
        world().display(),
        out.display()
    );
    let c: TrainConfig = toml::from_str(&text).unwrap();
    c.validate().unwrap();
    c
}

#[test]
fn grpo_runs_checkpoints_and_resumes_bit_identically() {
    tch::set_num_threads(1);
    let r = retriever();
    let tasks = tasks();
    let base = std::env::temp_dir().join(format!("knowrl-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let load = || Policy::load(&world().join("policy"), &LoadOptions::default()).unwrap();

    let a = load();
    let ma = train(&a, &tasks, &r, &config(&base.join("a"), 2), false, &|_| {}).unwrap();
    assert_eq!(ma.len(), 2);
    let lines = std::fs::read_to_string(base.join("a/metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    assert!(base.join("a/checkpoints/step-00000002/manifest.json").exists());

    // Interrupted after step 1, resumed by a fresh process state from the checkpoint.
    let b = load();
    train(&b, &tasks, &r, &config(&base.join("b"), 1), false, &|_| {}).unwrap();
    let b2 = load();
    let mb = train(&b2, &tasks, &r, &config(&base.join("b"), 2), true, &|_| {}).unwrap();
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
}
