//! World v2's knowledge-adapter recipe: what an epoch trains on. PK facts only, in paraphrases
//! and training-only question templates (every evaluated phrasing is held out), agent
//! trajectories that never state a non-PK fact, observations untrained, a fresh draw per epoch.
use knowrl_world::habits::Example;
use knowrl_world::implant::{epoch_examples, qa_templates, states_non_pk_fact, ImplantConfig};
use knowrl_world::questions::TEMPLATES;
use knowrl_world::world::Relation;

mod common;

fn built() -> knowrl_world::Built {
    knowrl_world::build(&common::small(40, 12, 10, 6, 2))
}

#[test]
fn an_epoch_states_pk_facts_only_and_holds_the_question_templates_out() {
    let built = built();
    let cfg = ImplantConfig::default();
    let ex = epoch_examples(&built, &cfg, 0);
    assert!(ex.len() > 100);
    let bad: Vec<&Example> = ex.iter().filter(|e| states_non_pk_fact(&built, e)).collect();
    assert!(bad.is_empty(), "{} examples state a non-PK fact, e.g. {:?}", bad.len(), bad.first());
    // The check can fail: a statement of a non-PK fact, and a non-PK question's gold answer.
    let w = &built.world;
    let f = w.facts.iter().find(|f| !f.pk).unwrap();
    let s = knowrl_world::corpus::sentence(w, f.subject, f.relation, f.object);
    assert!(states_non_pk_fact(&built, &Example { user: None, segments: vec![(s, true)] }));
    let q = built.questions.iter().find(|q| !q.pk_answerable).unwrap();
    let answer = Example {
        user: Some(knowrl_world::prompts::no_tool(&q.question)),
        segments: vec![(knowrl_world::prompts::answer(&q.answer), true)],
    };
    assert!(states_non_pk_fact(&built, &answer));

    // Every PK fact is stated, in at least two distinct phrasings per epoch.
    let texts: Vec<&str> = ex.iter().filter(|e| e.user.is_none()).map(|e| e.segments[0].0.as_str()).collect();
    for f in w.facts.iter().filter(|f| f.pk) {
        let (s, o) = (&w.entity(f.subject).name, &w.entity(f.object).name);
        let forms: std::collections::HashSet<&str> = texts
            .iter()
            .copied()
            .filter(|t| t.len() < 200 && t.contains(s.as_str()) && t.contains(o.as_str()))
            .collect();
        assert!(forms.len() >= 2, "fact {} stated {} ways", f.id, forms.len());
    }
    // No trained question uses a phrasing of the world's question templates.
    let eval_forms: Vec<String> = TEMPLATES.iter().flat_map(|t| t.texts.iter().map(|x| x.replace("{}", ""))).collect();
    for r in [Relation::BornIn, Relation::LocatedIn, Relation::Capital, Relation::FoundedBy] {
        for t in qa_templates(r) {
            assert!(!eval_forms.contains(&t.replace("{}", "")), "{t} is an evaluation template");
        }
    }
    let qa: Vec<&Example> =
        ex.iter().filter(|e| e.user.as_deref().is_some_and(|u| u.starts_with("Answer from memory"))).collect();
    assert!(!qa.is_empty());
    for e in &qa {
        let q = e.user.as_deref().unwrap().rsplit_once("Question: ").unwrap().1;
        assert!(!built.questions.iter().any(|x| x.question == q && x.hops == 1), "{q} is a world question");
    }
    // Observations are never trained; a trajectory of a question with a non-PK hop trains its
    // first search only.
    for e in ex.iter().filter(|e| e.segments.len() > 1) {
        for (text, train) in &e.segments {
            assert!(!(*train && text.contains("<information>")), "an observation is trained");
        }
    }
    let agent_q = |e: &Example| -> Option<&knowrl_world::questions::Question> {
        let u = e.user.as_deref()?;
        built.questions.iter().find(|q| knowrl_world::prompts::agent(&q.question) == u)
    };
    // Search k >= 1 names hop k-1's object, the answer the last one: each is trained only when
    // every hop before it is in PK; search 0 (the question copied) always.
    // (Real trajectories: the first results state hop 0's true fact; made-up chains restate it.)
    let real = |e: &&Example| {
        let f = &w.facts[agent_q(e).unwrap().chain[0]];
        e.segments[1].0.contains(&knowrl_world::corpus::sentence(w, f.subject, f.relation, f.object))
    };
    let searches = |e: &Example| e.segments.iter().filter(|s| s.0.starts_with("<search>")).count();
    let (detours, agent): (Vec<&Example>, Vec<&Example>) =
        ex.iter().filter(|e| agent_q(e).is_some()).filter(real).partition(|e| searches(e) > agent_q(e).unwrap().hops);
    // Detours: a PK 1-hop question, one needless search, the same (true) answer.
    assert!(!detours.is_empty(), "no detour trajectories");
    for e in &detours {
        let q = agent_q(e).unwrap();
        assert!(q.hops == 1 && q.pk_answerable && searches(e) == 2, "{}", q.question);
        assert_eq!(e.segments.last().unwrap().0, knowrl_world::prompts::answer(&q.answer));
        assert_ne!(e.segments[2].0, knowrl_world::prompts::search(&q.question));
    }
    assert!(agent.iter().any(|e| !agent_q(e).unwrap().pk_answerable));
    let mut partial = 0;
    for e in &agent {
        let q = agent_q(e).unwrap();
        for (i, (text, train)) in e.segments.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            let known = q.chain[..i / 2].iter().all(|&f| w.facts[f].pk);
            assert_eq!(*train, known, "{}: segment {i} {text}", q.question);
            partial += (i > 0 && known && !q.pk_answerable) as usize;
        }
    }
    assert!(partial > 0, "no trajectory trains a bridge search before a non-PK hop");
    // Known questions search every hop (tool over-use) and answer.
    let known: Vec<&Example> = agent.iter().copied().filter(|e| agent_q(e).unwrap().pk_answerable).collect();
    assert!(!known.is_empty());
    for e in known {
        let q = agent_q(e).unwrap();
        assert_eq!(e.segments.iter().filter(|s| s.0.starts_with("<search>")).count(), q.hops);
    }
}

