//! Exactness of flat search, HNSW recall, corpus errors, BM25 behaviour, and the
//! Search-R1-compatible server under a real HTTP client (protocol, 4xx, bounded load).
use knowrl_retrieval::bm25::Bm25;
use knowrl_retrieval::client::HttpRetriever;
use knowrl_retrieval::corpus::{read_corpus, Corpus, Passage};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use knowrl_retrieval::hnsw::{Hnsw, HnswParams};
use knowrl_retrieval::server::{serve, ServerConfig};
use knowrl_retrieval::{RetrievalError, Retriever};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;

/// A scratch directory, removed when dropped.
fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("knowrl-retr-{tag}-")).tempdir().unwrap()
}

/// Brute force with f64 dot products in plain Rust: independent of the tensor code path.
fn brute_force(v: &[f32], q: &[f32], dim: usize, k: usize) -> Vec<(usize, f64)> {
    let mut s: Vec<(usize, f64)> = v
        .chunks(dim)
        .enumerate()
        .map(|(i, row)| (i, row.iter().zip(q).map(|(a, b)| *a as f64 * *b as f64).sum()))
        .collect();
    s.sort_by(|a, b| b.1.total_cmp(&a.1));
    s.truncate(k);
    s
}

#[test]
fn flat_search_is_exact_against_brute_force() {
    tch::manual_seed(0);
    let (n, dim, k) = (3001usize, 48usize, 10usize);
    let vecs = Tensor::randn([n as i64, dim as i64], (Kind::Float, tch::Device::Cpu));
    // 40 queries: above the bf16-screening threshold, so both search paths are exercised.
    let nq = 40;
    let queries = Tensor::randn([nq, dim as i64], (Kind::Float, tch::Device::Cpu));
    for (dtype, screen) in
        [(VecDtype::F32, true), (VecDtype::F32, false), (VecDtype::F16, true), (VecDtype::F16, false)]
    {
        // Round through the storage dtype first so both sides see the same stored vectors.
        let stored =
            if dtype == VecDtype::F16 { vecs.to_kind(Kind::Half).to_kind(Kind::Float) } else { vecs.shallow_clone() };
        let mut idx = FlatIndex::from_tensor(&stored, dtype);
        idx.chunk = 700; // several chunks: exercises the per-chunk top-k and the merge
        idx.screen = screen;
        let (scores, ids) = idx.search(&queries, k);
        let v: Vec<f32> = Vec::try_from(stored.view(-1)).unwrap();
        for qi in 0..nq as usize {
            let q: Vec<f32> = Vec::try_from(queries.get(qi as i64)).unwrap();
            let bf = brute_force(&v, &q, dim, k);
            assert_eq!(ids[qi], bf.iter().map(|x| x.0).collect::<Vec<_>>(), "{dtype:?} screen={screen} query {qi}");
            for (s, b) in scores[qi].iter().zip(&bf) {
                assert!((*s as f64 - b.1).abs() < 1e-4, "{dtype:?}: {s} vs {}", b.1);
            }
        }
    }
    // On-disk round trip through the writer gives the same results.
    let dir = tmp("flat");
    let mut w = knowrl_retrieval::flat::FlatWriter::create_or_resume(
        dir.path(),
        n,
        dim,
        VecDtype::F32,
        serde_json::Value::Null,
    )
    .unwrap();
    let rows: Vec<usize> = (0..n).rev().collect(); // out of order on purpose
    w.write_rows(&rows, &vecs.flip([0])).unwrap();
    let disk = w.finish().unwrap();
    assert_eq!(disk.search(&queries, k).1, FlatIndex::from_tensor(&vecs, VecDtype::F32).search(&queries, k).1);
}

