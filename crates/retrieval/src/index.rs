//! An index directory: everything `knowrl search` and `knowrl serve retriever` need, built by
//! `knowrl index build`.
//!
//! ```text
//! INDEX/index.json      what was built, from which corpus (path + size) and encoder
//! INDEX/corpus.offsets  byte offset of each passage line (u64 LE): the corpus stays on disk
//! INDEX/bm25/           tantivy index
//! INDEX/dense/          flat vectors (flat.json, vectors.bin), resumable
//! INDEX/hnsw.usearch    optional HNSW graph over the dense vectors
//! ```
use crate::bm25::Bm25;
use crate::corpus::Corpus;
use crate::dense::{build_flat, DenseIndex, DenseRetriever};
use crate::error::{index_err, io, Result, RetrievalError};
use crate::flat::{FlatIndex, VecDtype};
use crate::hnsw::{Hnsw, HnswParams};
use crate::hybrid::Hybrid;
use crate::Retriever;
use knowrl_engine::encoder::Encoder;
use knowrl_engine::LoadOptions;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DenseSpec {
    pub encoder: PathBuf,
    pub dtype: VecDtype,
    #[serde(default)]
    pub query_prefix: String,
    #[serde(default)]
    pub passage_prefix: String,
    #[serde(default)]
    pub hnsw: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IndexSpec {
    pub corpus: PathBuf,
    pub corpus_bytes: u64,
    pub passages: usize,
    pub bm25: bool,
    pub dense: Option<DenseSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Bm25,
    Dense,
    Hybrid,
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "bm25" => Ok(Method::Bm25),
            "dense" => Ok(Method::Dense),
            "hybrid" => Ok(Method::Hybrid),
            _ => Err(format!("unknown retrieval method `{s}` (bm25, dense, hybrid)")),
        }
    }
}

/// Progress callbacks: (stage, done, total).
pub type Progress<'a> = &'a (dyn Fn(&str, usize, usize) + Sync);

fn write_offsets(path: &Path, starts: &[u64]) -> Result<()> {
    let bytes: Vec<u8> = starts.iter().flat_map(|x| x.to_le_bytes()).collect();
    knowrl_engine::fsutil::write_atomic(path, &bytes)?;
    Ok(())
}

fn read_offsets(path: &Path) -> Result<Vec<u64>> {
    let b = std::fs::read(path).map_err(|e| io(path, e))?;
    Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub bm25: bool,
    pub dense: Option<DenseSpec>,
    pub batch: usize,
    pub skip_bad: bool,
}

/// Builds (or resumes building) an index directory for `corpus_path`.
pub fn build(corpus_path: &Path, out: &Path, opts: &BuildOptions, progress: Progress) -> Result<IndexSpec> {
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let corpus_path = corpus_path.canonicalize().map_err(|e| io(corpus_path, e))?;
    let (starts, stats) = Corpus::scan_offsets(&corpus_path, opts.skip_bad, |n| progress("scan corpus", n, 0))?;
    if stats.skipped > 0 {
        eprintln!("{}: skipped {} bad line(s), kept {}", corpus_path.display(), stats.skipped, stats.read);
    }
    if starts.is_empty() {
        return Err(RetrievalError::Invalid(format!("{}: no passages", corpus_path.display())));
    }
    let n = starts.len();
    write_offsets(&out.join("corpus.offsets"), &starts)?;
    let corpus = Arc::new(Corpus::open_mapped(&corpus_path, starts)?);
    let corpus_bytes = std::fs::metadata(&corpus_path).map_err(|e| io(&corpus_path, e))?.len();
    if opts.bm25 {
        Bm25::build(&out.join("bm25"), corpus.clone(), |d| progress("bm25", d, n))?;
    }
    if let Some(d) = &opts.dense {
        let encoder = load_encoder(d, &LoadOptions::default())?;
        let flat =
            build_flat(&encoder, &corpus, &out.join("dense"), d.dtype, opts.batch, |a, b| progress("encode", a, b))?;
        if d.hnsw {
            let h = Hnsw::build(&flat, HnswParams::default(), |a| progress("hnsw", a, n))?;
            h.save(&out.join("hnsw.usearch"))?;
        }
    }
    let spec = IndexSpec { corpus: corpus_path, corpus_bytes, passages: n, bm25: opts.bm25, dense: opts.dense.clone() };
    let text = serde_json::to_string_pretty(&spec).unwrap();
    knowrl_engine::fsutil::write_atomic(&out.join("index.json"), text.as_bytes())?;
    Ok(spec)
}

