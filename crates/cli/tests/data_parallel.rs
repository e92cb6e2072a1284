//! Data parallel over gloo on loopback (`knowrl train --nproc 2`, 1 thread a rank), on the
//! tiny world in f32: two ranks end where one process with the whole batch ends (GRPO with its
//! rows dealt into mini-batches that straddle the ranks, and Knowledgeable-R1, whose β is a
//! batch statistic); a two-rank resume is bit-identical to the uninterrupted two-rank run; a
//! rank killed mid-run ends the other with an error, not a hang; a rank started with another
//! config is refused at the rendezvous; a method not yet sharded is refused.
#[path = "../../rl/tests/common/mod.rs"]
mod common;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn base(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("knowrl-dp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tiny world's GRPO config (4 questions × 4 samples, AKBE's format-aware EM so that the
/// tiny policy's groups do not all tie; mini-batches of 6 of the 16 rows, so two of them
/// straddle the ranks), or Knowledgeable-R1's on S1/S2 items (2 questions, 12 rows, mini-batches
/// of 4); written beside `out`.
fn config(out: &Path, method: &str, steps: u64) -> PathBuf {
    let mut c = match method {
        "grpo" => {
            let mut c = common::config(out, steps, "");
            (c.rollout.prompts_per_step, c.rollout.group_size, c.algorithm.ppo_mini_batch) = (4, 4, 6);
            c.reward.name = knowrl_rl::reward::RewardKind::EmFormat;
            c
        }
        "knowledgeable_r1" => {
            let mut c = common::config(out, steps, "[method]\nname = \"knowledgeable_r1\"\nn_pk = 2\nn_ck = 2\n");
            c.data.suite = knowrl_rl::config::Suite::Context;
            c.data.scenarios = vec!["S1".into(), "S2".into()];
            c
        }
        "akbe" => common::config(out, steps, "[method]\nname = \"akbe\"\n"),
        _ => unreachable!(),
    };
    if method != "grpo" {
        c.algorithm.ppo_mini_batch = 4;
    }
    let file = out.with_extension("toml");
    std::fs::write(&file, toml::to_string(&c).unwrap()).unwrap();
    file
}

fn knowrl(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_knowrl"));
    c.args(["--threads", "1"]).args(args).env("OMP_NUM_THREADS", "1");
    c
}

fn train(cfg: &Path, extra: &[&str]) -> Output {
    let out = knowrl(&[&["train", "--config", cfg.to_str().unwrap()][..], extra].concat()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn params(run: &Path, step: u64) -> HashMap<String, Vec<f32>> {
    let file = run.join(format!("checkpoints/step-{step:08}/params.safetensors"));
    tch::Tensor::read_safetensors(&file)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(t.to_kind(tch::Kind::Float).view(-1)).unwrap()))
        .collect()
}

fn max_diff(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().map(|(n, x)| x.iter().zip(&b[n]).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max)).fold(0.0, f32::max)
}

/// One figure of every metrics row.
fn column(run: &Path, key: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()[key].as_f64().unwrap()).collect()
}

fn rewards(run: &Path) -> Vec<f64> {
    column(run, "reward")
}

