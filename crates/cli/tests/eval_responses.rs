//! `knowrl eval --suite world-scenarios --trajectories F` writes one JSONL row per item whose
//! answers and verdicts are the ones the report counts (tiny world, 10 items).
use std::path::Path;
use std::process::Command;

#[test]
fn scenario_responses_match_the_report() {
    let world = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world");
    let base = std::env::temp_dir().join(format!("knowrl-eval-responses-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let (rows_file, report_file) = (base.join("responses.jsonl"), base.join("report.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_knowrl"))
        .args(["eval", "--suite", "world-scenarios", "--limit", "10"])
        .args(["--model".as_ref(), world.join("policy").as_os_str()])
        .args(["--world".as_ref(), world.as_os_str()])
        .args(["--trajectories".as_ref(), rows_file.as_os_str()])
        .args(["--out".as_ref(), report_file.as_os_str()])
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&rows_file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 10);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_file).unwrap()).unwrap();
    let mut counted = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for r in &rows {
        let gold: Vec<String> = serde_json::from_value(r["golden_answers"].clone()).unwrap();
        let answer = r["answer"].as_str().unwrap();
        // The verdict is EM of the answer extracted from the raw text.
        assert_eq!(knowrl_rl::reward::extract_answer(r["text"].as_str().unwrap()).unwrap_or_default(), answer);
        assert_eq!(r["correct"].as_bool().unwrap(), knowrl_rl::reward::exact_match(answer, &gold));
        let key = format!("{}-{}", r["scenario"].as_str().unwrap(), r["variant"].as_str().unwrap());
        let c = counted.entry(key).or_default();
        c.0 += r["correct"].as_bool().unwrap() as u64;
        c.1 += 1;
    }
    for (key, (correct, n)) in &counted {
        assert_eq!(report["em"][key]["correct"].as_u64(), Some(*correct), "{key}");
        assert_eq!(report["em"][key]["n"].as_u64(), Some(*n), "{key}");
    }
    assert_eq!(report["em"].as_object().unwrap().len(), counted.len());
    let _ = std::fs::remove_dir_all(&base);
}
