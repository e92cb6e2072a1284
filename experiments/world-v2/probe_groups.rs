//! Probe: where does GRPO's signal on the world's agent suite point? Samples G trajectories per
//! training question at temperature 1 and prints, per question kind, the rewards by search count,
//! plus Σ advantage × [searches = k] over mixed groups (the direction of the update).
use knowrl_engine::encoder::Encoder;
use knowrl_engine::{LoadOptions, Policy, Rng};
use knowrl_eval::data::{question_task, questions};
use knowrl_retrieval::corpus::Corpus;
use knowrl_retrieval::dense::{DenseIndex, DenseRetriever};
use knowrl_retrieval::flat::{FlatIndex, VecDtype};
use knowrl_rl::agent::{rollout, AgentConfig};
use knowrl_rl::reward::exact_match;
use knowrl_world::questions::Split;
use std::collections::BTreeMap;
use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let world = std::path::PathBuf::from(args.get(1).cloned().unwrap_or("assets/world".into()));
    let n_q: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(24);
    let g: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let policy_dir = args.get(4).cloned().unwrap_or("assets/world/policy".into());
    let policy = Policy::load(std::path::Path::new(&policy_dir), &LoadOptions::default()).unwrap();
    let tok = policy.tokenizer().unwrap();
    let (passages, _) = knowrl_retrieval::corpus::read_corpus(&world.join("corpus.jsonl"), false).unwrap();
    let enc = Encoder::load(&world.join("encoder"), &LoadOptions::default()).unwrap();
    let texts: Vec<&str> = passages.iter().map(|p| p.contents.as_str()).collect();
    let vecs: Vec<tch::Tensor> = texts.chunks(128).map(|c| enc.embed_passages(c).unwrap()).collect();
    let flat = FlatIndex::from_tensor(&tch::Tensor::cat(&vecs, 0), VecDtype::F32);
    let ret = DenseRetriever::new(enc, DenseIndex::Flat(flat), Arc::new(Corpus::Memory(passages)));
    let qs = questions(&world, Split::Train).unwrap();
    let mut rng = Rng::new(7);
    let picks: Vec<_> = (0..n_q).map(|_| qs[rng.below(qs.len())].clone()).collect();
    let cfg = AgentConfig::new(4, 3, 48, 1.0);
    // kind → (searches → (n, correct)), and Σ adv per search count
    let mut table: BTreeMap<String, BTreeMap<usize, (usize, usize)>> = BTreeMap::new();
    let mut signal: BTreeMap<String, BTreeMap<usize, f64>> = BTreeMap::new();
    let mut mixed: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut printed = 0;
    for (qi, q) in picks.iter().enumerate() {
        let task = question_task(q);
        let ids = task.agent.ids(tok).unwrap();
        let prompts = vec![ids; g];
        let mut rngs: Vec<Rng> = (0..g).map(|j| Rng::new(1000 + (qi * g + j) as u64)).collect();
        let trajs = rollout(&policy.lm, tok, &prompts, &ret, &cfg, &mut rngs).unwrap();
        let r: Vec<f64> = trajs
            .iter()
            .map(|t| exact_match(t.answer.as_deref().unwrap_or(""), &q.golden_answers) as u8 as f64)
            .collect();
        let kind = format!("{}hop-min{}", q.hops, q.min_searches);
        let mean = r.iter().sum::<f64>() / g as f64;
        let sd = (r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (g as f64 - 1.0)).sqrt();
        let m = mixed.entry(kind.clone()).or_default();
        m.1 += 1;
        for (t, rr) in trajs.iter().zip(&r) {
            let e = table.entry(kind.clone()).or_default().entry(t.tool_calls()).or_default();
            e.0 += 1;
            e.1 += *rr as usize;
            if sd > 0.0 {
                *signal.entry(kind.clone()).or_default().entry(t.tool_calls()).or_default() += (rr - mean) / sd;
            }
        }
        if sd > 0.0 {
            m.0 += 1;
            if printed < 8 && q.hops == 1 {
                println!("=== {} {kind} gold {:?}", q.question, q.golden_answers);
                for (t, rr) in trajs.iter().zip(&r).filter(|(t, r)| t.tool_calls() > 1 && **r == 0.0).take(2) {
                    printed += 1;
                    println!(
                        "--- r={rr} calls={} len={}\n{}",
                        t.tool_calls(),
                        t.response.len(),
                        t.text.chars().take(900).collect::<String>()
                    );
                }
            }
        }
        eprintln!(
            "{qi}/{n_q} {kind} rewards {:?} calls {:?}",
            r,
            trajs.iter().map(|t| t.tool_calls()).collect::<Vec<_>>()
        );
    }
    println!("\nkind: searches → (n, correct)");
    for (k, v) in &table {
        println!("{k}: {:?}  mixed groups {:?}  Σadv by searches {:?}", v, mixed[k], signal.get(k));
    }
}
