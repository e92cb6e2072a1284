//! Exact inner-product search over a flat matrix of passage vectors: f32 or f16 on disk,
//! memory-mapped, scanned in chunks as one matrix product per chunk (queries × chunkᵀ) with a
//! running top-k. It is the default dense index and the test oracle for the approximate one.
//!
//! Layout of an index directory: `flat.json` ({n, dim, dtype, done}) and `vectors.bin`
//! (row-major, little-endian). `done` counts rows written, so an interrupted build resumes.
use crate::error::{index_err, io, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VecDtype {
    F32,
    F16,
}

impl VecDtype {
    pub fn bytes(self) -> usize {
        match self {
            VecDtype::F32 => 4,
            VecDtype::F16 => 2,
        }
    }
    fn kind(self) -> Kind {
        match self {
            VecDtype::F32 => Kind::Float,
            VecDtype::F16 => Kind::Half,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlatMeta {
    pub n: usize,
    pub dim: usize,
    pub dtype: VecDtype,
    /// Rows written so far (== n when complete).
    pub done: usize,
    /// Free-form provenance (encoder directory, prefixes), checked on resume.
    #[serde(default)]
    pub source: serde_json::Value,
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

pub struct FlatIndex {
    data: Storage,
    pub meta: FlatMeta,
    /// Rows per matrix product; bounds the temporary [queries, chunk] score matrix.
    pub chunk: usize,
}

const CHUNK: usize = 65_536;

/// Per query: scores and row ids, best first.
pub type TopK = (Vec<Vec<f32>>, Vec<Vec<usize>>);

fn meta_path(dir: &Path) -> PathBuf {
    dir.join("flat.json")
}

/// Writes vectors at arbitrary row positions, recording progress after every batch.
pub struct FlatWriter {
    dir: PathBuf,
    file: std::fs::File,
    pub meta: FlatMeta,
}

impl FlatWriter {
    /// Creates a new index, or reopens an unfinished one with the same shape and source.
    pub fn create_or_resume(
        dir: &Path,
        n: usize,
        dim: usize,
        dtype: VecDtype,
        source: serde_json::Value,
    ) -> Result<FlatWriter> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let vec_path = dir.join("vectors.bin");
        if let Ok(text) = std::fs::read_to_string(meta_path(dir)) {
            let m: FlatMeta = serde_json::from_str(&text).map_err(|e| index_err(meta_path(dir), e))?;
            if m.n == n && m.dim == dim && m.dtype == dtype && m.source == source && vec_path.exists() {
                let file = std::fs::OpenOptions::new().write(true).open(&vec_path).map_err(|e| io(&vec_path, e))?;
                return Ok(FlatWriter { dir: dir.to_path_buf(), file, meta: m });
            }
        }
        let file = std::fs::File::create(&vec_path).map_err(|e| io(&vec_path, e))?;
        file.set_len((n * dim * dtype.bytes()) as u64).map_err(|e| io(&vec_path, e))?;
        let w = FlatWriter { dir: dir.to_path_buf(), file, meta: FlatMeta { n, dim, dtype, done: 0, source } };
        w.save_meta()?;
        Ok(w)
    }

    fn save_meta(&self) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.meta).unwrap();
        knowrl_engine::fsutil::write_atomic(&meta_path(&self.dir), text.as_bytes())?;
        Ok(())
    }

    /// Writes `vectors` [len(rows), dim] at `rows`, then marks `done` += len(rows) durably.
    pub fn write_rows(&mut self, rows: &[usize], vectors: &Tensor) -> Result<()> {
        let v = vectors.to_device(Device::Cpu).to_kind(self.meta.dtype.kind()).contiguous();
        let row_bytes = self.meta.dim * self.meta.dtype.bytes();
        let mut buf = vec![0u8; rows.len() * row_bytes];
        let numel = rows.len() * self.meta.dim;
        v.copy_data_u8(&mut buf, numel);
        for (j, &r) in rows.iter().enumerate() {
            let path = self.dir.join("vectors.bin");
            self.file
                .write_all_at(&buf[j * row_bytes..(j + 1) * row_bytes], (r * row_bytes) as u64)
                .map_err(|e| io(path, e))?;
        }
        self.file.sync_data().map_err(|e| io(self.dir.join("vectors.bin"), e))?;
        self.meta.done += rows.len();
        self.save_meta()
    }

    pub fn finish(self) -> Result<FlatIndex> {
        FlatIndex::open(&self.dir)
    }
}

impl FlatIndex {
    pub fn open(dir: &Path) -> Result<FlatIndex> {
        let text = std::fs::read_to_string(meta_path(dir)).map_err(|e| io(meta_path(dir), e))?;
        let meta: FlatMeta = serde_json::from_str(&text).map_err(|e| index_err(meta_path(dir), e))?;
        if meta.done != meta.n {
            return Err(index_err(
                dir,
                format!("incomplete: {} of {} vectors (resume `knowrl index build`)", meta.done, meta.n),
            ));
        }
        let p = dir.join("vectors.bin");
        let f = std::fs::File::open(&p).map_err(|e| io(&p, e))?;
        // SAFETY: read-only map of a file this process does not write while searching.
        let mmap = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io(&p, e))?;
        if mmap.len() != meta.n * meta.dim * meta.dtype.bytes() {
            return Err(index_err(
                &p,
                format!("{} bytes, expected {}", mmap.len(), meta.n * meta.dim * meta.dtype.bytes()),
            ));
        }
        Ok(FlatIndex { data: Storage::Mapped(mmap), meta, chunk: CHUNK })
    }

    /// An in-memory index from a [n, dim] float tensor.
    pub fn from_tensor(vectors: &Tensor, dtype: VecDtype) -> FlatIndex {
        let (n, dim) = vectors.size2().unwrap();
        let v = vectors.to_device(Device::Cpu).to_kind(dtype.kind()).contiguous();
        let mut buf = vec![0u8; (n * dim) as usize * dtype.bytes()];
        v.copy_data_u8(&mut buf, (n * dim) as usize);
        let meta =
            FlatMeta { n: n as usize, dim: dim as usize, dtype, done: n as usize, source: serde_json::Value::Null };
        FlatIndex { data: Storage::Owned(buf), meta, chunk: CHUNK }
    }

    fn bytes(&self) -> &[u8] {
        match &self.data {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// Rows [start, start+len) as a float32 tensor (zero-copy for f32 storage).
    pub fn rows(&self, start: usize, len: usize) -> Tensor {
        let (d, b) = (self.meta.dim, self.meta.dtype.bytes());
        let bytes = &self.bytes()[start * d * b..(start + len) * d * b];
        // SAFETY: `bytes` outlives the tensor uses below (copied or consumed before return by
        // callers within &self's lifetime); the view is never written.
        let t = unsafe {
            Tensor::from_blob(
                bytes.as_ptr(),
                &[len as i64, d as i64],
                &[d as i64, 1],
                self.meta.dtype.kind(),
                Device::Cpu,
            )
        };
        t.to_kind(Kind::Float)
    }

    /// Vectors of the given rows [len, dim] (copied).
    pub fn gather(&self, ids: &[usize]) -> Tensor {
        let rows: Vec<Tensor> = ids.iter().map(|&i| self.rows(i, 1).copy()).collect();
        Tensor::cat(&rows, 0)
    }

    /// Exact top-k by inner product for queries [Q, dim]: (scores, row ids), best first.
    pub fn search(&self, queries: &Tensor, k: usize) -> TopK {
        let q = queries.to_device(Device::Cpu).to_kind(Kind::Float);
        let nq = q.size()[0];
        let k = k.min(self.meta.n);
        let mut best: Option<(Tensor, Tensor)> = None;
        tch::no_grad(|| {
            let mut start = 0;
            while start < self.meta.n {
                let len = self.chunk.min(self.meta.n - start);
                let scores = q.matmul(&self.rows(start, len).tr());
                let kk = k.min(len) as i64;
                let (v, i) = scores.topk(kk, 1, true, true);
                let i = i + start as i64;
                best = Some(match best.take() {
                    None => (v, i),
                    Some((bv, bi)) => {
                        let (v2, pos) = Tensor::cat(&[bv, v], 1).topk(k as i64, 1, true, true);
                        (v2, Tensor::cat(&[bi, i], 1).gather(1, &pos, false))
                    }
                });
                start += len;
            }
        });
        let (v, i) = best.unwrap_or_else(|| {
            (Tensor::zeros([nq, 0], (Kind::Float, Device::Cpu)), Tensor::zeros([nq, 0], (Kind::Int64, Device::Cpu)))
        });
        let k = v.size()[1] as usize;
        let vs: Vec<f32> = Vec::try_from(v.contiguous().view(-1)).unwrap();
        let is: Vec<i64> = Vec::try_from(i.contiguous().view(-1)).unwrap();
        (
            vs.chunks(k.max(1)).map(<[f32]>::to_vec).take(nq as usize).collect(),
            is.chunks(k.max(1)).map(|c| c.iter().map(|&x| x as usize).collect()).take(nq as usize).collect(),
        )
    }
}
