//! `knowrl reproduce <method>`: the paper's comparison on the world at an equal budget — the
//! method vs its baseline over several seeds, plus ablation rows — printed in the paper's table
//! layout and written to `bench/results/reproduce-<method>.json` with a Markdown report and SVG
//! plots. A benchmark, not a test: minutes to an hour on 2 CPU cores.
//! One file per paper (`knowledgeable_r1`, `akbe`, `bridge`); this one holds what they share:
//! the arms (a label and a config change), training every arm for its seeds, the cells
//! (mean ± std over seeds) and the output files.
use crate::train::train_with_progress;
use anyhow::{Context, Result};
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_rl::config::{MethodConfig, TrainConfig};
use knowrl_rl::method::StepMetrics;
use knowrl_run::load;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

mod akbe;
mod bridge;
mod knowledgeable_r1;

/// The method section of a paper's preset (its arms change it).
macro_rules! section {
    ($f:ident, $variant:ident, $t:ty) => {
        pub(super) fn $f(c: &mut TrainConfig) -> &mut $t {
            match &mut c.method {
                MethodConfig::$variant(m) => m,
                other => panic!("the preset's method is {}, not {}", other.name(), stringify!($f)),
            }
        }
    };
}
section!(kr1_of, KnowledgeableR1, knowrl_rl::knowledgeable_r1::KnowledgeableR1Config);
section!(akbe_of, Akbe, knowrl_rl::akbe::AkbeConfig);
section!(bridge_of, Bridge, knowrl_rl::bridge::BridgeConfig);

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Knowledgeable-R1 vs GRPO with RAG on S1–S5 (Tables 2–4 layout).
    #[command(name = "knowledgeable-r1")]
    KnowledgeableR1(Args),
    /// GRPO(+AKBE) and DAPO(+AKBE) on the agent suite (Tables 1–3 layout).
    Akbe(Args),
    /// BRIDGE vs GRPO with a fixed retriever, §4.2 pipelines and estimator fidelity.
    Bridge(Args),
}

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Base training config (the method's world config).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seeds for the main rows.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Seeds for the ablation rows (0 = skip them).
    #[arg(long, default_value_t = 1)]
    pub ablation_seeds: u64,
    /// Training steps per run (default: the config's).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Test items per scenario/suite (0 = all of the test split).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// Rows to train this sitting, by label or slug, comma-separated (default: all). The report
    /// also shows every other row an earlier sitting finished.
    #[arg(long, value_delimiter = ',')]
    pub arms: Vec<String>,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
    /// Where the runs go: one directory per arm × seed under `<runs>/reproduce-<method>/`.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Where the JSON goes (default bench/results/reproduce-<method>.json; the Markdown report
    /// and SVGs go beside it). A report holding rows whose runs are not under --runs is never
    /// overwritten: the sitting stops before training and names them.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(c: Cmd) -> Result<()> {
    match c {
        Cmd::KnowledgeableR1(a) => knowledgeable_r1::run(a),
        Cmd::Akbe(a) => akbe::run(a),
        Cmd::Bridge(a) => bridge::run(a),
    }
}

/// One row of a comparison: a label and the config change that makes it.
pub(super) struct Arm {
    pub label: &'static str,
    pub ablation: bool,
    pub edit: Box<dyn Fn(&mut TrainConfig)>,
    /// Its step's cost relative to the method's typical step, for the expected wall time.
    pub step_cost: f64,
}

impl Arm {
    /// Prices this arm's step at `factor` × the method's typical step (first estimate only).
    pub fn costing(self, factor: f64) -> Arm {
        Arm { step_cost: factor, ..self }
    }
}

/// `label` names the row; it has no comma, since `--arms` is a comma-separated list of labels.
pub(super) fn arm(label: &'static str, ablation: bool, edit: impl Fn(&mut TrainConfig) + 'static) -> Arm {
    assert!(!label.contains(','), "arm label {label:?}: --arms splits at commas");
    Arm { label, ablation, edit: Box::new(edit), step_cost: 1.0 }
}

