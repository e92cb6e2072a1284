//! The policy gradient learns: a tiny random model, one prompt, one sampled token per response
//! and a reward of 1 for the 10 "right" tokens of 61. Through the real pieces (sampling, group
//! advantages, DAPO's informative groups, `update_policy` with PPO mini-batches), the exact
//! probability of a right token must rise from ~0.16 to over 0.5 in 12 steps with GRPO, DAPO and
//! GSPO. A flipped advantage, loss sign or optimiser step fails it.
mod common;
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::{LoadOptions, Policy, SamplingParams};
use knowrl_rl::advantage::{group_advantages, informative_groups};
use knowrl_rl::config::{Algorithm, TrainConfig};
use knowrl_rl::method::StepOutput;
use knowrl_rl::trainer::update_policy;
use knowrl_rl::update::{LossTerm, PgRow, Sequence};
use serde_json::json;
use tch::Kind;

const PROMPT: [u32; 4] = [1, 5, 9, 13];
const RIGHT: std::ops::Range<u32> = 20..30;

fn tiny_policy() -> Policy {
    let config = json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 61,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": true, "rope_theta": 10000.0,
    });
    let cfg = DecoderConfig::from_value(std::path::Path::new("config.json"), config).unwrap();
    Policy::random(&cfg, &LoadOptions::default(), 4)
}

/// P(a right token | prompt), exactly, from the logits.
fn p_right(p: &Policy) -> f64 {
    let logits = knowrl_engine::generate::full_logits(&p.lm, &[PROMPT.to_vec()]);
    let probs = logits.get(0).get(PROMPT.len() as i64 - 1).softmax(-1, Kind::Float);
    RIGHT.map(|t| probs.double_value(&[t as i64])).sum()
}

fn config(alg: Algorithm) -> TrainConfig {
    let mut c = common::config(&std::env::temp_dir().join("knowrl-learning-unused"), 1, "");
    c.algorithm.name = alg;
    match alg {
        Algorithm::Dapo => c.algorithm.clip_high = 0.28,
        Algorithm::Gspo => (c.algorithm.clip_low, c.algorithm.clip_high) = (3e-4, 4e-4),
        Algorithm::Grpo => {}
    }
    // Two PPO updates per batch of 4 groups × 8.
    (c.algorithm.ppo_mini_batch, c.optim.lr, c.optim.micro_batch) = (16, 1e-2, 16);
    c
}

#[test]
fn grpo_dapo_and_gspo_learn_a_one_token_reward() {
    tch::set_num_threads(1);
    for alg in [Algorithm::Grpo, Algorithm::Dapo, Algorithm::Gspo] {
        let cfg = config(alg);
        let p = tiny_policy();
        let mut opt = AdamW::new(p.trainable_parameters(), AdamWConfig { weight_decay: 0.0, ..Default::default() });
        let before = p_right(&p);
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        for step in 0..12u64 {
            let prompts = vec![PROMPT.to_vec(); 32];
            let seeds: Vec<u64> = (0..32).map(|j| step * 1000 + j).collect();
            let gens = knowrl_engine::generate::generate(&p.lm, None, &prompts, &params, &seeds, &[2], 0).unwrap();
            let rewards: Vec<f64> = gens.iter().map(|g| RIGHT.contains(&g.tokens[0]) as u8 as f64).collect();
            let group: Vec<usize> = (0..32).map(|j| j / 8).collect();
            let adv = group_advantages(&rewards, &group, cfg.algorithm.normalisation);
            let kept = if alg == Algorithm::Dapo { informative_groups(&rewards, &group) } else { (0..4).collect() };
            let rows = (0..32)
                .filter(|&j| kept.contains(&group[j]))
                .map(|j| {
                    let seq =
                        Sequence { prompt: PROMPT.to_vec(), response: gens[j].tokens.clone(), loss_mask: vec![true] };
                    PgRow::new(seq, adv[j], 1.0)
                })
                .collect();
            let mut out = StepOutput { terms: vec![LossTerm::Pg { rows, normaliser: None }], ..Default::default() };
            update_policy(None, &p, None, &mut opt, &mut out, &cfg, step).unwrap();
        }
        let after = p_right(&p);
        println!("{alg:?}: P(right token) {before:.3} -> {after:.3}");
        assert!(before < 0.3, "{alg:?}: the task starts hard ({before})");
        assert!(after > 0.5, "{alg:?}: P(right token) {before:.3} -> {after:.3} in 12 steps");
    }
}
