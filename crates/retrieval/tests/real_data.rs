//! Real-data check: all-MiniLM-L6-v2 (from PyPI, see `make models`) over the HotpotQA-IRCoT
//! sample's pooled paragraphs (4,858 passages, 500 questions, 2 supporting paragraphs each).
//! Recall@k of the supporting paragraphs for BM25, dense and hybrid, asserted to stay above the
//! values first measured (docs/retrieval.md) minus 0.02.
use knowrl_engine::encoder::Encoder;
use knowrl_engine::LoadOptions;
use knowrl_retrieval::bm25::Bm25;
use knowrl_retrieval::corpus::{hotpotqa_ircot, Corpus};
use knowrl_retrieval::dense::{build_flat, DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::VecDtype;
use knowrl_retrieval::hybrid::Hybrid;
use knowrl_retrieval::Retriever;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The HotpotQA-IRCoT sample the repository ships (data/real, provenance in its README).
fn ircot_sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/real/hotpotqa_ircot/dev_subsampled.jsonl")
}

fn minilm() -> PathBuf {
    let m = std::env::var_os("KNOWRL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/knowrl/models"))
        .join("all-minilm-l6-v2");
    assert!(m.join("config.json").exists(), "{} missing: run `make models`", m.display());
    m
}

fn recall(r: &dyn Retriever, questions: &[String], gold: &[Vec<String>], k: usize) -> f64 {
    let res = r.search(questions, k).unwrap();
    let mut found = 0usize;
    let mut total = 0usize;
    for (hits, g) in res.iter().zip(gold) {
        total += g.len();
        found += g.iter().filter(|id| hits.iter().any(|h| &h.id == *id)).count();
    }
    found as f64 / total as f64
}

#[test]
fn minilm_bm25_hybrid_recall_on_hotpotqa_ircot() {
    tch::set_num_threads(2);
    let (passages, qs) = hotpotqa_ircot(&ircot_sample()).unwrap();
    assert_eq!(passages.len(), 4858);
    assert_eq!(qs.len(), 500);
    let corpus = Arc::new(Corpus::Memory(passages));
    let dir = std::env::temp_dir().join(format!("knowrl-real-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let enc = Encoder::load(&minilm(), &LoadOptions::default()).unwrap();
    let t0 = std::time::Instant::now();
    let flat = build_flat(&enc, &corpus, &dir.join("dense"), VecDtype::F32, 64, |_, _| {}).unwrap();
    println!("encoded {} passages in {:.1}s", corpus.len(), t0.elapsed().as_secs_f64());
    let dense = DenseRetriever::new(enc, DenseIndex::Flat(flat), corpus.clone());
    let bm25 = Bm25::build(&dir.join("bm25"), corpus.clone(), |_| {}).unwrap();
    let questions: Vec<String> = qs.iter().map(|q| q.question.clone()).collect();
    let gold: Vec<Vec<String>> = qs.iter().map(|q| q.supporting.clone()).collect();
    let hybrid = Hybrid::new(bm25, dense);
    // First measured values (2026-11-29, this code): see docs/retrieval.md.
    let floor = |m: f64| m - 0.02;
    let expected = [
        ("bm25", &hybrid.sparse as &dyn Retriever, [0.608, 0.783, 0.927]),
        ("dense", &hybrid.dense as &dyn Retriever, [0.620, 0.794, 0.867]),
        ("hybrid", &hybrid as &dyn Retriever, [0.654, 0.836, 0.919]),
    ];
    for (name, r, first) in expected {
        let got: Vec<f64> = [2, 5, 10].iter().map(|&k| recall(r, &questions, &gold, k)).collect();
        println!("{name}: recall@2 {:.3} @5 {:.3} @10 {:.3}", got[0], got[1], got[2]);
        for (g, f) in got.iter().zip(first) {
            assert!(*g >= floor(f), "{name}: {g} < first measured {f} - 0.02");
        }
    }
    drop(hybrid); // the BM25 index holds files in `dir`
    let _ = std::fs::remove_dir_all(&dir);
}