pub(super) fn base_config(a: &Args, default: &str) -> Result<TrainConfig> {
    let path = a.config.clone().unwrap_or_else(|| PathBuf::from(default));
    let mut cfg = TrainConfig::load(&path)?;
    a.device.apply(&mut cfg.model);
    if let Some(s) = a.steps {
        cfg.run.steps = s;
    }
    Ok(cfg)
}

/// Evaluates a trained run: its policy, its retriever (BRIDGE adapts it) and its step metrics.
pub(super) type Evaluate<'a, T> = &'a dyn Fn(&knowrl_engine::Policy, &DenseRetriever, &[StepMetrics]) -> Result<T>;

/// A row: its label, one evaluation per seed, and mean seconds per step per seed.
pub(super) type Row<T> = (String, Vec<T>, Vec<f64>);

/// What a finished arm × seed leaves in its run directory (`result.toml`: TOML keeps the NaN
/// of an empty subset, which JSON cannot), so that a rerun skips it: the evaluation, what it
/// was evaluated on, and the run's time.
#[derive(Serialize, Deserialize, Clone)]
struct Finished<T> {
    /// The test items the evaluation saw (`--limit`, and for knowledgeable-r1 the scenario list);
    /// another value re-evaluates the checkpoint.
    eval_key: String,
    eval: T,
    step_s: f64,
    /// Training (the sum of every step's time, over all sittings) plus evaluation, seconds.
    wall_s: f64,
}

fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(toml::from_str(&text).with_context(|| format!("{}: not a reproduce record", path.display()))?))
}

fn write_toml(path: &Path, v: &impl Serialize) -> Result<()> {
    let text = toml::to_string(v).with_context(|| format!("{}: serialising", path.display()))?;
    knowrl_engine::fsutil::write_atomic(path, text.as_bytes())?;
    Ok(())
}

/// The untrained policy's row, evaluated once per `eval_key` and kept in
/// `runs/reproduce-<method>/<name>/result.toml` like a trained arm's.
pub(super) fn untrained<T: Serialize + DeserializeOwned>(
    method: &str,
    name: &str,
    a: &Args,
    eval: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let dir = a.runs.join(format!("reproduce-{method}/{}", slug(name)));
    let path = dir.join("result.toml");
    let key = eval_key(a, method);
    if let Some(f) = read_toml::<Finished<T>>(&path)?.filter(|f| f.eval_key == key) {
        eprintln!("{name}: from {}", path.display());
        return Ok(f.eval);
    }
    let t0 = std::time::Instant::now();
    let value = eval()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let wall_s = t0.elapsed().as_secs_f64();
    let f = Finished { eval_key: key, eval: value, step_s: f64::NAN, wall_s };
    write_toml(&path, &f)?;
    Ok(f.eval)
}

/// The step of a run directory's last checkpoint (0 without one).
fn checkpointed_step(dir: &Path) -> Result<u64> {
    let Some(latest) = knowrl_engine::checkpoint::latest(&dir.join("checkpoints"))? else { return Ok(0) };
    let name = latest.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.strip_prefix("step-")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{}: not a step-N checkpoint", latest.display()))
}

/// What an evaluation asked: the test items (`--limit`) and, for Knowledgeable-R1, the
/// scenarios (a record from before S2p existed is re-evaluated, not reported with a hole).
fn eval_key(a: &Args, method: &str) -> String {
    match method {
        // Under --limit, S2p is the sampled S2 items' twins (`knowledgeable_r1::test_items`).
        "knowledgeable-r1" => {
            let paired = if a.limit > 0 { ", S2p paired with S2" } else { "" };
            format!("test split, limit {}, {}{paired}", a.limit, knowrl_world::suites::SCENARIOS.join(" "))
        }
        _ => format!("test split, limit {}", a.limit),
    }
}

