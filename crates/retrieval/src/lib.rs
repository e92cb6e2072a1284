//! Retrieval for knowrl: the search tool every agent rollout calls and the retriever BRIDGE
//! trains. One trait, [`Retriever`], serves in-process indexes (BM25, dense flat, HNSW, hybrid)
//! and the HTTP client of a Search-R1-compatible server alike.
pub mod bm25;
pub mod client;
pub mod corpus;
pub mod dense;
pub mod error;
pub mod flat;
pub mod format;
pub mod hnsw;
pub mod hybrid;
pub mod index;
pub mod server;

pub use corpus::{Corpus, Passage};
pub use error::{Result, RetrievalError};

/// One retrieved passage: what Search-R1's server returns per result.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hit {
    pub id: String,
    pub contents: String,
    pub score: f32,
}

/// The search tool. `search` is batched: rollouts send every active trajectory's query of a
/// turn in one call. Results are best first.
pub trait Retriever: Send + Sync {
    fn search(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>>;
    /// Number of passages searchable (an upper bound for `k`).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Top-k (index, score) pairs → hits, using the corpus for ids and contents.
pub(crate) fn hits(corpus: &corpus::Corpus, ranked: &[(usize, f32)]) -> Vec<Hit> {
    ranked
        .iter()
        .map(|&(i, s)| {
            let p = corpus.get(i);
            Hit { id: p.id, contents: p.contents, score: s }
        })
        .collect()
}
