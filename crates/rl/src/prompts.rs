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
        let (pk, ck) = knowledgeable_r1("Who?", "Doc");
        assert_eq!(pk.user, "Who?");
        assert_eq!(ck.user, "Retrieved information:\nDoc\nQusetion:\nWho?");
        assert!(ck.system.unwrap().contains("Here is an exmaple:"));
    }
}
