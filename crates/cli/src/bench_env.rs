//! What every benchmark reports beside its figures: the machine it ran on, and the median of
//! repeated rounds.
use serde_json::{json, Value};

/// CPU model, logical cores, OS and the libtorch build, for a results file.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    json!({"cpu": cpu, "logical_cores": cores, "os": std::env::consts::OS, "libtorch": "2.11.0 (PyPI torch wheel)"})
}

/// The median of repeated measurements (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Writes a results file atomically (pretty JSON), creating its folder.
pub fn write_result(path: &std::path::Path, result: &Value) -> anyhow::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    knowrl_engine::fsutil::write_atomic(path, (serde_json::to_string_pretty(result)? + "\n").as_bytes())?;
    Ok(())
}