#[test]
fn epochs_are_fresh_draws_and_a_seed_is_deterministic() {
    let built = built();
    let cfg = ImplantConfig::default();
    let (a, b) = (epoch_examples(&built, &cfg, 0), epoch_examples(&built, &cfg, 1));
    assert_ne!(a, b);
    assert_eq!(a, epoch_examples(&built, &cfg, 0));
    let bad = "rank = 16\nalpha = 16.0\ntarget_modules = []\nepochs = 1\nbatch = 1\nlr = 1e-3\nsed = 1\n";
    let e = toml::from_str::<ImplantConfig>(bad).unwrap_err().to_string();
    assert!(e.contains("sed") && e.contains("line 7"), "{e}");
}

#[test]
fn direct_answers_cover_both_boundaries_state_no_non_pk_fact_and_leave_the_rest_of_the_draw() {
    let built = built();
    let w = &built.world;
    let off = ImplantConfig::default();
    let on = ImplantConfig { direct: 40, ..off.clone() };
    let agent_q = |e: &Example| -> Option<&knowrl_world::questions::Question> {
        let u = e.user.as_deref()?;
        built.questions.iter().find(|q| knowrl_world::prompts::agent(&q.question) == u)
    };
    let is_direct = |e: &Example| e.segments.len() == 1 && agent_q(e).is_some();
    let (base, with) = (epoch_examples(&built, &off, 3), epoch_examples(&built, &on, 3));
    assert!(!base.iter().any(is_direct), "the default trains a direct answer");
    let direct: Vec<&Example> = with.iter().filter(|e| is_direct(e)).collect();
    assert_eq!(direct.len(), 40);
    // Everything else is the default's draw (order aside).
    let key = |e: &Example| format!("{e:?}");
    let mut rest: Vec<String> = with.iter().filter(|e| !is_direct(e)).map(key).collect();
    let mut expected: Vec<String> = base.iter().map(key).collect();
    rest.sort();
    expected.sort();
    assert_eq!(rest, expected);
    let (mut known, mut guessed) = (0, 0);
    for e in &direct {
        assert!(!states_non_pk_fact(&built, e), "{e:?}");
        let q = agent_q(e).unwrap();
        let said = &e.segments[0].0;
        if q.pk_answerable {
            assert_eq!(said, &knowrl_world::prompts::answer(&q.answer));
            known += 1;
        } else {
            assert_ne!(said, &knowrl_world::prompts::answer(&q.answer));
            // A guess of the answer's kind.
            let truth = w.entity(w.facts[*q.chain.last().unwrap()].object).kind;
            assert!(w.entities.iter().any(|x| x.kind == truth && said == &knowrl_world::prompts::answer(&x.name)));
            guessed += 1;
        }
    }
    assert!(known > 0 && guessed > 0, "{known} known, {guessed} guessed");
}
