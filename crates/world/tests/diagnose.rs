//! The agent failure funnel on hand-built trajectories of a real 2-hop world question.
use knowrl_world::diagnose::{outcome, results_text, Outcome};

mod common;

#[test]
fn each_trajectory_is_charged_to_its_first_failing_step() {
    let built = knowrl_world::build(&common::small(40, 12, 10, 6, 2));
    let w = &built.world;
    let q = built.questions.iter().find(|q| q.hops == 2).expect("a 2-hop question");
    let (first, bridge) = (w.facts[q.chain[0]].subject, w.facts[q.chain[1]].subject);
    let e = |id: usize| format!("e{id}");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let bridge_name = w.entity(bridge).name.to_uppercase(); // names match case-insensitively
    let both = vec![vec![e(first), "e0".into()], vec!["e1".into(), e(bridge)]];
    let run = |queries: &[String], ids: &[Vec<String>], results: &str, answer: Option<&str>, right: bool| {
        outcome(w, q, queries, ids, results, answer, right)
    };
    let question = s(&[&q.question]);
    let searched = s(&[&q.question, &bridge_name]);
    assert_eq!(run(&[], &[], "", Some(&q.answer), true), Outcome::Right);
    assert_eq!(run(&[], &[], "", Some("x"), false), Outcome::NoSearch);
    assert_eq!(run(&s(&["nobody"]), &[vec![e(first)]], "", None, false), Outcome::NotSearched(0));
    assert_eq!(run(&question, &[vec!["e0".into()]], "", None, false), Outcome::NotRetrieved(0));
    assert_eq!(run(&s(&[&q.question, "nobody"]), &both, "", None, false), Outcome::NotSearched(1));
    assert_eq!(run(&searched, &both[..1], "", None, false), Outcome::NotRetrieved(1));
    let results = "Doc 1(Title: \"A\") A was born in Vobilford.";
    assert_eq!(run(&searched, &both, results, Some("vobilford "), false), Outcome::AnswerFromOtherPassage);
    assert_eq!(run(&searched, &both, results, Some("Pailoumere"), false), Outcome::AnswerNotInResults);
    assert_eq!(run(&searched, &both, results, None, false), Outcome::AnswerNotInResults);
    assert_eq!(Outcome::NotRetrieved(1).key(), "hop2_not_retrieved");
    assert_eq!(Outcome::NotSearched(0).key(), "hop1_not_searched");
    let text = "<search> a </search>\n\n<information>one</information>\n\n<search> b </search>\n\n<information>two</information>\n\n<answer> x </answer>";
    assert_eq!(results_text(text), "one\ntwo");
}
