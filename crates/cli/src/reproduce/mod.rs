//! `knowrl reproduce <method>`: the paper's comparison on the world at an equal budget — the
//! method vs its baseline over several seeds, plus ablation rows — printed in the paper's table
//! layout and written to `bench/results/reproduce-<method>.json` with a Markdown report and SVG
//! plots. A benchmark, not a test: minutes to an hour on 2 CPU cores.
//! One file per paper (`knowledgeable_r1`, `akbe`, `bridge`); this one holds what they share:
//! the arms (a label and a config change), training every arm for its seeds, the cells
//! (mean ± std over seeds) and the output files.
use crate::train::train_with_progress;
use anyhow::Result;
use knowrl_retrieval::dense::DenseRetriever;
use knowrl_rl::config::{MethodConfig, TrainConfig};
use knowrl_rl::method::StepMetrics;
use knowrl_run::load;
use serde_json::Value;
use std::path::PathBuf;

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
    /// Where the JSON goes (the Markdown report and SVGs go beside it).
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
}

pub(super) fn arm(label: &'static str, ablation: bool, edit: impl Fn(&mut TrainConfig) + 'static) -> Arm {
    Arm { label, ablation, edit: Box::new(edit) }
}

pub(super) fn base_config(a: &Args, default: &str) -> Result<TrainConfig> {
    let path = a.config.clone().unwrap_or_else(|| PathBuf::from(default));
    let mut cfg = TrainConfig::load(&path)?;
    if let Some(s) = a.steps {
        cfg.run.steps = s;
    }
    cfg.run.checkpoint_every = 0;
    Ok(cfg)
}

/// Evaluates a trained run: its policy, its retriever (BRIDGE adapts it) and its step metrics.
pub(super) type Evaluate<'a, T> = &'a dyn Fn(&knowrl_engine::Policy, &DenseRetriever, &[StepMetrics]) -> Result<T>;

/// A row: its label, one evaluation per seed, and mean seconds per step per seed.
pub(super) type Row<T> = (String, Vec<T>, Vec<f64>);

/// Trains every arm for its seeds and evaluates each result with `eval`.
pub(super) fn run_arms<T>(
    base: &TrainConfig,
    arms: &[Arm],
    a: &Args,
    method: &str,
    eval: Evaluate<T>,
) -> Result<Vec<Row<T>>> {
    let mut out = vec![];
    for arm in arms {
        let seeds = if arm.ablation { a.ablation_seeds } else { a.seeds };
        let (mut evals, mut step_s) = (vec![], vec![]);
        for seed in 1..=seeds {
            let mut cfg = base.clone();
            cfg.run.seed = seed;
            (arm.edit)(&mut cfg);
            cfg.run.out_dir = PathBuf::from(format!("runs/reproduce-{method}/{}-seed{seed}", slug(arm.label)));
            cfg.validate().map_err(anyhow::Error::msg)?;
            let policy = load(&cfg)?;
            let retriever = knowrl_run::retriever(&cfg)?;
            let m = train_with_progress(&policy, &retriever, &cfg, false, &format!("{} seed {seed}", arm.label))?;
            step_s.push(m.iter().map(|x| x.step_s).sum::<f64>() / m.len().max(1) as f64);
            let dense =
                retriever.dense().ok_or_else(|| anyhow::anyhow!("reproduce runs on the world's dense retriever"))?;
            evals.push(eval(&policy, dense, &m)?);
            eprintln!("{}: seed {seed} done", arm.label);
        }
        if seeds > 0 {
            out.push((arm.label.to_string(), evals, step_s));
        }
    }
    Ok(out)
}

pub(super) fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
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

/// mean ± std of a cell's per-seed values (the mean alone for one seed, "–" for none).
fn cell(v: &[f64], decimals: usize) -> String {
    match v.len() {
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

pub(super) fn write_outputs(
    out: &std::path::Path,
    json: &Value,
    markdown: &str,
    svgs: &[(String, String)],
) -> Result<()> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d)?;
    }
    knowrl_engine::fsutil::write_atomic(out, serde_json::to_string_pretty(json)?.as_bytes())?;
    let md = out.with_extension("md");
    knowrl_engine::fsutil::write_atomic(&md, markdown.as_bytes())?;
    for (name, svg) in svgs {
        knowrl_engine::fsutil::write_atomic(&out.with_file_name(name), svg.as_bytes())?;
    }
    println!("wrote {} and {}", out.display(), md.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_renders_markdown_and_json_from_the_same_rows() {
        let mut t = Table::new(vec![col("em", "EM", 100.0, 1), col("tc", "TC", 1.0, 2), hidden("bytes")]);
        t.push("GRPO", vec![vec![0.5, 0.7], vec![2.0], vec![10.0]]);
        t.push("Pretrained", vec![vec![0.25], vec![], vec![]]);
        // 60.0 ± 14.1 (sample std of 50, 70); one seed: the mean alone; no value: a dash.
        assert_eq!(
            t.markdown(),
            "| method | EM | TC |\n|---|---|---|\n| GRPO | 60.0 ± 14.1 | 2.00 |\n| Pretrained | 25.0 | – |\n"
        );
        let mut j = serde_json::Map::new();
        t.json_into(&mut j);
        assert_eq!(j["GRPO"], serde_json::json!({"em": [50.0, 70.0], "tc": [2.0], "bytes": [10.0]}));
        assert_eq!((t.mean("GRPO", "em"), t.mean("GRPO", "bytes")), (60.0, 10.0));
        assert!(t.mean("GRPO", "nope").is_nan() && t.mean("nobody", "em").is_nan());
    }
}
