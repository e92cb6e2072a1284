//! `knowrl world pretrain`: the world's tokenizer, tiny policy and tiny retriever, saved as
//! standard HF directories loaded by the same code as real models.
//!
//! - Tokenizer: byte-level BPE trained with the `tokenizers` crate on the world's text, the
//!   Search-R1 tags as single tokens, a ChatML template.
//! - Policy: a Llama-family decoder trained from scratch on `examples` (token-mean
//!   NLL, observation tokens masked, AdamW, cosine schedule).
//! - Retriever: a BertModel trained contrastively (in-batch negatives) on question → first-hop
//!   passage pairs of the train split, so first-hop retrieval is good and later hops are not.
use crate::habits::{
    agent_trajectory, context_item, counterfactual_chains, counterfactual_context, reading_examples, Example,
};
use crate::prompts::{self, CHAT_TEMPLATE};
use crate::questions::{Question, Split};
use crate::Built;
use knowrl_engine::config::{BertConfig, DecoderConfig};
use knowrl_engine::encoder::Encoder;
use knowrl_engine::models::llama::DecoderLm;
use knowrl_engine::optim::{AdamW, AdamWConfig, LrSchedule};
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{LoadOptions, Message, Mode, Policy, Rng, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::Path;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PretrainConfig {
    pub vocab_size: usize,
    pub hidden_size: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub intermediate_size: i64,
    pub epochs: usize,
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
    pub encoder_hidden: i64,
    pub encoder_layers: i64,
    pub encoder_epochs: usize,
    /// Copies of every parametric-knowledge example per epoch (facts are short and few; without
    /// repeats the policy under-fits them: answer NLL 3.4 nats after 20 epochs at 1 copy).
    #[serde(default = "default_fact_repeats")]
    pub fact_repeats: usize,
    /// Context-reading examples per epoch, drawn from the train split's S1/S2/S5 items (they are
    /// long; all ~3000 of them took 2/3 of an epoch's compute).
    #[serde(default = "default_context_examples")]
    pub context_examples: usize,
    /// Shadow worlds (same world config, other seeds) whose passages teach reading: each epoch
    /// uses one of them in turn, so names never repeat often enough to be memorised. Without
    /// them the policy memorised its ~1500 context items instead of learning to copy (S1 EM on
    /// non-PK questions ~0.2).
    #[serde(default)]
    pub shadow_worlds: usize,
    /// Index of the first shadow world. A run continued with `--init` should start past the
    /// worlds its init was trained on: a tiny policy memorises the names of worlds it has seen
    /// (copying the question into the first search fell to 0.00 on an unseen shadow world
    /// after 8 worlds had been cycled for ~50 epochs).
    #[serde(default)]
    pub shadow_first: usize,
    /// Context-reading items (S1/S2/S5) per epoch from the epoch's shadow world.
    #[serde(default)]
    pub shadow_contexts: usize,
    /// Search-agent trajectories per epoch from the epoch's shadow world.
    #[serde(default)]
    pub shadow_agent: usize,
    /// Real-world multi-hop agent trajectories per epoch along a made-up chain: every retrieved
    /// hop names a random entity, which the next search must copy (`habits::counterfactual_chains`;
    /// a new draw each epoch).
    #[serde(default)]
    pub counterfactual_chains: usize,
    /// Real-world S1 items per epoch whose last-hop sentence names a made-up object, the trained
    /// answer (`habits::counterfactual_context`; a new draw each epoch): reading practice on the
    /// real names in the context format.
    #[serde(default)]
    pub counterfactual_contexts: usize,
    /// Train no real-world target that states a non-PK fact (agent trajectories of questions
    /// with a non-PK hop, S1/S5 items of non-PK questions), so the policy's parametric knowledge
    /// is exactly the PK split; reading unknown facts is learnt from shadow worlds.
    #[serde(default)]
    pub pk_only_targets: bool,
}

fn default_fact_repeats() -> usize {
    1
}
fn default_context_examples() -> usize {
    usize::MAX
}

impl Default for PretrainConfig {
    fn default() -> Self {
        PretrainConfig {
            vocab_size: 4000,
            hidden_size: 128,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            intermediate_size: 384,
            epochs: 36,
            batch: 32,
            lr: 3e-3,
            seed: 7,
            encoder_hidden: 96,
            encoder_layers: 2,
            encoder_epochs: 8,
            fact_repeats: 3,
            context_examples: 1500,
            shadow_worlds: 8,
            shadow_first: 0,
            shadow_contexts: 1200,
            shadow_agent: 800,
            counterfactual_chains: 0,
            counterfactual_contexts: 0,
            pk_only_targets: true,
        }
    }
}

pub const TAGS: [&str; 8] =
    ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"];
pub const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Trains the byte-level BPE on the world's text and writes `tokenizer.json`,
/// `tokenizer_config.json` (ChatML template) into `dir`; also an encoder variant with
/// [CLS]/[SEP] into `encoder_dir`.
pub fn train_tokenizer(built: &Built, vocab: usize, dir: &Path, encoder_dir: &Path) -> Result<(), String> {
    use tokenizers::decoders::DecoderWrapper;
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::normalizers::NormalizerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::processors::PostProcessorWrapper;
    use tokenizers::{AddedToken, TokenizerBuilder, TokenizerImpl};
    let e = |x: tokenizers::Error| x.to_string();
    let mut texts: Vec<String> = built.passages.iter().map(|p| p.contents.clone()).collect();
    texts.extend(built.questions.iter().map(|q| q.question.clone()));
    texts.extend(built.questions.iter().map(|q| crate::prompts::agent(&q.question)));
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(SPECIAL.iter().map(|s| AddedToken::from(s.to_string(), true)).collect())
        .build();
    let mut tok: TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper> =
        TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true))))
            .with_post_processor(Some(PostProcessorWrapper::ByteLevel(ByteLevel::new(false, true, true))))
            .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
            .build()
            .map_err(e)?;
    tok.train(&mut trainer, texts.iter()).map_err(e)?;
    tok.add_tokens(TAGS.iter().map(|t| AddedToken::from(t.to_string(), false))).map_err(e)?;
    std::fs::create_dir_all(dir).map_err(|x| x.to_string())?;
    tok.save(dir.join("tokenizer.json"), false).map_err(e)?;
    let cfg = json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                     "unk_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "model_max_length": 1024,
                     "tokenizer_class": "PreTrainedTokenizerFast"});
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&cfg).unwrap())
        .map_err(|x| x.to_string())?;
    // Encoder tokenizer: same vocabulary, [CLS] x [SEP].
    tok.add_special_tokens(["[CLS]", "[SEP]", "[PAD]"].map(|t| AddedToken::from(t.to_string(), true))).map_err(e)?;
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let post = TemplateProcessing::builder()
        .try_single("[CLS] $A [SEP]")
        .map_err(|x| x.to_string())?
        .special_tokens(vec![("[CLS]", id("[CLS]")), ("[SEP]", id("[SEP]"))])
        .build()
        .map_err(|x| x.to_string())?;
    tok.with_post_processor(Some(PostProcessorWrapper::Template(post)));
    std::fs::create_dir_all(encoder_dir).map_err(|x| x.to_string())?;
    tok.save(encoder_dir.join("tokenizer.json"), false).map_err(e)
}

