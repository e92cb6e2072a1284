//! Device and precision selection. One code path for CPU and CUDA: the choice is data.
use crate::error::{EngineError, Result};
use tch::{Device, Kind};

/// "cpu", "cuda", "cuda:N" or "auto" (CUDA when available).
pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "auto" => Ok(Device::cuda_if_available()),
        "cuda" => cuda(0),
        _ => match s.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => cuda(n),
            None => Err(EngineError::Invalid(format!("unknown device `{s}` (cpu, cuda, cuda:N, auto)"))),
        },
    }
}

fn cuda(n: usize) -> Result<Device> {
    if !tch::Cuda::is_available() {
        return Err(EngineError::Invalid(format!("device cuda:{n} requested but libtorch sees no CUDA device")));
    }
    if n as i64 >= tch::Cuda::device_count() {
        return Err(EngineError::Invalid(format!(
            "device cuda:{n} requested but only {} CUDA device(s)",
            tch::Cuda::device_count()
        )));
    }
    Ok(Device::Cuda(n))
}

/// Waits for the device's queued work (a no-op on the CPU), so a host clock read after it times
/// the work and not only its launches.
pub fn synchronize(device: Device) {
    if let Device::Cuda(n) = device {
        tch::Cuda::synchronize(n as i64);
    }
}

/// "f32" / "float32", "bf16" / "bfloat16", "f16" / "float16".
pub fn parse_dtype(s: &str) -> Result<Kind> {
    match s {
        "f32" | "float32" | "float" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        "f16" | "float16" | "half" => Ok(Kind::Half),
        _ => Err(EngineError::Invalid(format!("unknown dtype `{s}` (f32, bf16, f16)"))),
    }
}

/// A warning for bf16 on a CPU without native bf16 arithmetic (AVX512-BF16 or AMX): libtorch
/// emulates it there, ~1 GFLOP/s against ~100 for f32 on the 2-core AVX2 machines knowrl is
/// measured on, so such a run is ~100× slower than the same run in f32.
pub fn bf16_cpu_warning(device: Device, kind: Kind) -> Option<String> {
    if device != Device::Cpu || kind != Kind::BFloat16 {
        return None;
    }
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let native = flags
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "avx512_bf16" || f == "amx_bf16"));
    (!native).then(|| {
        "warning: bf16 on this CPU (no AVX512-BF16 or AMX) is emulated by libtorch, ~100x slower than f32; use f32 on CPU".to_string()
    })
}

/// A device and a dtype from their names, warning (stderr) when bf16 would be emulated on this CPU.
pub fn parse_placement(device: &str, dtype: &str) -> Result<(Device, Kind)> {
    let (device, dtype) = (parse_device(device)?, parse_dtype(dtype)?);
    if let Some(w) = bf16_cpu_warning(device, dtype) {
        eprintln!("{w}");
    }
    Ok((device, dtype))
}

pub fn dtype_name(k: Kind) -> &'static str {
    match k {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    }
}

/// Moves a host tensor to `device`, through pinned memory when the target is a GPU so the
/// copy can overlap with compute.
pub fn to_device(t: tch::Tensor, device: Device) -> tch::Tensor {
    match device {
        Device::Cpu => t,
        d => t.pin_memory(d).to_device_(d, t.kind(), true, false),
    }
}
