//! `knowrl bench retrieval`: BM25 vs bm25s, exact dense search vs faiss-cpu IndexFlatIP, corpus
//! encoding vs sentence-transformers; same data, same threads, one run.
//! Results: bench/results/retrieval.json.
use anyhow::{Context, Result};
use knowrl_engine::encoder::Encoder;
use knowrl_engine::LoadOptions;
use knowrl_retrieval::bm25::Bm25;
use knowrl_retrieval::corpus::{hotpotqa_ircot, Corpus};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tch::{Kind, Tensor};

#[derive(clap::Args)]
pub struct RetrievalArgs {
    /// HotpotQA-IRCoT sample (pooled into the BM25/encoding corpus).
    #[arg(long, default_value = "data/real/hotpotqa_ircot/dev_subsampled.jsonl")]
    pub hotpotqa: PathBuf,
    /// Encoder for the encoding benchmark (default: $KNOWRL_MODELS/all-minilm-l6-v2).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "bench/results/retrieval.json")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 2)]
    pub bench_threads: i32,
    /// Flat-search benchmark size: passages, dimension, queries, k.
    #[arg(long, default_value_t = 200_000)]
    pub flat_n: usize,
    #[arg(long, default_value_t = 384)]
    pub flat_dim: usize,
    #[arg(long, default_value_t = 1000)]
    pub flat_queries: usize,
    /// Passages encoded in the encoding benchmark.
    #[arg(long, default_value_t = 1024)]
    pub encode_n: usize,
    #[arg(long)]
    pub python: Option<PathBuf>,
}