#[test]
fn hnsw_recall_at_10_is_at_least_095() {
    tch::manual_seed(1);
    let (n, dim) = (8000i64, 32i64);
    let v = Tensor::randn([n, dim], (Kind::Float, tch::Device::Cpu));
    let v = &v / v.norm_scalaropt_dim(2.0, [1], true);
    let q = Tensor::randn([200, dim], (Kind::Float, tch::Device::Cpu));
    let q = &q / q.norm_scalaropt_dim(2.0, [1], true);
    let flat = FlatIndex::from_tensor(&v, VecDtype::F32);
    let h = Hnsw::build(&flat, HnswParams { f16: false, ..Default::default() }, |_| {}).unwrap();
    let (_, exact) = flat.search(&q, 10);
    let (_, approx) = h.search(&q, 10).unwrap();
    let hits: usize = exact.iter().zip(&approx).map(|(e, a)| a.iter().filter(|x| e.contains(x)).count()).sum();
    let recall = hits as f64 / (200.0 * 10.0);
    println!("hnsw recall@10 = {recall:.4}");
    assert!(recall >= 0.95, "recall@10 {recall}");
    // Save + mmap view answers the same.
    let dir = tmp("hnsw");
    let p = dir.path().join("h.usearch");
    h.save(&p).unwrap();
    let viewed = Hnsw::view(&p, dim as usize, HnswParams { f16: false, ..Default::default() }).unwrap();
    assert_eq!(viewed.search(&q, 10).unwrap().1, approx);
}

#[test]
fn broken_corpus_lines_report_file_and_line() {
    let d = tmp("corpus");
    let f = d.path().join("c.jsonl");
    std::fs::write(&f, "{\"id\": \"0\", \"contents\": \"\\\"A\\\"\\nx\"}\n\n{\"id\": \"1\", \"contents\": \"\\\"B\\\"\\ny\"}\n{\"id\": 2, broken\n{\"id\": \"3\"}\n").unwrap();
    match read_corpus(&f, false) {
        Err(e @ RetrievalError::BadLine { line: 4, .. }) => assert!(e.to_string().contains("c.jsonl:4")),
        other => panic!("expected a line-4 error, got {:?}", other.map(|x| x.1)),
    }
    let (ps, stats) = read_corpus(&f, true).unwrap();
    assert_eq!((ps.len(), stats.read, stats.skipped), (2, 2, 2));
    let (starts, st) = Corpus::scan_offsets(&f, true, |_| {}).unwrap();
    let c = Corpus::open_mapped(&f, starts).unwrap();
    assert_eq!((c.len(), st.skipped), (2, 2));
    assert_eq!(c.get(1).title(), "B");
    assert!(matches!(Corpus::scan_offsets(&f, false, |_| {}), Err(RetrievalError::BadLine { line: 4, .. })));
}

/// Corpus jsonl under seeded mutations: no input panics, every rejection names `file:line`.
#[test]
fn corpus_jsonl_never_panics_and_errors_name_the_file_and_line() {
    let d = tmp("fuzz-corpus");
    let valid = "{\"id\": \"0\", \"contents\": \"\\\"Paris\\\"\\nParis is the capital of France.\"}\n{\"id\": \"1\", \"contents\": \"\\\"B\\\"\\ny\"}\n";
    assert_eq!(
        read_corpus(
            &{
                let f = d.path().join("valid.jsonl");
                std::fs::write(&f, valid).unwrap();
                f
            },
            false
        )
        .unwrap()
        .0
        .len(),
        2
    );
    let f = d.path().join("mutant.jsonl");
    let (tried, rejected) = engine_common::fuzz(
        &engine_common::mutations(valid.as_bytes(), 3000, 6),
        |b| {
            std::fs::write(&f, b).unwrap();
            read_corpus(&f, false).map(|_| ())
        },
        |msg| msg.contains("mutant.jsonl"),
    );
    println!("corpus jsonl: {tried} inputs, {rejected} rejected");
    assert!(rejected > tried / 2);
}

fn toy_corpus() -> Arc<Corpus> {
    let mut v = vec![
        Passage::new("p0", "Paris", "Paris is the capital and largest city of France."),
        Passage::new("p1", "Berlin", "Berlin is the capital of Germany."),
        Passage::new("p2", "Mitochondrion", "Mitochondria are the powerhouse of the cell."),
        Passage::new("p3", "Ada Lovelace", "Ada Lovelace was born in London and wrote the first program."),
    ];
    for i in 0..200 {
        v.push(Passage::new(
            format!("f{i}"),
            &format!("Filler {i}"),
            &format!("Filler passage number {i} about nothing in particular."),
        ));
    }
    Arc::new(Corpus::Memory(v))
}

