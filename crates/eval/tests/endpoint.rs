//! The OpenAI-compatible client against a local server speaking the chat-completions protocol:
//! request shape, greedy settings, the `</answer>` stop string restored, order kept under
//! concurrency, HTTP errors reported with the URL.
use axum::{routing::post, Json, Router};
use knowrl_eval::endpoint::ChatEndpoint;
use knowrl_eval::{greedy_answers, Responder};
use knowrl_rl::task::Prompt;
use serde_json::{json, Value};

async fn chat(Json(body): Json<Value>) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    assert_eq!(body["model"], "served-model");
    assert_eq!(body["temperature"], 0.0);
    assert_eq!(body["stop"][0], "</answer>");
    let msgs = body["messages"].as_array().unwrap();
    let user = msgs.last().unwrap()["content"].as_str().unwrap().to_string();
    if user == "bad" {
        return Err((axum::http::StatusCode::BAD_REQUEST, "unsupported".into()));
    }
    // Later prompts answer sooner, so completion order differs from request order.
    let n: u64 = user.trim_start_matches('q').parse().unwrap_or(0);
    tokio::time::sleep(std::time::Duration::from_millis(50u64.saturating_sub(n * 5))).await;
    let system = msgs.iter().find(|m| m["role"] == "system").map_or("", |m| m["content"].as_str().unwrap());
    Ok(Json(json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": format!("<think>{system}</think> <answer> a-{user}")}}]})))
}

#[test]
fn chat_endpoint_answers_in_order_and_reports_http_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, Router::new().route("/v1/chat/completions", post(chat))).await });
    let ep = ChatEndpoint::new(&format!("http://{addr}/v1/"), "served-model", Some("k".into())).unwrap();
    let prompts: Vec<Prompt> = (0..10).map(|i| Prompt::user(format!("q{i}"))).collect();
    let answers = greedy_answers(&ep, &prompts, 16).unwrap();
    assert_eq!(answers, (0..10).map(|i| format!("a-q{i}")).collect::<Vec<_>>());
    let with_system = Prompt { system: Some("sys".into()), user: "q1".into() };
    let raw = Responder::responses(&ep, &[with_system], 16).unwrap();
    assert_eq!(raw[0], "<think>sys</think> <answer> a-q1</answer>");
    let err = ep.responses(&[Prompt::user("q1"), Prompt::user("bad")], 16).unwrap_err();
    assert!(err.contains("/v1/chat/completions: HTTP 400"), "{err}");
    let down = ChatEndpoint::new("http://127.0.0.1:9/v1", "m", None).unwrap();
    assert!(down
        .responses(&[Prompt::user("q1")], 4)
        .unwrap_err()
        .starts_with("http://127.0.0.1:9/v1/chat/completions"));
}
