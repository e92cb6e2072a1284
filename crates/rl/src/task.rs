//! A question as the RL methods see it: its accepted answers and the prompt variants the
//! methods need (rendered by the data loader, so every method trains on identical conditions).
use knowrl_engine::{Message, Tokenizer};
use serde::{Deserialize, Serialize};

/// One prompt: an optional system message and the user message.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Prompt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub user: String,
}

impl Prompt {
    pub fn user(text: impl Into<String>) -> Prompt {
        Prompt { system: None, user: text.into() }
    }

    /// Token ids of the prompt rendered with the model's chat template (generation prompt on).
    pub fn ids(&self, tok: &Tokenizer) -> knowrl_engine::Result<Vec<u32>> {
        let mut msgs = vec![];
        if let Some(s) = &self.system {
            msgs.push(Message::new("system", s));
        }
        // AKBE's prompts are a lone system message holding the question: no empty user turn.
        if !(self.user.is_empty() && self.system.is_some()) {
            msgs.push(Message::new("user", &self.user));
        }
        tok.encode(&tok.apply_chat_template(&msgs, true)?, false)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Task {
    pub id: String,
    pub golden: Vec<String>,
    /// Search-agent prompt (the tool is available).
    pub agent: Prompt,
    /// The same question without the tool (AKBE's no-tool path).
    #[serde(default)]
    pub no_tool: Prompt,
    /// Query only: Knowledgeable-R1's p.
    #[serde(default)]
    pub query_only: Prompt,
    /// Context + query: Knowledgeable-R1's p′ (absent for agent-only data).
    #[serde(default)]
    pub with_context: Option<Prompt>,
}