/// The encoder of an index, optionally with a query-side LoRA adapter (BRIDGE).
/// The index's query encoder, loaded as `opts` says (device, a query-side LoRA).
pub fn load_encoder(d: &DenseSpec, opts: &LoadOptions) -> Result<Encoder> {
    let enc = Encoder::load(&d.encoder, opts)?;
    Ok(enc.with_prefixes(&d.query_prefix, &d.passage_prefix))
}

pub struct OpenIndex {
    pub spec: IndexSpec,
    pub corpus: Arc<Corpus>,
    pub dir: PathBuf,
}

pub fn open(dir: &Path) -> Result<OpenIndex> {
    let p = dir.join("index.json");
    let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
    let spec: IndexSpec = serde_json::from_str(&text).map_err(|e| index_err(&p, e))?;
    let size = std::fs::metadata(&spec.corpus).map_err(|e| io(&spec.corpus, e))?.len();
    if size != spec.corpus_bytes {
        return Err(index_err(
            dir,
            format!(
                "corpus {} changed since indexing ({} bytes, was {}): rebuild",
                spec.corpus.display(),
                size,
                spec.corpus_bytes
            ),
        ));
    }
    let starts = read_offsets(&dir.join("corpus.offsets"))?;
    let corpus = Arc::new(Corpus::open_mapped(&spec.corpus, starts)?);
    Ok(OpenIndex { spec, corpus, dir: dir.to_path_buf() })
}

impl OpenIndex {
    pub fn bm25(&self) -> Result<Bm25> {
        if !self.spec.bm25 {
            return Err(index_err(&self.dir, "built without BM25 (--bm25)"));
        }
        Bm25::open(&self.dir.join("bm25"), self.corpus.clone())
    }

    pub fn dense(&self, use_hnsw: bool, opts: &LoadOptions) -> Result<DenseRetriever> {
        let d = self
            .spec
            .dense
            .as_ref()
            .ok_or_else(|| index_err(&self.dir, "built without dense vectors (--dense MODEL)"))?;
        let flat = FlatIndex::open(&self.dir.join("dense"))?;
        let index = if use_hnsw && d.hnsw {
            let params = HnswParams { f16: true, ..Default::default() };
            DenseIndex::Hnsw { hnsw: Hnsw::view(&self.dir.join("hnsw.usearch"), flat.meta.dim, params)?, flat }
        } else {
            DenseIndex::Flat(flat)
        };
        Ok(DenseRetriever::new(load_encoder(d, opts)?, index, self.corpus.clone()))
    }

    /// The retriever for `method` (default: hybrid when both exist, else whichever exists).
    pub fn retriever(&self, method: Option<Method>, use_hnsw: bool) -> Result<Arc<dyn Retriever>> {
        let m = method.unwrap_or(match (self.spec.bm25, self.spec.dense.is_some()) {
            (true, true) => Method::Hybrid,
            (true, false) => Method::Bm25,
            _ => Method::Dense,
        });
        Ok(match m {
            Method::Bm25 => Arc::new(self.bm25()?),
            Method::Dense => Arc::new(self.dense(use_hnsw, &LoadOptions::default())?),
            Method::Hybrid => Arc::new(Hybrid::new(self.bm25()?, self.dense(use_hnsw, &LoadOptions::default())?)),
        })
    }
}
