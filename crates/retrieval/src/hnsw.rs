//! Approximate search with usearch's HNSW (C++ through cxx): f16/f32/i8 storage, save and
//! memory-mapped `view`, concurrent inserts. Chosen over pure-Rust HNSW crates for quantised
//! storage and mmap serving, which is what a 21M-passage index needs (docs/retrieval-scale.md).
use crate::error::{index_err, Result};
use crate::flat::FlatIndex;
use std::path::Path;
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

pub struct Hnsw {
    index: Index,
    pub dim: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct HnswParams {
    pub connectivity: usize,
    pub expansion_add: usize,
    pub expansion_search: usize,
    pub f16: bool,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams { connectivity: 16, expansion_add: 128, expansion_search: 96, f16: true }
    }
}

fn options(dim: usize, p: HnswParams) -> IndexOptions {
    IndexOptions {
        dimensions: dim,
        metric: MetricKind::IP,
        quantization: if p.f16 { ScalarKind::F16 } else { ScalarKind::F32 },
        connectivity: p.connectivity,
        expansion_add: p.expansion_add,
        expansion_search: p.expansion_search,
        multi: false,
    }
}

impl Hnsw {
    /// Builds from the flat index's vectors (keys = row ids), inserting from all cores.
    pub fn build(flat: &FlatIndex, p: HnswParams, progress: impl Fn(usize) + Sync) -> Result<Hnsw> {
        use rayon::prelude::*;
        let dim = flat.meta.dim;
        let index = Index::new(&options(dim, p)).map_err(|e| index_err("hnsw", e))?;
        index
            .reserve_capacity_and_threads(flat.meta.n, rayon::current_num_threads())
            .map_err(|e| index_err("hnsw", e))?;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let block = 4096;
        (0..flat.meta.n.div_ceil(block)).into_par_iter().try_for_each(|b| {
            let start = b * block;
            let len = block.min(flat.meta.n - start);
            let rows: Vec<f32> = Vec::try_from(flat.rows(start, len).contiguous().view(-1)).unwrap();
            for (j, v) in rows.chunks(dim).enumerate() {
                index.add((start + j) as u64, v).map_err(|e| index_err("hnsw", e))?;
            }
            progress(done.fetch_add(len, std::sync::atomic::Ordering::Relaxed) + len);
            Ok::<_, crate::RetrievalError>(())
        })?;
        Ok(Hnsw { index, dim })
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        self.index.save(&path.to_string_lossy()).map_err(|e| index_err(path, e))
    }

    /// Opens a saved index memory-mapped (`view`): no load time, pages on demand.
    pub fn view(path: &Path, dim: usize, p: HnswParams) -> Result<Hnsw> {
        let index = Index::new(&options(dim, p)).map_err(|e| index_err(path, e))?;
        index.view(&path.to_string_lossy()).map_err(|e| index_err(path, e))?;
        Ok(Hnsw { index, dim })
    }

    /// Top-k (scores, row ids) per query [Q, dim]; score = inner product.
    pub fn search(&self, queries: &tch::Tensor, k: usize) -> Result<crate::flat::TopK> {
        use rayon::prelude::*;
        let q: Vec<f32> = Vec::try_from(queries.to_kind(tch::Kind::Float).contiguous().view(-1)).unwrap();
        let res: Vec<(Vec<f32>, Vec<usize>)> = q
            .par_chunks(self.dim)
            .map(|v| {
                let m = self.index.search(v, k).map_err(|e| index_err("hnsw", e))?;
                // usearch's IP "distance" is 1 - dot.
                Ok((m.distances.iter().map(|d| 1.0 - d).collect(), m.keys.iter().map(|&x| x as usize).collect()))
            })
            .collect::<Result<_>>()?;
        Ok(res.into_iter().unzip())
    }

    pub fn len(&self) -> usize {
        self.index.size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
