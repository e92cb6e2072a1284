//! The BRIDGE-facing API: candidate scores s(h, d) = ⟨q_η(h), p_d⟩ are differentiable w.r.t.
//! the query-side LoRA only; passage vectors and the base encoder never change; the adapter
//! saves and reloads without re-encoding the corpus.
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, LoraConfig};
use knowrl_retrieval::corpus::{hotpotqa_ircot, Corpus};
use knowrl_retrieval::dense::{build_flat, DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::VecDtype;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tch::Kind;

fn minilm() -> PathBuf {
    std::env::var_os("KNOWRL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/knowrl/models"))
        .join("all-minilm-l6-v2")
}

#[test]
fn query_lora_trains_through_candidate_scores_only() {
    tch::manual_seed(0);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/real/hotpotqa_ircot/dev_subsampled.jsonl");
    let (mut passages, qs) = hotpotqa_ircot(&data).unwrap();
    passages.truncate(60);
    let corpus = Arc::new(Corpus::Memory(passages));
    let dir = tempfile::Builder::new().prefix("knowrl-qlora-").tempdir().unwrap();
    let lora = LoraConfig { rank: 8, alpha: 8.0, dropout: 0.0, target_modules: vec!["query".into(), "value".into()] };
    let enc = Encoder::load(&minilm(), &LoadOptions { lora: Some(lora.clone()), ..Default::default() }).unwrap();
    let flat = build_flat(&enc, &corpus, &dir.path().join("dense"), VecDtype::F32, 32, |_, _| {}).unwrap();
    let index_before = flat.rows(0, corpus.len()).copy();
    let r = DenseRetriever::new(enc, DenseIndex::Flat(flat), corpus.clone());
    let queries: Vec<String> = qs[..4].iter().map(|q| q.question.clone()).collect();

    let c = r.candidates(&queries, 10).unwrap();
    assert_eq!(c.scores.size(), [4, 10]);
    // Scores equal the index's own (exact) search scores before any update.
    let plain = knowrl_retrieval::Retriever::search(&r, &queries, 10).unwrap();
    for (qi, hits) in plain.iter().enumerate() {
        for (j, h) in hits.iter().enumerate() {
            assert!((c.scores.double_value(&[qi as i64, j as i64]) as f32 - h.score).abs() < 1e-4);
        }
    }
    // ρ_η(d|h) = softmax(s/τ); push probability onto the 5th candidate of each query.
    let rho = (&c.scores / 0.4).log_softmax(-1, Kind::Float);
    let loss = -rho.select(1, 4).mean(Kind::Float);
    loss.backward();
    let enc = r.encoder.lock().unwrap();
    let mut lora_grads = 0;
    for (n, t) in enc.vs.variables() {
        let g = t.grad();
        if n.contains("lora_") {
            if n.contains("lora_B") {
                assert!(g.defined() && g.abs().sum(Kind::Float).double_value(&[]) > 0.0, "{n} has no gradient");
            }
            lora_grads += 1;
        } else {
            assert!(!g.defined(), "base parameter {n} received a gradient");
        }
    }
    assert_eq!(lora_grads, 6 * 2 * 2);
    // One plain SGD step on the adapter raises the target's probability.
    tch::no_grad(|| {
        for (_, mut p) in enc.adapter_parameters() {
            let g = p.grad();
            if g.defined() {
                let _ = p.g_add_(&(g * -50.0));
            }
        }
    });
    // Re-score the same candidate set with the updated query tower.
    let q: Vec<&str> = queries.iter().map(String::as_str).collect();
    let q2 = tch::no_grad(|| enc.embed_queries(&q, knowrl_engine::Mode::EVAL).unwrap());
    drop(enc);
    let s2 = (q2.unsqueeze(1) * &c.passages).sum_dim_intlist(-1, false, Kind::Float);
    let before_p = rho.select(1, 4).exp().mean(Kind::Float).double_value(&[]);
    let after_p = (&s2 / 0.4).softmax(-1, Kind::Float).select(1, 4).mean(Kind::Float).double_value(&[]);
    println!("mean rho of the target candidate: {before_p:.4} -> {after_p:.4}");
    assert!(after_p > before_p + 1e-3, "{after_p} <= {before_p}");
    // The passage index is untouched.
    let flat = r.index.flat();
    assert!(flat.rows(0, corpus.len()).equal(&index_before));
    // Adapter round trip: a fresh encoder with the saved adapter embeds queries identically.
    let path = dir.path().join("adapter.safetensors");
    r.encoder.lock().unwrap().save_adapter(&path).unwrap();
    let fresh = Encoder::load(&minilm(), &LoadOptions { lora: Some(lora), ..Default::default() }).unwrap();
    fresh.load_adapter(&path).unwrap();
    let q: Vec<&str> = queries.iter().map(String::as_str).collect();
    let a = tch::no_grad(|| r.encoder.lock().unwrap().embed_queries(&q, knowrl_engine::Mode::EVAL).unwrap());
    let b = tch::no_grad(|| fresh.embed_queries(&q, knowrl_engine::Mode::EVAL).unwrap());
    assert!((a - b).abs().max().double_value(&[]) < 1e-6);
}
