//! The agent loop against a scripted policy and a fake retriever: loss masks, tool-call counts,
//! one batched retrieval call per turn, the max-turn cut-off, invalid-action handling.
use knowrl_engine::generate::{Finish, Generation};
use knowrl_engine::{Rng, SamplingParams, Tokenizer};
use knowrl_retrieval::{Hit, Retriever};
use knowrl_rl::agent::{run, AgentConfig, TurnPolicy, INVALID_ACTION};
use std::sync::Mutex;

/// Emits, per row, the next scripted turn; records what was appended.
struct Scripted<'a> {
    tok: &'a Tokenizer,
    turns: Vec<Vec<&'static str>>,
    next: Vec<usize>,
    appended: Vec<Vec<u32>>,
}

impl TurnPolicy for Scripted<'_> {
    fn generate(
        &mut self,
        rows: &[usize],
        _: &[SamplingParams],
        _: &mut [Rng],
        _: Option<&Tokenizer>,
        _: &[u32],
    ) -> knowrl_engine::Result<Vec<Generation>> {
        rows.iter()
            .map(|&r| {
                let text = self.turns[r][self.next[r]];
                self.next[r] += 1;
                let tokens = self.tok.encode(text, false)?;
                let finish = if text.ends_with("</search>") || text.ends_with("</answer>") {
                    Finish::Stop
                } else {
                    Finish::Length
                };
                Ok(Generation { logprobs: vec![-0.5; tokens.len()], tokens, finish, stop: None })
            })
            .collect()
    }
    fn append(&mut self, blocks: &[Vec<u32>]) -> knowrl_engine::Result<()> {
        for (r, b) in blocks.iter().enumerate() {
            self.appended[r].extend(b);
        }
        Ok(())
    }
}

/// Returns one fixed passage per query and records each call's batch.
struct Fake {
    calls: Mutex<Vec<Vec<String>>>,
}

impl Retriever for Fake {
    fn search(&self, queries: &[String], k: usize) -> knowrl_retrieval::Result<Vec<Vec<Hit>>> {
        self.calls.lock().unwrap().push(queries.to_vec());
        Ok(queries
            .iter()
            .map(|q| {
                (0..k)
                    .map(|i| Hit { id: format!("{q}-{i}"), contents: format!("\"{q}\"\nabout {q}"), score: 1.0 })
                    .collect()
            })
            .collect())
    }
    fn len(&self) -> usize {
        100
    }
}

#[test]
fn scripted_agent_loop() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world/policy");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let mut policy = Scripted {
        tok: &tok,
        turns: vec![
            vec!["<search> Ada </search>", "<answer> London </answer>"],
            vec!["no tags at all", "<answer> x </answer>"],
            vec!["<search> a </search>", "<search> b </search>", "<search> c </search>"],
        ],
        next: vec![0; 3],
        appended: vec![vec![]; 3],
    };
    let fake = Fake { calls: Mutex::new(vec![]) };
    let cfg = AgentConfig::new(3, 2, 32, 0.0);
    let mut rngs = vec![Rng::new(0); 3];
    let t = run(&mut policy, 3, &tok, &fake, &cfg, &mut rngs).unwrap();

    // One batched retrieval call per turn, with every searching row's query.
    assert_eq!(*fake.calls.lock().unwrap(), vec![vec!["Ada".to_string(), "a".into()], vec!["b".into()]]);
    // Row 0: one search, then the answer.
    assert_eq!((t[0].tool_calls(), t[0].answer.as_deref()), (1, Some("London")));
    assert_eq!(t[0].retrieved_ids, vec![vec!["Ada-0".to_string(), "Ada-1".into()]]);
    // Row 1: an invalid turn gets Search-R1's corrective message, masked out.
    assert_eq!((t[1].invalid_actions, t[1].answer.as_deref(), t[1].tool_calls()), (1, Some("x"), 0));
    assert!(t[1].text.contains(INVALID_ACTION.trim()));
    // Row 2: the third search falls on the last turn and is not executed; no answer.
    assert_eq!((t[2].tool_calls(), t[2].answer.as_deref()), (2, None));
    for (r, tr) in t.iter().enumerate() {
        assert_eq!(tr.response.len(), tr.loss_mask.len());
        assert_eq!(tr.response.len(), tr.logprobs.len());
        // Policy tokens are exactly the scripted turns; everything else is masked observation.
        let generated: usize =
            policy.turns[r][..policy.next[r]].iter().map(|s| tok.encode(s, false).unwrap().len()).sum();
        assert_eq!(tr.loss_mask.iter().filter(|m| **m).count(), generated, "row {r}");
        let masked: Vec<u32> = tr.response.iter().zip(&tr.loss_mask).filter(|(_, m)| !**m).map(|(x, _)| *x).collect();
        assert_eq!(masked, policy.appended[r], "row {r}: masked tokens are what was appended");
        assert!(tr.logprobs.iter().zip(&tr.loss_mask).all(|(lp, m)| if *m { *lp == -0.5 } else { *lp == 0.0 }));
    }
    let obs = tok.decode(&policy.appended[0], false).unwrap();
    assert!(obs.starts_with("\n\n<information>Doc 1(Title: \"Ada\") about Ada"), "{obs:?}");
}

#[test]
fn system_only_prompts_render_without_an_empty_user_turn() {
    // AKBE's prompts are one system message holding the question.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-world/policy");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let (wt, _) = knowrl_rl::prompts::akbe("Who founded Xyz");
    let text = tok.decode(&wt.ids(&tok).unwrap(), false).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful assistant"), "{text}");
    assert!(text.ends_with("Who founded Xyz?<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    assert!(!text.contains("<|im_start|>user"));
    let both = knowrl_rl::task::Prompt { system: Some("s".into()), user: "u".into() };
    assert!(tok.decode(&both.ids(&tok).unwrap(), false).unwrap().contains("<|im_start|>user\nu<|im_end|>"));
}