/// Token ids of an example: (prompt, response, loss mask).
pub fn encode(tok: &Tokenizer, ex: &Example) -> knowrl_engine::Result<(Vec<u32>, Vec<u32>, Vec<bool>)> {
    let (prompt, end) = match &ex.user {
        Some(u) => (tok.encode(&tok.apply_chat_template(&[Message::new("user", u)], true)?, false)?, "<|im_end|>"),
        None => (vec![tok.token_to_id("<|endoftext|>").unwrap()], "<|endoftext|>"),
    };
    let (mut resp, mut mask) = (vec![], vec![]);
    for (text, train) in &ex.segments {
        let ids = tok.encode(text, false)?;
        mask.extend(std::iter::repeat_n(*train, ids.len()));
        resp.extend(ids);
    }
    resp.push(tok.token_to_id(end).unwrap());
    mask.push(true);
    Ok((prompt, resp, mask))
}

pub fn policy_config(cfg: &PretrainConfig, vocab: usize) -> serde_json::Value {
    json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
           "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
           "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.hidden_size / cfg.heads,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 1024,
           "tie_word_embeddings": true, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
}

/// The pretraining loss of encoded examples ([`encode`]): token-mean NLL over the trained
/// response tokens (observations masked out).
pub fn sft_loss<'a>(lm: &DecoderLm, batch: impl IntoIterator<Item = &'a (Vec<u32>, Vec<u32>, Vec<bool>)>) -> Tensor {
    let (sum, tokens) = nll(lm, batch);
    sum / tokens
}

