//! Prompt formats of the world's policy. Compact on purpose (the tiny policy's context is
//! short); the anchors' exact prompts (Search-R1, Knowledgeable-R1, AKBE) are presets of the RL
//! crate for real models. Tags are Search-R1's: <search>, <information>, <answer>.
/// Query-only (parametric knowledge, Knowledgeable-R1's PK prompt).
pub fn query_only(question: &str) -> String {
    format!("Answer from memory in <answer> </answer>.\nQuestion: {question}")
}

/// Question with retrieved context (Knowledgeable-R1's CK prompt).
pub fn with_context(question: &str, passages: &[String]) -> String {
    let ctx: Vec<String> = passages.iter().enumerate().map(|(i, p)| format!("Doc {}: {}", i + 1, flatten(p))).collect();
    format!("Retrieved information:\n{}\nQuestion: {question}", ctx.join("\n"))
}

/// The search agent (Search-R1 style).
pub fn agent(question: &str) -> String {
    format!(
        "Search with <search> query </search> when needed, then answer in <answer> </answer>.\nQuestion: {question}"
    )
}

/// The same task without the tool (AKBE's no-tool path).
pub fn no_tool(question: &str) -> String {
    format!("Answer without searching, in <answer> </answer>.\nQuestion: {question}")
}

/// Search-R1's `contents` ("\"Title\"\ntext") as one line: `Title: text`.
pub fn flatten(contents: &str) -> String {
    let (t, x) = contents.split_once('\n').unwrap_or((contents, ""));
    format!("{}: {x}", t.trim_matches('"'))
}

pub fn answer(a: &str) -> String {
    format!("<answer> {a} </answer>")
}

pub fn search(q: &str) -> String {
    format!("<search> {q} </search>")
}

/// The chat template of the world policy (ChatML, no default system turn).
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