fn peer(python: &Path, task: &str, dir: &Path, threads: i32) -> Result<Value> {
    let out = std::process::Command::new(python)
        .args(["bench/peers/retrieval_peer.py", "--task", task, "--threads", &threads.to_string()])
        .arg("--dir")
        .arg(dir)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .with_context(|| format!("starting peer {task}"))?;
    anyhow::ensure!(out.status.success(), "peer {task} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).with_context(|| format!("peer {task} printed {text}"))
}

pub fn run(a: RetrievalArgs) -> Result<()> {
    tch::set_num_threads(a.bench_threads);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(a.bench_threads as usize).build_global();
    let python = a
        .python
        .clone()
        .or_else(|| std::env::var_os("KNOWRL_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| ".venv/bin/python".into());
    let dir = std::env::temp_dir().join(format!("knowrl-bench-retrieval-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let model = a.model.clone().unwrap_or_else(|| knowrl_engine::adapter::models_dir().join("all-minilm-l6-v2"));
    let (passages, qs) = hotpotqa_ircot(&a.hotpotqa).with_context(|| format!("reading {}", a.hotpotqa.display()))?;
    let queries: Vec<String> = qs.iter().map(|q| q.question.clone()).collect();
    let jsonl: String = passages.iter().map(|p| serde_json::to_string(p).unwrap() + "\n").collect();
    std::fs::write(dir.join("corpus.jsonl"), &jsonl)?;
    std::fs::write(dir.join("queries.json"), serde_json::to_string(&queries)?)?;

    // BM25.
    eprintln!("bm25: {} passages, {} queries", passages.len(), queries.len());
    let corpus = Arc::new(Corpus::Memory(passages.clone()));
    let t0 = Instant::now();
    let bm25 = Bm25::build(&dir.join("bm25"), corpus.clone(), |_| {})?;
    let build_s = t0.elapsed().as_secs_f64();
    use rayon::prelude::*;
    let ranked = |bm: &Bm25| -> Result<Vec<Vec<usize>>> {
        queries.par_iter().map(|q| Ok(bm.ranked(q, 10)?.into_iter().map(|x| x.0).collect())).collect::<Result<_>>()
    };
    ranked(&bm25)?; // warm-up
    let t0 = Instant::now();
    let ours_top = ranked(&bm25)?;
    let qps = queries.len() as f64 / t0.elapsed().as_secs_f64();
    std::fs::write(dir.join("spec.json"), json!({"model": model}).to_string())?;
    let p = peer(&python, "bm25", &dir, a.bench_threads)?;
    let peer_top: Vec<Vec<usize>> = serde_json::from_value(p["top10"].clone())?;
    let overlap = ours_top
        .iter()
        .zip(&peer_top)
        .map(|(x, y)| x.iter().filter(|i| y.contains(i)).count() as f64 / 10.0)
        .sum::<f64>()
        / queries.len() as f64;
    let bm25_res = json!({"knowrl": {"build_s": build_s, "qps": qps}, "peer": {"build_s": p["build_s"], "qps": p["qps"], "peak_rss_mb": p["peak_rss_mb"]},
        "top10_overlap": overlap, "qps_speedup": qps / p["qps"].as_f64().unwrap(), "build_speedup": p["build_s"].as_f64().unwrap() / build_s});

    // Exact dense search.
    eprintln!("flat: {} x {}, {} queries", a.flat_n, a.flat_dim, a.flat_queries);
    tch::manual_seed(0);
    let x = Tensor::randn([a.flat_n as i64, a.flat_dim as i64], (Kind::Float, tch::Device::Cpu));
    let q = Tensor::randn([a.flat_queries as i64, a.flat_dim as i64], (Kind::Float, tch::Device::Cpu));
    let dump = |t: &Tensor, f: &str| -> Result<()> {
        let v: Vec<f32> = Vec::try_from(t.contiguous().view(-1))?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.join(f), bytes)?;
        Ok(())
    };
    dump(&x, "vectors.f32")?;
    dump(&q, "queries.f32")?;
    let repeats = 3;
    std::fs::write(
        dir.join("spec.json"),
        json!({"n": a.flat_n, "dim": a.flat_dim, "nq": a.flat_queries, "k": 10, "repeats": repeats, "model": model})
            .to_string(),
    )?;
    let flat = FlatIndex::from_tensor(&x, VecDtype::F32);
    flat.search(&q.narrow(0, 0, 8), 10);
    let mut times = vec![];
    let mut ids = vec![];
    for _ in 0..repeats {
        let t0 = Instant::now();
        ids = flat.search(&q, 10).1;
        times.push(t0.elapsed().as_secs_f64());
    }
    let flat_qps = a.flat_queries as f64 / crate::bench_env::median(times);
    let p = peer(&python, "flat", &dir, a.bench_threads)?;
    let peer_ids: Vec<Vec<usize>> = serde_json::from_value(p["ids"].clone())?;
    let identical = ids.iter().zip(&peer_ids).filter(|(x, y)| x == y).count() as f64 / ids.len() as f64;
    let flat_res = json!({"knowrl": {"qps": flat_qps}, "peer": {"qps": p["qps"], "peak_rss_mb": p["peak_rss_mb"]},
        "identical_topk_fraction": identical, "speedup": flat_qps / p["qps"].as_f64().unwrap(),
        "n": a.flat_n, "dim": a.flat_dim, "queries": a.flat_queries, "k": 10});
    drop(flat);

    // Corpus encoding.
    let n = a.encode_n.min(passages.len());
    eprintln!("encode: {n} passages with {}", model.display());
    let enc_texts: String = passages[..n].iter().map(|p| serde_json::to_string(p).unwrap() + "\n").collect();
    std::fs::write(dir.join("encode.jsonl"), enc_texts)?;
    std::fs::write(dir.join("spec.json"), json!({"model": model}).to_string())?;
    let enc = Encoder::load(&model, &LoadOptions::default())?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(passages[i].contents.len()));
    let texts: Vec<&str> = order.iter().map(|&i| passages[i].contents.as_str()).collect();
    let _ = enc.embed_passages(&texts[..64.min(n)])?;
    let t0 = Instant::now();
    for b in texts.chunks(64) {
        let _ = enc.embed_passages(b)?;
    }
    let pps = n as f64 / t0.elapsed().as_secs_f64();
    let p = peer(&python, "encode", &dir, a.bench_threads)?;
    let enc_res = json!({"knowrl": {"passages_per_s": pps, "peak_rss_mb": crate::rss::peak_rss_mb()}, "peer": p, "speedup": pps / p["passages_per_s"].as_f64().unwrap(), "passages": n, "batch": 64});

    let report = json!({
        "faiss_speedup": flat_res["speedup"], "bm25s_speedup": bm25_res["qps_speedup"], "encode_speedup": enc_res["speedup"],
        "bm25s_build_speedup": bm25_res["build_speedup"],
        "bm25": bm25_res, "flat": flat_res, "encode": enc_res, "threads": a.bench_threads,
        "peers": "bm25s 0.3.16 (+PyStemmer, k1=1.2 b=0.75 lucene), faiss-cpu 1.15.1 IndexFlatIP, sentence-transformers 6.2.0",
    });
    crate::bench_env::write_result(&a.out, &report)?;
    println!("| benchmark | knowrl | peer | ratio |\n|---|---|---|---|");
    println!(
        "| BM25 queries/s ({} passages) | {:.0} | {:.0} (bm25s) | {:.2}x |",
        passages.len(),
        qps,
        bm25_res["peer"]["qps"].as_f64().unwrap(),
        bm25_res["qps_speedup"].as_f64().unwrap()
    );
    println!(
        "| BM25 index build s | {:.2} | {:.2} (bm25s) | {:.2}x |",
        build_s,
        bm25_res["peer"]["build_s"].as_f64().unwrap(),
        bm25_res["build_speedup"].as_f64().unwrap()
    );
    println!(
        "| exact dense queries/s ({}x{}) | {:.0} | {:.0} (faiss IndexFlatIP) | {:.2}x |",
        a.flat_n,
        a.flat_dim,
        flat_qps,
        flat_res["peer"]["qps"].as_f64().unwrap(),
        flat_res["speedup"].as_f64().unwrap()
    );
    println!(
        "| encoding passages/s (MiniLM) | {:.1} | {:.1} (sentence-transformers) | {:.2}x |",
        pps,
        enc_res["peer"]["passages_per_s"].as_f64().unwrap(),
        enc_res["speedup"].as_f64().unwrap()
    );
    println!("BM25 top-10 overlap with bm25s: {overlap:.3}; identical faiss top-10: {identical:.3}");
    println!("wrote {}", a.out.display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