/// The summed NLL of the trained tokens (token-mean losses accumulated over micro-batches).
pub fn sft_nll_sum<'a>(lm: &DecoderLm, batch: impl IntoIterator<Item = &'a (Vec<u32>, Vec<u32>, Vec<bool>)>) -> Tensor {
    nll(lm, batch).0
}

/// (summed NLL, count) of the trained response tokens.
fn nll<'a>(lm: &DecoderLm, batch: impl IntoIterator<Item = &'a (Vec<u32>, Vec<u32>, Vec<bool>)>) -> (Tensor, Tensor) {
    let reqs: Vec<ScoreRequest> =
        batch.into_iter().map(|d| ScoreRequest { prompt: &d.0, response: &d.1, loss_mask: Some(&d.2) }).collect();
    let s = score(lm, &reqs, 1.0, Mode::TRAIN);
    (-(&s.logprobs * &s.mask).sum(Kind::Float), s.mask.sum(Kind::Float))
}

/// Trains the policy; `progress(epoch, step, steps, loss)`. Returns the final epoch's mean loss.
/// `init`: continue from these weights (an HF directory with the same tokenizer) instead of a
/// random initialisation.
pub fn train_policy(
    built: &Built,
    cfg: &PretrainConfig,
    dir: &Path,
    init: Option<&Path>,
    progress: &dyn Fn(usize, usize, usize, f64),
) -> knowrl_engine::Result<f64> {
    let tok = Tokenizer::from_dir(dir)?;
    let vocab = tok.vocab_size();
    let mcfg = DecoderConfig::from_value(&dir.join("config.json"), policy_config(cfg, vocab))?;
    let policy = match init {
        Some(d) => {
            let p = Policy::load(d, &LoadOptions::default())?;
            if p.lm.cfg.num_layers == mcfg.num_layers {
                p
            } else {
                deepened(&p, &mcfg, cfg.seed as i64, d)?
            }
        }
        None => Policy::random(&mcfg, &LoadOptions::default(), cfg.seed as i64),
    };
    let mut data: Vec<(Vec<u32>, Vec<u32>, Vec<bool>)> =
        examples(built, cfg).iter().map(|e| encode(&tok, e)).collect::<Result<_, _>>()?;
    let base: Vec<usize> = (0..data.len()).collect();
    // Epoch e trains on the base examples plus shadow world e mod shadow_worlds.
    let mut shadows: Vec<Vec<usize>> = vec![];
    for k in cfg.shadow_first..cfg.shadow_first + cfg.shadow_worlds {
        let wcfg = crate::WorldConfig { seed: shadow_seed(built.config.seed, k), ..built.config.clone() };
        let shadow = crate::build(&wcfg);
        let start = data.len();
        let seed = cfg.seed + k as u64;
        let reading = reading_examples(&shadow, cfg.shadow_contexts, cfg.shadow_agent, seed);
        let contexts = counterfactual_context(built, "S1", cfg.counterfactual_contexts, seed);
        let chains = counterfactual_chains(built, cfg.counterfactual_chains, seed);
        for e in reading.iter().chain(&contexts).chain(&chains) {
            data.push(encode(&tok, e)?);
        }
        shadows.push((start..data.len()).collect());
    }
    let lens: Vec<usize> = data.iter().map(|d| d.0.len() + d.1.len()).collect();
    let last = fit(
        policy.trainable_parameters(),
        Fit { epochs: cfg.epochs, lr: cfg.lr, seed: cfg.seed },
        |epoch, rng| {
            let mut items = base.clone();
            if !shadows.is_empty() {
                items.extend(&shadows[epoch % shadows.len()]);
            }
            length_buckets(&items, &lens, cfg.batch, rng)
        },
        |chunk| Ok(sft_loss(&policy.lm, chunk.iter().map(|&i| &data[i]))),
        progress,
    )?;
    policy.export_hf(&dir.join(".model"), Kind::Float)?;
    for f in ["model.safetensors", "config.json"] {
        std::fs::rename(dir.join(".model").join(f), dir.join(f)).map_err(|e| knowrl_engine::EngineError::io(dir, e))?;
    }
    let _ = std::fs::remove_dir_all(dir.join(".model"));
    let gen = json!({"bos_token_id": tok.token_to_id("<|im_start|>"), "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
                     "pad_token_id": tok.token_to_id("<|endoftext|>")});
    knowrl_engine::fsutil::write_atomic(
        &dir.join("generation_config.json"),
        serde_json::to_string_pretty(&gen).unwrap().as_bytes(),
    )?;
    Ok(last)
}

