//! A training run composed from its config, for the CLI and for library users alike: the
//! training tasks (`data.suite`), the frozen reference when something needs one, the search
//! tool (the world's dense retriever or an index; with a query LoRA when the method trains one),
//! the periodic validation evaluation, and [`train`] putting them together around
//! `knowrl_rl::trainer::train_with_eval` (which owns metrics.jsonl, eval.jsonl, TensorBoard and
//! the checkpoints).
use anyhow::{Context, Result};
use knowrl_dist::{Backend, ProcessGroup, Rendezvous};
use knowrl_engine::device::parse_device;
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, Policy};
use knowrl_eval::data::{question_task, questions, scenario_items, scenario_task};
use knowrl_retrieval::corpus::{read_corpus, Corpus};
use knowrl_retrieval::dense::{DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use knowrl_rl::config::{Suite, TrainConfig};
use knowrl_rl::method::{StepMetrics, TrainEnv};
use knowrl_rl::task::Task;
use knowrl_world::questions::Split;
use std::sync::Arc;

/// The world's search tool: its tiny dense retriever over `corpus.jsonl` (exact, in memory).
pub fn world_retriever(world: &std::path::Path) -> Result<DenseRetriever> {
    world_retriever_with(world, &LoadOptions::default())
}

/// The same, with the encoder loaded as `opts` says: its device, a query-side LoRA (passages
/// are encoded without it).
pub fn world_retriever_with(world: &std::path::Path, opts: &LoadOptions) -> Result<DenseRetriever> {
    let (passages, _) = read_corpus(&world.join("corpus.jsonl"), false)?;
    let enc = Encoder::load(&world.join("encoder"), opts)?;
    let texts: Vec<&str> = passages.iter().map(|p| p.contents.as_str()).collect();
    let vecs: Vec<tch::Tensor> = texts.chunks(128).map(|c| enc.embed_passages(c)).collect::<Result<_, _>>()?;
    let flat = FlatIndex::from_tensor(&tch::Tensor::cat(&vecs, 0), VecDtype::F32);
    Ok(DenseRetriever::new(enc, DenseIndex::Flat(flat), Arc::new(Corpus::Memory(passages))))
}

/// The training tasks a config asks for (train split of the world).
pub fn tasks(cfg: &TrainConfig) -> Result<Vec<Task>> {
    let w = &cfg.data.world;
    let t: Vec<Task> = match cfg.data.suite {
        Suite::Agent => questions(w, Split::Train).map_err(anyhow::Error::msg)?.iter().map(question_task).collect(),
        Suite::Context => scenario_items(w, Split::Train, &cfg.data.scenarios)
            .map_err(anyhow::Error::msg)?
            .iter()
            .map(scenario_task)
            .collect(),
        Suite::Jsonl => {
            knowrl_eval::data::jsonl_tasks(cfg.data.path.as_ref().expect("validated")).map_err(anyhow::Error::msg)?
        }
    };
    anyhow::ensure!(!t.is_empty(), "{}: no training tasks for suite {:?}", w.display(), cfg.data.suite);
    Ok(t)
}

/// A frozen copy of the starting weights, when something needs it and LoRA cannot provide it;
/// or of a checkpoint of this run's model, when the method names one (offline AKBE).
pub fn reference(cfg: &TrainConfig) -> Result<Option<Policy>> {
    let spec = cfg.method.spec();
    if let Some(dir) = spec.reference_checkpoint() {
        let step = knowrl_engine::checkpoint::resolve(&dir)?;
        let p = load(cfg)?;
        knowrl_engine::checkpoint::load_params(&step, &p.trainable_parameters())
            .with_context(|| format!("loading the reference checkpoint {}", step.display()))?;
        return Ok(Some(p));
    }
    let needs = (cfg.algorithm.kl_coef > 0.0 && cfg.model.lora.is_none()) || spec.needs_reference();
    let frozen = LoadOptions { lora: None, ..load_options(cfg)? };
    Ok(if needs { Some(Policy::load(&cfg.model.path, &frozen)?) } else { None })
}

/// `[model]`'s device and dtype, the run's LoRA and seed.
pub fn load_options(cfg: &TrainConfig) -> Result<LoadOptions> {
    let m = &cfg.model;
    let (device, dtype) = knowrl_engine::device::parse_placement(&m.device, &m.dtype)?;
    Ok(LoadOptions { device, dtype, lora: m.lora.clone(), seed: cfg.run.seed as i64 })
}

pub fn load(cfg: &TrainConfig) -> Result<Policy> {
    Policy::load(&cfg.model.path, &load_options(cfg)?).with_context(|| format!("loading {}", cfg.model.path.display()))
}

/// The search tool of a run: a dense retriever (the world's, or an index's; BRIDGE adapts its
/// query LoRA) or any other index retriever (BM25, hybrid).
pub enum SearchTool {
    Dense(Box<knowrl_retrieval::dense::DenseRetriever>),
    Other(std::sync::Arc<dyn knowrl_retrieval::Retriever>),
}

impl SearchTool {
    pub fn as_dyn(&self) -> &dyn knowrl_retrieval::Retriever {
        match self {
            SearchTool::Dense(d) => d.as_ref(),
            SearchTool::Other(o) => o.as_ref(),
        }
    }
    pub fn dense(&self) -> Option<&knowrl_retrieval::dense::DenseRetriever> {
        match self {
            SearchTool::Dense(d) => Some(d),
            SearchTool::Other(_) => None,
        }
    }
}

/// The run's retriever: `data.index` if given, else the world's; with a fresh query-side LoRA
/// when BRIDGE trains it.
pub fn retriever(cfg: &TrainConfig) -> Result<SearchTool> {
    let lora = cfg.method.spec().query_lora();
    let bridge = lora.is_some();
    // The encoder (and BRIDGE's query LoRA) on the run's device, in f32: it is small.
    let opts = LoadOptions { device: parse_device(&cfg.model.device)?, lora, ..Default::default() };
    Ok(match &cfg.data.index {
        Some(dir) => {
            let ix = knowrl_retrieval::index::open(dir)?;
            if bridge || (ix.spec.dense.is_some() && !ix.spec.bm25) {
                SearchTool::Dense(Box::new(ix.dense(false, &opts)?))
            } else {
                SearchTool::Other(ix.retriever(None, false)?)
            }
        }
        None => SearchTool::Dense(Box::new(world_retriever_with(&cfg.data.world, &opts)?)),
    })
}

/// This process's process group when torchrun's environment (or `knowrl train --nproc`) makes
/// it one rank of several (`None`: one process): NCCL when the run is on CUDA, else gloo. Ranks meet at MASTER_ADDR:MASTER_PORT within
/// `timeout` (which also bounds every collective), and a rank started with another config than
/// rank 0's is refused there, naming the first differing field.
pub fn join_ranks(cfg: &TrainConfig, timeout: std::time::Duration) -> Result<Option<ProcessGroup>> {
    let Some(r) = Rendezvous::from_env()? else {
        return Ok(None);
    };
    if r.world_size == 1 {
        return Ok(None);
    }
    // NCCL between GPUs (one per local rank), gloo between CPUs.
    let backend = if cfg.model.device.starts_with("cuda") { Backend::Nccl } else { Backend::Gloo };
    let g = ProcessGroup::new(&r, backend, timeout).with_context(|| {
        format!("rank {} of {} at {}:{} ({backend:?})", r.rank, r.world_size, r.master_addr, r.master_port)
    })?;
    let text = toml::to_string(cfg).context("serialising the config")?;
    let all = g.all_gather_bytes(text.as_bytes())?;
    let lead: TrainConfig = toml::from_str(&String::from_utf8_lossy(&all[0])).context("rank 0's config")?;
    if let Some(field) = lead.first_difference(cfg) {
        anyhow::bail!("rank {} was started with another config than rank 0's (first difference: {field})", r.rank);
    }
    for (rank, theirs) in all.iter().enumerate().skip(1) {
        let theirs: TrainConfig = toml::from_str(&String::from_utf8_lossy(theirs)).context("a rank's config")?;
        if let Some(field) = lead.first_difference(&theirs) {
            anyhow::bail!("rank {rank} was started with another config than rank 0's (first difference: {field})");
        }
    }
    Ok(Some(g))
}

/// Trains `policy` with `tool` as `cfg` says (continuing from the latest checkpoint when
/// `resume`), evaluating every `run.eval_every` steps; `on_step` sees each step's metrics. With
/// a `group` this process is one of its ranks (`join_ranks`).
pub fn train(
    policy: &Policy,
    tool: &SearchTool,
    cfg: &TrainConfig,
    resume: bool,
    group: Option<&ProcessGroup>,
    on_step: &dyn Fn(&StepMetrics),
) -> Result<Vec<StepMetrics>> {
    let tasks = tasks(cfg)?;
    let reference = reference(cfg)?;
    let dense = if cfg.method.spec().query_lora().is_some() {
        Some(tool.dense().ok_or_else(|| {
            anyhow::anyhow!(
                "{}: data.index must have dense vectors (the method trains a query LoRA)",
                cfg.method.name()
            )
        })?)
    } else {
        None
    };
    let env = TrainEnv { policy, reference: reference.as_ref(), retriever: tool.as_dyn(), dense, group };
    let periodic = PeriodicEval::new(cfg, tool)?;
    let evaluate =
        |p: &Policy| periodic.as_ref().expect("only called with an evaluator").run(p).map_err(|e| format!("{e:#}"));
    let eval: Option<knowrl_rl::trainer::Evaluate> = if periodic.is_some() { Some(&evaluate) } else { None };
    Ok(knowrl_rl::trainer::train_with_eval(&env, &tasks, cfg, resume, on_step, eval)?)
}

/// `run.eval_every`: greedy validation-split evaluation during training (the trainer writes its
/// rows to eval.jsonl and TensorBoard).
pub struct PeriodicEval<'a> {
    cfg: &'a TrainConfig,
    retriever: &'a SearchTool,
    questions: Vec<knowrl_world::questions::Question>,
    items: Vec<knowrl_world::suites::ScenarioItem>,
}

