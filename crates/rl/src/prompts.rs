//! Prompt presets: the anchor projects' exact texts (anchors.md §1.1, §2.4), as templates with
//! `{question}` and `{context}` placeholders. The world uses its own texts (`knowrl_world::prompts`,
//! the ones its tiny policy was pretrained on); these are for real models and real data.
use crate::task::Prompt;

/// Search-R1's agent prompt (v0.2+, one user message; "as your want" is the original's typo).
pub const SEARCH_R1_AGENT: &str = "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n";

/// Knowledgeable-R1's system prompt, hard-coded in its `ray_trainer.py` ("exmaple" is original).
pub const KNOWLEDGEABLE_R1_SYSTEM: &str = "You are a helpful assistant. After the user asks a question, you first think carefully and then give the answer.\nWhen responding, please keep the following points in mind:\n- The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively.\n- Output your final answer directly between the tag <answer> </answer> without any intermediate steps.\nHere is an exmaple:\nuser's question: what is the capital of China?\n<think> reasoning process here </think>\n<answer> BeiJing </answer>";

/// Knowledgeable-R1's CK user message ("Qusetion" is the original's typo).
pub const KNOWLEDGEABLE_R1_CK_USER: &str = "Retrieved information:\n{context}\nQusetion:\n{question}";

/// Knowledgeable-R1's PK user message: the question alone.
pub const KNOWLEDGEABLE_R1_PK_USER: &str = "{question}";

/// Fills `{question}` / `{context}` of a template.
pub fn fill(template: &str, question: &str, context: &str) -> String {
    template.replace("{context}", context).replace("{question}", question)
}

/// Knowledgeable-R1's p (query only) and p′ (context + query) for a question.
pub fn knowledgeable_r1(question: &str, context: &str) -> (Prompt, Prompt) {
    let sys = Some(KNOWLEDGEABLE_R1_SYSTEM.to_string());
    (
        Prompt { system: sys.clone(), user: fill(KNOWLEDGEABLE_R1_PK_USER, question, "") },
        Prompt { system: sys, user: fill(KNOWLEDGEABLE_R1_CK_USER, question, context) },
    )
}

/// AKBE's with-tool prompt (`data_process/hotpotqa_dual_path.py`, `make_prefix`), a *system*
/// message holding the question, byte for byte as the released Python produces it: `\b` in
/// its non-raw f-string became a backspace (U+0008) before "oxed", and `\\n` a literal
/// backslash-n before and after "user". "as your want" and the double space are original.
pub const AKBE_WITH_TOOL_SYSTEM: &str = "You are a helpful assistant that can solve the given question step by step with the help of the wikipedia search tool. Given a question, you need to first think about the reasoning process in the mind and then provide the answer. During thinking, you can invoke the wikipedia search tool to search for fact information about specific topics if needed. You can search as many times as your want. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags respectively, and the search query and result are enclosed within <search> </search> and <result> </result> tags respectively. For example, <think> This is the reasoning process. </think> <search> search query here </search> <result> search result here </result>  <think> This is the reasoning process. </think> <answer> The final answer is \\[ \u{8}oxed{answer here} \\] </answer>. In the last part of the answer, the final exact answer is enclosed within \u{8}oxed{} with latex format.\\nuser\\n{question}";

/// AKBE's no-tool prompt (`make_no_tool_prefix`): same quirks, except that here `\n` became real
/// newlines around "user".
pub const AKBE_NO_TOOL_SYSTEM: &str = "You are a helpful assistant that can solve the given question step by step without external tool. Given a question, you need to first think about the reasoning process in the mind and then provide the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags respectively. For example, <think> This is the reasoning process. </think> <answer> The final answer is \\[ \u{8}oxed{answer here} \\] </answer>. In the last part of the answer, the final exact answer is enclosed within \u{8}oxed{} with latex format.\nuser\n{question}";

/// AKBE's (with-tool, no-tool) prompts: system messages only, the question stripped and ending
/// in "?" as its data script does.
pub fn akbe(question: &str) -> (Prompt, Prompt) {
    let mut q = question.trim().to_string();
    if !q.ends_with('?') {
        q.push('?');
    }
    let sys = |t: &str| Prompt { system: Some(fill(t, &q, "")), user: String::new() };
    (sys(AKBE_WITH_TOOL_SYSTEM), sys(AKBE_NO_TOOL_SYSTEM))
}

/// Search-R1's agent prompt for a question.
pub fn search_r1(question: &str) -> Prompt {
    Prompt::user(fill(SEARCH_R1_AGENT, question, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_keep_the_originals_texts() {
        let p = search_r1("Who?");
        assert!(p.user.ends_with("For example, <answer> Beijing </answer>. Question: Who?\n"));
        assert!(p.user.contains("as your want"));
        let (wt, nt) = akbe(" Who founded Xyz ");
        let (wt, nt) = (wt.system.unwrap(), nt.system.unwrap());
        assert!(wt.ends_with("with latex format.\\nuser\\nWho founded Xyz?"), "{wt}");
        assert!(nt.ends_with("with latex format.\nuser\nWho founded Xyz?"));
        assert!(wt.contains("</answer>. In the last part") && wt.contains("\\[ \u{8}oxed{answer here} \\]"));
        assert!(wt.contains("</result>  <think>") && !nt.contains("search"));
        assert_eq!(wt.matches('\u{8}').count(), 2);
        let (pk, ck) = knowledgeable_r1("Who?", "Doc");
        assert_eq!(pk.user, "Who?");
        assert_eq!(ck.user, "Retrieved information:\nDoc\nQusetion:\nWho?");
        assert!(ck.system.unwrap().contains("Here is an exmaple:"));
    }
}
