//! Hybrid retrieval: reciprocal-rank fusion (Cormack et al. 2009) of BM25 and dense rankings,
//! score(d) = Σ_r 1 / (k_rrf + rank_r(d)), rank from 1. Rank-based, so no score calibration
//! between BM25 and cosine is needed.
use crate::{Hit, Result, Retriever};
use std::collections::HashMap;

pub struct Hybrid<A: Retriever, B: Retriever> {
    pub sparse: A,
    pub dense: B,
    pub k_rrf: f32,
    /// Candidates taken from each ranking before fusion.
    pub depth: usize,
}

impl<A: Retriever, B: Retriever> Hybrid<A, B> {
    pub fn new(sparse: A, dense: B) -> Self {
        Hybrid { sparse, dense, k_rrf: 60.0, depth: 100 }
    }
}

pub fn rrf(lists: &[Vec<Hit>], k_rrf: f32, k: usize) -> Vec<Hit> {
    let mut fused: HashMap<&str, (f32, &Hit)> = HashMap::new();
    for list in lists {
        for (rank, h) in list.iter().enumerate() {
            let e = fused.entry(h.id.as_str()).or_insert((0.0, h));
            e.0 += 1.0 / (k_rrf + rank as f32 + 1.0);
        }
    }
    let mut v: Vec<(f32, &Hit)> = fused.into_values().collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    v.into_iter().take(k).map(|(s, h)| Hit { score: s, ..h.clone() }).collect()
}

impl<A: Retriever, B: Retriever> Retriever for Hybrid<A, B> {
    fn search(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>> {
        let depth = self.depth.max(k);
        let s = self.sparse.search(queries, depth)?;
        let d = self.dense.search(queries, depth)?;
        Ok(s.into_iter().zip(d).map(|(a, b)| rrf(&[a, b], self.k_rrf, k)).collect())
    }
    fn len(&self) -> usize {
        self.sparse.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn h(id: &str) -> Hit {
        Hit { id: id.into(), contents: String::new(), score: 0.0 }
    }
    #[test]
    fn rrf_hand_computed() {
        // a: ranks 1 and 2 → 1/61 + 1/62; b: rank 2 → 1/62; c: rank 1 in the second → 1/61.
        let out = rrf(&[vec![h("a"), h("b")], vec![h("c"), h("a")]], 60.0, 3);
        assert_eq!(out.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(), ["a", "c", "b"]);
        assert!((out[0].score - (1.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-7);
        assert!((out[1].score - 1.0 / 61.0).abs() < 1e-7);
    }
}
