//! Shared by the rl integration tests: the shipped world, its retriever, a small train config.
#![allow(dead_code)]
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, Policy};
use knowrl_retrieval::corpus::{read_corpus, Corpus};
use knowrl_retrieval::dense::{DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use knowrl_rl::config::TrainConfig;
use knowrl_rl::task::{Prompt, Task};
use knowrl_world::questions::{Question, Split};
use knowrl_world::suites::ScenarioItem;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn world() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world")
}

pub fn policy() -> Policy {
    Policy::load(&world().join("policy"), &LoadOptions::default()).unwrap()
}

pub fn retriever() -> DenseRetriever {
    retriever_with(None)
}

/// The world's retriever with a query-side LoRA (BRIDGE).
pub fn retriever_with(lora: Option<knowrl_engine::LoraConfig>) -> DenseRetriever {
    let (passages, _) = read_corpus(&world().join("corpus.jsonl"), false).unwrap();
    let enc = Encoder::load(&world().join("encoder"), &LoadOptions { lora, ..Default::default() }).unwrap();
    let texts: Vec<&str> = passages.iter().map(|p| p.contents.as_str()).collect();
    let v: Vec<tch::Tensor> = texts.chunks(256).map(|c| enc.embed_passages(c).unwrap()).collect();
    DenseRetriever::new(
        enc,
        DenseIndex::Flat(FlatIndex::from_tensor(&tch::Tensor::cat(&v, 0), VecDtype::F32)),
        Arc::new(Corpus::Memory(passages)),
    )
}

fn lines<T: serde::de::DeserializeOwned>(file: &str) -> Vec<T> {
    let text = std::fs::read_to_string(world().join(file)).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Agent-suite tasks of the train split.
pub fn agent_tasks(n: usize) -> Vec<Task> {
    lines::<Question>("questions.jsonl")
        .into_iter()
        .filter(|q| q.split == Split::Train)
        .take(n)
        .map(|q| Task {
            id: q.id.clone(),
            golden: q.golden_answers,
            agent: Prompt::user(knowrl_world::prompts::agent(&q.question)),
            no_tool: Prompt::user(knowrl_world::prompts::no_tool(&q.question)),
            query_only: Prompt::user(knowrl_world::prompts::query_only(&q.question)),
            with_context: None,
            mix: None,
        })
        .collect()
}

/// Context-suite tasks (S2: counterfactual context) of the train split.
pub fn context_tasks(n: usize) -> Vec<Task> {
    lines::<ScenarioItem>("scenarios.jsonl")
        .into_iter()
        .filter(|s| s.split == Split::Train && s.scenario == "S2" && s.variant == "qa")
        .take(n)
        .map(|s| Task {
            id: s.id.clone(),
            golden: s.golden_answers.clone(),
            query_only: Prompt::user(knowrl_world::prompts::query_only(&s.question)),
            with_context: Some(Prompt::user(knowrl_world::prompts::with_context(&s.question, &s.context))),
            ..Default::default()
        })
        .collect()
}

/// A small config; `extra` is appended TOML (method sections).
pub fn config(out: &Path, steps: u64, extra: &str) -> TrainConfig {
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
{extra}
"#,
        world().join("policy").display(),
        world().display(),
        out.display()
    );
    let c: TrainConfig = toml::from_str(&text).unwrap();
    c.validate().unwrap();
    c
}

/// A step context at step 0 over `policy` and `retriever` (no reference, no trainable retriever).
pub fn ctx<'a>(
    policy: &'a Policy,
    retriever: &'a DenseRetriever,
    cfg: &'a TrainConfig,
) -> knowrl_rl::method::StepCtx<'a> {
    knowrl_rl::method::StepCtx {
        policy,
        reference: None,
        tok: policy.tokenizer().unwrap(),
        retriever,
        dense: None,
        rollout: &cfg.rollout,
        algorithm: &cfg.algorithm,
        reward: &cfg.reward,
        micro_batch: cfg.optim.micro_batch,
        seed: cfg.run.seed,
        step: 0,
        steps: cfg.run.steps,
        shard: knowrl_rl::method::Shard::whole(cfg.rollout.prompts_per_step),
    }
}
