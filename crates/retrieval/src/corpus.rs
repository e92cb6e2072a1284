//! Corpora in Search-R1 / FlashRAG jsonl (`{"id", "contents": "\"Title\"\ntext"}`), read as a
//! stream, plus the HotpotQA-IRCoT sample pooled into such a corpus.
//!
//! A malformed line stops the read with `file:line` and the reason, unless `skip_bad` is set, in
//! which case it is skipped and counted (never silently dropped).
use crate::error::{io, Result, RetrievalError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Passage {
    pub id: String,
    /// The raw Search-R1 `contents` (title line in quotes, then text): what the server returns.
    pub contents: String,
}

impl Passage {
    pub fn new(id: impl Into<String>, title: &str, text: &str) -> Passage {
        Passage { id: id.into(), contents: format!("\"{}\"\n{text}", title.replace('"', "\"\"")) }
    }

    /// Title without its quotes, inner doubled quotes undone (`""New York""` → `"New York"`).
    pub fn title(&self) -> String {
        let first = self.contents.split('\n').next().unwrap_or("");
        let t = first.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(first);
        t.replace("\"\"", "\"")
    }

    /// Everything after the title line.
    pub fn text(&self) -> &str {
        self.contents.split_once('\n').map_or("", |(_, t)| t)
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadStats {
    pub read: usize,
    pub skipped: usize,
}

#[derive(Deserialize)]
struct Line {
    id: serde_json::Value,
    contents: Option<String>,
    title: Option<String>,
    text: Option<String>,
}

/// Parses one jsonl line; `contents` or (`title`, `text`) must be present.
fn parse_line(s: &str) -> std::result::Result<Passage, String> {
    let l: Line = serde_json::from_str(s).map_err(|e| format!("invalid JSON: {e}"))?;
    let id = match l.id {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(format!("`id` must be a string or number, found {other}")),
    };
    match (l.contents, l.title, l.text) {
        (Some(c), _, _) => Ok(Passage { id, contents: c }),
        (None, Some(t), Some(x)) => Ok(Passage::new(id, &t, &x)),
        _ => Err("missing `contents` (or `title` and `text`)".into()),
    }
}

/// Streams passages to `f`. Empty lines are ignored.
pub fn for_each_passage(path: &Path, skip_bad: bool, mut f: impl FnMut(Passage) -> Result<()>) -> Result<ReadStats> {
    let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let mut stats = ReadStats::default();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(&line) {
            Ok(p) => {
                stats.read += 1;
                f(p)?;
            }
            Err(msg) if skip_bad => {
                stats.skipped += 1;
                eprintln!("{}:{}: skipped: {msg}", path.display(), i + 1);
            }
            Err(msg) => return Err(RetrievalError::BadLine { path: path.to_path_buf(), line: i + 1, msg }),
        }
    }
    Ok(stats)
}

/// Reads a whole corpus; duplicate ids are an error (they would make results ambiguous).
pub fn read_corpus(path: &Path, skip_bad: bool) -> Result<(Vec<Passage>, ReadStats)> {
    let mut out = vec![];
    let mut seen = HashMap::new();
    let stats = for_each_passage(path, skip_bad, |p| {
        if let Some(first) = seen.insert(p.id.clone(), out.len()) {
            return Err(RetrievalError::Invalid(format!(
                "{}: duplicate passage id `{}` (passages {} and {})",
                path.display(),
                p.id,
                first + 1,
                out.len() + 1
            )));
        }
        out.push(p);
        Ok(())
    })?;
    Ok((out, stats))
}

/// One multi-hop question with the ids of its supporting passages.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SupportedQuestion {
    pub id: String,
    pub question: String,
    pub answers: Vec<String>,
    pub supporting: Vec<String>,
}

/// Pools the HotpotQA-IRCoT paragraphs into a corpus (deduplicated by title + text) and returns
/// the questions with their supporting passage ids.
pub fn hotpotqa_ircot(path: &Path) -> Result<(Vec<Passage>, Vec<SupportedQuestion>)> {
    #[derive(Deserialize)]
    struct Ctx {
        title: String,
        paragraph_text: String,
        #[serde(default)]
        is_supporting: bool,
    }
    #[derive(Deserialize)]
    struct Ans {
        spans: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Q {
        question_id: String,
        question_text: String,
        answers_objects: Vec<Ans>,
        contexts: Vec<Ctx>,
    }
    let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let mut passages: Vec<Passage> = vec![];
    let mut by_key: HashMap<(String, String), String> = HashMap::new();
    let mut questions = vec![];
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let q: Q = serde_json::from_str(&line).map_err(|e| RetrievalError::BadLine {
            path: path.to_path_buf(),
            line: i + 1,
            msg: e.to_string(),
        })?;
        let mut supporting = vec![];
        for c in q.contexts {
            let key = (c.title.clone(), c.paragraph_text.clone());
            let id = by_key
                .entry(key)
                .or_insert_with(|| {
                    let id = format!("hp{}", passages.len());
                    passages.push(Passage::new(id.clone(), &c.title, &c.paragraph_text));
                    id
                })
                .clone();
            if c.is_supporting {
                supporting.push(id);
            }
        }
        questions.push(SupportedQuestion {
            id: q.question_id,
            question: q.question_text,
            answers: q.answers_objects.into_iter().flat_map(|a| a.spans).collect(),
            supporting,
        });
    }
    Ok((passages, questions))
}

/// A corpus to serve passages from: in memory, or memory-mapped jsonl plus the byte offset of
/// each passage line (8 bytes per passage: 21M passages cost 168 MB of RAM, not ~13 GB).
pub enum Corpus {
    Memory(Vec<Passage>),
    Mapped { mmap: memmap2::Mmap, starts: Vec<u64>, path: std::path::PathBuf },
}

impl Corpus {
    pub fn len(&self) -> usize {
        match self {
            Corpus::Memory(v) => v.len(),
            Corpus::Mapped { starts, .. } => starts.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A cheap size proxy for passage `i` (bytes), used to batch similar lengths together.
    pub fn approx_len(&self, i: usize) -> usize {
        match self {
            Corpus::Memory(v) => v[i].contents.len(),
            Corpus::Mapped { mmap, starts, .. } => {
                let end = starts.get(i + 1).map_or(mmap.len() as u64, |&e| e);
                (end - starts[i]) as usize
            }
        }
    }

    /// Passage `i` (parsed on demand for a mapped corpus; lines were validated when indexed).
    pub fn get(&self, i: usize) -> Passage {
        match self {
            Corpus::Memory(v) => v[i].clone(),
            Corpus::Mapped { mmap, starts, path } => {
                let rest = &mmap[starts[i] as usize..];
                let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                let s = std::str::from_utf8(&rest[..end]).unwrap_or("");
                parse_line(s.trim_end())
                    .unwrap_or_else(|e| panic!("{}: passage {i} changed since indexing: {e}", path.display()))
            }
        }
    }

    /// Scans `path` once, validating every line; returns the byte offset of each passage line.
    /// A bad line stops with file:line unless `skip_bad` (then it is skipped and counted).
    pub fn scan_offsets(path: &Path, skip_bad: bool, mut progress: impl FnMut(usize)) -> Result<(Vec<u64>, ReadStats)> {
        let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
        let mut r = BufReader::new(file);
        let (mut starts, mut pos, mut stats, mut line_no) = (vec![], 0u64, ReadStats::default(), 0usize);
        let mut buf = String::new();
        loop {
            buf.clear();
            let n = r.read_line(&mut buf).map_err(|e| io(path, e))?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if !buf.trim().is_empty() {
                match parse_line(buf.trim_end()) {
                    Ok(_) => {
                        starts.push(pos);
                        stats.read += 1;
                        if stats.read % 100_000 == 0 {
                            progress(stats.read);
                        }
                    }
                    Err(msg) if skip_bad => {
                        stats.skipped += 1;
                        eprintln!("{}:{line_no}: skipped: {msg}", path.display());
                    }
                    Err(msg) => return Err(RetrievalError::BadLine { path: path.to_path_buf(), line: line_no, msg }),
                }
            }
            pos += n as u64;
        }
        Ok((starts, stats))
    }

    /// Maps `path` with line offsets from [`Corpus::scan_offsets`].
    pub fn open_mapped(path: &Path, starts: Vec<u64>) -> Result<Corpus> {
        let f = std::fs::File::open(path).map_err(|e| io(path, e))?;
        // SAFETY: read-only map; the corpus must not change while served (index.json records
        // its size, checked on open).
        let mmap = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io(path, e))?;
        Ok(Corpus::Mapped { mmap, starts, path: path.to_path_buf() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_with_doubled_quotes_round_trip() {
        let p = parse_line(r#"{"id": 7, "contents": "\"\"\"New York\"\" (song)\"\nA song."}"#).unwrap();
        assert_eq!(p.id, "7");
        assert_eq!(p.title(), "\"New York\" (song)");
        assert_eq!(p.text(), "A song.");
        let q = Passage::new("x", "\"New York\" (song)", "A song.");
        assert_eq!(q.contents, p.contents);
    }

    #[test]
    fn title_text_fields_are_accepted() {
        let p = parse_line(r#"{"id": "a", "title": "T", "text": "body"}"#).unwrap();
        assert_eq!((p.title().as_str(), p.text()), ("T", "body"));
    }
}
