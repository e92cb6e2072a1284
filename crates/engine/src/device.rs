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

/// "f32" / "float32", "bf16" / "bfloat16", "f16" / "float16".
pub fn parse_dtype(s: &str) -> Result<Kind> {
    match s {
        "f32" | "float32" | "float" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        "f16" | "float16" | "half" => Ok(Kind::Half),
        _ => Err(EngineError::Invalid(format!("unknown dtype `{s}` (f32, bf16, f16)"))),
    }
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
