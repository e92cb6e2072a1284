//! BM25 with tantivy (k1 = 1.2, b = 0.75; English stemming like pyserini's default analyzer),
//! persisted in an index directory next to the corpus it was built from.
use crate::corpus::Corpus;
use crate::error::{index_err, Result};
use crate::{hits, Hit, Retriever};
use std::path::Path;
use std::sync::Arc;
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, FAST};
use tantivy::{Index, IndexReader, TantivyDocument};

pub struct Bm25 {
    index: Index,
    reader: IndexReader,
    contents: Field,
    corpus: Arc<Corpus>,
}

fn schema() -> (Schema, Field, Field) {
    let mut b = Schema::builder();
    let text = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default().set_tokenizer("en_stem").set_index_option(IndexRecordOption::WithFreqs),
    );
    let contents = b.add_text_field("contents", text);
    let idx = b.add_u64_field("idx", FAST);
    (b.build(), contents, idx)
}

/// Replaces query-syntax characters with spaces: queries are bags of words, never a query
/// language (a `:` or `"` from an LLM must not raise a parse error).
fn sanitize(q: &str) -> String {
    q.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect()
}

impl Bm25 {
    /// Indexes `corpus` into `dir` (created or replaced). `threads` writer threads.
    pub fn build(dir: &Path, corpus: Arc<Corpus>, progress: impl Fn(usize)) -> Result<Bm25> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| crate::error::io(dir, e))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| crate::error::io(dir, e))?;
        let (schema, contents, idx) = schema();
        let index = Index::create_in_dir(dir, schema).map_err(|e| index_err(dir, e))?;
        let mut w: tantivy::IndexWriter = index.writer(200_000_000).map_err(|e| index_err(dir, e))?;
        for i in 0..corpus.len() {
            let p = corpus.get(i);
            let mut d = TantivyDocument::default();
            d.add_text(contents, &p.contents);
            d.add_u64(idx, i as u64);
            w.add_document(d).map_err(|e| index_err(dir, e))?;
            if i % 1000 == 999 {
                progress(i + 1);
            }
        }
        w.commit().map_err(|e| index_err(dir, e))?;
        w.wait_merging_threads().map_err(|e| index_err(dir, e))?;
        progress(corpus.len());
        Self::open(dir, corpus)
    }

    pub fn open(dir: &Path, corpus: Arc<Corpus>) -> Result<Bm25> {
        let index = Index::open_in_dir(dir).map_err(|e| index_err(dir, format!("not a BM25 index: {e}")))?;
        let contents = index.schema().get_field("contents").map_err(|e| index_err(dir, e))?;
        let reader = index.reader().map_err(|e| index_err(dir, e))?;
        let n = reader.searcher().num_docs() as usize;
        if n != corpus.len() {
            return Err(index_err(
                dir,
                format!("holds {n} documents but the corpus has {} (rebuild it)", corpus.len()),
            ));
        }
        Ok(Bm25 { index, reader, contents, corpus })
    }

    /// Ranked (corpus index, score) for one query.
    pub fn ranked(&self, query: &str, k: usize) -> Result<Vec<(usize, f32)>> {
        let parser = QueryParser::for_index(&self.index, vec![self.contents]);
        let (q, _) = parser.parse_query_lenient(&sanitize(query));
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&q, &TopDocs::with_limit(k.max(1)).order_by_score())
            .map_err(|e| crate::RetrievalError::Invalid(e.to_string()))?;
        let mut out = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let col = searcher
                .segment_reader(addr.segment_ord)
                .fast_fields()
                .u64("idx")
                .map_err(|e| crate::RetrievalError::Invalid(e.to_string()))?;
            let i = col.first(addr.doc_id).expect("every document has an idx") as usize;
            out.push((i, score));
        }
        Ok(out)
    }
}

impl Retriever for Bm25 {
    fn search(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>> {
        use rayon::prelude::*;
        queries.par_iter().map(|q| Ok(hits(&self.corpus, &self.ranked(q, k)?))).collect()
    }
    fn len(&self) -> usize {
        self.corpus.len()
    }
}
