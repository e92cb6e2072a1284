//! Shared helpers for the engine's integration tests: where the venv's Python and the real
//! models live (installed by `make test` through scripts/setup and scripts/fetch-real-models),
//! and a runner for scripts/reference/hf_reference.py.
#![allow(dead_code)]
use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

pub fn python() -> PathBuf {
    std::env::var_os("KNOWRL_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("KNOWRL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/knowrl/models"))
}

/// A real model directory; panics with the command to run when it is missing.
pub fn real_model(name: &str) -> PathBuf {
    let d = models_dir().join(name);
    assert!(
        d.join("config.json").exists(),
        "{} is missing: run `make models` (scripts/fetch-real-models)",
        d.display()
    );
    d
}

/// A scratch directory under the system temp dir, removed when the test ends (kept when it
/// fails, for a look): every `make test` used to leave ~190 MB behind.
pub struct TmpDir(PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn tmpdir(tag: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("knowrl-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

/// Runs reference jobs (a JSON list) in one Python process.
pub fn run_reference(jobs: &serde_json::Value, dir: &Path) {
    let f = dir.join("jobs.json");
    std::fs::write(&f, serde_json::to_string(jobs).unwrap()).unwrap();
    let out = std::process::Command::new(python())
        .arg(repo_root().join("scripts/reference/hf_reference.py"))
        .arg(&f)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .expect("cannot start the reference Python (run `make setup`)");
    assert!(out.status.success(), "reference failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

pub fn max_abs_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    (a.to_kind(tch::Kind::Double) - b.to_kind(tch::Kind::Double)).abs().max().double_value(&[])
}

/// Seeded mutations of a valid input, for the parsers' fuzz tests: byte flips, deletions,
/// insertions of structural bytes (quotes, braces, newlines, NUL, invalid UTF-8), truncations,
/// duplicated ranges, and a few inputs of random bytes. Deterministic: the same seed gives the
/// same inputs.
pub fn mutations(valid: &[u8], n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = knowrl_engine::Rng::new(seed);
    const SPECIAL: &[u8] = b"\"{}[]:,\n\r\0\\=#' \xff\xfe0-9e.";
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if i % 50 == 49 {
            let len = rng.below(256);
            out.push((0..len).map(|_| rng.below(256) as u8).collect());
            continue;
        }
        let mut v = valid.to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = if v.is_empty() { 0 } else { rng.below(v.len()) };
            match rng.below(6) {
                0 if !v.is_empty() => v[at] ^= 1 << rng.below(8),
                1 if !v.is_empty() => {
                    let end = (at + 1 + rng.below(16)).min(v.len());
                    v.drain(at..end);
                }
                2 => v.insert(at, SPECIAL[rng.below(SPECIAL.len())]),
                3 => v.truncate(at),
                4 if !v.is_empty() => {
                    let end = (at + 1 + rng.below(32)).min(v.len());
                    let piece = v[at..end].to_vec();
                    let to = rng.below(v.len() + 1);
                    v.splice(to..to, piece);
                }
                _ if !v.is_empty() => v[at] = rng.below(256) as u8,
                _ => v.push(rng.below(256) as u8),
            }
        }
        out.push(v);
    }
    out
}

/// Runs `parse` on every input, none may panic; returns (inputs tried, inputs rejected).
/// `check` sees each error message (it must name the file, line or field).
pub fn fuzz<E: std::fmt::Display>(
    inputs: &[Vec<u8>],
    mut parse: impl FnMut(&[u8]) -> Result<(), E>,
    check: impl Fn(&str) -> bool,
) -> (usize, usize) {
    let mut rejected = 0;
    for (i, input) in inputs.iter().enumerate() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(input)));
        match r {
            Err(_) => {
                panic!("input {i} panicked the parser: {:?}", String::from_utf8_lossy(&input[..input.len().min(300)]))
            }
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(check(&msg), "input {i}: the error does not name its source: {msg}");
                rejected += 1;
            }
            Ok(Ok(())) => {}
        }
    }
    (inputs.len(), rejected)
}

/// A LoRA of `rank` (alpha 2·rank) on all seven projections of every block.
pub fn lora_on_every_projection(rank: i64) -> knowrl_engine::LoraConfig {
    knowrl_engine::LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        dropout: 0.0,
        target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            .map(String::from)
            .to_vec(),
    }
}
