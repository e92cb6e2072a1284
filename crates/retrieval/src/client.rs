//! A client for Search-R1-compatible retrieval servers (ours or Search-R1's own), implementing
//! the same [`Retriever`] trait as in-process indexes. Timeouts on every request; retries with
//! exponential back-off on connection errors, timeouts, 5xx and 503 (a busy server); 4xx is the
//! caller's mistake and is returned at once with the server's message.
use crate::error::{Result, RetrievalError};
use crate::{Hit, Retriever};
use serde_json::{json, Value};
use std::time::Duration;

pub struct HttpRetriever {
    base: String,
    client: reqwest::blocking::Client,
    pub retries: usize,
    pub backoff: Duration,
    passages: usize,
}

impl HttpRetriever {
    /// `url` like `http://127.0.0.1:8000` (a trailing `/retrieve` is accepted).
    pub fn connect(url: &str, timeout: Duration) -> Result<HttpRetriever> {
        let base = url.trim_end_matches('/').trim_end_matches("/retrieve").to_string();
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| RetrievalError::Http(e.to_string()))?;
        let mut r = HttpRetriever { base, client, retries: 4, backoff: Duration::from_millis(100), passages: 0 };
        // Search-R1's own server has no /health; treat its absence as "size unknown".
        if let Ok(h) = r.client.get(format!("{}/health", r.base)).send() {
            if let Ok(v) = h.json::<Value>() {
                r.passages = v.get("passages").and_then(Value::as_u64).unwrap_or(0) as usize;
            }
        }
        Ok(r)
    }

    fn post(&self, body: &Value) -> Result<Value> {
        let url = format!("{}/retrieve", self.base);
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                std::thread::sleep(self.backoff * 2u32.pow(attempt as u32 - 1));
            }
            match self.client.post(&url).json(body).send() {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().unwrap_or_default();
                    if status.is_success() {
                        return serde_json::from_str(&text)
                            .map_err(|e| RetrievalError::Http(format!("{url}: bad JSON response: {e}")));
                    }
                    last = format!("{url}: HTTP {status}: {text}");
                    if status.is_client_error() && status.as_u16() != 429 {
                        return Err(RetrievalError::Http(last));
                    }
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(RetrievalError::Http(format!("{last} (after {} retries)", self.retries)))
    }
}

impl Retriever for HttpRetriever {
    fn search(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>> {
        if queries.is_empty() {
            return Ok(vec![]);
        }
        let v = self.post(&json!({"queries": queries, "topk": k, "return_scores": true}))?;
        let bad = || RetrievalError::Http("response has no `result` list of lists".into());
        let result = v.get("result").and_then(Value::as_array).ok_or_else(bad)?;
        result
            .iter()
            .map(|per_q| {
                per_q
                    .as_array()
                    .ok_or_else(bad)?
                    .iter()
                    .map(|item| {
                        let doc = item.get("document").unwrap_or(item);
                        Ok(Hit {
                            id: match doc.get("id") {
                                Some(Value::String(s)) => s.clone(),
                                Some(other) => other.to_string(),
                                None => String::new(),
                            },
                            contents: doc.get("contents").and_then(Value::as_str).unwrap_or("").to_string(),
                            score: item.get("score").and_then(Value::as_f64).unwrap_or(0.0) as f32,
                        })
                    })
                    .collect()
            })
            .collect()
    }
    fn len(&self) -> usize {
        self.passages
    }
}
