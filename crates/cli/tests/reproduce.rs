//! `knowrl reproduce` runs in sittings: a finished arm × seed is read back, not retrained; an
//! interrupted one resumes from its checkpoints; a run directory trained under another config
//! is refused (nothing overwritten); `--arms` names unknown rows. On the tiny world, the
//! Knowledgeable-R1 comparison's baseline row, 2 steps.
#[path = "../../rl/tests/common/mod.rs"]
mod common;
use std::path::Path;
use std::process::{Command, Output};

fn reproduce(base: &Path, extra: &[&str]) -> Output {
    let method = "[method]\nname = \"knowledgeable_r1\"\nn_pk = 2\nn_ck = 2\n";
    let mut c = common::config(&base.join("unused"), 2, method);
    c.data.suite = knowrl_rl::config::Suite::Context;
    c.data.scenarios = vec!["S1".into(), "S2".into()];
    let file = base.join("kr1.toml");
    std::fs::write(&file, toml::to_string(&c).unwrap()).unwrap();
    let (runs, out) = (base.join("runs"), base.join("report.json"));
    let mut args = vec!["reproduce", "knowledgeable-r1", "--config", file.to_str().unwrap()];
    args.extend(["--seeds", "1", "--ablation-seeds", "0", "--limit", "4", "--arms", "GRPO w/ RAG"]);
    args.extend(["--runs", runs.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    args.extend(extra);
    Command::new(env!("CARGO_BIN_EXE_knowrl")).args(&args).env("OMP_NUM_THREADS", "1").output().unwrap()
}

fn report(base: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(base.join("report.json")).unwrap()).unwrap()
}

#[test]
fn a_rerun_reads_finished_arms_back_and_refuses_a_changed_config() {
    let base = std::env::temp_dir().join(format!("knowrl-reproduce-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).to_string();

    let first = reproduce(&base, &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("1 runs to train or evaluate, 2 steps to train (0 runs finished earlier)"),
        "{}",
        stderr(&first)
    );
    let run = base.join("runs/reproduce-knowledgeable-r1/grpo-w-rag-seed1");
    assert!(run.join("result.toml").is_file() && run.join("config.toml").is_file());
    let wall = report(&base)["arms"]["GRPO w/ RAG"]["wall_s"].clone();
    assert_eq!(wall.as_array().map(Vec::len), Some(1));

    // The second sitting trains nothing and reports the same row.
    let second = reproduce(&base, &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("0 runs to train or evaluate, 0 steps to train (1 runs finished earlier)"),
        "{}",
        stderr(&second)
    );
    assert!(stderr(&second).contains("seed 1 from"), "{}", stderr(&second));
    assert_eq!(report(&base)["arms"]["GRPO w/ RAG"]["wall_s"], wall);

    // An interrupted run (its result gone, the latest checkpoint at step 1) resumes: step 0's
    // row (its timing included) is kept, only step 1 runs again.
    let rows = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let step0 = rows.lines().next().unwrap().to_string();
    std::fs::remove_file(run.join("result.toml")).unwrap();
    std::fs::remove_dir_all(run.join("checkpoints/step-00000002")).unwrap();
    std::fs::write(run.join("checkpoints/latest"), "step-00000001").unwrap();
    let resumed = reproduce(&base, &[]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains("1 runs to train or evaluate, 1 steps to train"), "{}", stderr(&resumed));
    let rows = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 2, "{rows}");
    assert_eq!(rows.lines().next(), Some(step0.as_str()), "step 0 was not run again");
    assert!(run.join("result.toml").is_file());

    // Another step count under the same directory: refused, naming the field; the run is kept.
    let changed = reproduce(&base, &["--steps", "3"]);
    assert!(!changed.status.success());
    assert!(stderr(&changed).contains("first difference: run.steps"), "{}", stderr(&changed));
    assert!(run.join("result.toml").is_file());

    let unknown = reproduce(&base, &["--arms", "nope"]);
    assert!(!unknown.status.success() && stderr(&unknown).contains("the arms are: grpo-w-rag, knowledgeable-r1"));
    let _ = std::fs::remove_dir_all(&base);
}
