//! World v2's policy: a pretrained reader (SmolLM2-135M-Instruct by default) with the world's
//! parametric knowledge implanted by a LoRA, saved as a PEFT adapter.
//!
//! What the adapter is trained on, each epoch a fresh draw (`epoch_examples`):
//! - **PK facts, and only those**, as paraphrased statements and biography-style passages
//!   (knowledge stored so that it can be extracted under new phrasings: Allen-Zhu & Li, "Physics
//!   of Language Models: Part 3.1", arXiv 2309.14316), plus query-only QA in *training-only*
//!   question templates (`QA_TEMPLATES`, disjoint from the world's `questions::TEMPLATES`), so
//!   every evaluated question is a held-out phrasing.
//! - **Formats**: the world's answer tags, the no-tool format on PK questions, and Search-R1
//!   search-agent trajectories that search every hop, PK questions included (the tool over-use
//!   AKBE removes; `direct` adds answers without a search, on any question, for probes that
//!   need an agent which explores skipping it); observation tokens are masked out of the loss.
//! - **Reading**, which fact training alone destroys (a PEFT probe followed a counterfactual
//!   context 0.00 of the time after 6 fact epochs, against 0.78 for the base model): context
//!   items answered with what the context says, S2 counterfactual contexts included (context
//!   dominance, what Knowledgeable-R1 removes), and shadow-world contexts and trajectories, whose
//!   names are all new.
//!
//! No target states a non-PK fact of the real world: an agent trajectory trains a search or
//! its answer only when every hop before it is in PK (the first search copies the question),
//! context items are those of PK questions or counterfactual ones, made-up chains and shadow
//! worlds state no real fact.
use crate::habits::{
    agent_trajectory, context_item, counterfactual_chains, detour_trajectory, reading_examples, Example,
};
use crate::pretrain::{encode, sft_nll_sum, shadow_seed};
use crate::prompts;
use crate::questions::{Question, Split};
use crate::world::{Fact, Relation, World};
use crate::Built;
use knowrl_engine::optim::{AdamW, AdamWConfig, LrSchedule};
use knowrl_engine::{LoadOptions, LoraConfig, Policy, Rng};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The recipe (`WORLD/implant.toml`; unknown fields are errors).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImplantConfig {
    /// Base model: a directory name under `$KNOWRL_MODELS` (`scripts/fetch-real-models`).
    pub base: String,
    pub rank: i64,
    pub alpha: f64,
    pub target_modules: Vec<String>,
    pub epochs: usize,
    /// Examples per optimiser step.
    pub batch: usize,
    /// Peak learning rate (linear warm-up over 5% of the steps, cosine to 5%).
    pub lr: f64,
    pub seed: u64,
    /// Paraphrased statements per PK fact per epoch (distinct paraphrases while they last).
    pub statements: usize,
    /// Biography-style passages per entity with PK facts per epoch (its PK facts, shuffled,
    /// each in a random paraphrase).
    pub biographies: usize,
    /// Query-only QA items per PK fact per epoch, in training-only templates.
    pub qa: usize,
    /// Real-world context items per epoch (S1/S5 of PK questions, S2 of any question).
    pub contexts: usize,
    /// Real-world agent trajectories per epoch (train split).
    pub agent: usize,
    /// Real-world multi-hop trajectories per epoch along made-up chains (`habits::counterfactual_chains`).
    pub chains: usize,
    /// No-tool answers per epoch (PK-answerable train questions).
    pub no_tool: usize,
    /// Shadow-world context items and agent trajectories per epoch (a new shadow world each epoch).
    pub shadow_contexts: usize,
    pub shadow_agent: usize,
    /// 1-hop trajectories with one needless search before the (unchanged) answer
    /// (`habits::detour_trajectory`) per epoch: PK train questions of the real world, and
    /// questions of the shadow world.
    #[serde(default)]
    pub detours: usize,
    #[serde(default)]
    pub shadow_detours: usize,
    /// Agent-prompt answers given without a search, per epoch (`direct_answer`): train questions
    /// drawn whatever their boundary, so that the agent samples an answer without a search now
    /// and then, on questions it knows and on questions it does not alike, and RL has a choice
    /// to reinforce. 0 (the shipped adapter): every trained trajectory searches.
    #[serde(default)]
    pub direct: usize,
    /// The tiny retriever (trained on the world; see `pretrain::train_encoder`).
    pub encoder_vocab: usize,
    pub encoder_hidden: i64,
    pub encoder_layers: i64,
    pub encoder_epochs: usize,
}

