//! `knowrl index build`, `knowrl search`, `knowrl serve retriever`, `knowrl corpus`.
use anyhow::{Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use knowrl_retrieval::flat::VecDtype;
use knowrl_retrieval::format::{information_block, PassageStyle};
use knowrl_retrieval::index::{self, BuildOptions, DenseSpec, Method};
use knowrl_retrieval::server::{serve, ServerConfig};
use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(clap::Subcommand)]
pub enum IndexCmd {
    /// Build (or resume) an index directory: BM25 and/or dense vectors (+ HNSW) over a corpus.
    Build(BuildArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Corpus jsonl (Search-R1 / FlashRAG: {"id", "contents": "\"Title\"\ntext"}).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Output index directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Skip BM25.
    #[arg(long)]
    pub no_bm25: bool,
    /// Encoder model directory for dense vectors (MiniLM, E5, BGE, the world's encoder).
    #[arg(long)]
    pub dense: Option<PathBuf>,
    /// Storage of dense vectors.
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub dtype: String,
    /// Also build an HNSW graph (usearch) for approximate search.
    #[arg(long)]
    pub hnsw: bool,
    /// Prefixes for E5-style encoders, e.g. --query-prefix 'query: ' --passage-prefix 'passage: '.
    #[arg(long, default_value = "")]
    pub query_prefix: String,
    #[arg(long, default_value = "")]
    pub passage_prefix: String,
    /// Passages per encoder batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Skip (and count) malformed corpus lines instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
}

#[derive(clap::Args)]
pub struct SearchArgs {
    /// Index directory from `knowrl index build`.
    #[arg(long)]
    pub index: PathBuf,
    /// bm25, dense or hybrid (default: hybrid when both were built).
    #[arg(long)]
    pub method: Option<Method>,
    #[arg(short, long, default_value_t = 3)]
    pub k: usize,
    /// Use the HNSW graph when one was built.
    #[arg(long)]
    pub hnsw: bool,
    /// Print the `<information>` block as an agent would see it.
    #[arg(long)]
    pub information: bool,
    /// Queries; without any, one query per line is read from standard input.
    pub queries: Vec<String>,
}

#[derive(clap::Subcommand)]
pub enum ServeCmd {
    /// A Search-R1-compatible retrieval server (POST /retrieve, GET /health).
    Retriever(ServeArgs),
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Index directory from `knowrl index build` (BM25, dense vectors, or both).
    #[arg(long)]
    pub index: PathBuf,
    /// bm25, dense or hybrid (default: hybrid when both were built, else the one there is).
    #[arg(long)]
    pub method: Option<Method>,
    /// Search the index's HNSW graph (approximate) instead of the exact flat vectors.
    #[arg(long)]
    pub hnsw: bool,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// topk when a request has none (Search-R1 uses 3).
    #[arg(long, default_value_t = 3)]
    pub topk: usize,
    /// Queries merged into one batched search.
    #[arg(long, default_value_t = 256)]
    pub max_batch: usize,
    /// Requests queued before the server answers 503.
    #[arg(long, default_value_t = 1024)]
    pub queue: usize,
}

#[derive(clap::Subcommand)]
pub enum CorpusCmd {
    /// Pool the HotpotQA-IRCoT sample's paragraphs into a corpus jsonl (+ questions with supporting ids).
    FromHotpotqa {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Where to write the questions (jsonl with supporting passage ids).
        #[arg(long)]
        questions: Option<PathBuf>,
    },
}

pub fn corpus(c: CorpusCmd) -> Result<()> {
    let CorpusCmd::FromHotpotqa { input, out, questions } = c;
    let (passages, qs) = knowrl_retrieval::corpus::hotpotqa_ircot(&input)?;
    let mut s = String::new();
    for p in &passages {
        s.push_str(&serde_json::to_string(p)?);
        s.push('\n');
    }
    knowrl_engine::fsutil::write_atomic(&out, s.as_bytes())?;
    if let Some(q) = questions {
        let text: String = qs.iter().map(|x| serde_json::to_string(x).unwrap() + "\n").collect();
        knowrl_engine::fsutil::write_atomic(&q, text.as_bytes())?;
    }
    println!("{} passages, {} questions -> {}", passages.len(), qs.len(), out.display());
    Ok(())
}

pub fn build(a: BuildArgs) -> Result<()> {
    let dense = a.dense.map(|encoder| DenseSpec {
        encoder: encoder.canonicalize().unwrap_or(encoder),
        dtype: if a.dtype == "f16" { VecDtype::F16 } else { VecDtype::F32 },
        query_prefix: a.query_prefix.clone(),
        passage_prefix: a.passage_prefix.clone(),
        hnsw: a.hnsw,
    });
    anyhow::ensure!(!a.no_bm25 || dense.is_some(), "nothing to build: give --dense MODEL or drop --no-bm25");
    let opts = BuildOptions { bm25: !a.no_bm25, dense, batch: a.batch, skip_bad: a.skip_bad };
    let multi = MultiProgress::new();
    let bars: Mutex<HashMap<String, ProgressBar>> = Mutex::new(HashMap::new());
    let style =
        ProgressStyle::with_template("{prefix:>12} {bar:30} {pos}/{len} [{elapsed} < {eta}] {per_sec}").unwrap();
    let progress = |stage: &str, done: usize, total: usize| {
        let mut b = bars.lock().unwrap();
        let bar = b.entry(stage.to_string()).or_insert_with(|| {
            let pb = multi.add(if total > 0 { ProgressBar::new(total as u64) } else { ProgressBar::new_spinner() });
            if total > 0 {
                pb.set_style(style.clone());
            }
            pb.set_prefix(stage.to_string());
            pb
        });
        bar.set_position(done as u64);
        if total > 0 && done >= total {
            bar.finish();
        }
    };
    let t0 = std::time::Instant::now();
    let spec =
        index::build(&a.corpus, &a.out, &opts, &progress).with_context(|| format!("building {}", a.out.display()))?;
    println!(
        "indexed {} passages from {} in {:.1}s: bm25={} dense={}",
        spec.passages,
        spec.corpus.display(),
        t0.elapsed().as_secs_f64(),
        spec.bm25,
        spec.dense.as_ref().map_or("no".to_string(), |d| format!(
            "{} ({:?}{})",
            d.encoder.display(),
            d.dtype,
            if d.hnsw { ", hnsw" } else { "" }
        ))
    );
    Ok(())
}

pub fn search(a: SearchArgs) -> Result<()> {
    let idx = index::open(&a.index)?;
    let r = idx.retriever(a.method, a.hnsw)?;
    let queries: Vec<String> = if a.queries.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|l| !l.trim().is_empty())
            .collect()
    } else {
        a.queries
    };
    for (q, hits) in queries.iter().zip(r.search(&queries, a.k)?) {
        if a.information {
            println!("{}", information_block(&hits, PassageStyle::SearchR1));
            continue;
        }
        println!("# {q}");
        for (i, h) in hits.iter().enumerate() {
            let first: String = h.contents.chars().take(160).collect::<String>().replace('\n', " | ");
            println!("{:>2}. [{:.4}] {} {}", i + 1, h.score, h.id, first);
        }
    }
    Ok(())
}

pub fn serve_cmd(c: ServeCmd) -> Result<()> {
    let ServeCmd::Retriever(a) = c;
    let idx = index::open(&a.index)?;
    let r = idx.retriever(a.method, a.hnsw)?;
    let cfg = ServerConfig { default_topk: a.topk, max_batch: a.max_batch, queue: a.queue, ..Default::default() };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        eprintln!("serving {} passages on http://{}/retrieve (ctrl-c to stop)", r.len(), listener.local_addr()?);
        serve(listener, r, cfg, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        Ok(())
    })
}