impl<'a> PeriodicEval<'a> {
    pub fn new(cfg: &'a TrainConfig, retriever: &'a SearchTool) -> Result<Option<PeriodicEval<'a>>> {
        if cfg.run.eval_every == 0 || cfg.data.suite == Suite::Jsonl {
            return Ok(None);
        }
        let take = |n: usize| if cfg.run.eval_limit == 0 { n } else { cfg.run.eval_limit.min(n) };
        let w = &cfg.data.world;
        let mut questions = questions(w, Split::Valid).map_err(anyhow::Error::msg)?;
        questions.truncate(take(questions.len()));
        // The paper's five, and a scenario the run trains on beyond them (S2p): S2p in every run
        // would lengthen each periodic evaluation by a fifth.
        let mut names: Vec<String> = knowrl_world::suites::PAPER_SCENARIOS.map(String::from).to_vec();
        for s in &cfg.data.scenarios {
            if !names.contains(s) {
                names.push(s.clone());
            }
        }
        let mut items = scenario_items(w, Split::Valid, &names).map_err(anyhow::Error::msg)?;
        items.truncate(take(items.len()));
        Ok(Some(PeriodicEval { cfg, retriever, questions, items }))
    }

    pub fn run(&self, policy: &Policy) -> Result<serde_json::Value> {
        use knowrl_rl::task::Prompt;
        Ok(match self.cfg.data.suite {
            Suite::Context => {
                let refs: Vec<_> = self.items.iter().collect();
                let r = knowrl_eval::scenarios(policy, &refs, |s| {
                    Prompt::user(knowrl_world::prompts::with_context(&s.question, &s.context))
                })?;
                let em: serde_json::Map<String, serde_json::Value> =
                    r.overall.iter().map(|(k, c)| (k.clone(), serde_json::json!(c.rate()))).collect();
                serde_json::json!({"scenario_em": em})
            }
            _ => {
                let refs: Vec<_> = self.questions.iter().collect();
                let r = &self.cfg.rollout;
                let agent = r.agent(0.0);
                let prompt =
                    |q: &knowrl_world::questions::Question| Prompt::user(knowrl_world::prompts::agent(&q.question));
                let a = knowrl_eval::agent(policy, self.retriever.as_dyn(), &refs, prompt, &agent)?;
                serde_json::json!({"em": a.em, "tc": a.tc, "tp": a.tp, "boundary_accuracy": a.boundary_accuracy})
            }
        })
    }
}