impl Default for ImplantConfig {
    fn default() -> Self {
        ImplantConfig {
            base: "smollm2-135m-instruct".into(),
            rank: 16,
            alpha: 16.0,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
            epochs: 7,
            batch: 16,
            lr: 1e-3,
            seed: 7,
            statements: 4,
            biographies: 1,
            qa: 2,
            contexts: 30,
            agent: 60,
            chains: 24,
            no_tool: 30,
            shadow_contexts: 20,
            shadow_agent: 30,
            detours: 20,
            shadow_detours: 30,
            direct: 0,
            encoder_vocab: 4000,
            encoder_hidden: 96,
            encoder_layers: 2,
            encoder_epochs: 8,
        }
    }
}

impl ImplantConfig {
    pub fn lora(&self) -> LoraConfig {
        LoraConfig { rank: self.rank, alpha: self.alpha, dropout: 0.0, target_modules: self.target_modules.clone() }
    }

    /// The tiny-retriever fields in the shape `pretrain::train_encoder` takes.
    pub fn encoder_recipe(&self) -> crate::pretrain::PretrainConfig {
        crate::pretrain::PretrainConfig {
            vocab_size: self.encoder_vocab,
            encoder_hidden: self.encoder_hidden,
            encoder_layers: self.encoder_layers,
            encoder_epochs: self.encoder_epochs,
            seed: self.seed,
            ..Default::default()
        }
    }
}

/// Statements of `r(s) = o` (`{s}`, `{o}`); the first is the corpus's own sentence.
fn paraphrases(r: Relation) -> &'static [&'static str] {
    match r {
        Relation::BornIn => &[
            "{s} was born in {o}.",
            "{s} is a native of {o}.",
            "The birthplace of {s} is {o}.",
            "{o} is where {s} was born.",
            "Born in {o}, {s} spent a childhood there.",
        ],
        Relation::LocatedIn => &[
            "{s} is a city in {o}.",
            "{s} lies in {o}.",
            "The city of {s} is located in {o}.",
            "{o} is the country where {s} is found.",
            "{s} belongs to the country {o}.",
        ],
        Relation::Capital => &[
            "The capital of {s} is {o}.",
            "{o} is the capital city of {s}.",
            "{s} has its capital at {o}.",
            "The seat of government of {s} is {o}.",
        ],
        Relation::FoundedBy => &[
            "{s} was founded by {o}.",
            "{o} founded {s}.",
            "The founder of {s} is {o}.",
            "{o} started the company {s}.",
        ],
        Relation::HeadquarteredIn => &[
            "{s} is headquartered in {o}.",
            "{s} has its headquarters in {o}.",
            "The head office of {s} is in {o}.",
            "{s} is run from its offices in {o}.",
        ],
        Relation::MemberOf => &[
            "{s} is a member of the band {o}.",
            "{s} plays in {o}.",
            "{s} belongs to the band {o}.",
            "The band {o} counts {s} among its members.",
        ],
        Relation::FormedIn => &[
            "{s} were formed in {o}.",
            "The band {s} was formed in {o}.",
            "{s} got together in {o}.",
            "{o} is the city where {s} started out.",
        ],
    }
}

