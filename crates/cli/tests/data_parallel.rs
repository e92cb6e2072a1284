//! Data parallel over gloo on loopback (`knowrl train --nproc 2`, 1 thread a rank), on the
//! tiny world in f32: two ranks end where one process with the whole batch ends (GRPO with its
//! rows dealt into mini-batches that straddle the ranks, and Knowledgeable-R1, whose β is a
//! batch statistic); a two-rank resume is bit-identical to the uninterrupted two-rank run; a
//! rank killed mid-run ends the other with an error, not a hang; a rank started with another
//! config is refused at the rendezvous; AKBE's CE and DPO terms (online and offline signals) and
//! BRIDGE's query LoRA (both states) and RAG terms give what one process gives; BRIDGE's
//! one-process fidelity diagnostic is refused.
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

/// The tiny world's config for `method`, written beside `out`. Every arm's PPO mini-batches
/// straddle the ranks:
/// - GRPO: 4 questions × 4 samples, AKBE's format-aware EM so that the tiny policy's groups do
///   not all tie, mini-batches of 6 of the 16 rows;
/// - Knowledgeable-R1 on S1/S2 items: 2 questions, 12 rows, mini-batches of 4;
/// - AKBE (online CE; DPO on offline signals, a frozen reference): 8 questions, 16 with-tool rows
///   a rank in 2 mini-batches, so a CE/DPO part holds several ranks' targets;
/// - BRIDGE (Drop: the query LoRA and one RAG term; two-state: η and η*; two-state with the
///   fidelity diagnostic, refused): one mini-batch, so its RAG part holds both ranks' turns.
fn config(out: &Path, method: &str, steps: u64) -> PathBuf {
    let akbe = |extra: &str| {
        let method = format!("[method]\nname = \"akbe\"\nn_wt = 4\nn_nt = 4\nlambda = 0.5\n{extra}");
        let mut c = common::config(out, steps, &method);
        (c.rollout.prompts_per_step, c.algorithm.ppo_mini_batch) = (8, 16);
        c
    };
    let bridge = |extra: &str| {
        let mut c = common::config(out, steps, &format!("[method]\nname = \"bridge\"\nk = 4\n{extra}"));
        c.algorithm.ppo_mini_batch = 0;
        c
    };
    let c = match method {
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
            c.algorithm.ppo_mini_batch = 4;
            c
        }
        "akbe" => akbe(""),
        "akbe_dpo" => akbe("objective = \"dpo\"\nsignals = \"offline\"\n"),
        "bridge" => bridge("estimator = \"drop\"\n"),
        "bridge_two_state" => bridge("estimator = \"two_state\"\n"),
        "bridge_fidelity" => bridge("estimator = \"two_state\"\nfidelity_every = 1\n"),
        _ => unreachable!(),
    };
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

/// One file of a checkpoint's tensors, flattened to f32.
fn checkpoint_file(run: &Path, step: u64, file: &str) -> HashMap<String, Vec<f32>> {
    let file = run.join(format!("checkpoints/step-{step:08}/{file}"));
    tch::Tensor::read_safetensors(&file)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(t.to_kind(tch::Kind::Float).view(-1)).unwrap()))
        .collect()
}

fn params(run: &Path, step: u64) -> HashMap<String, Vec<f32>> {
    checkpoint_file(run, step, "params.safetensors")
}