/// The arms `--arms` selects (all when it is empty); an unknown name is an error listing them.
fn selected(arms: &[Arm], a: &Args) -> Result<Vec<bool>> {
    let names: Vec<String> = arms.iter().map(|x| slug(x.label)).collect();
    for want in &a.arms {
        if !names.contains(&slug(want)) {
            anyhow::bail!("--arms: no arm {want:?}; the arms are: {}", names.join(", "));
        }
    }
    Ok(names.iter().map(|n| a.arms.is_empty() || a.arms.iter().any(|w| slug(w) == *n)).collect())
}

/// Expected seconds for the runs to train, `todo` = (arm, steps): a timed arm is priced by its own
/// mean s/step, any other by the method's typical step (the timed runs' mean, each scaled back by
/// its arm's cost; `typical_step_s` when none is timed) times its arm's cost.
fn expected_seconds(timed: &[(usize, f64)], todo: &[(usize, u64)], costs: &[f64], typical_step_s: f64) -> f64 {
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let method_s = mean(timed.iter().map(|t| t.1 / costs[t.0]).collect()).unwrap_or(typical_step_s);
    todo.iter()
        .map(|&(arm, steps)| {
            let own = mean(timed.iter().filter(|t| t.0 == arm).map(|t| t.1).collect());
            own.unwrap_or(method_s * costs[arm]) * steps as f64
        })
        .sum()
}