/// Training-only question templates (`{}` = the subject), none of them a phrasing of
/// `questions::TEMPLATES`: PK is measured on held-out templates only.
pub fn qa_templates(r: Relation) -> &'static [&'static str] {
    match r {
        Relation::BornIn => &["Tell me the city where {} was born.", "{} was born in which city?"],
        Relation::LocatedIn => &["Name the country that {} is in.", "{} lies in which country?"],
        Relation::Capital => &["Name the capital city of {}.", "{} has which city as its capital?"],
        Relation::FoundedBy => &["Name the person who founded {}.", "{} was founded by whom?"],
        Relation::HeadquarteredIn => {
            &["Name the city where {} has its head office.", "{} has its headquarters in which city?"]
        }
        Relation::MemberOf => &["Name the band that {} belongs to.", "{} plays in which band?"],
        Relation::FormedIn => &["Name the city where the band {} got together.", "{} was formed in which city?"],
    }
}

fn say(w: &World, f: &Fact, template: &str) -> String {
    template.replace("{s}", &w.entity(f.subject).name).replace("{o}", &w.entity(f.object).name)
}

/// Epoch `epoch`'s examples (a fresh draw of paraphrases, items and shadow world per epoch).
pub fn epoch_examples(built: &Built, cfg: &ImplantConfig, epoch: usize) -> Vec<Example> {
    let mut rng = Rng::new(cfg.seed ^ 0x1A7_0000 ^ (epoch as u64).wrapping_mul(0x9E37_79B9));
    let w = &built.world;
    let text = |s: String| Example { user: None, segments: vec![(s, true)] };
    let chat = |u: String, a: String| Example { user: Some(u), segments: vec![(a, true)] };
    let mut out = vec![];
    let pk: Vec<&Fact> = w.facts.iter().filter(|f| f.pk).collect();
    for f in &pk {
        let forms = paraphrases(f.relation);
        let mut order: Vec<usize> = (0..forms.len()).collect();
        crate::shuffle(&mut order, &mut rng);
        for k in 0..cfg.statements {
            out.push(text(say(w, f, forms[order[k % forms.len()]])));
        }
        let qs = qa_templates(f.relation);
        for _ in 0..cfg.qa {
            let q = qs[rng.below(qs.len())].replace("{}", &w.entity(f.subject).name);
            out.push(chat(prompts::query_only(&q), prompts::answer(&w.entity(f.object).name)));
        }
    }
    for e in &w.entities {
        let mut facts: Vec<&Fact> = pk.iter().copied().filter(|f| f.subject == e.id).collect();
        if facts.is_empty() {
            continue;
        }
        for _ in 0..cfg.biographies {
            crate::shuffle(&mut facts, &mut rng);
            let mut bio = crate::corpus::intro(w, e.id);
            for f in &facts {
                let forms = paraphrases(f.relation);
                bio.push(' ');
                bio.push_str(&say(w, f, forms[rng.below(forms.len())]));
            }
            out.push(text(bio));
        }
    }
    let mut train: Vec<&Question> = built.questions.iter().filter(|q| q.split == Split::Train).collect();
    crate::shuffle(&mut train, &mut rng);
    for q in train.iter().filter(|q| q.pk_answerable).take(cfg.no_tool) {
        out.push(chat(prompts::no_tool(&q.question), prompts::answer(&q.answer)));
    }
    for q in train.iter().take(cfg.agent) {
        let mut segments = agent_trajectory(built, q, &mut rng);
        // Segments: search 0, its results, search 1, …, the answer. Search k ≥ 1 names hop
        // k−1's object and the answer names the last one, so each is trained only when every
        // hop before it is in PK; search 0 copies the question (a name, not a fact). Training
        // only search 0 of every question with a non-PK hop left the agent answering after one
        // search: 28 of 39 2-hop test questions never searched their bridge.
        for (i, s) in segments.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
            s.1 = q.chain[..i / 2].iter().all(|&f| w.facts[f].pk);
        }
        out.push(Example { user: Some(prompts::agent(&q.question)), segments });
    }
    // Bridge practice on the real names: multi-hop trajectories along a made-up chain (every
    // retrieved hop names a random entity, which the next search copies; the answer is made up).
    // A made-up chain can end, by chance, on the true answer of a non-PK question: left out.
    let chains = counterfactual_chains(built, cfg.chains, cfg.seed ^ ((epoch as u64) << 8));
    out.extend(chains.into_iter().filter(|e| !states_non_pk_fact(built, e)));
    let mut items: Vec<_> = built
        .scenarios
        .iter()
        .filter(|s| {
            s.split == Split::Train
                && s.context_answer.is_some()
                && match s.scenario.as_str() {
                    "S1" | "S5" => s.pk_answerable,
                    "S2" => true,
                    _ => false,
                }
        })
        .collect();
    crate::shuffle(&mut items, &mut rng);
    for s in items.into_iter().take(cfg.contexts) {
        out.push(context_item(s, s.context_answer.as_deref().unwrap()));
    }
    let shadow_cfg = crate::WorldConfig { seed: shadow_seed(built.config.seed, epoch), ..built.config.clone() };
    let shadow = crate::build(&shadow_cfg);
    out.extend(reading_examples(&shadow, cfg.shadow_contexts, cfg.shadow_agent, cfg.seed + epoch as u64));
    let one_hop = |b: &'_ Built, pk_only: bool| -> Vec<Question> {
        b.questions
            .iter()
            .filter(|q| q.hops == 1 && q.split == Split::Train && (q.pk_answerable || !pk_only))
            .cloned()
            .collect()
    };
    for (world, mut pool, n) in
        [(built, one_hop(built, true), cfg.detours), (&shadow, one_hop(&shadow, false), cfg.shadow_detours)]
    {
        crate::shuffle(&mut pool, &mut rng);
        for q in pool.iter().cycle().take(if pool.is_empty() { 0 } else { n }) {
            if let Some(segments) = detour_trajectory(world, q, &mut rng) {
                out.push(Example { user: Some(prompts::agent(&q.question)), segments });
            }
        }
    }
    // Its own generator, so that `direct = 0` draws every other item exactly as before it existed.
    let mut direct_rng = Rng::new(cfg.seed ^ 0xD1EC_7000 ^ (epoch as u64).wrapping_mul(0x9E37_79B9));
    crate::shuffle(&mut train, &mut direct_rng);
    for q in train.iter().take(cfg.direct) {
        out.push(Example {
            user: Some(prompts::agent(&q.question)),
            segments: vec![(direct_answer(w, q, &mut direct_rng), true)],
        });
    }
    crate::shuffle(&mut out, &mut rng);
    out
}