/// How many of the parameters differ by more than `bound`, and how many there are.
fn count_over(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>, bound: f32) -> (usize, usize) {
    let over = a.iter().map(|(n, x)| x.iter().zip(&b[n]).filter(|(p, q)| (*p - *q).abs() > bound).count()).sum();
    (over, a.values().map(Vec::len).sum())
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

/// One method's figure of every metrics row's `extra` (NaN where a row lacks it).
fn extra(run: &Path, key: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["extra"][key].as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// A method's state in a checkpoint (BRIDGE's query LoRA and its moments).
fn method_state(run: &Path, step: u64) -> HashMap<String, Vec<f32>> {
    checkpoint_file(run, step, "method.safetensors")
}

/// Step figures that agree: within 1e-6 (relative) at step 0, from the same weights, where only
/// the order of the ranks' sums differs; within 1e-4 later, from weights that differ by that
/// rounding carried through AdamW.
fn close(a: &[f64], b: &[f64]) -> bool {
    let tol = |step: usize| if step == 0 { 1e-6 } else { 1e-4 };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .enumerate()
            .all(|(s, (x, y))| (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol(s) * x.abs().max(1e-3))
}

/// Trains `method` `steps` steps in one process and on 2 ranks and checks they end alike: the
/// same rollouts, loss, gradient norm and `figures` (the method's own loss terms) step by step,
/// and parameters as close as float order allows (at most `tol`). `active` names an `extra` count that must be positive on some
/// step, so the method's own term was there to get wrong. Returns the two runs' directories.
fn two_ranks_match_one_process(
    dir: &Path,
    method: &str,
    steps: u64,
    tol: f32,
    figures: &[&str],
    active: Option<&str>,
) -> (PathBuf, PathBuf) {
    let (one, two) = (dir.join(format!("{method}-one")), dir.join(format!("{method}-two")));
    train(&config(&one, method, steps), &[]);
    train(&config(&two, method, steps), &["--nproc", "2"]);
    // Same rollouts (each row keeps its generator), so the same rewards step by step …
    assert_eq!(rewards(&one), rewards(&two), "{method}: rollouts differ");
    if let Some(key) = active {
        let v = extra(&one, key);
        println!("{method}: `{key}` by step: {v:?}");
        assert!(v.iter().any(|x| *x > 0.0), "{method}: no `{key}` in any step: the check is vacuous");
        assert_eq!(v, extra(&two, key), "{method}: `{key}` differs");
    }
    // … the same loss and gradient norm (AdamW would hide a gradient scaled by a wrong
    // normaliser; the norm before clipping does not), and the same auxiliary losses …
    for key in ["loss", "grad_norm"] {
        let (a, b) = (column(&one, key), column(&two, key));
        assert!(close(&a, &b), "{method} {key}: {a:?} vs {b:?}");
    }
    for key in figures {
        let (a, b) = (extra(&one, key), extra(&two, key));
        assert!(a.iter().any(|x| x.is_finite()), "{method}: no `{key}` reported");
        assert!(close(&a, &b), "{method} {key}: {a:?} vs {b:?}");
    }
    // … and the same parameters at the end, up to float order: within 1e-6, or else within 1e-5
    // or twice what one process moves when it scores one row at a time (micro-batches of 1
    // instead of 4: other GEMM shapes and sums, the same arithmetic), whichever is larger, and
    // always within `tol`, but for the few coordinates Adam amplifies (below). (Both are
    // rounding, so their ratio varies by machine: BRIDGE's was 1.3 on one.)
    let (end_one, end_two) = (params(&one, steps), params(&two, steps));
    let d = max_diff(&end_one, &end_two);
    println!("{method}: max |Δθ| one process vs 2 ranks after {steps} steps: {d:e}");
    if d > 1e-6 {
        let reordered = dir.join(format!("{method}-mb1"));
        let cfg = config(&reordered, method, steps);
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert!(text.contains("micro_batch = 4"));
        std::fs::write(&cfg, text.replace("micro_batch = 4", "micro_batch = 1")).unwrap();
        train(&cfg, &[]);
        let floor = max_diff(&end_one, &params(&reordered, steps));
        println!("{method}: max |Δθ| one process, micro-batches of 4 vs 1: {floor:e}");
        let bound = tol.min((2.0 * floor).max(1e-5));
        // Adam divides each step by √v, so a coordinate whose gradient is itself at rounding
        // level (an embedding row one token touched once) takes a rounding-sized but
        // lr-scaled step: a handful of such coordinates may reach `tol`, never more, and no
        // more than one in 100,000 may pass the float-order bound (a wrong reduction moves
        // them all, and the loss and gradient norm above would differ too).
        let (over, total) = count_over(&end_one, &end_two, bound);
        println!("{method}: {over} of {total} parameters differ by more than {bound:e}");
        assert!(d <= tol, "{method}: parameters differ by {d} (float order alone: {floor}; at most {tol})");
        assert!(
            over * 100_000 <= total,
            "{method}: {over} of {total} parameters differ by more than {bound} (float order alone: {floor})"
        );
    }
    if steps > 1 {
        let moved = max_diff(&params(&one, 1), &params(&one, steps));
        assert!(moved > 1e-4, "{method}: training moved nothing: the check is vacuous");
    }
    (one, two)
}

#[test]
fn two_ranks_end_where_one_process_ends_and_resume_bit_identically() {
    let dir = base("equal");
    two_ranks_match_one_process(&dir, "grpo", 3, 1e-6, &[], None);
    two_ranks_match_one_process(&dir, "knowledgeable_r1", 3, 1e-6, &["beta"], None);
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

#[test]
fn akbe_ce_and_dpo_terms_are_sharded_as_one_process_takes_them() {
    let dir = base("akbe");
    two_ranks_match_one_process(&dir, "akbe", 3, 1e-4, &["ce_nll", "cat_efficiency", "nt_em"], Some("targets"));
    two_ranks_match_one_process(&dir, "akbe_dpo", 3, 1e-4, &["dpo_loss"], Some("targets"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The query LoRA's state in a checkpoint: η (`adapter.*`), η* (`second.*`) and their moments.
fn query_lora_matches(method: &str, one: &Path, two: &Path, step: u64, tol: f32) {
    let (a, b) = (method_state(one, step), method_state(two, step));
    let d = max_diff(&a, &b);
    println!("{method}: max |Δη| one process vs 2 ranks after {step} steps: {d:e}");
    assert!(d <= tol, "{method}: query LoRA differs by {d}");
    // LoRA B starts at zero: a non-zero one has been trained.
    assert!(a.iter().any(|(n, v)| n.contains("lora_B") && v.iter().any(|x| *x != 0.0)), "{method}: η never stepped");
}

#[test]
fn bridge_query_lora_and_rag_terms_are_reduced_as_one_process_takes_them() {
    let dir = base("bridge");
    let figures = ["retriever_j_rl", "retriever_l_rag", "policy_l_rag_0"];
    let (one, two) = two_ranks_match_one_process(&dir, "bridge", 3, 1e-4, &figures, Some("retrieval_turns"));
    query_lora_matches("bridge", &one, &two, 3, 1e-4);
    // Two-state, one step: η and η* from every rank's turns. (Later steps are not compared: on
    // the tiny world every turn's advantage is 0, so η* = η and the estimator's two RAG terms
    // cancel to rounding noise, which Adam scales up to lr-sized steps, in one process alike.)
    let (one, two) = two_ranks_match_one_process(&dir, "bridge_two_state", 1, 1e-6, &["policy_l_rag_1"], None);
    query_lora_matches("bridge_two_state", &one, &two, 1, 1e-6);
    assert!(method_state(&one, 1).keys().any(|k| k.starts_with("second.")), "η* never stepped");
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
fn a_rank_with_another_config_or_a_one_process_diagnostic_is_refused() {
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

    let fidelity = config(&dir.join("fidelity"), "bridge_fidelity", 1);
    let out = knowrl(&["train", "--config", fidelity.to_str().unwrap(), "--nproc", "2"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("runs in one process only"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