/// `init` with its layers spread over `mcfg.num_layers` and an identity block in each gap
/// (o_proj and down_proj zero: the block adds nothing to the residual stream), so training
/// continues from the same function with more depth. Everything but the depth must match.
pub fn deepened(init: &Policy, mcfg: &DecoderConfig, seed: i64, dir: &Path) -> knowrl_engine::Result<Policy> {
    let (old, new) = (init.lm.cfg.num_layers, mcfg.num_layers);
    let bad = |what: String| knowrl_engine::EngineError::Invalid(format!("--init {}: {what}", dir.display()));
    if old > new {
        return Err(bad(format!("{old} layers, pretrain.toml `layers` = {new} (a policy can grow, not shrink)")));
    }
    if (init.lm.cfg.hidden_size, init.lm.cfg.intermediate_size, init.lm.cfg.vocab_size)
        != (mcfg.hidden_size, mcfg.intermediate_size, mcfg.vocab_size)
    {
        return Err(bad("hidden_size, intermediate_size and vocabulary must match pretrain.toml".into()));
    }
    let grown = Policy::random(mcfg, &LoadOptions::default(), seed);
    // New layer j holds old layer i when j = i·new/old; the others are the inserted blocks.
    let mut source = vec![None; new as usize];
    (0..old).for_each(|i| source[(i * new / old) as usize] = Some(i));
    let from: std::collections::HashMap<String, Tensor> = init.parameters().into_iter().collect();
    tch::no_grad(|| {
        for (name, mut t) in grown.parameters() {
            let copy_of = match name.strip_prefix("model.layers.").and_then(|r| r.split_once('.')) {
                Some((j, tail)) => match source[j.parse::<usize>().unwrap()] {
                    Some(i) => Some(format!("model.layers.{i}.{tail}")),
                    None if tail.ends_with("o_proj.weight") || tail.ends_with("down_proj.weight") => {
                        let _ = t.zero_();
                        None
                    }
                    None => None,
                },
                None => Some(name.clone()),
            };
            if let Some(n) = copy_of {
                t.copy_(&from[&n]);
            }
        }
    });
    Ok(grown)
}

/// The seed of shadow world `k`: far from any seed a user would pick for the real world.
pub fn shadow_seed(world_seed: u64, k: usize) -> u64 {
    world_seed.wrapping_mul(0x9E37_79B9).wrapping_add(0x5AD0_0000 + k as u64)
}

struct Fit {
    epochs: usize,
    lr: f64,
    seed: u64,
}