/// Trains every selected arm for its seeds and evaluates each result with `eval`; arms left out
/// by `--arms` contribute the seeds an earlier sitting finished. Each arm × seed is a run
/// directory `runs/reproduce-<method>/<arm>-seed<k>` with checkpoints: a finished one is read
/// back (`result.toml`), an interrupted one resumes, one trained under another config is an
/// error (nothing is overwritten). `typical_step_s` prices the runs no sitting has timed yet.
/// Returns the rows and, per arm, its config and wall times (the report's `arms`).
pub(super) fn run_arms<T: Serialize + DeserializeOwned>(
    base: &TrainConfig,
    arms: &[Arm],
    a: &Args,
    method: &str,
    typical_step_s: f64,
    eval: Evaluate<T>,
) -> Result<(Vec<Row<T>>, Value)> {
    let chosen = selected(arms, a)?;
    let key = eval_key(a, method);
    struct Plan {
        arm: usize,
        cfg: TrainConfig,
        dir: PathBuf,
        done: Option<Finished<toml::Value>>,
    }
    let mut plans = vec![];
    for (i, arm) in arms.iter().enumerate() {
        let seeds = if arm.ablation { a.ablation_seeds } else { a.seeds };
        for seed in 1..=seeds {
            let mut cfg = base.clone();
            cfg.run.seed = seed;
            (arm.edit)(&mut cfg);
            let dir = run_dir(a, method, arm.label, seed);
            cfg.run.out_dir = dir.clone();
            // Checkpoints make an interrupted arm resumable (reproduce runs in sittings).
            cfg.run.checkpoint_every = (cfg.run.steps / 4).max(1);
            cfg.run.eval_every = 0;
            cfg.validate().map_err(anyhow::Error::msg)?;
            if dir.join("checkpoints").exists() && !dir.join("config.toml").exists() {
                anyhow::bail!(
                    "{}: checkpoints without a config.toml (not a reproduce run); move it away",
                    dir.display()
                );
            }
            if let Some(old) = read_toml::<TrainConfig>(&dir.join("config.toml"))? {
                if let Some(field) = old.first_difference(&cfg) {
                    anyhow::bail!(
                        "{}: trained under another config (first difference: {field}); move the directory away to train this arm again",
                        dir.display()
                    );
                }
            }
            let done = read_toml::<Finished<toml::Value>>(&dir.join("result.toml"))?.filter(|f| f.eval_key == key);
            plans.push(Plan { arm: i, cfg, dir, done });
        }
    }
    let kept: Vec<(&str, u64)> = plans
        .iter()
        .filter(|p| p.done.is_some() || chosen[p.arm])
        .map(|p| (arms[p.arm].label, p.cfg.run.seed))
        .collect();
    let out = out_path(a, method);
    let lost = rows_lost(&out, &kept)?;
    if !lost.is_empty() {
        anyhow::bail!(
            "{}: holds rows this sitting would not write ({}): their runs are not under {}. Write this sitting's report elsewhere with --out, or move {} away to replace it",
            out.display(),
            lost.join(", "),
            a.runs.join(format!("reproduce-{method}")).display(),
            out.display()
        );
    }
    let timed: Vec<(usize, f64)> =
        plans.iter().filter_map(|p| p.done.as_ref().map(|f| (p.arm, f.wall_s / p.cfg.run.steps as f64))).collect();
    let todo: Vec<&Plan> = plans.iter().filter(|p| chosen[p.arm] && p.done.is_none()).collect();
    let costs: Vec<f64> = arms.iter().map(|a| a.step_cost).collect();
    // An interrupted run resumes from its last checkpoint; a trained one whose record is stale
    // (another eval_key) is only evaluated again.
    let mut todo_steps: Vec<(usize, u64)> = vec![];
    for p in &todo {
        todo_steps.push((p.arm, p.cfg.run.steps.saturating_sub(checkpointed_step(&p.dir)?)));
    }
    let expected = expected_seconds(&timed, &todo_steps, &costs, typical_step_s);
    eprintln!(
        "reproduce {method}: {} runs to train or evaluate, {} steps to train ({} runs finished earlier); training expected ≈ {:.0} min on this machine, plus an evaluation per run",
        todo.len(),
        todo_steps.iter().map(|t| t.1).sum::<u64>(),
        plans.iter().filter(|p| p.done.is_some()).count(),
        expected.max(0.0) / 60.0
    );
    let mut finished: Vec<Option<(Finished<toml::Value>, TrainConfig)>> = vec![];
    for p in &plans {
        let arm = &arms[p.arm];
        if let Some(f) = &p.done {
            eprintln!("{}: seed {} from {}", arm.label, p.cfg.run.seed, p.dir.display());
            finished.push(Some((f.clone(), p.cfg.clone())));
            continue;
        }
        if !chosen[p.arm] {
            finished.push(None);
            continue;
        }
        std::fs::create_dir_all(&p.dir).with_context(|| format!("creating {}", p.dir.display()))?;
        // Also `knowrl train --config` input: the arm's run on its own.
        write_toml(&p.dir.join("config.toml"), &p.cfg)?;
        let resume = p.dir.join("checkpoints").exists();
        let policy = load(&p.cfg)?;
        let retriever = knowrl_run::retriever(&p.cfg)?;
        let label = format!("{} seed {}", arm.label, p.cfg.run.seed);
        train_with_progress(&policy, &retriever, &p.cfg, resume, &label)?;
        // Every step of the run, those of earlier sittings included.
        let steps: Vec<StepMetrics> = std::fs::read_to_string(p.dir.join("metrics.jsonl"))
            .with_context(|| format!("reading {}/metrics.jsonl", p.dir.display()))?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .with_context(|| format!("{}/metrics.jsonl", p.dir.display()))?;
        let dense =
            retriever.dense().ok_or_else(|| anyhow::anyhow!("reproduce runs on the world's dense retriever"))?;
        let t0 = std::time::Instant::now();
        let value = eval(&policy, dense, &steps)?;
        let train_s: f64 = steps.iter().map(|x| x.step_s).sum();
        let f = Finished {
            eval_key: key.clone(),
            eval: toml::Value::try_from(&value)?,
            step_s: train_s / steps.len().max(1) as f64,
            wall_s: train_s + t0.elapsed().as_secs_f64(),
        };
        write_toml(&p.dir.join("result.toml"), &f)?;
        eprintln!("{label} done ({:.0} s)", f.wall_s);
        finished.push(Some((f, p.cfg.clone())));
    }
    let (mut rows, mut details) = (vec![], serde_json::Map::new());
    for (i, arm) in arms.iter().enumerate() {
        let mine: Vec<&(Finished<toml::Value>, TrainConfig)> =
            plans.iter().zip(&finished).filter(|(p, _)| p.arm == i).filter_map(|(_, f)| f.as_ref()).collect();
        if mine.is_empty() {
            continue;
        }
        let evals = mine
            .iter()
            .map(|(f, _)| f.eval.clone().try_into())
            .collect::<Result<Vec<T>, _>>()
            .with_context(|| format!("{}: a result.toml of another version; move it away", arm.label))?;
        details.insert(
            arm.label.to_string(),
            json!({
                "seeds": mine.iter().map(|(_, c)| c.run.seed).collect::<Vec<_>>(),
                "wall_s": mine.iter().map(|(f, _)| f.wall_s).collect::<Vec<_>>(),
                "config": mine[0].1,
            }),
        );
        rows.push((arm.label.to_string(), evals, mine.iter().map(|(f, _)| f.step_s).collect()));
    }
    Ok((rows, Value::Object(details)))
}