/// An answer without a search: the truth when every hop is in PK, else a guess of the answer's
/// kind (an over-confident reader's, as a real model's direct answers are). A guess is never
/// the true object, so no target states a non-PK fact; it is drawn afresh each epoch, so no
/// wrong association is learnt either.
fn direct_answer(w: &World, q: &Question, rng: &mut Rng) -> String {
    let truth = w.facts[*q.chain.last().expect("a question has a hop")].object;
    if q.pk_answerable {
        return prompts::answer(&w.entity(truth).name);
    }
    let pool: Vec<usize> = w.of_kind(w.entity(truth).kind).into_iter().filter(|&e| e != truth).collect();
    prompts::answer(&w.entity(pool[rng.below(pool.len())]).name)
}

/// True when an example's trained text states a real-world fact that is not in PK: a
/// statement of it (any paraphrase), or the gold answer to a real question with a non-PK hop
/// (the recipe's invariant; tests check it on every example of an epoch).
pub fn states_non_pk_fact(built: &Built, ex: &Example) -> bool {
    let w = &built.world;
    let trained: String = ex.segments.iter().filter(|s| s.1).map(|s| s.0.as_str()).collect::<Vec<_>>().join(" ");
    let stated = w
        .facts
        .iter()
        .filter(|f| !f.pk)
        .any(|f| paraphrases(f.relation).iter().any(|t| trained.contains(&say(w, f, t))));
    let question = ex.user.as_deref().and_then(|u| u.rsplit_once("Question: ")).map(|(_, q)| q.trim());
    let answered = question.is_some_and(|text| {
        built
            .questions
            .iter()
            .any(|q| q.question == text && !q.pk_answerable && trained.contains(&prompts::answer(&q.answer)))
    });
    stated || answered
}

