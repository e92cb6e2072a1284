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