/// The report's closing time line: every run's training and evaluation over all sittings (from
/// `run_arms`'s per-arm `wall_s`), and this sitting's share, which a re-render alone makes tiny.
pub(super) fn wall_line(arms_json: &Value, sitting: std::time::Instant) -> (String, Value) {
    let total: f64 = arms_json
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|arm| arm["wall_s"].as_array())
        .flatten()
        .filter_map(Value::as_f64)
        .sum();
    let this = sitting.elapsed().as_secs_f64();
    (
        format!("Wall time {total:.0} s over all sittings ({this:.0} s in this one)."),
        json!({"seconds": total, "sitting_seconds": this}),
    )
}

/// Where a reproduction's JSON goes: `--out`, else `bench/results/reproduce-<method>.json`.
pub(super) fn out_path(a: &Args, method: &str) -> PathBuf {
    a.out.clone().unwrap_or_else(|| PathBuf::from(format!("bench/results/reproduce-{method}.json")))
}

/// The arm × seed rows of the report at `out` that a report made of `kept` would drop: an
/// earlier sitting's rows whose runs are not here (another machine, another `--runs`), which
/// overwriting the report would lose.
fn rows_lost(out: &Path, kept: &[(&str, u64)]) -> Result<Vec<String>> {
    if !out.exists() {
        return Ok(vec![]);
    }
    let text = std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    let old: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a reproduce report; move it away or pass another --out", out.display()))?;
    let mut lost = vec![];
    for (label, arm) in old["arms"].as_object().into_iter().flatten() {
        for seed in arm["seeds"].as_array().into_iter().flatten().filter_map(Value::as_u64) {
            if !kept.contains(&(label.as_str(), seed)) {
                lost.push(format!("{label} seed {seed}"));
            }
        }
    }
    lost.sort();
    Ok(lost)
}

/// The run directory of an arm × seed.
pub(super) fn run_dir(a: &Args, method: &str, label: &str, seed: u64) -> PathBuf {
    a.runs.join(format!("reproduce-{method}/{}-seed{seed}", slug(label)))
}

pub(super) fn slug(s: &str) -> String {
    let dashed: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    dashed.split('-').filter(|w| !w.is_empty()).collect::<Vec<_>>().join("-")
}

/// Mean and sample std.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let s = if v.len() > 1 { (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, s)
}

/// mean ± std of a cell's per-seed values (the mean alone for one seed, "–" for none). Values
/// that are not finite count as none (TP = EM / TC of a run that never searched).
fn cell(v: &[f64], decimals: usize) -> String {
    // `mean_std` skips the values that are not finite; count what it keeps.
    match v.iter().filter(|x| x.is_finite()).count() {
        0 => "–".into(),
        1 => format!("{:.*}", decimals, mean_std(v).0),
        _ => {
            let (m, s) = mean_std(v);
            format!("{m:.decimals$} ± {s:.decimals$}")
        }
    }
}

/// One column of a [`Table`]: its JSON key, its Markdown header (`None`: JSON only), the factor
/// its values are stored and shown at (100 for percentages) and the decimals shown.
pub(super) struct Column {
    key: String,
    header: Option<&'static str>,
    scale: f64,
    decimals: usize,
}

