//! What every benchmark reports beside its figures: the machine it ran on, and the median of
//! repeated rounds.
use serde_json::{json, Value};

/// The variables that cap the vector ISA below the CPU's (knowrl's kernels, MKL's GEMMs,
/// ATen's kernels): set together, they time an AVX2-only machine's code paths on an AVX-512 one.
const ISA_CAPS: [&str; 3] = ["KNOWRL_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"];

/// CPU model, logical cores, OS, the libtorch build and the ISA knowrl's kernels ran with (plus
/// any cap set through [`ISA_CAPS`]), for a results file.
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
    let caps: serde_json::Map<String, Value> =
        ISA_CAPS.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), json!(v)))).collect();
    let isa = format!("{:?}", knowrl_engine::kernels::vmath::isa());
    json!({"cpu": cpu, "logical_cores": cores, "os": std::env::consts::OS, "libtorch": "2.11.0 (PyPI torch wheel)",
           "knowrl_isa": isa, "isa_caps": caps})
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_machine_names_the_isa_the_kernels_ran_with() {
        let m = super::machine();
        assert!(["Avx512", "Avx2", "Baseline"].contains(&m["knowrl_isa"].as_str().unwrap()), "{m}");
        // Only the caps this process has set are listed.
        let caps = m["isa_caps"].as_object().unwrap();
        for (k, v) in caps {
            assert_eq!(std::env::var(k).unwrap(), v.as_str().unwrap());
        }
    }
}
