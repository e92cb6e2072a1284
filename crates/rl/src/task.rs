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
    /// The part of the training mix the task belongs to (the context suite: its scenario, S1
    /// correct or S2 counterfactual context). See [`TaskDraw`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<String>,
}

/// How a run draws a step's questions: uniformly over the tasks, or, when the tasks name two or
/// more parts of a mix, a part first (uniformly) and then a task within it. Knowledgeable-R1
/// trains on correct and counterfactual contexts "in the same proportion" (its Appendix B),
/// whatever the number of items of each; the world has 348 S1 and 518 S2 train items (S2 also
/// has the multiple-conflict variant), which a uniform draw would take 40 : 60.
pub struct TaskDraw {
    parts: Vec<Vec<usize>>,
}

impl TaskDraw {
    pub fn new(tasks: &[Task]) -> TaskDraw {
        let mut parts: Vec<(Option<&str>, Vec<usize>)> = vec![];
        for (i, t) in tasks.iter().enumerate() {
            match parts.iter_mut().find(|(m, _)| *m == t.mix.as_deref()) {
                Some((_, ix)) => ix.push(i),
                None => parts.push((t.mix.as_deref(), vec![i])),
            }
        }
        TaskDraw { parts: parts.into_iter().map(|(_, ix)| ix).collect() }
    }

    /// The index of the next task. With one part it is one uniform draw over all tasks, as
    /// before parts existed (the agent suite's runs draw the same questions as then).
    pub fn pick(&self, rng: &mut knowrl_engine::Rng) -> usize {
        match self.parts.as_slice() {
            [one] => one[rng.below(one.len())],
            parts => {
                let part = &parts[rng.below(parts.len())];
                part[rng.below(part.len())]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knowrl_engine::Rng;

    fn task(id: &str, mix: Option<&str>) -> Task {
        Task { id: id.into(), mix: mix.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn one_part_draws_as_a_uniform_draw_over_all_tasks() {
        let tasks: Vec<Task> = (0..7).map(|i| task(&i.to_string(), None)).collect();
        let draw = TaskDraw::new(&tasks);
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..200 {
            assert_eq!(draw.pick(&mut a), b.below(7));
        }
    }

    #[test]
    fn parts_get_equal_shares_whatever_their_sizes() {
        // One S1 item against three S2 items: a uniform draw would give S1 a quarter.
        let tasks = [task("a", Some("S1")), task("b", Some("S2")), task("c", Some("S2")), task("d", Some("S2"))];
        let draw = TaskDraw::new(&tasks);
        let mut rng = Rng::new(1);
        let mut counts = [0usize; 4];
        let n = 20_000;
        for _ in 0..n {
            counts[draw.pick(&mut rng)] += 1;
        }
        let share = |c: usize| c as f64 / n as f64;
        assert!((share(counts[0]) - 0.5).abs() < 0.015, "{counts:?}");
        for &c in &counts[1..] {
            assert!((share(c) - 1.0 / 6.0).abs() < 0.015, "{counts:?}");
        }
    }
}
