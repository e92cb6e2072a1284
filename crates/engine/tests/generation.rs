//! KV-cached batched generation against uncached recomputation, resumption after an appended
//! observation, per-sequence seeds, stop strings and eos.
mod common;
use common::*;
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::generate::{full_logits, generate, DecodeSession, Finish};
use knowrl_engine::sampling::{Rng, SamplingParams};
use knowrl_engine::{LoadOptions, Message, Policy};
use serde_json::json;
use tch::Kind;

fn tiny(model_type: &str) -> Policy {
    let v = json!({"model_type": model_type, "vocab_size": 61, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": model_type != "qwen2"});
    let cfg = DecoderConfig::from_value(std::path::Path::new("tiny/config.json"), v).unwrap();
    Policy::random(&cfg, &LoadOptions::default(), 11)
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![3, 4, 5, 6, 7, 8, 9], vec![10, 11], vec![12, 13, 14, 15]]
}

/// Log-probs recomputed without a cache, from the concatenated sequence, for every generated token.
fn recomputed_logprobs(p: &Policy, prompt: &[u32], gen: &[u32], temperature: f64) -> Vec<f32> {
    let seq = [prompt, gen].concat();
    let logits = full_logits(&p.lm, std::slice::from_ref(&seq)).get(0);
    (0..gen.len())
        .map(|t| {
            let row = logits.get((prompt.len() + t - 1) as i64) / temperature;
            row.log_softmax(-1, Kind::Float).double_value(&[gen[t] as i64]) as f32
        })
        .collect()
}

/// Each greedy token is the argmax of the logits recomputed without a cache.
fn assert_greedy_is_uncached_argmax(p: &Policy, gens: &[knowrl_engine::generate::Generation], label: &str) {
    for (pr, g) in prompts().iter().zip(gens) {
        let seq = [pr.as_slice(), &g.tokens].concat();
        let logits = full_logits(&p.lm, &[seq]).get(0);
        for t in 0..g.tokens.len() {
            let arg = logits.get((pr.len() + t - 1) as i64).argmax(-1, false).int64_value(&[]);
            assert_eq!(arg as u32, g.tokens[t], "{label}: step {t}");
        }
    }
}

#[test]
fn cached_generation_equals_uncached_recomputation() {
    for mt in ["llama", "qwen2", "qwen3"] {
        let p = tiny(mt);
        // Greedy: each token is the argmax of the uncached logits, log-probs agree.
        let gens = generate(&p.lm, None, &prompts(), &SamplingParams::greedy(12), &[0, 0, 0], &[], 0).unwrap();
        assert_greedy_is_uncached_argmax(&p, &gens, mt);
        for (pr, g) in prompts().iter().zip(&gens) {
            let lp = recomputed_logprobs(&p, pr, &g.tokens, 1.0);
            for (a, b) in lp.iter().zip(&g.logprobs) {
                assert!((a - b).abs() < 1e-4, "{mt}: {a} vs {b}");
            }
            assert_eq!(g.finish, Finish::Length);
        }
        // Sampling at temperature 0.7: the sampler's log-probs are the tempered policy's.
        let params = SamplingParams { temperature: 0.7, max_new_tokens: 10, ..Default::default() };
        let gens = generate(&p.lm, None, &prompts(), &params, &[1, 2, 3], &[], 0).unwrap();
        for (pr, g) in prompts().iter().zip(&gens) {
            let lp = recomputed_logprobs(&p, pr, &g.tokens, 0.7);
            for (a, b) in lp.iter().zip(&g.logprobs) {
                assert!((a - b).abs() < 1e-4, "{mt} sampled: {a} vs {b}");
            }
        }
    }
}

#[test]
fn per_sequence_seeds_are_reproducible_and_batch_independent() {
    let p = tiny("llama");
    let params = SamplingParams { temperature: 1.0, max_new_tokens: 16, ..Default::default() };
    let a = generate(&p.lm, None, &prompts(), &params, &[5, 6, 7], &[], 0).unwrap();
    let b = generate(&p.lm, None, &prompts(), &params, &[5, 6, 7], &[], 0).unwrap();
    assert_eq!(a, b);
    // The same prompt and seed alone in its batch gives the same tokens.
    let alone = generate(&p.lm, None, &prompts()[1..2], &params, &[6], &[], 0).unwrap();
    assert_eq!(alone[0].tokens, a[1].tokens);
    let c = generate(&p.lm, None, &prompts(), &params, &[8, 6, 7], &[], 0).unwrap();
    assert_ne!(a[0].tokens, c[0].tokens, "a different seed must change the sample");
}

#[test]
fn resuming_after_an_observation_equals_generating_from_the_concatenation() {
    for mt in ["llama", "qwen3"] {
        let p = tiny(mt);
        let pr = prompts();
        // Stop row 0 early and row 2 later, so the cache has ragged "holes" when we append.
        let mut s = DecodeSession::new(&p.lm, 3, 0);
        s.append(&pr).unwrap();
        let lens = [3usize, 5, 4];
        let params: Vec<SamplingParams> = lens.iter().map(|&n| SamplingParams::greedy(n)).collect();
        let mut rngs = vec![Rng::new(0); 3];
        let first = s.generate(&[0, 1, 2], &params, &mut rngs, None, &[]).unwrap();
        let obs = vec![vec![40, 41, 42, 43, 44], vec![], vec![50, 51]];
        s.append(&obs).unwrap();
        let second = s
            .generate(&[0, 2], &[SamplingParams::greedy(6), SamplingParams::greedy(6)], &mut rngs[..2], None, &[])
            .unwrap();
        for (k, &r) in [0usize, 2].iter().enumerate() {
            let concat = [pr[r].clone(), first[r].tokens.clone(), obs[r].clone()].concat();
            let fresh = generate(&p.lm, None, &[concat], &SamplingParams::greedy(6), &[0], &[], 0).unwrap();
            assert_eq!(second[k].tokens, fresh[0].tokens, "{mt} row {r}");
            for (a, b) in second[k].logprobs.iter().zip(&fresh[0].logprobs) {
                assert!((a - b).abs() < 1e-4, "{mt} row {r}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn stop_strings_and_eos_end_generation_on_real_model() {
    let dir = real_model("smollm2-135m-instruct");
    let p = Policy::load(&dir, &LoadOptions::default()).unwrap();
    let tok = p.tokenizer().unwrap();
    let text = tok.apply_chat_template(&[Message::new("user", "What is the capital of France?")], true).unwrap();
    let prompt = tok.encode(&text, false).unwrap();
    let full = generate(
        &p.lm,
        Some(tok),
        std::slice::from_ref(&prompt),
        &SamplingParams::greedy(24),
        &[0],
        &tok.eos_ids,
        tok.pad_id,
    )
    .unwrap();
    assert_eq!(full[0].finish, Finish::Eos, "{:?}", tok.decode(&full[0].tokens, false));
    assert_eq!(*full[0].tokens.last().unwrap(), tok.eos_ids[0]);
    let params = SamplingParams { stop: vec!["France".into()], ..SamplingParams::greedy(24) };
    let cut = generate(&p.lm, Some(tok), &[prompt], &params, &[0], &tok.eos_ids, tok.pad_id).unwrap();
    assert_eq!(cut[0].finish, Finish::Stop);
    let t = tok.decode(&cut[0].tokens, false).unwrap();
    assert!(t.ends_with("France"), "{t:?}");
    assert_eq!(&full[0].tokens[..cut[0].tokens.len()], &cut[0].tokens[..]);
}

#[test]
fn repeated_prompts_prefill_once_and_generate_as_if_alone() {
    // Rows repeating a prompt (a GRPO group) share one prefill; each row must still sample,
    // score and resume exactly as it would alone.
    let p = tiny("qwen3");
    let pr = prompts();
    let batch = vec![pr[0].clone(), pr[1].clone(), pr[0].clone(), pr[0].clone(), pr[1].clone()];
    let params = SamplingParams { temperature: 1.0, max_new_tokens: 8, ..Default::default() };
    let seeds = [5, 6, 7, 8, 9];
    let together = generate(&p.lm, None, &batch, &params, &seeds, &[], 0).unwrap();
    for (r, g) in together.iter().enumerate() {
        let alone = generate(&p.lm, None, &batch[r..r + 1], &params, &seeds[r..r + 1], &[], 0).unwrap();
        assert_eq!(g.tokens, alone[0].tokens, "row {r}");
        let lp = recomputed_logprobs(&p, &batch[r], &g.tokens, 1.0);
        for (a, b) in lp.iter().zip(&g.logprobs) {
            assert!((a - b).abs() < 1e-4, "row {r}: {a} vs {b}");
        }
    }
    assert_ne!(together[0].tokens, together[2].tokens, "same prompt, different seeds");
    // Resume one row after an observation.
    let mut s = DecodeSession::new(&p.lm, 5, 0);
    s.append(&batch).unwrap();
    let mut rngs = vec![Rng::new(0); 5];
    let first = s.generate(&[0, 1, 2, 3, 4], &vec![SamplingParams::greedy(3); 5], &mut rngs, None, &[]).unwrap();
    s.append(&[vec![], vec![], vec![40, 41], vec![], vec![]]).unwrap();
    let second = s.generate(&[2], &[SamplingParams::greedy(5)], &mut rngs[..1], None, &[]).unwrap();
    let concat = [batch[2].clone(), first[2].tokens.clone(), vec![40, 41]].concat();
    let fresh = generate(&p.lm, None, &[concat], &SamplingParams::greedy(5), &[0], &[], 0).unwrap();
    assert_eq!(second[0].tokens, fresh[0].tokens);
}

#[test]
fn finished_rows_leave_the_batch_and_the_rest_generate_as_if_alone() {
    // Eight rows stop at different lengths, then half of them resume after an observation (a
    // search turn): finished rows are moved out of the computed batch, and every row's tokens
    // and log-probs are still those it gets alone.
    let p = tiny("llama");
    let base = prompts();
    let batch: Vec<Vec<u32>> = (0..8).map(|r| base[r % 3].iter().map(|&t| t + r as u32).collect()).collect();
    let lens = [1usize, 12, 2, 9, 3, 12, 4, 6];
    let mut s = DecodeSession::new(&p.lm, 8, 0);
    s.append(&batch).unwrap();
    let mut rngs = vec![Rng::new(0); 8];
    let params: Vec<SamplingParams> = lens.iter().map(|&n| SamplingParams::greedy(n)).collect();
    let first = s.generate(&(0..8).collect::<Vec<_>>(), &params, &mut rngs, None, &[]).unwrap();
    let steps = 11; // feeds after the prefill: the longest row's 12 tokens minus the last
    assert_eq!(s.stats.forwards, 1 + steps);
    assert!(
        s.stats.rows_computed < 8 * (1 + steps) * 3 / 4,
        "finished rows still computed: {} row-forwards",
        s.stats.rows_computed
    );
    for r in 0..8 {
        let alone = generate(&p.lm, None, &batch[r..r + 1], &params[r], &[0], &[], 0).unwrap();
        assert_eq!(first[r].tokens, alone[0].tokens, "row {r}");
        for (a, b) in first[r].logprobs.iter().zip(&alone[0].logprobs) {
            assert!((a - b).abs() < 1e-4, "row {r}: {a} vs {b}");
        }
    }
    let searching = [6usize, 1, 4, 3];
    let mut obs = vec![vec![]; 8];
    for (i, &r) in searching.iter().enumerate() {
        obs[r] = (40..43 + i as u32).collect();
    }
    s.append(&obs).unwrap();
    let again = vec![SamplingParams::greedy(5); 4];
    let second = s.generate(&searching, &again, &mut rngs[..4], None, &[]).unwrap();
    for (k, &r) in searching.iter().enumerate() {
        let concat = [batch[r].clone(), first[r].tokens.clone(), obs[r].clone()].concat();
        let fresh = generate(&p.lm, None, &[concat], &SamplingParams::greedy(5), &[0], &[], 0).unwrap();
        assert_eq!(second[k].tokens, fresh[0].tokens, "row {r} after its observation");
        for (a, b) in second[k].logprobs.iter().zip(&fresh[0].logprobs) {
            assert!((a - b).abs() < 1e-4, "row {r}: {a} vs {b}");
        }
    }
}

/// A tiny Llama with a LoRA on every projection whose B is not zero (so the adapter matters).
fn tiny_with_lora() -> Policy {
    let lora = lora_on_every_projection(4);
    let mut p = tiny("llama");
    let cfg = p.lm.cfg.clone();
    p = Policy::random(&cfg, &LoadOptions { lora: Some(lora), ..Default::default() }, 11);
    tch::manual_seed(5);
    for (n, t) in p.trainable_parameters() {
        if n.contains("lora_B") {
            tch::no_grad(|| t.shallow_clone().copy_(&(t.randn_like() * 0.3)));
        }
    }
    p
}

/// Logits of the prompts with every adapter off (the base model).
fn adapters_off_logits(p: &Policy) -> tch::Tensor {
    let batch = knowrl_engine::score::PackedBatch::new(&prompts(), p.lm.device());
    let h = tch::no_grad(|| {
        p.lm.forward_hidden(&batch.ids, &batch.positions, &batch.mask, None, knowrl_engine::Mode::REFERENCE)
    });
    p.lm.logits(&h)
}

/// A decode session runs on LoRA-merged weights (one product per projection instead of
/// three); its greedy tokens and sampled log-probs are those of the adapter's own path,
/// recomputed without a cache and without the merge.
#[test]
fn generation_on_merged_lora_equals_the_adapter_path() {
    let p = tiny_with_lora();
    let base = full_logits(&p.lm, &prompts());
    let gens = generate(&p.lm, None, &prompts(), &SamplingParams::greedy(12), &[0, 0, 0], &[], 0).unwrap();
    assert_greedy_is_uncached_argmax(&p, &gens, "merged LoRA");
    let params = SamplingParams { temperature: 0.7, max_new_tokens: 10, ..Default::default() };
    for (pr, g) in prompts().iter().zip(generate(&p.lm, None, &prompts(), &params, &[1, 2, 3], &[], 0).unwrap()) {
        for (a, b) in recomputed_logprobs(&p, pr, &g.tokens, 0.7).iter().zip(&g.logprobs) {
            assert!((a - b).abs() < 1e-4, "sampled: {a} vs {b}");
        }
    }
    // The adapter moves the logits: the comparisons above could tell the paths apart.
    let moved = (&base - adapters_off_logits(&p)).abs().max().double_value(&[]);
    assert!(moved > 0.1, "the adapter moves the logits by {moved}");
    // The session's scope is closed: inference forwards run the adapter path again.
    assert!(full_logits(&p.lm, &prompts()).allclose(&base, 1e-6, 1e-6, false));
}

/// Inside a merged scope, inference forwards use the weights merged when it opened (proved by
/// changing B in place: they do not see it), forwards that need a gradient take the adapter
/// path, and closing the last of nested scopes drops the merge.
#[test]
fn merged_scope_serves_inference_only_and_ends_with_the_last_scope() {
    let p = tiny_with_lora();
    let before = full_logits(&p.lm, &prompts());
    let outer = p.lm.merged_adapters();
    let inner = p.lm.merged_adapters();
    let merged = full_logits(&p.lm, &prompts());
    assert!(merged.allclose(&before, 1e-5, 1e-5, false), "merged = adapter path");
    let b: Vec<tch::Tensor> =
        p.trainable_parameters().into_iter().filter(|(n, _)| n.contains("lora_B")).map(|(_, t)| t).collect();
    let saved: Vec<tch::Tensor> = b.iter().map(|t| t.detach().copy()).collect();
    b.iter().for_each(|t| {
        let _ = tch::no_grad(|| t.shallow_clone().zero_());
    });
    assert!(full_logits(&p.lm, &prompts()).allclose(&merged, 1e-6, 1e-6, false), "still the merged weights");
    // A forward that needs a gradient sees the live adapter (B = 0 now: the base's output).
    let batch = knowrl_engine::score::PackedBatch::new(&prompts(), p.lm.device());
    let h = p.lm.forward_hidden(&batch.ids, &batch.positions, &batch.mask, None, knowrl_engine::Mode::TRAIN);
    assert!(h.requires_grad());
    let base = adapters_off_logits(&p);
    assert!(p.lm.logits(&h).detach().allclose(&base, 1e-5, 1e-5, false), "training forward on the live weights");
    drop(inner);
    assert!(full_logits(&p.lm, &prompts()).allclose(&merged, 1e-6, 1e-6, false), "outer scope still open");
    drop(outer);
    assert!(full_logits(&p.lm, &prompts()).allclose(&base, 1e-5, 1e-5, false), "scope closed: live weights");
    b.iter().zip(&saved).for_each(|(t, s)| tch::no_grad(|| t.shallow_clone().copy_(s)));
    assert!(full_logits(&p.lm, &prompts()).allclose(&before, 1e-6, 1e-6, false));
}