/// The loop both models share: per epoch, `batches` (from the run's generator), then per batch
/// loss → backward → clip(1.0) → AdamW (decay 0.01) with warm-up + cosine. Returns the last
/// epoch's mean loss.
fn fit(
    params: Vec<(String, tch::Tensor)>,
    f: Fit,
    mut batches: impl FnMut(usize, &mut Rng) -> Vec<Vec<usize>>,
    loss: impl Fn(&[usize]) -> knowrl_engine::Result<tch::Tensor>,
    progress: &dyn Fn(usize, usize, usize, f64),
) -> knowrl_engine::Result<f64> {
    let mut rng = Rng::new(f.seed);
    let mut opt = AdamW::new(params, AdamWConfig { weight_decay: 0.01, ..Default::default() });
    let (mut step, mut last) = (0u64, 0.0);
    let mut sched = None;
    for epoch in 0..f.epochs {
        let bs = batches(epoch, &mut rng);
        let total = (bs.len() * f.epochs) as u64;
        let sched =
            *sched.get_or_insert(LrSchedule::Cosine { lr: f.lr, warmup: (total / 20).max(1), total, min_ratio: 0.05 });
        let mut sum = 0.0;
        for (b, chunk) in bs.iter().enumerate() {
            let l = loss(chunk)?;
            opt.zero_grad();
            l.backward();
            opt.clip_grad_norm(1.0);
            opt.step(sched.lr_at(step));
            step += 1;
            let v = l.double_value(&[]);
            sum += v;
            progress(epoch, b + 1, bs.len(), v);
        }
        last = sum / bs.len().max(1) as f64;
    }
    Ok(last)
}

/// Batches of `items` with similar lengths (less padding): shuffle, sort windows of 50 batches
/// by length, cut into batches, shuffle the batches.
pub(crate) fn length_buckets(items: &[usize], lens: &[usize], batch: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut order = items.to_vec();
    crate::shuffle(&mut order, rng);
    let mut batches: Vec<Vec<usize>> = vec![];
    for window in order.chunks_mut(batch * 50) {
        window.sort_by_key(|&i| lens[i]);
        batches.extend(window.chunks(batch).map(<[usize]>::to_vec));
    }
    crate::shuffle(&mut batches, rng);
    batches
}

/// Question → first-hop gold passage pairs (train split) for the retriever.
pub fn retrieval_pairs(built: &Built, split: Split, hop: usize) -> Vec<(String, String)> {
    let by_id: std::collections::HashMap<String, &str> =
        built.passages.iter().map(|p| (p.id.clone(), p.contents.as_str())).collect();
    built
        .questions
        .iter()
        .filter(|q| q.split == split && q.hops > hop)
        .map(|q| (q.question.clone(), by_id[&format!("e{}", built.world.facts[q.chain[hop]].subject)].to_string()))
        .collect()
}

/// Contrastive training of the tiny BertModel (InfoNCE with in-batch negatives, τ = 0.05).
pub fn train_encoder(
    built: &Built,
    cfg: &PretrainConfig,
    dir: &Path,
    progress: &dyn Fn(usize, usize, usize, f64),
) -> knowrl_engine::Result<f64> {
    let tok = Tokenizer::from_dir(dir)?;
    let bcfg = json!({"architectures": ["BertModel"], "model_type": "bert", "vocab_size": tok.vocab_size(),
                      "hidden_size": cfg.encoder_hidden, "num_hidden_layers": cfg.encoder_layers,
                      "num_attention_heads": 4, "intermediate_size": cfg.encoder_hidden * 4,
                      "max_position_embeddings": 256, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                      "hidden_act": "gelu", "pad_token_id": tok.token_to_id("[PAD]")});
    let bert_cfg = BertConfig::from_value(&dir.join("config.json"), bcfg.clone())?;
    let enc = Encoder::random(&bert_cfg, tok, &LoadOptions::default(), cfg.seed as i64 + 1);
    // "Part of the pairs": cities are never first-hop subjects in training, so the second hop of
    // most chains (a city, searched by name among passages that mention it) stays imperfect —
    // the room BRIDGE's retriever adaptation is meant to use.
    let w = &built.world;
    let pairs: Vec<(String, String)> = retrieval_pairs(built, Split::Train, 0)
        .into_iter()
        .zip(built.questions.iter().filter(|q| q.split == Split::Train))
        .filter(|(_, q)| w.entity(w.facts[q.chain[0]].subject).kind != crate::world::Kind::City)
        .map(|(p, _)| p)
        .collect();
    let last = fit(
        knowrl_engine::weights::by_name(enc.vs.variables()),
        Fit { epochs: cfg.encoder_epochs, lr: 1e-3, seed: cfg.seed ^ 0xE },
        |_, rng| {
            let mut order: Vec<usize> = (0..pairs.len()).collect();
            crate::shuffle(&mut order, rng);
            order.chunks(64).map(<[usize]>::to_vec).collect()
        },
        |chunk| {
            let q: Vec<String> = chunk.iter().map(|&i| pairs[i].0.clone()).collect();
            let p: Vec<String> = chunk.iter().map(|&i| pairs[i].1.clone()).collect();
            let logits = enc.embed(&q, Mode::TRAIN)?.matmul(&enc.embed(&p, Mode::TRAIN)?.tr()) / 0.05;
            let target = tch::Tensor::arange(chunk.len() as i64, (Kind::Int64, tch::Device::Cpu));
            Ok(logits.cross_entropy_for_logits(&target))
        },
        progress,
    )?;
    enc.save(dir, &bcfg)?;
    Ok(last)
}

