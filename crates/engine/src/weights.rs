//! Loading HF safetensors checkpoints (single file or sharded with an index) into the model's
//! named parameters. Strict by design: a missing tensor, a tensor of the wrong shape, or a
//! tensor the config does not describe is an error that names the tensor and the file.
use crate::error::{read_json, EngineError, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// The weight files of a model directory: `model.safetensors`, or every shard named by
/// `model.safetensors.index.json`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Err(EngineError::Invalid(format!(
            "{}: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are supported)",
            dir.display()
        )));
    }
    let v = read_json(&index)?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| EngineError::config(&index, "weight_map", "missing or not an object"))?;
    let shards: BTreeSet<&str> = map.values().filter_map(|s| s.as_str()).collect();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}

fn kind_of(file: &Path, name: &str, d: Dtype) -> Result<Kind> {
    Ok(match d {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        other => return Err(EngineError::weights(file, name, format!("unsupported dtype {other:?}"))),
    })
}

/// Calls `f(name, tensor)` for every tensor of a safetensors file (memory-mapped; each tensor
/// is copied once into a libtorch CPU tensor).
pub fn for_each_tensor(file: &Path, mut f: impl FnMut(&str, Tensor) -> Result<()>) -> Result<()> {
    let fd = std::fs::File::open(file).map_err(|e| EngineError::io(file, e))?;
    // SAFETY: the map is read-only and dropped before we return; a concurrent writer would be a
    // user error we cannot guard against anyway (same contract as transformers/candle).
    let mmap = unsafe { memmap2::Mmap::map(&fd) }.map_err(|e| EngineError::io(file, e))?;
    let st = SafeTensors::deserialize(&mmap)
        .map_err(|e| EngineError::Safetensors { file: file.to_path_buf(), msg: e.to_string() })?;
    for (name, view) in st.tensors() {
        let kind = kind_of(file, &name, view.dtype())?;
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, kind)?;
        f(&name, t)?;
    }
    Ok(())
}

/// Calls `f(name)` for every tensor name in a safetensors file's header (no data copied).
pub fn for_each_header(file: &Path, mut f: impl FnMut(&str)) -> Result<()> {
    let fd = std::fs::File::open(file).map_err(|e| EngineError::io(file, e))?;
    // SAFETY: read-only map, dropped before returning.
    let mmap = unsafe { memmap2::Mmap::map(&fd) }.map_err(|e| EngineError::io(file, e))?;
    let (_, meta) = SafeTensors::read_metadata(&mmap)
        .map_err(|e| EngineError::Safetensors { file: file.to_path_buf(), msg: e.to_string() })?;
    for name in meta.tensors().keys() {
        f(name);
    }
    Ok(())
}

/// Reads all tensors of a file into a map (small files: checkpoints, test references).
pub fn read_all(file: &Path) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for_each_tensor(file, |n, t| {
        out.insert(n.to_string(), t);
        Ok(())
    })?;
    Ok(out)
}

/// Copies checkpoint tensors into `params` (name → parameter tensor, already on its device and
/// dtype). `optional` parameters may be absent (LoRA adapters); `ignore` names may be present
/// without a parameter (e.g. `lm_head.weight` next to tied embeddings, rotary buffers).
pub fn load_into(
    files: &[PathBuf],
    params: &HashMap<String, Tensor>,
    optional: impl Fn(&str) -> bool,
    ignore: impl Fn(&str) -> bool,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    for file in files {
        for_each_tensor(file, |name, t| {
            let Some(p) = params.get(name) else {
                if ignore(name) {
                    return Ok(());
                }
                return Err(EngineError::weights(
                    file,
                    name,
                    "unexpected tensor: the model built from config.json has no such parameter (wrong config.json or architecture?)",
                ));
            };
            if p.size() != t.size() {
                return Err(EngineError::weights(
                    file,
                    name,
                    format!("shape mismatch: checkpoint has {:?}, config.json implies {:?}", t.size(), p.size()),
                ));
            }
            tch::no_grad(|| p.shallow_clone().f_copy_(&t.to_kind(p.kind())))?;
            seen.insert(name.to_string());
            Ok(())
        })?;
    }
    let mut missing: Vec<&String> = params.keys().filter(|k| !seen.contains(*k) && !optional(k)).collect();
    missing.sort();
    if let Some(first) = missing.first() {
        let where_ = files.first().cloned().unwrap_or_default();
        return Err(EngineError::weights(
            where_,
            first,
            format!("missing from the checkpoint ({} parameter(s) missing in all)", missing.len()),
        ));
    }
    Ok(())
}

/// Named tensors in name order: a VarStore's `variables()` is a HashMap whose order changes from
/// run to run, and whatever sums, draws noise or writes in parameter order must not.
pub fn by_name(tensors: impl IntoIterator<Item = (String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = tensors.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Writes named tensors as safetensors atomically: a temporary file in the same directory,
/// fsync, then rename, so a crash never leaves a half-written file under the final name.
pub fn write_atomic(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let cpu: Vec<(String, Tensor)> =
        tensors.iter().map(|(n, t)| (n.clone(), t.detach().to_device(tch::Device::Cpu).contiguous())).collect();
    Tensor::write_safetensors(&cpu, &tmp)?;
    crate::fsutil::commit(&tmp, path)
}
