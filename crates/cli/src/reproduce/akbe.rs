//! `knowrl reproduce akbe`: GRPO(+AKBE) and DAPO(+AKBE) on the agent suite, the ablations, offline AKBE, the DPO variant and the OTC-style baseline, in the layouts of Tables 1–3.
use super::*;
use knowrl_eval::data::questions;
use knowrl_eval::plot::bar_svg;
use knowrl_eval::AgentReport;
use knowrl_rl::akbe::{Category, Signals};
use knowrl_rl::config::Algorithm;
use knowrl_rl::task::Prompt;
use knowrl_world::questions::Split;
use serde_json::json;

/// Seconds per AKBE step on 2 cores (dual-path rollouts at 4 × (8 + 4); world v2, AMD EPYC,
/// measured 51.2 in bench/results/world-v2-speed.json), for the first estimate.
const AKBE_STEP_S: f64 = 50.0;

pub fn run(a: Args) -> Result<()> {
    let base = base_config(&a, "configs/world-akbe.toml")?;
    let world = base.data.world.clone();
    let qs = sample(questions(&world, Split::Test).map_err(anyhow::Error::msg)?, a.limit);
    let refs: Vec<&knowrl_world::questions::Question> = qs.iter().collect();
    let retriever = knowrl_run::world_retriever(&world)?;
    let r = &base.rollout;
    let agent_cfg = r.agent(0.0);
    let eval = |p: &knowrl_engine::Policy| -> Result<AgentReport> {
        Ok(knowrl_eval::agent(
            p,
            &retriever,
            &refs,
            |q| Prompt::user(knowrl_world::prompts::agent(&q.question)),
            &agent_cfg,
        )?)
    };
    let plain = |c: &mut TrainConfig| {
        // The base algorithm alone, at AKBE's with-tool group size.
        c.rollout.group_size = akbe_of(c).n_wt;
        c.method = MethodConfig::default();
    };
    let dapo = |c: &mut TrainConfig| {
        c.algorithm.name = Algorithm::Dapo;
        c.algorithm.clip_high = 0.28;
    };
    let only = |cats: &'static [Category]| move |c: &mut TrainConfig| akbe_of(c).categories = cats.to_vec();
    use Category::*;
    let args = a.clone();
    let arms = vec![
        arm("GRPO", false, plain),
        arm("GRPO + AKBE", false, |_| {}),
        arm("DAPO", false, move |c| {
            plain(c);
            dapo(c)
        }),
        arm("DAPO + AKBE", false, dapo),
        arm("w/o Tool-dependent", true, only(&[Efficiency, Hallucination])),
        arm("w/o Efficiency", true, only(&[ToolDependent, Hallucination])),
        arm("w/o Hallucination", true, only(&[ToolDependent, Efficiency])),
        arm("w/ Tool-dependent only", true, only(&[ToolDependent])),
        // The paper's offline variant: signals from a fixed GRPO-trained checkpoint (this seed's
        // GRPO row, trained above), not from the starting policy.
        arm("Offline AKBE (GRPO checkpoint)", true, move |c| {
            let ckpt = run_dir(&args, "akbe", "GRPO", c.run.seed).join("checkpoints");
            let a = akbe_of(c);
            a.signals = Signals::Offline;
            a.signals_checkpoint = Some(ckpt);
        }),
        arm("AKBE DPO variant (Appendix C)", true, |c| akbe_of(c).objective = knowrl_rl::akbe::Objective::Dpo),
        arm("GRPO + OTC reward", true, move |c| {
            plain(c);
            c.reward.tool_productivity = true;
        }),
        arm("AKBE with-tool teacher prompt", true, |c| {
            akbe_of(c).teacher_prompt = knowrl_rl::akbe::TeacherPrompt::WithTool
        }),
    ];
    let t0 = std::time::Instant::now();
    let policy = load(&base)?;
    let (trained, arms_json) = run_arms(&base, &arms, &a, "akbe", AKBE_STEP_S, &|p, _, _| eval(p))?;
    let before = untrained("akbe", "Pretrained policy", &a, || eval(&policy))?;
    let rows: Vec<Row<AgentReport>> =
        std::iter::once(("Pretrained policy".to_string(), vec![before], vec![])).chain(trained).collect();
    let mut md = String::from("# AKBE on the world's agent suite (test split, greedy)\n\n");
    md += &format!(
        "{} steps per run; main rows {} seeds, ablations {} (mean ± std). EM in %, TC = tool calls per question, TP = EM / TC.\n\n",
        base.run.steps, a.seeds, a.ablation_seeds
    );
    let mut t = Table::new(vec![
        col("em", "EM", 100.0, 1),
        col("em_1hop", "1-hop", 100.0, 1),
        col("em_2hop", "2-hop", 100.0, 1),
        col("em_3hop", "3-hop", 100.0, 1),
        col("tc", "TC", 1.0, 2),
        col("tp", "TP", 1.0, 1),
        col("boundary_accuracy", "boundary acc.", 100.0, 1),
        col("over_search", "over-search", 100.0, 1),
        col("under_search", "under-search", 100.0, 1),
        col("step_s", "s/step", 1.0, 2),
    ]);
    for (label, r, step_s) in &rows {
        let f = |g: &dyn Fn(&AgentReport) -> f64| -> Vec<f64> { r.iter().map(g).collect() };
        let hop = |h: &'static str| f(&move |x| x.em_by_hops.get(h).copied().unwrap_or(f64::NAN));
        t.push(
            label,
            vec![
                f(&|x| x.em),
                hop("1"),
                hop("2"),
                hop("3"),
                f(&|x| x.tc),
                f(&|x| x.tp),
                f(&|x| x.boundary_accuracy),
                f(&|x| x.over_search_rate),
                f(&|x| x.under_search_rate),
                step_s.clone(),
            ],
        );
    }
    md += &t.markdown();
    let mut table = serde_json::Map::new();
    t.json_into(&mut table);
    let m = |label: &str, key: &str| t.mean(label, key);
    let tc_ratio = m("GRPO + AKBE", "tc") / m("GRPO", "tc");
    let em_delta = m("GRPO + AKBE", "em") - m("GRPO", "em");
    let tp_ratio = m("GRPO + AKBE", "tp") / m("GRPO", "tp");
    let time_ratio = m("GRPO + AKBE", "step_s") / m("GRPO", "step_s");
    let (wall, wall_json) = wall_line(&arms_json, t0);
    md += "\n";
    md += &t.headline("GRPO + AKBE vs GRPO", &["GRPO", "GRPO + AKBE"], || format!(
        "**TC × {tc_ratio:.2}** (goal ≤ 0.85), **EM {em_delta:+.1} points** (goal ≥ −0.5), **TP × {tp_ratio:.2}** (goal ≥ 1.15), time per step × {time_ratio:.2}."
    ));
    md += &format!(" {wall}\n");
    println!("{md}");
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let series = vec![
        ("EM (%)".to_string(), labels.iter().map(|l| m(l, "em")).collect()),
        ("TC × 10".to_string(), labels.iter().map(|l| m(l, "tc") * 10.0).collect()),
        ("TP".to_string(), labels.iter().map(|l| m(l, "tp")).collect()),
    ];
    let short: Vec<String> = labels.iter().map(|l| l.replace(" + AKBE", "+A").chars().take(14).collect()).collect();
    let svg = bar_svg("AKBE: EM, tool calls, tool productivity", &short, &series);
    let json = json!({
        "tc_ratio_vs_grpo": tc_ratio, "em_delta_vs_grpo": em_delta, "tp_ratio_vs_grpo": tp_ratio,
        "step_time_ratio_vs_grpo": time_ratio, "steps": base.run.steps, "seeds": a.seeds,
        "ablation_seeds": a.ablation_seeds, "test_questions": qs.len(), "seconds": wall_json["seconds"], "sitting_seconds": wall_json["sitting_seconds"],
        "tables": table, "config": base, "arms": arms_json,
    });
    let out = out_path(&a, "akbe");
    write_outputs(&out, &json, &md, &[Figure { suffix: "", alt: "EM, TC, TP", svg }])
}
