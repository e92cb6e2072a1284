//! What the update trains on must be what the rollout sampled from: for real multi-turn agent
//! rollouts (the world policy, its dense retriever, temperature 1, several turns with
//! `<information>` blocks spliced in), the scorer's log-probs of every generated token equal
//! the sampler's. A mismatch (re-tokenised observations, a mask off by one, a different
//! temperature or position) silently turns GRPO into off-policy noise.
mod common;
use common::{agent_tasks, config, ctx, policy, retriever};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::Mode;

#[test]
fn scored_logprobs_of_agent_rollouts_equal_the_sampled_ones() {
    let dir = std::env::temp_dir().join(format!("knowrl-test-consistency-{}", std::process::id()));
    let mut cfg = config(&dir, 1, "");
    cfg.rollout.max_turns = 4;
    cfg.rollout.max_tokens_per_turn = 32;
    let (p, r) = (policy(), retriever());
    let c = ctx(&p, &r, &cfg);
    let tasks = agent_tasks(6);
    let picks: Vec<&knowrl_rl::task::Task> = tasks.iter().collect();
    let (prompts, _) = c.replicate(&picks, 4, |t| &t.agent).unwrap();
    let trajs = c.rollout(&prompts, true, 0).unwrap();
    assert!(trajs.iter().any(|t| t.tool_calls() >= 2), "multi-turn rollouts");
    let reqs: Vec<ScoreRequest> = prompts
        .iter()
        .zip(&trajs)
        .map(|(pr, t)| ScoreRequest { prompt: pr, response: &t.response, loss_mask: Some(&t.loss_mask) })
        .collect();
    let s = tch::no_grad(|| score(&p.lm, &reqs, cfg.rollout.temperature, Mode::EVAL));
    let (mut worst, mut n) = (0f64, 0);
    for (i, t) in trajs.iter().enumerate() {
        let scored: Vec<f32> = Vec::try_from(s.logprobs.get(i as i64)).unwrap();
        let mask: Vec<f32> = Vec::try_from(s.mask.get(i as i64)).unwrap();
        for (k, (&lp, &m)) in t.logprobs.iter().zip(&t.loss_mask).enumerate() {
            assert_eq!(mask[k] == 1.0, m, "row {i} token {k}: the scorer's mask differs from the rollout's");
            if m {
                worst = worst.max((scored[k] - lp).abs() as f64);
                n += 1;
            }
        }
    }
    assert!(n > 200, "{n} generated tokens compared");
    assert!(worst < 1e-4, "sampled vs scored log-prob differ by {worst} over {n} tokens");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[rollout] max_rows` rolls a step out in chunks of rows (a GPU's KV cache bounds how many fit);
/// each row keeps its own generator, so chunks of 5 give the same trajectories as one batch of 24.
#[test]
fn chunked_rollouts_sample_what_one_batch_samples() {
    let dir = std::env::temp_dir().join(format!("knowrl-test-chunks-{}", std::process::id()));
    let mut cfg = config(&dir, 1, "");
    (cfg.rollout.max_turns, cfg.rollout.max_tokens_per_turn) = (3, 24);
    let (p, r) = (policy(), retriever());
    let tasks = agent_tasks(6);
    let picks: Vec<&knowrl_rl::task::Task> = tasks.iter().collect();
    let whole = {
        let c = ctx(&p, &r, &cfg);
        let (prompts, _) = c.replicate(&picks, 4, |t| &t.agent).unwrap();
        c.rollout(&prompts, true, 0).unwrap()
    };
    cfg.rollout.max_rows = 5;
    let c = ctx(&p, &r, &cfg);
    let (prompts, _) = c.replicate(&picks, 4, |t| &t.agent).unwrap();
    let chunked = c.rollout(&prompts, true, 0).unwrap();
    assert_eq!(whole.len(), 24);
    assert!(whole.iter().any(|t| t.tool_calls() >= 1), "rollouts that search");
    let same = whole.iter().zip(&chunked).filter(|(a, b)| a.response == b.response).count();
    assert_eq!(same, 24, "rows whose tokens differ between one batch and chunks of 5");
}