#[test]
fn two_ranks_end_where_one_process_ends_and_resume_bit_identically() {
    let dir = base("equal");
    for method in ["grpo", "knowledgeable_r1"] {
        let (one, two) = (dir.join(format!("{method}-one")), dir.join(format!("{method}-two")));
        train(&config(&one, method, 3), &[]);
        train(&config(&two, method, 3), &["--nproc", "2"]);
        // Same rollouts (each row keeps its generator), so the same rewards step by step …
        assert_eq!(rewards(&one), rewards(&two), "{method}: rollouts differ");
        let after_one = params(&one, 1);
        // … the same loss and gradient norm (AdamW would hide a gradient scaled by a wrong
        // normaliser; the norm before clipping does not) …
        for key in ["loss", "grad_norm"] {
            let (a, b) = (column(&one, key), column(&two, key));
            assert!(
                a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs().max(1e-3)),
                "{method} {key}: {a:?} vs {b:?}"
            );
        }
        // … and the same parameters after 3 steps, up to the order of the gradient sums.
        let d = max_diff(&params(&one, 3), &params(&two, 3));
        println!("{method}: max |Δθ| one process vs 2 ranks after 3 steps: {d:e}");
        assert!(d <= 1e-6, "{method}: parameters differ by {d}");
        assert!(
            max_diff(&after_one, &params(&one, 3)) > 1e-4,
            "{method}: training moved nothing: the check is vacuous"
        );
    }
    // A two-rank run cut back to its step-1 checkpoint and resumed on two ranks: bit-identical.
    let two = dir.join("grpo-two");
    let cfg = two.with_extension("toml");
    let end = params(&two, 3);
    for s in [2, 3] {
        std::fs::remove_dir_all(two.join(format!("checkpoints/step-{s:08}"))).unwrap();
    }
    std::fs::write(two.join("checkpoints/latest"), "step-00000001").unwrap();
    train(&cfg, &["--nproc", "2", "--resume"]);
    assert_eq!(params(&two, 3), end, "a resumed two-rank run differs from the uninterrupted one");
    assert_eq!(rewards(&two).len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rank `rank` of 2 under torchrun's variables, its stderr to a file.
fn rank(cfg: &Path, rank: usize, port: u16, log: &Path) -> std::process::Child {
    knowrl(&["train", "--config", cfg.to_str().unwrap(), "--dist-timeout", "120"])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn free_port() -> u16 {
    knowrl_dist::free_port().unwrap()
}

fn wait(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_rank_ends_the_run_with_an_error_not_a_hang() {
    let dir = base("kill");
    let run = dir.join("run");
    let cfg = config(&run, "grpo", 200);
    let port = free_port();
    let (log0, log1) = (dir.join("rank0.log"), dir.join("rank1.log"));
    let mut r0 = rank(&cfg, 0, port, &log0);
    let mut r1 = rank(&cfg, 1, port, &log1);
    // Once the ranks trained a step together, rank 1 dies without a word.
    let t0 = Instant::now();
    while !run.join("metrics.jsonl").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no step in 120 s: {}",
            std::fs::read_to_string(&log0).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    r1.kill().unwrap();
    r1.wait().unwrap();
    let killed = Instant::now();
    let status = wait(&mut r0, Duration::from_secs(60));
    let log = std::fs::read_to_string(&log0).unwrap();
    println!("rank 0 exited {status} {:.1} s after rank 1 was killed: {log}", killed.elapsed().as_secs_f64());
    assert!(!status.success(), "rank 0 went on alone: {log}");
    assert!(log.lines().any(|l| l.starts_with("error: ") && l.contains("data parallel: ")), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_with_another_config_or_an_unsharded_method_is_refused() {
    let dir = base("refuse");
    let cfg = config(&dir.join("run"), "grpo", 3);
    let other = dir.join("other.toml");
    std::fs::write(&other, std::fs::read_to_string(&cfg).unwrap().replace("lr = 0.001", "lr = 0.002")).unwrap();
    assert_ne!(std::fs::read_to_string(&cfg).unwrap(), std::fs::read_to_string(&other).unwrap());
    let port = free_port();
    let (log0, log1) = (dir.join("rank0.log"), dir.join("rank1.log"));
    let mut r0 = rank(&cfg, 0, port, &log0);
    let mut r1 = rank(&other, 1, port, &log1);
    let (s0, s1) = (wait(&mut r0, Duration::from_secs(60)), wait(&mut r1, Duration::from_secs(60)));
    assert!(!s0.success() && !s1.success());
    for log in [&log0, &log1] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(
            text.contains("rank 1 was started with another config than rank 0's (first difference: optim.lr)"),
            "{text}"
        );
    }
    assert!(!dir.join("run/metrics.jsonl").exists(), "nothing may be trained");

    let akbe = config(&dir.join("akbe"), "akbe", 1);
    let out = knowrl(&["train", "--config", akbe.to_str().unwrap(), "--nproc", "2"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("AKBE does not run data-parallel yet"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
