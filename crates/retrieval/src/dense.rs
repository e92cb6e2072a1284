//! Dense retrieval: a sentence encoder from an HF directory (through the engine) over a flat or
//! HNSW index of passage vectors. Passages are encoded once, without adapters; a query-side
//! LoRA adapter can be loaded or trained without touching the index (BRIDGE's design).
use crate::corpus::Corpus;
use crate::error::Result;
use crate::flat::{FlatIndex, FlatWriter, VecDtype};
use crate::hnsw::Hnsw;
use crate::{hits, Hit, Retriever};
use knowrl_engine::encoder::Encoder;
use knowrl_engine::Mode;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tch::{Kind, Tensor};

pub enum DenseIndex {
    Flat(FlatIndex),
    Hnsw { hnsw: Hnsw, flat: FlatIndex },
}

impl DenseIndex {
    /// The exact vectors (HNSW keeps the flat file for candidate gathering and rescoring).
    pub fn flat(&self) -> &FlatIndex {
        match self {
            DenseIndex::Flat(f) => f,
            DenseIndex::Hnsw { flat, .. } => flat,
        }
    }

    pub fn search(&self, q: &Tensor, k: usize) -> Result<crate::flat::TopK> {
        match self {
            DenseIndex::Flat(f) => Ok(f.search(q, k)),
            DenseIndex::Hnsw { hnsw, .. } => hnsw.search(q, k),
        }
    }
}

pub struct DenseRetriever {
    /// Behind a mutex: libtorch modules are not Sync in tch, and query encoding is short.
    pub encoder: Mutex<Encoder>,
    pub index: DenseIndex,
    pub corpus: Arc<Corpus>,
}

// SAFETY: the encoder (tch tensors, not Sync) is only touched under the mutex; the index is
// read-only after construction.
unsafe impl Sync for DenseRetriever {}
unsafe impl Send for DenseRetriever {}

/// Candidates for one batch of queries, for retriever training (BRIDGE's ρ_η(d|h)).
pub struct Candidates {
    /// Row ids per query, best first (retrieved without gradients).
    pub ids: Vec<Vec<usize>>,
    /// Differentiable query embeddings [Q, D] (adapters on, train mode).
    pub query_emb: Tensor,
    /// Fixed passage vectors [Q, k, D].
    pub passages: Tensor,
    /// s(h, d) = ⟨q, p_d⟩ [Q, k], differentiable w.r.t. the query adapter only.
    pub scores: Tensor,
}

/// Encodes the corpus into a flat index at `dir` (resumable: rows already written are kept).
/// Passages are processed longest first in batches, which keeps padding small.
pub fn build_flat(
    encoder: &Encoder,
    corpus: &Corpus,
    dir: &Path,
    dtype: VecDtype,
    batch: usize,
    progress: impl Fn(usize, usize),
) -> Result<FlatIndex> {
    let dim = {
        let first = if corpus.is_empty() { String::new() } else { corpus.get(0).contents };
        let probe = encoder.embed_passages(&[first.as_str()])?;
        probe.size()[1] as usize
    };
    let source =
        serde_json::json!({"passage_prefix": encoder.passage_prefix, "max_len": encoder.max_len, "n": corpus.len()});
    let mut w = FlatWriter::create_or_resume(dir, corpus.len(), dim, dtype, source)?;
    let mut order: Vec<usize> = (0..corpus.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(corpus.approx_len(i)), i));
    let mut done = w.meta.done;
    progress(done, corpus.len());
    for rows in order[done..].chunks(batch.max(1)) {
        let texts: Vec<String> = rows.iter().map(|&i| corpus.get(i).contents).collect();
        let v = encoder.embed_passages(&texts.iter().map(String::as_str).collect::<Vec<_>>())?;
        w.write_rows(rows, &v)?;
        done += rows.len();
        progress(done, corpus.len());
    }
    w.finish()
}

impl DenseRetriever {
    pub fn new(encoder: Encoder, index: DenseIndex, corpus: Arc<Corpus>) -> DenseRetriever {
        DenseRetriever { encoder: Mutex::new(encoder), index, corpus }
    }

    pub fn embed_queries(&self, queries: &[String]) -> Result<Tensor> {
        let enc = self.encoder.lock().unwrap();
        let q: Vec<&str> = queries.iter().map(String::as_str).collect();
        Ok(tch::no_grad(|| enc.embed_queries(&q, Mode::EVAL))?)
    }

    /// Top-k candidates with differentiable scores (train mode: LoRA dropout active).
    pub fn candidates(&self, queries: &[String], k: usize) -> Result<Candidates> {
        let (_, ids) = self.index.search(&self.embed_queries(queries)?, k)?;
        let enc = self.encoder.lock().unwrap();
        let q: Vec<&str> = queries.iter().map(String::as_str).collect();
        let query_emb = enc.embed_queries(&q, Mode::TRAIN)?;
        let flat = self.index.flat();
        // The index lives in host memory; its rows follow the encoder to its device.
        let passages =
            Tensor::stack(&ids.iter().map(|row| flat.gather(row)).collect::<Vec<_>>(), 0).to_device(query_emb.device());
        let scores = (query_emb.unsqueeze(1) * &passages).sum_dim_intlist(-1, false, Kind::Float);
        Ok(Candidates { ids, query_emb, passages, scores })
    }
}

impl DenseRetriever {
    /// Scores s(h, d) [Q, k] of fixed candidate rows (logged at rollout time) under the current
    /// query adapter; differentiable w.r.t. the adapter in `Mode::TRAIN`.
    pub fn scores_of(&self, queries: &[String], ids: &[Vec<usize>], mode: Mode) -> Result<Tensor> {
        let enc = self.encoder.lock().unwrap();
        let q: Vec<&str> = queries.iter().map(String::as_str).collect();
        let query_emb = enc.embed_queries(&q, mode)?;
        let flat = self.index.flat();
        let passages =
            Tensor::stack(&ids.iter().map(|row| flat.gather(row)).collect::<Vec<_>>(), 0).to_device(query_emb.device());
        Ok((query_emb.unsqueeze(1) * passages).sum_dim_intlist(-1, false, Kind::Float))
    }

    /// Top-k row ids per query under the current adapter (no gradients).
    pub fn top_rows(&self, queries: &[String], k: usize) -> Result<Vec<Vec<usize>>> {
        Ok(self.index.search(&self.embed_queries(queries)?, k)?.1)
    }
}

impl Retriever for DenseRetriever {
    fn search(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>> {
        if queries.is_empty() {
            return Ok(vec![]);
        }
        let (scores, ids) = self.index.search(&self.embed_queries(queries)?, k)?;
        Ok(scores
            .iter()
            .zip(&ids)
            .map(|(s, i)| hits(&self.corpus, &i.iter().copied().zip(s.iter().copied()).collect::<Vec<_>>()))
            .collect())
    }
    fn len(&self) -> usize {
        self.corpus.len()
    }
}