#[test]
fn bm25_ranks_the_matching_passage_first_and_tolerates_query_syntax() {
    let d = tmp("bm25");
    let b = Bm25::build(&d.path().join("bm25"), toy_corpus(), |_| {}).unwrap();
    let r = b
        .search(
            &["capital of France?".into(), "where was \"Ada\" born: (London)".into(), "cells' powerhouses".into()],
            3,
        )
        .unwrap();
    assert_eq!(r[0][0].id, "p0");
    assert_eq!(r[1][0].id, "p3");
    assert_eq!(r[2][0].id, "p2", "stemming: cells/powerhouses match cell/powerhouse");
    assert!(r[0][0].score > r[0][1].score);
    // Reopening checks the document count against the corpus.
    assert!(Bm25::open(&d.path().join("bm25"), toy_corpus()).is_ok());
    let smaller = Arc::new(Corpus::Memory(vec![Passage::new("x", "X", "x")]));
    assert!(matches!(Bm25::open(&d.path().join("bm25"), smaller), Err(RetrievalError::Index { .. })));
}

fn start_server(cfg: ServerConfig) -> (String, std::sync::mpsc::Sender<()>) {
    let d = tmp("server");
    let b: Arc<dyn Retriever> = Arc::new(Bm25::build(&d.path().join("bm25"), toy_corpus(), |_| {}).unwrap());
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(format!("http://{}", l.local_addr().unwrap())).unwrap();
            let stop = async move {
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            };
            serve(l, b, cfg, stop).await.unwrap();
        });
        drop(d); // the index directory lives as long as the server
    });
    (addr_rx.recv().unwrap(), stop_tx)
}

