//! Training checkpoints: trainable parameters + optimiser moments (safetensors) + a JSON state
//! (step, RNG states, anything the trainer needs) + a manifest of sha256 sums.
//!
//! Written into `<root>/.tmp-step-N`, fsynced, then renamed to `<root>/step-N`, and only then is
//! `<root>/latest` replaced (also atomically). A crash at any point leaves the previous
//! checkpoint intact and `latest` pointing at a complete one.
use crate::error::{read_json, read_to_string, EngineError, Result};
use crate::fsutil::{sha256_file, sync_dir, write_atomic};
use crate::optim::AdamW;
use crate::weights;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tch::Tensor;

const FILES: [&str; 3] = ["params.safetensors", "optimizer.safetensors", "state.json"];
/// Tensors of the training method's own state (e.g. BRIDGE's retriever adapter), when it has any.
const METHOD_FILE: &str = "method.safetensors";

pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

/// Saves a checkpoint for `step` (with the method's tensors, if any); returns its directory.
pub fn save(
    root: &Path,
    step: u64,
    params: &[(String, Tensor)],
    opt: &AdamW,
    state: &Value,
    method: &[(String, Tensor)],
) -> Result<PathBuf> {
    std::fs::create_dir_all(root).map_err(|e| EngineError::io(root, e))?;
    let tmp = root.join(format!(".tmp-step-{step:08}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
    weights::write_atomic(&tmp.join(FILES[0]), params)?;
    weights::write_atomic(&tmp.join(FILES[1]), &opt.state_tensors())?;
    let full = json!({ "step": step, "optimizer_steps": opt.steps, "trainer": state });
    write_atomic(&tmp.join(FILES[2]), serde_json::to_string_pretty(&full).unwrap().as_bytes())?;
    let mut files = FILES.to_vec();
    if !method.is_empty() {
        weights::write_atomic(&tmp.join(METHOD_FILE), method)?;
        files.push(METHOD_FILE);
    }
    let mut sums = serde_json::Map::new();
    for f in files {
        sums.insert(f.into(), sha256_file(&tmp.join(f))?.into());
    }
    write_atomic(&tmp.join("manifest.json"), serde_json::to_string_pretty(&Value::Object(sums)).unwrap().as_bytes())?;
    let dst = step_dir(root, step);
    if dst.exists() {
        std::fs::remove_dir_all(&dst).map_err(|e| EngineError::io(&dst, e))?;
    }
    std::fs::rename(&tmp, &dst).map_err(|e| EngineError::io(&dst, e))?;
    sync_dir(&dst)?;
    write_atomic(&root.join("latest"), format!("step-{step:08}\n").as_bytes())?;
    Ok(dst)
}

/// The directory `latest` points to, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let p = root.join("latest");
    if !p.exists() {
        return Ok(None);
    }
    let name = read_to_string(&p)?;
    Ok(Some(root.join(name.trim())))
}

/// `dir` itself when it is a checkpoint (`step-N`), else the checkpoint its `latest` points to
/// (a run's `checkpoints` directory); an error naming `dir` otherwise.
pub fn resolve(dir: &Path) -> Result<PathBuf> {
    if dir.join("manifest.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    match latest(dir)? {
        Some(d) => Ok(d),
        None => Err(EngineError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a checkpoint (no manifest.json) nor a checkpoints directory (no latest)",
            ),
        )),
    }
}

/// Verifies every file of the checkpoint against its manifest and loads the parameters in place
/// (the optimiser state is left alone: a frozen copy of a run's policy at that step).
pub fn load_params(dir: &Path, params: &[(String, Tensor)]) -> Result<()> {
    let manifest = read_json(&dir.join("manifest.json"))?;
    let with_method = manifest.get(METHOD_FILE).is_some();
    for f in FILES.iter().copied().chain(with_method.then_some(METHOD_FILE)) {
        let path = dir.join(f);
        let expected = manifest
            .get(f)
            .and_then(Value::as_str)
            .ok_or_else(|| EngineError::config(dir.join("manifest.json"), f, "missing checksum"))?;
        let actual = sha256_file(&path)?;
        if actual != expected {
            return Err(EngineError::Checksum { file: path, expected: expected.into(), actual });
        }
    }
    let named: std::collections::HashMap<String, Tensor> =
        params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
    weights::load_into(&[dir.join(FILES[0])], &named, |_| false, |_| false)
}

/// Verifies every file against the manifest, then loads parameters and optimiser state in
/// place. Returns the trainer state saved with it and the step.
pub fn load(dir: &Path, params: &[(String, Tensor)], opt: &mut AdamW) -> Result<(u64, Value)> {
    load_params(dir, params)?;
    let state = read_json(&dir.join(FILES[2]))?;
    let steps = state.get("optimizer_steps").and_then(Value::as_u64).unwrap_or(0);
    opt.load_state_tensors(weights::read_all(&dir.join(FILES[1]))?, steps)?;
    let step = state
        .get("step")
        .and_then(Value::as_u64)
        .ok_or_else(|| EngineError::config(dir.join(FILES[2]), "step", "missing"))?;
    Ok((step, state.get("trainer").cloned().unwrap_or(Value::Null)))
}

/// The method's tensors saved with a checkpoint (empty when it saved none). `load` has verified
/// their checksum.
pub fn method_tensors(dir: &Path) -> Result<std::collections::HashMap<String, Tensor>> {
    let path = dir.join(METHOD_FILE);
    if !path.exists() {
        return Ok(Default::default());
    }
    weights::read_all(&path)
}
