//! Probe (#23, AKBE): does the policy's own confidence separate what it knows from what it does
//! not? For each test question, G answers sampled at temperature 1 and one greedy answer without
//! the tool, under the query-only and AKBE's no-tool prompts. Signals per question: the share of
//! samples giving the modal answer (self-consistency) and the mean per-token log-prob of the
//! samples. Prints, per knowledge class (min_searches 0 = PK, 1, 2+), EM and the signals' means,
//! and each signal's AUROC for PK vs the rest. If a signal separates them, the knowledge boundary
//! is there for a search decision to read; if not, no reward can teach "skip what you know".
//! Under the agent prompt (two turns, a retriever that finds nothing), the share of samples that
//! answer in the first turn without searching: does the search decision itself read the boundary?
//! Usage: probe_boundary [world dir] [G] [policy dir] [prompts, default query_only,no_tool,agent]
use knowrl_engine::{LoadOptions, Policy, Rng};
use knowrl_eval::data::{question_task, questions};
use knowrl_rl::agent::{rollout, AgentConfig};
use knowrl_rl::method::NoTool;
use knowrl_rl::reward::{exact_match, normalize};
use knowrl_world::questions::Split;
use std::collections::HashMap;

/// P(score of a random positive > score of a random negative), ties count ½.
fn auroc(pos: &[f64], neg: &[f64]) -> f64 {
    let mut s = 0.0;
    for p in pos {
        for n in neg {
            s += if p > n {
                1.0
            } else if p == n {
                0.5
            } else {
                0.0
            };
        }
    }
    s / (pos.len() * neg.len()) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let world = std::path::PathBuf::from(args.get(1).cloned().unwrap_or("assets/world".into()));
    let g: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let policy_dir = args.get(3).cloned().unwrap_or("assets/world/policy".into());
    let policy = Policy::load(std::path::Path::new(&policy_dir), &LoadOptions::default()).unwrap();
    let tok = policy.tokenizer().unwrap();
    let qs = questions(&world, Split::Test).unwrap();
    println!("policy {policy_dir}, {} test questions, G = {g}", qs.len());
    let kinds = args.get(4).cloned().unwrap_or("query_only,no_tool,agent".into());
    for prompt_kind in kinds.split(',') {
        // The last turn's search is not run (nor recorded), so the agent gets a second turn.
        let turns = if prompt_kind == "agent" { 2 } else { 1 };
        // class → rows of (greedy EM, sample EM share, modal share, mean token log-prob, share answering without a search)
        let mut rows: Vec<(usize, [f64; 5])> = Vec::new();
        for (qi, q) in qs.iter().enumerate() {
            let task = question_task(q);
            let prompt = match prompt_kind {
                "query_only" => &task.query_only,
                "no_tool" => &task.no_tool,
                _ => &task.agent,
            };
            let ids = prompt.ids(tok).unwrap();
            let greedy = rollout(
                &policy.lm,
                tok,
                std::slice::from_ref(&ids),
                &NoTool,
                &AgentConfig::new(turns, 3, 64, 0.0),
                &mut [Rng::new(1)],
            )
            .unwrap();
            let mut rngs: Vec<Rng> = (0..g).map(|j| Rng::new(5000 + (qi * g + j) as u64)).collect();
            let samples =
                rollout(&policy.lm, tok, &vec![ids; g], &NoTool, &AgentConfig::new(turns, 3, 64, 1.0), &mut rngs)
                    .unwrap();
            let mut counts: HashMap<String, usize> = HashMap::new();
            let mut lp = 0.0;
            let mut em = 0.0;
            let direct = samples.iter().filter(|t| t.tool_calls() == 0 && t.answer.is_some()).count() as f64 / g as f64;
            for t in &samples {
                let a = t.answer.as_deref().unwrap_or("");
                *counts.entry(normalize(a)).or_default() += 1;
                // The policy's own tokens only: observation tokens carry a log-prob of 0.
                let own: Vec<f64> =
                    t.logprobs.iter().zip(&t.loss_mask).filter(|(_, &m)| m).map(|(&x, _)| x as f64).collect();
                lp += own.iter().sum::<f64>() / own.len().max(1) as f64;
                em += exact_match(a, &q.golden_answers) as u8 as f64;
            }
            let modal = *counts.values().max().unwrap() as f64 / g as f64;
            let gem = exact_match(greedy[0].answer.as_deref().unwrap_or(""), &q.golden_answers) as u8 as f64;
            rows.push((q.min_searches.min(2), [gem, em / g as f64, modal, lp / g as f64, direct]));
            eprintln!(
                "{prompt_kind} {qi}/{} class {} greedy EM {gem} modal {modal:.2} lp {:.3}",
                qs.len(),
                q.min_searches,
                lp / g as f64
            );
        }
        println!("\n## {prompt_kind} prompt\n");
        println!(
            "| class | n | greedy EM | sample EM | modal share | mean token log-prob | answers without a search |"
        );
        println!("|---|---|---|---|---|---|---|");
        for c in 0..3 {
            let v: Vec<&[f64; 5]> = rows.iter().filter(|r| r.0 == c).map(|r| &r.1).collect();
            let m = |i: usize| v.iter().map(|x| x[i]).sum::<f64>() / v.len().max(1) as f64;
            let name = ["PK (0 searches needed)", "1 needed", "2+ needed"][c];
            println!("| {name} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} |", v.len(), m(0), m(1), m(2), m(3), m(4));
        }
        let sig =
            |i: usize, pk: bool| -> Vec<f64> { rows.iter().filter(|r| (r.0 == 0) == pk).map(|r| r.1[i]).collect() };
        println!(
            "\nAUROC, PK vs the rest: modal share {:.3}, mean token log-prob {:.3}, answers without a search {:.3}",
            auroc(&sig(2, true), &sig(2, false)),
            auroc(&sig(3, true), &sig(3, false)),
            auroc(&sig(4, true), &sig(4, false))
        );
        // Within the questions it answers right greedily vs wrong: is confidence about correctness?
        let by_em = |i: usize, right: bool| -> Vec<f64> {
            rows.iter().filter(|r| (r.1[0] == 1.0) == right).map(|r| r.1[i]).collect()
        };
        println!(
            "AUROC, greedy right vs wrong: modal share {:.3}, mean token log-prob {:.3}",
            auroc(&by_em(2, true), &by_em(2, false)),
            auroc(&by_em(3, true), &by_em(3, false))
        );
    }
}