pub(super) fn col(key: &str, header: &'static str, scale: f64, decimals: usize) -> Column {
    Column { key: key.into(), header: Some(header), scale, decimals }
}

/// A column kept in the JSON only.
pub(super) fn hidden(key: &str) -> Column {
    Column { key: key.into(), header: None, scale: 1.0, decimals: 2 }
}

/// A results table: a row per arm, each cell that arm's per-seed values. The Markdown (mean ±
/// std) and the JSON (`{label: {key: [per-seed values]}}`) are rendered from the same rows.
pub(super) struct Table {
    columns: Vec<Column>,
    rows: Vec<(String, Vec<Vec<f64>>)>,
}

impl Table {
    pub(super) fn new(columns: Vec<Column>) -> Table {
        Table { columns, rows: vec![] }
    }

    /// A row of raw values, one list per column (scaled here).
    pub(super) fn push(&mut self, label: &str, values: Vec<Vec<f64>>) {
        assert_eq!(values.len(), self.columns.len(), "{label}: one list of values per column");
        let scaled =
            values.into_iter().zip(&self.columns).map(|(v, c)| v.iter().map(|x| x * c.scale).collect()).collect();
        self.rows.push((label.to_string(), scaled));
    }

    pub(super) fn markdown(&self) -> String {
        let shown: Vec<(usize, &Column)> =
            self.columns.iter().enumerate().filter(|(_, c)| c.header.is_some()).collect();
        let mut md =
            format!("| method | {} |\n", shown.iter().map(|(_, c)| c.header.unwrap()).collect::<Vec<_>>().join(" | "));
        md += &format!("|---|{}\n", "---|".repeat(shown.len()));
        for (label, values) in &self.rows {
            let cells: Vec<String> = shown.iter().map(|(i, c)| cell(&values[*i], c.decimals)).collect();
            md += &format!("| {label} | {} |\n", cells.join(" | "));
        }
        md
    }

    /// Adds this table's columns to `json` (`{label: {key: [values]}}`; tables of one report share it).
    pub(super) fn json_into(&self, json: &mut serde_json::Map<String, Value>) {
        for (label, values) in &self.rows {
            let row = json.entry(label.clone()).or_insert_with(|| Value::Object(Default::default()));
            for (c, v) in self.columns.iter().zip(values) {
                row[&c.key] = serde_json::json!(v);
            }
        }
    }

    /// `comparison: figures` when every row it compares is in the table; otherwise the
    /// comparison and the missing rows (a sitting that ran only ablations must not print
    /// `TC × NaN`).
    pub(super) fn headline(&self, comparison: &str, rows: &[&str], figures: impl FnOnce() -> String) -> String {
        let missing: Vec<&str> = rows.iter().copied().filter(|r| !self.has(r)).collect();
        if missing.is_empty() {
            format!("{comparison}: {}", figures())
        } else {
            format!(
                "{comparison}: not measured in this report (missing rows: {}; `--arms` runs them).",
                missing.join(", ")
            )
        }
    }

    /// Whether the table has a row `label`.
    pub(super) fn has(&self, label: &str) -> bool {
        self.rows.iter().any(|(l, _)| l == label)
    }

    /// The mean over seeds of `label`'s `key` (as stored: scaled); NaN when absent.
    pub(super) fn mean(&self, label: &str, key: &str) -> f64 {
        let (Some(i), Some((_, values))) =
            (self.columns.iter().position(|c| c.key == key), self.rows.iter().find(|(l, _)| l == label))
        else {
            return f64::NAN;
        };
        mean_std(&values[i]).0
    }
}

pub(super) fn sample<T: Clone>(v: Vec<T>, limit: usize) -> Vec<T> {
    if limit == 0 || v.len() <= limit {
        return v;
    }
    let mut rng = knowrl_engine::Rng::new(11);
    let mut v = v;
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v.truncate(limit);
    v
}

