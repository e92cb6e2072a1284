//! Probe helper (#23, AKBE): writes, per question of every split, the token ids of its agent and
//! query-only prompts, the world's knowledge boundary (hops, min_searches, pk_answerable) and
//! whether the policy's greedy query-only answer is right (and its tokens), as JSON lines on stdout. The hidden
//! states at the agent prompt's last token are then probed by `probe_hidden_boundary.py`.
//! Usage: dump_prompts [world dir] [policy dir]
use knowrl_engine::{LoadOptions, Policy, Rng};
use knowrl_eval::data::{question_task, questions};
use knowrl_rl::agent::{rollout, AgentConfig};
use knowrl_rl::method::NoTool;
use knowrl_rl::reward::exact_match;
use knowrl_world::questions::Split;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let world = std::path::PathBuf::from(args.get(1).cloned().unwrap_or("assets/world".into()));
    let policy_dir = args.get(2).cloned().unwrap_or("assets/world/policy".into());
    let policy = Policy::load(std::path::Path::new(&policy_dir), &LoadOptions::default()).unwrap();
    let tok = policy.tokenizer().unwrap();
    for split in [Split::Train, Split::Valid, Split::Test] {
        let qs = questions(&world, split).unwrap();
        for (qi, q) in qs.iter().enumerate() {
            let task = question_task(q);
            let agent = task.agent.ids(tok).unwrap();
            let qo = task.query_only.ids(tok).unwrap();
            let greedy = rollout(
                &policy.lm,
                tok,
                std::slice::from_ref(&qo),
                &NoTool,
                &AgentConfig::new(1, 3, 64, 0.0),
                &mut [Rng::new(1)],
            )
            .unwrap();
            let answer = greedy[0].answer.clone().unwrap_or_default();
            let em = exact_match(&answer, &q.golden_answers);
            println!(
                "{}",
                serde_json::json!({"id": q.id, "split": format!("{split:?}"), "hops": q.hops,
                    "min_searches": q.min_searches, "pk": q.pk_answerable, "qo_em": em,
                    "qo_answer": answer, "agent_ids": agent, "qo_ids": qo,
                    "qo_response": greedy[0].response})
            );
            eprintln!("{split:?} {qi}/{}", qs.len());
        }
    }
}
