//! Evaluation of a served model through an OpenAI-compatible chat endpoint (vLLM, SGLang, TGI,
//! an API): `POST {base}/chat/completions`, greedy (temperature 0), stopped after `</answer>`
//! like the local decoder. Single-turn suites only: the agent suites need token-level control
//! of the trajectory (observations appended mid-response) that a chat API does not give.
use knowrl_rl::task::Prompt;
use serde_json::{json, Value};
use std::time::Duration;

pub struct ChatEndpoint {
    /// Base URL, e.g. `http://localhost:8000/v1`.
    pub base: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Requests in flight at once.
    pub concurrency: usize,
    client: reqwest::blocking::Client,
}

impl ChatEndpoint {
    pub fn new(base: &str, model: &str, api_key: Option<String>) -> Result<ChatEndpoint, String> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(ChatEndpoint {
            base: base.trim_end_matches('/').to_string(),
            model: model.to_string(),
            api_key,
            concurrency: 8,
            client,
        })
    }

    fn one(&self, p: &Prompt, max_new: usize) -> Result<String, String> {
        let mut messages = vec![];
        if let Some(s) = &p.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": p.user}));
        let body = json!({"model": self.model, "messages": messages, "temperature": 0.0,
                          "max_tokens": max_new, "stop": ["</answer>"]});
        let url = format!("{}/chat/completions", self.base);
        let mut req = self.client.post(&url).json(&body);
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let text = resp.text().map_err(|e| format!("{url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("{url}: HTTP {status}: {}", text.chars().take(300).collect::<String>()));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{url}: not a chat completion: {e}"))?;
        let choice = &v["choices"][0];
        let mut content = choice["message"]["content"]
            .as_str()
            .ok_or_else(|| format!("{url}: response has no choices[0].message.content"))?
            .to_string();
        // The stop string is not returned: put it back so the answer extracts as it would locally.
        if choice["finish_reason"] == "stop" && content.contains("<answer>") && !content.ends_with("</answer>") {
            content.push_str("</answer>");
        }
        Ok(content)
    }

    /// One response per prompt, in order; the first failure is returned with its URL.
    pub fn responses(&self, prompts: &[Prompt], max_new: usize) -> Result<Vec<String>, String> {
        let mut out: Vec<Option<Result<String, String>>> = (0..prompts.len()).map(|_| None).collect();
        for (chunk_in, chunk_out) in
            prompts.chunks(self.concurrency.max(1)).zip(out.chunks_mut(self.concurrency.max(1)))
        {
            std::thread::scope(|s| {
                let handles: Vec<_> = chunk_in.iter().map(|p| s.spawn(move || self.one(p, max_new))).collect();
                for (slot, h) in chunk_out.iter_mut().zip(handles) {
                    *slot = Some(h.join().unwrap_or_else(|_| Err("request thread panicked".into())));
                }
            });
        }
        out.into_iter().map(|r| r.expect("every slot filled")).collect()
    }
}