/// A figure of a report: its file is `<out's stem><suffix>.svg` beside the JSON, so two
/// reproductions written to different `--out` files never overwrite each other's figures.
pub(super) struct Figure {
    pub suffix: &'static str,
    pub alt: &'static str,
    pub svg: String,
}

pub(super) fn figure_name(out: &std::path::Path, suffix: &str) -> String {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{stem}{suffix}.svg")
}

/// Writes the JSON, the Markdown report (with a link to each figure appended) and the figures.
pub(super) fn write_outputs(out: &std::path::Path, json: &Value, markdown: &str, figures: &[Figure]) -> Result<()> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d)?;
    }
    knowrl_engine::fsutil::write_atomic(out, serde_json::to_string_pretty(json)?.as_bytes())?;
    let mut markdown = markdown.to_string();
    for f in figures {
        let name = figure_name(out, f.suffix);
        markdown += &format!("\n![{}]({name})\n", f.alt);
        knowrl_engine::fsutil::write_atomic(&out.with_file_name(&name), f.svg.as_bytes())?;
    }
    let md = out.with_extension("md");
    knowrl_engine::fsutil::write_atomic(&md, markdown.as_bytes())?;
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_time_prices_untimed_arms_by_their_cost() {
        // Arms: 0 = cost 0.5, 1 = cost 1, 2 = cost 10. Timed: arm 0 at 40 and 60 s/step, arm 1 at 100.
        let costs = [0.5, 1.0, 10.0];
        let timed = [(0, 40.0), (0, 60.0), (1, 100.0)];
        // Typical step = mean(80, 120, 100) = 100. Arm 0 by its own mean (50 × 8), arm 2 at 10 × 100 × 2.
        assert_eq!(expected_seconds(&timed, &[(0, 8), (2, 2)], &costs, 160.0), 400.0 + 2000.0);
        // Nothing timed: the typical step (160) times each arm's cost.
        assert_eq!(expected_seconds(&[], &[(0, 4), (1, 1)], &costs, 160.0), 320.0 + 160.0);
    }

    #[test]
    fn remaining_steps_start_from_the_last_checkpoint() {
        let dir = std::env::temp_dir().join(format!("knowrl-checkpointed-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
        assert_eq!(checkpointed_step(&dir.join("absent")).unwrap(), 0);
        assert_eq!(checkpointed_step(&dir).unwrap(), 0);
        std::fs::write(dir.join("checkpoints/latest"), "step-00000048\n").unwrap();
        assert_eq!(checkpointed_step(&dir).unwrap(), 48);
        std::fs::write(dir.join("checkpoints/latest"), "elsewhere\n").unwrap();
        assert!(checkpointed_step(&dir).unwrap_err().to_string().contains("not a step-N checkpoint"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_report_is_not_overwritten_by_one_missing_its_rows() {
        let dir = std::env::temp_dir().join(format!("knowrl-rows-lost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("reproduce-bridge.json");
        // No report yet: nothing to lose.
        assert!(rows_lost(&out, &[]).unwrap().is_empty());
        let report = json!({"arms": {"GRPO": {"seeds": [1, 2]}, "BRIDGE": {"seeds": [1]}}});
        std::fs::write(&out, report.to_string()).unwrap();
        assert!(rows_lost(&out, &[("GRPO", 1), ("GRPO", 2), ("BRIDGE", 1), ("RL-then-RAG", 1)]).unwrap().is_empty());
        assert_eq!(rows_lost(&out, &[("GRPO", 1), ("RL-then-RAG", 1)]).unwrap(), ["BRIDGE seed 1", "GRPO seed 2"]);
        std::fs::write(&out, "{ truncated").unwrap();
        let e = rows_lost(&out, &[]).unwrap_err().to_string();
        assert!(e.contains("reproduce-bridge.json: not a reproduce report"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn figures_are_named_after_the_output_so_two_reproductions_keep_their_own() {
        let default = std::path::Path::new("bench/results/reproduce-knowledgeable-r1.json");
        let longer = std::path::Path::new("bench/results/reproduce-knowledgeable-r1-48-steps.json");
        assert_eq!(figure_name(default, "-scenarios"), "reproduce-knowledgeable-r1-scenarios.svg");
        assert_eq!(figure_name(longer, "-scenarios"), "reproduce-knowledgeable-r1-48-steps-scenarios.svg");
        assert_eq!(figure_name(std::path::Path::new("x/reproduce-akbe.json"), ""), "reproduce-akbe.svg");
    }

    #[test]
    fn a_table_renders_markdown_and_json_from_the_same_rows() {
        let mut t = Table::new(vec![col("em", "EM", 100.0, 1), col("tc", "TC", 1.0, 2), hidden("bytes")]);
        t.push("GRPO", vec![vec![0.5, 0.7], vec![2.0], vec![10.0]]);
        t.push("Pretrained", vec![vec![0.25], vec![], vec![]]);
        t.push("Never searches", vec![vec![0.3, 0.4], vec![f64::NAN, 1.0], vec![]]);
        // 60.0 ± 14.1 (sample std of 50, 70); one seed: the mean alone; no value (or none
        // finite): a dash.
        assert_eq!(
            t.markdown(),
            "| method | EM | TC |\n|---|---|---|\n| GRPO | 60.0 ± 14.1 | 2.00 |\n| Pretrained | 25.0 | – |\n| Never searches | 35.0 ± 7.1 | 1.00 |\n"
        );
        let mut nan = Table::new(vec![col("tp", "TP", 1.0, 1)]);
        nan.push("No tool call", vec![vec![f64::NAN]]);
        assert_eq!(nan.markdown(), "| method | TP |\n|---|---|\n| No tool call | – |\n");
        let mut j = serde_json::Map::new();
        t.json_into(&mut j);
        assert_eq!(j["GRPO"], serde_json::json!({"em": [50.0, 70.0], "tc": [2.0], "bytes": [10.0]}));
        assert_eq!((t.mean("GRPO", "em"), t.mean("GRPO", "bytes")), (60.0, 10.0));
        assert!(t.mean("GRPO", "nope").is_nan() && t.mean("nobody", "em").is_nan());
        assert!(t.has("Pretrained") && !t.has("nobody"));
    }

    #[test]
    fn a_claim_line_needs_both_rows_it_compares() {
        let mut t = Table::new(vec![col("tc", "TC", 1.0, 2)]);
        t.push("GRPO", vec![vec![2.0]]);
        t.push("w/o Efficiency", vec![vec![1.7]]);
        let claim = || format!("TC × {:.2}", t.mean("GRPO + AKBE", "tc") / t.mean("GRPO", "tc"));
        assert_eq!(
            t.headline("GRPO + AKBE vs GRPO", &["GRPO", "GRPO + AKBE"], claim),
            "GRPO + AKBE vs GRPO: not measured in this report (missing rows: GRPO + AKBE; `--arms` runs them)."
        );
        assert_eq!(
            t.headline("w/o Efficiency vs GRPO", &["GRPO", "w/o Efficiency"], || "TC × 0.85".to_string()),
            "w/o Efficiency vs GRPO: TC × 0.85"
        );
        let empty = Table::new(vec![col("tc", "TC", 1.0, 2)]);
        assert_eq!(
            empty.headline("A vs B", &["A", "B"], String::new),
            "A vs B: not measured in this report (missing rows: A, B; `--arms` runs them)."
        );
    }

    #[test]
    fn the_wall_time_sums_every_run_of_every_sitting_not_only_this_one() {
        let arms = json!({
            "GRPO": {"seeds": [1, 2], "wall_s": [300.0, 400.25]},
            "GRPO + AKBE": {"seeds": [1], "wall_s": [500.0]},
        });
        let (line, j) = wall_line(&arms, std::time::Instant::now());
        assert_eq!(j["seconds"], json!(1200.25));
        assert!(j["sitting_seconds"].as_f64().unwrap() < 1.0);
        assert_eq!(line, "Wall time 1200 s over all sittings (0 s in this one).");
    }
}
