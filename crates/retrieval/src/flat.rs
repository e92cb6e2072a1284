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
    /// Largest row norm (bounds the bf16 screening error; unknown = no screening).
    #[serde(default)]
    pub max_norm: Option<f32>,
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
    /// Use the certified bf16 screen for large query batches (results are identical).
    pub screen: bool,
}

const CHUNK: usize = 4096;

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
        let w = FlatWriter {
            dir: dir.to_path_buf(),
            file,
            meta: FlatMeta { n, dim, dtype, done: 0, source, max_norm: Some(0.0) },
        };
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
        let norm = v.to_kind(Kind::Float).norm_scalaropt_dim(2.0, [1], false).max().double_value(&[]) as f32;
        self.meta.max_norm = self.meta.max_norm.map(|m| m.max(norm));
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
        Ok(FlatIndex { data: Storage::Mapped(mmap), meta, chunk: CHUNK, screen: true })
    }

    /// An in-memory index from a [n, dim] float tensor.
    pub fn from_tensor(vectors: &Tensor, dtype: VecDtype) -> FlatIndex {
        let (n, dim) = vectors.size2().unwrap();
        let v = vectors.to_device(Device::Cpu).to_kind(dtype.kind()).contiguous();
        let mut buf = vec![0u8; (n * dim) as usize * dtype.bytes()];
        v.copy_data_u8(&mut buf, (n * dim) as usize);
        let max_norm = v.to_kind(Kind::Float).norm_scalaropt_dim(2.0, [1], false).max().double_value(&[]) as f32;
        let meta = FlatMeta {
            n: n as usize,
            dim: dim as usize,
            dtype,
            done: n as usize,
            source: serde_json::Value::Null,
            max_norm: Some(max_norm),
        };
        FlatIndex { data: Storage::Owned(buf), meta, chunk: CHUNK, screen: true }
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

    /// The stored matrix [n, dim] in its storage dtype (zero-copy view).
    fn raw(&self) -> Tensor {
        let (n, d) = (self.meta.n as i64, self.meta.dim as i64);
        // SAFETY: a read-only view of memory owned by `self`, used only within `&self` calls.
        unsafe { Tensor::from_blob(self.bytes().as_ptr(), &[n, d], &[d, 1], self.meta.dtype.kind(), Device::Cpu) }
    }

    /// Exact top-k by inner product for queries [Q, dim]: (scores, row ids), best first.
    ///
    /// Large query batches are screened with a bf16 matrix product (2–3x the f32 rate on CPUs
    /// with bf16 dot products, and the tensor-core path on GPUs) and the survivors rescored in
    /// f32. The screen is certified, so the result is still exact: a bf16 score is within
    /// δ = ‖q‖·max‖x‖·2⁻⁶ of the f32 one (2u = 2⁻⁷ for bf16 rounding of both operands, f32
    /// accumulation, and a 2x margin), so every true top-k row scores at least t − 2δ in bf16,
    /// t being the k-th best bf16 score. Rows above that threshold are rescored exactly; a query
    /// for which some chunk may hold more such rows than were kept falls back to the f32 scan.
    pub fn search(&self, queries: &Tensor, k: usize) -> TopK {
        let q = queries.to_device(Device::Cpu).to_kind(Kind::Float);
        let nq = q.size()[0];
        let k = k.min(self.meta.n);
        if nq == 0 || k == 0 {
            return (vec![vec![]; nq as usize], vec![vec![]; nq as usize]);
        }
        let (v, i) = tch::no_grad(|| match self.meta.max_norm {
            Some(max_norm) if nq >= SCREEN_MIN_QUERIES && self.screen => self.search_screened(&q, k, max_norm),
            _ => self.search_f32(&q, k),
        });
        let vs: Vec<f32> = Vec::try_from(v.contiguous().view(-1)).unwrap();
        let is: Vec<i64> = Vec::try_from(i.contiguous().view(-1)).unwrap();
        (
            vs.chunks(k).map(<[f32]>::to_vec).collect(),
            is.chunks(k).map(|c| c.iter().map(|&x| x as usize).collect()).collect(),
        )
    }

    /// Per chunk: `score` the chunk, keep its top `keep`; returns (values, row ids, the chunk's
    /// last kept value or -inf when the whole chunk was kept [Q, chunks]).
    fn chunked_topk(&self, keep: usize, score: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor, Tensor) {
        let (mut vs, mut is, mut lasts) = (vec![], vec![], vec![]);
        let mut start = 0;
        while start < self.meta.n {
            let len = self.chunk.min(self.meta.n - start);
            let s = score(&self.rows(start, len));
            let kk = keep.min(len) as i64;
            let (v, i) = s.topk(kk, 1, true, true);
            lasts.push(if len > keep { v.select(1, kk - 1) } else { v.select(1, 0).full_like(f64::NEG_INFINITY) });
            vs.push(v);
            is.push(i + start as i64);
            start += len;
        }
        (Tensor::cat(&vs, 1), Tensor::cat(&is, 1), Tensor::stack(&lasts, 1))
    }

    fn search_f32(&self, q: &Tensor, k: usize) -> (Tensor, Tensor) {
        let (v, i, _) = self.chunked_topk(k, |x| q.matmul(&x.tr()));
        let (v, pos) = v.topk(k as i64, 1, true, true);
        (v, i.gather(1, &pos, false))
    }

    fn search_screened(&self, q: &Tensor, k: usize, max_norm: f32) -> (Tensor, Tensor) {
        let qb = q.to_kind(Kind::BFloat16);
        let keep = (2 * k).max(k + 8);
        let (v, i, last) = self.chunked_topk(keep, |x| qb.matmul(&x.to_kind(Kind::BFloat16).tr()).to_kind(Kind::Float));
        let t = v.topk(k as i64, 1, true, true).0.select(1, k as i64 - 1);
        let delta = q.norm_scalaropt_dim(2.0, [1], false) * (max_norm as f64 * SCREEN_EPS);
        let thr = (t - delta * 2.0).unsqueeze(1);
        let certified: Vec<bool> = Vec::try_from(last.lt_tensor(&thr).all_dim(1, false)).unwrap();
        let cand = v.ge_tensor(&thr);
        let raw = self.raw();
        let (mut out_v, mut out_i) = (vec![], vec![]);
        for (r, ok) in certified.iter().enumerate() {
            let r = r as i64;
            let qr = q.get(r);
            let (vr, ir) = if *ok {
                let ids = i.get(r).masked_select(&cand.get(r));
                let exact = raw.index_select(0, &ids).to_kind(Kind::Float).mv(&qr);
                let (ev, pos) = exact.topk(k as i64, 0, true, true);
                (ev, ids.gather(0, &pos, false))
            } else {
                let (ev, ei) = self.search_f32(&qr.unsqueeze(0), k);
                (ev.squeeze_dim(0), ei.squeeze_dim(0))
            };
            out_v.push(vr);
            out_i.push(ir);
        }
        (Tensor::stack(&out_v, 0), Tensor::stack(&out_i, 0))
    }
}

/// bf16 screening pays off once the product is compute-bound.
const SCREEN_MIN_QUERIES: i64 = 32;
/// 2⁻⁶: twice the bf16 dot-product error bound (see `FlatIndex::search`).
const SCREEN_EPS: f64 = 1.0 / 64.0;