/// `progress(epoch, step, steps, loss)`.
pub type Progress<'a> = &'a dyn Fn(usize, usize, usize, f64);

/// Trains the knowledge adapter on `base` and writes it to `out` (PEFT format, with the base's
/// sha256). Returns the last epoch's mean loss.
pub fn train_adapter(
    built: &Built,
    cfg: &ImplantConfig,
    base: &Path,
    out: &Path,
    progress: Progress,
) -> knowrl_engine::Result<f64> {
    let lora = cfg.lora();
    let opts = LoadOptions { lora: Some(lora.clone()), seed: cfg.seed as i64, ..Default::default() };
    let policy = Policy::load(base, &opts)?;
    let tok = policy.tokenizer()?;
    let mut data = vec![];
    let mut epochs = vec![];
    for e in 0..cfg.epochs {
        let start = data.len();
        for ex in epoch_examples(built, cfg, e) {
            data.push(encode(tok, &ex)?);
        }
        epochs.push(start..data.len());
    }
    let lens: Vec<usize> = data.iter().map(|d| d.0.len() + d.1.len()).collect();
    let mut rng = Rng::new(cfg.seed);
    let mut opt = AdamW::new(policy.trainable_parameters(), AdamWConfig { weight_decay: 0.0, ..Default::default() });
    let batches: Vec<Vec<Vec<usize>>> = epochs
        .iter()
        .map(|r| crate::pretrain::length_buckets(&r.clone().collect::<Vec<_>>(), &lens, cfg.batch, &mut rng))
        .collect();
    let total: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let sched = LrSchedule::Cosine { lr: cfg.lr, warmup: (total / 20).max(1), total, min_ratio: 0.05 };
    let (mut step, mut last) = (0u64, 0.0);
    for (epoch, bs) in batches.iter().enumerate() {
        let mut sum = 0.0;
        for (b, chunk) in bs.iter().enumerate() {
            // Token-mean NLL over the batch, accumulated over micro-batches of at most
            // `MICRO_TOKENS` padded tokens: 16 agent trajectories of ~500 tokens held ~16 GB of
            // activations in one pass.
            let trained: usize = chunk.iter().map(|&i| data[i].2.iter().filter(|&&m| m).count()).sum();
            opt.zero_grad();
            let mut v = 0.0;
            for micro in micro_batches(chunk, &lens) {
                let l = sft_nll_sum(&policy.lm, micro.iter().map(|&i| &data[i])) / trained.max(1) as f64;
                l.backward();
                v += l.double_value(&[]);
            }
            opt.clip_grad_norm(1.0);
            opt.step(sched.lr_at(step));
            step += 1;
            sum += v;
            progress(epoch, b + 1, bs.len(), v);
        }
        last = sum / bs.len().max(1) as f64;
    }
    knowrl_engine::adapter::save(out, &lora, &policy.trainable_parameters(), base)?;
    Ok(last)
}

/// Padded tokens per forward pass of the adapter's training (activation memory ~2.5 MB a
/// token for SmolLM2-135M with its 49k-token head).
const MICRO_TOKENS: usize = 2048;

/// `chunk` cut into runs whose padded size (rows × longest row) stays within `MICRO_TOKENS`.
fn micro_batches<'a>(chunk: &'a [usize], lens: &[usize]) -> Vec<&'a [usize]> {
    let (mut out, mut start, mut longest) = (vec![], 0, 0);
    for (k, &i) in chunk.iter().enumerate() {
        let l = longest.max(lens[i]);
        if k > start && l * (k + 1 - start) > MICRO_TOKENS {
            out.push(&chunk[start..k]);
            (start, longest) = (k, lens[i]);
        } else {
            longest = l;
        }
    }
    out.push(&chunk[start..]);
    out
}
