//! The pretraining pipeline end to end on a small world: tokenizer (tags are single tokens,
//! chat template renders), policy SFT (loss falls, observation tokens are not trained on,
//! the result loads as a standard HF directory), retriever (contrastive loss falls, loads).
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, Message, Policy, Tokenizer};
use knowrl_world::config::WorldConfig;
use knowrl_world::corpus::sentence;
use knowrl_world::pretrain::examples;
use knowrl_world::pretrain::{encode, train_encoder, train_policy, train_tokenizer, PretrainConfig, TAGS};
use std::cell::RefCell;

mod common;

fn small() -> WorldConfig {
    common::small(40, 12, 10, 6, 2)
}

#[test]
fn tokenizer_policy_and_retriever_pretrain_and_load() {
    tch::set_num_threads(2);
    let built = knowrl_world::build(&small());
    let dir = tempfile::Builder::new().prefix("knowrl-pretrain-").tempdir().unwrap();
    let (pdir, edir) = (dir.path().join("policy"), dir.path().join("encoder"));
    train_tokenizer(&built, 600, &pdir, &edir).unwrap();
    let tok = Tokenizer::from_dir(&pdir).unwrap();
    for t in TAGS {
        assert_eq!(tok.encode(t, false).unwrap().len(), 1, "{t} is not a single token");
    }
    let chat = tok.apply_chat_template(&[Message::new("user", "hi")], true).unwrap();
    assert_eq!(chat, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

    // Observation segments are masked; everything the policy says is trained on.
    let ex = examples(&built, &PretrainConfig { seed: 1, ..Default::default() });
    // Parametric-knowledge examples are repeated `fact_repeats` times per epoch.
    let once = examples(&built, &PretrainConfig { seed: 1, fact_repeats: 1, ..Default::default() });
    let statements = |v: &[knowrl_world::habits::Example]| v.iter().filter(|e| e.user.is_none()).count();
    assert_eq!(statements(&ex), 3 * statements(&once));
    assert!(statements(&once) > 0);
    // With pk_only_targets (the default) agent trajectories of questions the policy does not
    // know train only their first search (the question copied); with it off, everything.
    let agent_prompts = |v: &[knowrl_world::habits::Example]| -> Vec<String> {
        v.iter().filter(|e| e.segments.len() > 1).map(|e| e.user.clone().unwrap()).collect()
    };
    let known: std::collections::HashSet<String> =
        built.questions.iter().filter(|q| q.pk_answerable).map(|q| knowrl_world::prompts::agent(&q.question)).collect();
    let trained = |e: &knowrl_world::habits::Example| e.segments.iter().filter(|s| s.1).count();
    let unknown =
        |e: &&knowrl_world::habits::Example| e.segments.len() > 1 && !known.contains(e.user.as_ref().unwrap());
    let ex_unknown: Vec<_> = ex.iter().filter(unknown).collect();
    assert!(!ex_unknown.is_empty() && ex_unknown.iter().all(|e| trained(e) == 1 && e.segments[0].1));
    let all = examples(&built, &PretrainConfig { seed: 1, pk_only_targets: false, ..Default::default() });
    assert!(all.iter().filter(unknown).all(|e| trained(e) > 1));
    // Shadow-world reading practice: contexts and agent runs about entities the real world lacks.
    let shadow = knowrl_world::build(&WorldConfig { seed: knowrl_world::pretrain::shadow_seed(17, 0), ..small() });
    let reading = knowrl_world::habits::reading_examples(&shadow, 5, 4, 1);
    assert_eq!((reading.len(), agent_prompts(&reading).len()), (9, 4));
    let real_names: std::collections::HashSet<&str> = built.world.entities.iter().map(|e| e.name.as_str()).collect();
    assert!(shadow.world.entities.iter().filter(|e| real_names.contains(e.name.as_str())).count() < 3);
    // Counterfactual practice in the S1 format: the train item's context with its last-hop sentence naming a
    // made-up object of the right kind, which is the only trained text; the other passages as
    // they were; a new draw per seed.
    let s1: std::collections::HashMap<String, &knowrl_world::suites::ScenarioItem> = built
        .scenarios
        .iter()
        .filter(|s| s.scenario == "S1")
        .map(|s| (knowrl_world::prompts::with_context(&s.question, &s.context), s))
        .collect();
    let (cc, cc2) = (
        knowrl_world::habits::counterfactual_context(&built, "S1", 40, 2),
        knowrl_world::habits::counterfactual_context(&built, "S1", 40, 3),
    );
    assert_eq!(cc.len(), 40);
    assert_ne!(cc, cc2);
    let q_of: std::collections::HashMap<&str, &knowrl_world::questions::Question> =
        built.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    let mut multi_hop = 0;
    for e in &cc {
        let (user, answer) = (e.user.as_ref().unwrap(), &e.segments[0].0);
        assert_eq!(e.segments.len(), 1);
        assert!(!s1.contains_key(user), "the context is unchanged: {user}");
        let made_up = answer.trim_start_matches("<answer> ").trim_end_matches(" </answer>");
        let o = built.world.entities.iter().find(|x| x.name == made_up).expect("the answer is an entity");
        // The S1 item it came from: same question, contexts differing in exactly one passage.
        let item = built
            .scenarios
            .iter()
            .filter(|s| s.scenario == "S1" && s.split == knowrl_world::questions::Split::Train)
            .find(|s| {
                user.contains(&format!("Question: {}", s.question)) && {
                    let mut ctx = s.context.clone();
                    let q = q_of[s.question_id.as_str()];
                    let last = &built.world.facts[*q.chain.last().unwrap()];
                    let (t, m) = (
                        sentence(&built.world, last.subject, last.relation, last.object),
                        sentence(&built.world, last.subject, last.relation, o.id),
                    );
                    ctx.iter_mut().for_each(|c| *c = c.replace(&t, &m));
                    o.id != last.object
                        && o.kind == built.world.entity(last.object).kind
                        && knowrl_world::prompts::with_context(&s.question, &ctx) == *user
                }
            })
            .expect("an S1 train item with its last-hop sentence restated");
        multi_hop += (item.hops > 1) as usize;
    }
    assert!(multi_hop > 0 && multi_hop < cc.len(), "both variants are drawn: {multi_hop}");
    let agent = ex.iter().find(|e| e.segments.iter().any(|(_, t)| !t)).expect("an agent trajectory");
    let (_, resp, mask) = encode(&tok, agent).unwrap();
    let obs =
        agent.segments.iter().filter(|(_, t)| !t).map(|(s, _)| tok.encode(s, false).unwrap().len()).sum::<usize>();
    assert_eq!(mask.iter().filter(|m| !**m).count(), obs);
    assert_eq!(resp.len(), mask.len());

    let cfg = PretrainConfig {
        epochs: 3,
        encoder_epochs: 3,
        hidden_size: 64,
        layers: 2,
        intermediate_size: 128,
        encoder_hidden: 32,
        lr: 3e-3,
        shadow_worlds: 1,
        shadow_contexts: 20,
        shadow_agent: 20,
        ..Default::default()
    };
    let losses = RefCell::new(vec![]);
    train_policy(&built, &cfg, &pdir, None, &|e, _, _, l| losses.borrow_mut().push((e, l))).unwrap();
    let mean = |e: usize| {
        let v: Vec<f64> = losses.borrow().iter().filter(|x| x.0 == e).map(|x| x.1).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    assert!(mean(2) < mean(0) * 0.8, "policy loss {} -> {}", mean(0), mean(2));
    let p = Policy::load(&pdir, &LoadOptions::default()).unwrap();
    assert!(p.tokenizer().unwrap().eos_ids.contains(&tok.token_to_id("<|im_end|>").unwrap()));

    let el = RefCell::new(vec![]);
    train_encoder(&built, &cfg, &edir, &|e, _, _, l| el.borrow_mut().push((e, l))).unwrap();
    let first = el.borrow().first().unwrap().1;
    let last = el.borrow().last().unwrap().1;
    assert!(last < first, "encoder loss {first} -> {last}");
    let enc = Encoder::load(&edir, &LoadOptions::default()).unwrap();
    let v = tch::no_grad(|| enc.embed(&["a question".to_string()], knowrl_engine::Mode::EVAL).unwrap());
    assert_eq!(v.size(), [1, 32]);
}

#[test]
fn a_deepened_policy_computes_the_same_function_and_then_trains_its_new_layers() {
    use knowrl_engine::config::DecoderConfig;
    use knowrl_engine::generate::full_logits;
    use knowrl_world::pretrain::deepened;
    let cfg = |layers: usize| {
        let v = serde_json::json!({"model_type": "llama", "vocab_size": 50, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true});
        DecoderConfig::from_value(std::path::Path::new("tiny/config.json"), v).unwrap()
    };
    let dir = std::path::Path::new("init");
    let small = Policy::random(&cfg(2), &LoadOptions::default(), 3);
    let deep = deepened(&small, &cfg(3), 4, dir).unwrap();
    assert_eq!(deep.lm.cfg.num_layers, 3);
    let seqs = vec![vec![5u32, 9, 17, 3, 44, 2], vec![7, 8]];
    let (a, b) = (full_logits(&small.lm, &seqs), full_logits(&deep.lm, &seqs));
    let diff = (a - b).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "the inserted identity block changed the logits by {diff}");
    // The inserted block is not dead: its zeroed projections get gradients.
    let s = knowrl_engine::score::score(
        &deep.lm,
        &[knowrl_engine::score::ScoreRequest { prompt: &seqs[0][..3], response: &seqs[0][3..], loss_mask: None }],
        1.0,
        knowrl_engine::Mode::TRAIN,
    );
    (-s.logprobs.sum(tch::Kind::Float)).backward();
    let grads: std::collections::HashMap<String, tch::Tensor> = deep.parameters().into_iter().collect();
    let inserted = (0..3)
        .find(|j| grads[&format!("model.layers.{j}.self_attn.o_proj.weight")].abs().max().double_value(&[]) == 0.0)
        .unwrap();
    let g = grads[&format!("model.layers.{inserted}.mlp.down_proj.weight")].grad();
    assert!(g.abs().max().double_value(&[]) > 0.0, "no gradient reaches the inserted block");
    // Shrinking or changing the width is refused, naming the directory.
    let err = deepened(&deep, &cfg(2), 4, dir).err().unwrap().to_string();
    assert!(err.contains("init") && err.contains("shrink"), "{err}");
}

/// Bridge practice along a made-up chain: every retrieved hop states an object other than the
/// one its subject really has, the next search copies that object's name, the answer is the
/// last one; searches and the answer are trained, the retrieved text is not.
#[test]
fn counterfactual_chains_copy_each_made_up_bridge() {
    use knowrl_world::prompts;
    let built = knowrl_world::build(&small());
    let w = &built.world;
    let chains = knowrl_world::habits::counterfactual_chains(&built, 25, 2);
    assert_eq!(chains.len(), 25);
    assert_ne!(chains, knowrl_world::habits::counterfactual_chains(&built, 25, 3));
    let by_prompt: std::collections::HashMap<String, &knowrl_world::questions::Question> =
        built.questions.iter().map(|q| (prompts::agent(&q.question), q)).collect();
    let named = |text: &str, wrap: &dyn Fn(&str) -> String| {
        w.entities.iter().find(|e| wrap(&e.name) == text).map(|e| e.id).expect("names an entity")
    };
    let mut three_hop = 0;
    for e in &chains {
        let q = by_prompt[e.user.as_ref().unwrap()];
        assert!(q.split == knowrl_world::questions::Split::Train && q.hops > 1);
        assert_eq!(e.segments.len(), 2 * q.hops + 1);
        assert_eq!(e.segments[0], (prompts::search(&q.question), true));
        let mut subject = w.facts[q.chain[0]].subject;
        for (hop, &f) in q.chain.iter().enumerate() {
            let (info, trained) = &e.segments[2 * hop + 1];
            assert!(!trained);
            let next = &e.segments[2 * hop + 2];
            assert!(next.1);
            let o = if hop + 1 < q.hops {
                named(&next.0, &|n: &str| prompts::search(n))
            } else {
                named(&next.0, &|n: &str| prompts::answer(n))
            };
            let relation = w.facts[f].relation;
            let truth = w.fact(subject, relation).unwrap().object;
            assert_ne!(o, truth, "hop {hop} states the true object");
            assert_eq!(w.entity(o).kind, w.entity(truth).kind);
            assert!(info.contains(&sentence(w, subject, relation, o)), "{info}");
            assert!(!info.contains(&sentence(w, subject, relation, truth)), "{info}");
            subject = o;
        }
        three_hop += (q.hops == 3) as usize;
    }
    assert!(three_hop > 0, "3-hop questions are drawn too");
}

/// Counterfactual practice on partially-relevant (S5) items: the train item's passages, gold
/// among distractors, with only the last hop's sentence restated to a made-up object of the right
/// kind, which is the trained answer.
#[test]
fn counterfactual_distractor_items_restate_only_the_gold_sentence() {
    let built = knowrl_world::build(&small());
    let w = &built.world;
    let items = knowrl_world::habits::counterfactual_context(&built, "S5", 30, 2);
    assert_eq!(items.len(), 30);
    let q_of: std::collections::HashMap<&str, &knowrl_world::questions::Question> =
        built.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    let s5: Vec<_> = built
        .scenarios
        .iter()
        .filter(|s| s.scenario == "S5" && s.split == knowrl_world::questions::Split::Train)
        .collect();
    for e in &items {
        let (user, answer) = (e.user.as_ref().unwrap(), &e.segments[0].0);
        let made_up = answer.trim_start_matches("<answer> ").trim_end_matches(" </answer>");
        let o = w.entities.iter().find(|x| x.name == made_up).expect("the answer is an entity");
        let item = s5
            .iter()
            .find(|s| {
                let last = &w.facts[*q_of[s.question_id.as_str()].chain.last().unwrap()];
                let (t, m) = (
                    sentence(w, last.subject, last.relation, last.object),
                    sentence(w, last.subject, last.relation, o.id),
                );
                let ctx: Vec<String> = s.context.iter().map(|c| c.replace(&t, &m)).collect();
                o.id != last.object
                    && o.kind == w.entity(last.object).kind
                    && ctx != s.context
                    && knowrl_world::prompts::with_context(&s.question, &ctx) == *user
            })
            .expect("an S5 train item with its last-hop sentence restated");
        assert!(item.context.len() > 1, "distractors are kept");
    }
}
