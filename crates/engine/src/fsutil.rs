//! Atomic file writes: write a sibling temp file, fsync it, rename over the target, fsync the
//! directory. Readers see the old file or the new one, never a torn one.
use crate::error::{EngineError, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

pub fn commit(tmp: &Path, dst: &Path) -> Result<()> {
    let f = std::fs::File::open(tmp).map_err(|e| EngineError::io(tmp, e))?;
    f.sync_all().map_err(|e| EngineError::io(tmp, e))?;
    std::fs::rename(tmp, dst).map_err(|e| EngineError::io(dst, e))?;
    sync_dir(dst)
}

pub fn sync_dir(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

pub fn write_atomic(dst: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dst.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| EngineError::io(&tmp, e))?;
    drop(f);
    commit(&tmp, dst)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| EngineError::io(path, e))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| EngineError::io(path, e))?;
    Ok(format!("{:x}", h.finalize()))
}