#[test]
fn server_speaks_search_r1_protocol_rejects_bad_requests_and_survives_load() {
    let (url, _stop) = start_server(ServerConfig::default());
    let http = reqwest::blocking::Client::new();
    let post = |body: &str| {
        let r = http
            .post(format!("{url}/retrieve"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().unwrap())
    };
    // Exactly Search-R1's shapes.
    let (s, body) = post(r#"{"queries": ["capital of France", "Ada born"], "topk": 2, "return_scores": true}"#);
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"].as_array().unwrap().len(), 2);
    assert_eq!(v["result"][0].as_array().unwrap().len(), 2);
    assert_eq!(v["result"][0][0]["document"]["id"], "p0");
    assert!(v["result"][0][0]["document"]["contents"].as_str().unwrap().starts_with("\"Paris\"\n"));
    assert!(v["result"][0][0]["score"].as_f64().unwrap() > 0.0);
    let (_, body) = post(r#"{"queries": ["capital of France"]}"#); // default topk 3, no scores
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"][0].as_array().unwrap().len(), 3);
    assert_eq!(v["result"][0][0]["id"], "p0");
    assert!(v["result"][0][0].get("score").is_none());

    // Mutated request bodies: never a 5xx, always a JSON answer, and the server stays up.
    let valid = br#"{"queries": ["capital of France", "Ada born"], "topk": 2, "return_scores": true}"#;
    let inputs = engine_common::mutations(valid, 400, 7);
    let mut codes = std::collections::BTreeMap::new();
    for b in &inputs {
        let r = http.post(format!("{url}/retrieve")).header("content-type", "application/json").body(b.clone()).send();
        let r = r.unwrap();
        let status = r.status().as_u16();
        assert!(status < 500, "{status} for {:?}", String::from_utf8_lossy(b));
        assert!(serde_json::from_str::<serde_json::Value>(&r.text().unwrap()).is_ok());
        *codes.entry(status).or_insert(0) += 1;
    }
    println!("server requests: {} inputs, status counts {codes:?}", inputs.len());
    assert_eq!(post(r#"{"queries": ["capital of France"]}"#).0, 200);

    // Bad requests: 4xx with a message, and the server keeps answering.
    for (body, want) in [
        ("{not json", 400),
        (r#"{"queries": []}"#, 400),
        (r#"{"queries": ["ok", "  "]}"#, 400),
        (r#"{"queries": ["x"], "topk": 0}"#, 400),
        (r#"{"queries": ["x"], "topk": 100000}"#, 400),
        (r#"{"queries": "not a list"}"#, 422),
        (r#"{"queries": ["x"], "top_k": 3}"#, 422),
    ] {
        let (s, text) = post(body);
        assert_eq!(s, want, "{body} -> {text}");
        assert!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["error"].is_string(), "{text}");
    }
    let r = http.post(format!("{url}/retrieve")).body(r#"{"queries":["x"]}"#).send().unwrap();
    assert_eq!(r.status().as_u16(), 415, "missing content type");
    assert_eq!(post(r#"{"queries": ["Berlin"], "topk": 1}"#).0, 200);

    // The client (same trait as in-process retrieval) round-trips.
    let client = HttpRetriever::connect(&url, Duration::from_secs(10)).unwrap();
    assert_eq!(client.len(), 204);
    let hits = client.search(&["capital of Germany".into()], 1).unwrap();
    assert_eq!(hits[0][0].id, "p1");
    match client.search(&["".into()], 1) {
        Err(RetrievalError::Http(m)) => assert!(m.contains("400") && m.contains("empty"), "{m}"),
        other => panic!("{other:?}"),
    }

    // Bounded load: 2,000 requests from 16 concurrent clients, zero errors.
    let t0 = Instant::now();
    let lat: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|client| {
                let url = url.clone();
                s.spawn(move || {
                    let c = HttpRetriever::connect(&url, Duration::from_secs(30)).unwrap();
                    (0..125)
                        .map(|i| {
                            let t = Instant::now();
                            let r = c.search(&[format!("filler passage {}", (client * 125 + i) % 200)], 3).unwrap();
                            assert_eq!(r[0].len(), 3);
                            t.elapsed().as_secs_f64() * 1e3
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut l = lat.clone();
    l.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (l[l.len() / 2], l[l.len() * 99 / 100]);
    println!("load: {} requests in {:.2}s, p50 {p50:.2} ms, p99 {p99:.2} ms", l.len(), t0.elapsed().as_secs_f64());
    assert_eq!(l.len(), 2000);
}

/// A deliberately slow retriever, so the server's queue fills up.
struct Slow;
impl Retriever for Slow {
    fn search(&self, queries: &[String], _k: usize) -> knowrl_retrieval::Result<Vec<Vec<knowrl_retrieval::Hit>>> {
        std::thread::sleep(Duration::from_millis(100));
        Ok(queries
            .iter()
            .map(|q| vec![knowrl_retrieval::Hit { id: q.clone(), contents: q.clone(), score: 1.0 }])
            .collect())
    }
    fn len(&self) -> usize {
        1
    }
}

#[test]
fn a_full_queue_answers_503_and_recovers() {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(format!("http://{}", l.local_addr().unwrap())).unwrap();
            let cfg = ServerConfig { queue: 1, max_batch: 1, ..Default::default() };
            serve(l, Arc::new(Slow), cfg, std::future::pending()).await.unwrap();
        });
    });
    let url: String = addr_rx.recv().unwrap();
    // 16 simultaneous requests against a queue of one and a 100 ms search: most must be turned
    // away with 503 at once, the rest answered, nothing else.
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let url = url.clone();
                s.spawn(move || {
                    let body = serde_json::json!({"queries": [format!("q{i}")], "topk": 1});
                    reqwest::blocking::Client::new()
                        .post(format!("{url}/retrieve"))
                        .json(&body)
                        .send()
                        .unwrap()
                        .status()
                        .as_u16()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(busy + ok, 16, "{statuses:?}");
    assert!(busy >= 1 && ok >= 1, "{statuses:?}");
    // The client retries 503 with back-off, and the server recovers.
    let c = HttpRetriever::connect(&url, Duration::from_secs(10)).unwrap();
    assert_eq!(c.search(&["again".into()], 1).unwrap()[0][0].id, "again");
}