/// The tiny policy's whole training mix (see `habits` for what each part teaches).
pub fn examples(built: &Built, cfg: &PretrainConfig) -> Vec<Example> {
    let mut rng = Rng::new(cfg.seed ^ 0x004A_B175);
    let w = &built.world;
    let mut out = vec![];
    let text = |s: String| Example { user: None, segments: vec![(s, true)] };
    let chat = |u: String, a: String| Example { user: Some(u), segments: vec![(a, true)] };
    // Parametric knowledge: PK facts as statements and as query-only answers (every template).
    for f in w.facts.iter().filter(|f| f.pk) {
        for _ in 0..cfg.fact_repeats {
            out.push(text(crate::corpus::sentence(w, f.subject, f.relation, f.object)));
            for t in crate::questions::TEMPLATES.iter().filter(|t| t.chain == [f.relation]) {
                for tx in t.texts {
                    let q = tx.replace("{}", &w.entity(f.subject).name);
                    out.push(chat(prompts::query_only(&q), prompts::answer(&w.entity(f.object).name)));
                }
            }
        }
    }
    let train: Vec<&Question> = built.questions.iter().filter(|q| q.split == Split::Train).collect();
    for q in &train {
        if q.pk_answerable {
            if q.hops > 1 {
                out.push(chat(prompts::query_only(&q.question), prompts::answer(&q.answer)));
            }
            out.push(chat(prompts::no_tool(&q.question), prompts::answer(&q.answer)));
        }
        // Tool over-use: search every hop of questions it knows. Questions with a non-PK hop are
        // left out: their trained search queries and answers would teach non-PK facts (query-only
        // EM on non-PK questions rose to 0.16); searching and reading unknown facts is practised
        // on shadow worlds instead (`reading_examples`).
        let mut segments = agent_trajectory(built, q, &mut rng);
        if !q.pk_answerable && cfg.pk_only_targets {
            // Only the first search (the question copied into the query: a name, not a fact) is
            // trained; the rest is context. Without it the policy never learnt to copy names it
            // had never produced and searched for a memorised train-split name instead.
            segments.iter_mut().skip(1).for_each(|s| s.1 = false);
        }
        out.push(Example { user: Some(prompts::agent(&q.question)), segments });
    }
    // Context dominance: answer whatever the context says (S1, S2 incl. multi-conflict, S5).
    // With `pk_only_targets`, only items whose trained answer is not a non-PK fact: PK questions,
    // and counterfactual (S2) items, whose answer is the made-up object.
    let mut reading: Vec<_> = built
        .scenarios
        .iter()
        .filter(|s| s.split == Split::Train && (s.pk_answerable || s.scenario == "S2" || !cfg.pk_only_targets))
        // The paper's scenarios only: S2p repeats S2's items (and would reorder this draw).
        .filter(|s| crate::suites::PAPER_SCENARIOS.contains(&s.scenario.as_str()))
        .collect();
    crate::shuffle(&mut reading, &mut rng);
    for s in
        reading.into_iter().filter(|s| matches!(s.scenario.as_str(), "S1" | "S2" | "S5")).take(cfg.context_examples)
    {
        let target = match s.scenario.as_str() {
            "S1" | "S2" | "S5" => s.context_answer.clone(),
            _ => None,
        };
        if let Some(a) = target {
            out.push(context_item(s, &a));
        }
    }
    crate::shuffle(&mut out, &mut rng);
    out
}
