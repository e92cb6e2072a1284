//! `knowrl report RUN_DIR`: a Markdown report of a training run (readable on GitHub) with SVG
//! training curves — reward, EM, tool calls, response length, entropy, and the method's own
//! figures (Knowledgeable-R1's β, AKBE's categories, BRIDGE's retriever losses).
use anyhow::{Context, Result};
use knowrl_eval::plot::line_svg;
use knowrl_rl::method::StepMetrics;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A run directory (`run.out_dir` of a train config: metrics.jsonl, checkpoints/).
    pub run_dir: PathBuf,
}

/// A figure read off one step's metrics.
type Metric<'a> = &'a dyn Fn(&StepMetrics) -> f64;

pub fn run(a: Args) -> Result<()> {
    let path = a.run_dir.join("metrics.jsonl");
    let m: Vec<StepMetrics> =
        crate::world_eval::load_jsonl(&path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(!m.is_empty(), "{}: no steps recorded", path.display());
    let curve =
        |f: &dyn Fn(&StepMetrics) -> f64| -> Vec<(f64, f64)> { m.iter().map(|x| (x.step as f64, f(x))).collect() };
    let mut plots: Vec<(String, String)> = vec![
        (
            "reward".into(),
            line_svg("reward / EM", &[("reward".into(), curve(&|x| x.reward)), ("EM".into(), curve(&|x| x.em))]),
        ),
        ("tools".into(), line_svg("tool calls per trajectory", &[("tool calls".into(), curve(&|x| x.tool_calls))])),
        ("length".into(), line_svg("response tokens", &[("length".into(), curve(&|x| x.response_len))])),
        (
            "entropy".into(),
            line_svg(
                "token entropy / KL",
                &[("entropy".into(), curve(&|x| x.entropy)), ("KL".into(), curve(&|x| x.kl))],
            ),
        ),
    ];
    let mut keys: Vec<String> = m.iter().flat_map(|x| x.extra.keys().cloned()).collect();
    keys.sort();
    keys.dedup();
    let groups: Vec<(&str, Vec<&String>)> = vec![
        ("knowledgeable-r1 β", keys.iter().filter(|k| k.as_str() == "beta").collect()),
        ("AKBE categories", keys.iter().filter(|k| k.starts_with("cat_")).collect()),
        (
            "BRIDGE retriever",
            keys.iter().filter(|k| k.starts_with("retriever_j") || k.starts_with("retriever_l")).collect(),
        ),
    ];
    for (title, ks) in groups {
        if ks.is_empty() {
            continue;
        }
        let series: Vec<(String, Vec<(f64, f64)>)> = ks
            .iter()
            .map(|k| (k.to_string(), m.iter().filter_map(|x| x.extra.get(*k).map(|v| (x.step as f64, *v))).collect()))
            .collect();
        plots.push((title.split_whitespace().next().unwrap().to_lowercase(), line_svg(title, &series)));
    }
    let first = &m[0];
    let last = m.last().unwrap();
    let window = |f: &dyn Fn(&StepMetrics) -> f64, tail: bool| {
        let n = (m.len() / 5).max(1);
        let s: Vec<f64> = if tail { m[m.len() - n..].iter().map(f).collect() } else { m[..n].iter().map(f).collect() };
        s.iter().sum::<f64>() / s.len() as f64
    };
    let mut md = format!(
        "# Run report: {}\n\n{} steps (step {} → {}).\n\n",
        a.run_dir.display(),
        m.len(),
        first.step,
        last.step
    );
    md += "| metric | first 20% of steps | last 20% |\n|---|---|---|\n";
    let rows: [(&str, Metric); 7] = [
        ("reward", &|x| x.reward),
        ("EM", &|x| x.em),
        ("tool calls", &|x| x.tool_calls),
        ("response tokens", &|x| x.response_len),
        ("entropy", &|x| x.entropy),
        ("grad norm", &|x| x.grad_norm),
        ("seconds / step", &|x| x.step_s),
    ];
    for (name, f) in rows {
        md += &format!("| {name} | {:.3} | {:.3} |\n", window(f, false), window(f, true));
    }
    md += "\n";
    for (name, svg) in &plots {
        let file = format!("report-{name}.svg");
        knowrl_engine::fsutil::write_atomic(&a.run_dir.join(&file), svg.as_bytes())?;
        md += &format!("![{name}]({file})\n");
    }
    let out = a.run_dir.join("report.md");
    knowrl_engine::fsutil::write_atomic(&out, md.as_bytes())?;
    println!("wrote {} ({} plots)", out.display(), plots.len());
    Ok(())
}
