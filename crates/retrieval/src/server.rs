//! `knowrl serve retriever`: an HTTP server speaking Search-R1's retrieval protocol exactly
//! (`POST /retrieve` {"queries", "topk", "return_scores"} → {"result": [[...]]}) plus
//! `GET /health`.
//!
//! Requests go through a bounded queue to one batcher, which merges whatever is waiting into
//! a single batched search (up to `max_batch` queries) on a blocking thread. A full queue is
//! answered 503 at once (back-pressure, not unbounded memory); malformed JSON, empty queries and
//! absurd `topk` are answered 4xx with a message, and the server stays up.
use crate::{Hit, Retriever};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `topk` when a request omits it (Search-R1's launch scripts use 3).
    pub default_topk: usize,
    pub max_topk: usize,
    pub max_queries_per_request: usize,
    pub max_query_chars: usize,
    /// Queries merged into one search call.
    pub max_batch: usize,
    /// Requests waiting for the batcher before new ones get 503.
    pub queue: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            default_topk: 3,
            max_topk: 1000,
            max_queries_per_request: 4096,
            max_query_chars: 8192,
            max_batch: 256,
            queue: 1024,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrieveRequest {
    queries: Vec<String>,
    topk: Option<usize>,
    #[serde(default)]
    return_scores: bool,
}

struct Job {
    queries: Vec<String>,
    topk: usize,
    reply: oneshot::Sender<Result<Vec<Vec<Hit>>, String>>,
}

#[derive(Clone)]
struct AppState {
    jobs: mpsc::Sender<Job>,
    cfg: Arc<ServerConfig>,
    passages: usize,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({"error": msg.into()}))).into_response()
}

fn document(h: &Hit) -> Value {
    json!({"id": h.id, "contents": h.contents})
}

async fn retrieve(State(st): State<AppState>, body: Result<Json<RetrieveRequest>, JsonRejection>) -> Response {
    let req = match body {
        Ok(Json(r)) => r,
        Err(rej) => return error(rej.status(), rej.body_text()),
    };
    let cfg = &st.cfg;
    if req.queries.is_empty() {
        return error(StatusCode::BAD_REQUEST, "`queries` is empty");
    }
    if req.queries.len() > cfg.max_queries_per_request {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} queries; at most {} per request", req.queries.len(), cfg.max_queries_per_request),
        );
    }
    if let Some(i) = req.queries.iter().position(|q| q.trim().is_empty()) {
        return error(StatusCode::BAD_REQUEST, format!("queries[{i}] is empty"));
    }
    if let Some(i) = req.queries.iter().position(|q| q.len() > cfg.max_query_chars) {
        return error(StatusCode::BAD_REQUEST, format!("queries[{i}] is longer than {} bytes", cfg.max_query_chars));
    }
    let topk = req.topk.unwrap_or(cfg.default_topk);
    if topk == 0 || topk > cfg.max_topk {
        return error(StatusCode::BAD_REQUEST, format!("`topk` must be in 1..={} (got {topk})", cfg.max_topk));
    }
    let (tx, rx) = oneshot::channel();
    if st.jobs.try_send(Job { queries: req.queries, topk, reply: tx }).is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "server busy: request queue is full, retry later");
    }
    match rx.await {
        Ok(Ok(results)) => {
            let result: Vec<Vec<Value>> = results
                .iter()
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            if req.return_scores {
                                json!({"document": document(h), "score": h.score})
                            } else {
                                document(h)
                            }
                        })
                        .collect()
                })
                .collect();
            Json(json!({ "result": result })).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "search worker stopped"),
    }
}

async fn health(State(st): State<AppState>) -> Response {
    let pending = st.cfg.queue - st.jobs.capacity();
    Json(json!({"status": "ok", "passages": st.passages, "queued": pending})).into_response()
}

/// The batcher: merges waiting jobs into one search call of at most `max_batch` queries.
async fn batcher(mut rx: mpsc::Receiver<Job>, retriever: Arc<dyn Retriever>, max_batch: usize) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        let mut n = jobs[0].queries.len();
        while n < max_batch {
            match rx.try_recv() {
                Ok(j) => {
                    n += j.queries.len();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let k = jobs.iter().map(|j| j.topk).max().unwrap_or(1);
        let queries: Vec<String> = jobs.iter().flat_map(|j| j.queries.iter().cloned()).collect();
        let r = retriever.clone();
        let out = tokio::task::spawn_blocking(move || r.search(&queries, k)).await;
        match out {
            Ok(Ok(mut results)) => {
                for j in jobs.into_iter().rev() {
                    let mine: Vec<Vec<Hit>> = results
                        .split_off(results.len() - j.queries.len())
                        .into_iter()
                        .map(|mut hs| {
                            hs.truncate(j.topk);
                            hs
                        })
                        .collect();
                    let _ = j.reply.send(Ok(mine));
                }
            }
            Ok(Err(e)) => jobs.into_iter().for_each(|j| drop(j.reply.send(Err(e.to_string())))),
            Err(e) => jobs.into_iter().for_each(|j| drop(j.reply.send(Err(format!("search panicked: {e}"))))),
        }
    }
}

/// The router with its batcher task (spawned on the current runtime).
pub fn router(retriever: Arc<dyn Retriever>, cfg: ServerConfig) -> Router {
    let (tx, rx) = mpsc::channel(cfg.queue);
    let passages = retriever.len();
    tokio::spawn(batcher(rx, retriever, cfg.max_batch));
    let st = AppState { jobs: tx, cfg: Arc::new(cfg), passages };
    Router::new().route("/retrieve", post(retrieve)).route("/health", get(health)).with_state(st)
}

/// Serves until ctrl-c (or the future `shutdown` resolves).
pub async fn serve(
    listener: tokio::net::TcpListener,
    retriever: Arc<dyn Retriever>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(retriever, cfg)).with_graceful_shutdown(shutdown).await
}
