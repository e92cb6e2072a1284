//! The world is deterministic, its oracle labels agree with its corpus, and bad configs are
//! rejected naming the field.
use knowrl_world::config::{default_toml, WorldConfig};
use knowrl_world::corpus::{sentence, PassageKind};
use knowrl_world::questions::Split;
use std::collections::{HashMap, HashSet};

mod common;

fn small() -> WorldConfig {
    common::small(80, 20, 20, 10, 4)
}

/// A scratch directory, removed when dropped.
fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("knowrl-world-{tag}-")).tempdir().unwrap()
}

#[test]
fn same_seed_same_bytes_different_seed_differs() {
    let c = small();
    let (a, b) = (tmp("a"), tmp("b"));
    knowrl_world::build(&c).write(a.path()).unwrap();
    knowrl_world::build(&c).write(b.path()).unwrap();
    let files = ["config.toml", "world.json", "corpus.jsonl", "passages.jsonl", "questions.jsonl", "scenarios.jsonl"];
    for f in files {
        assert_eq!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap(), "{f}");
    }
    let mut c2 = c.clone();
    c2.seed += 1;
    let d = tmp("c");
    knowrl_world::build(&c2).write(d.path()).unwrap();
    for f in ["world.json", "corpus.jsonl", "questions.jsonl"] {
        assert_ne!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(d.path().join(f)).unwrap(), "{f}");
    }
}

#[test]
fn oracle_labels_agree_with_the_corpus() {
    let b = knowrl_world::build(&small());
    let w = &b.world;
    let passages: HashMap<&str, &knowrl_world::corpus::WorldPassage> =
        b.passages.iter().map(|p| (p.id.as_str(), p)).collect();
    assert!(
        b.questions.iter().any(|q| q.hops == 1)
            && b.questions.iter().any(|q| q.hops == 2)
            && b.questions.iter().any(|q| q.hops == 3)
    );
    for q in &b.questions {
        // Labels follow from the facts.
        let missing: Vec<usize> =
            q.chain.iter().enumerate().filter(|(_, f)| !w.facts[**f].pk).map(|(i, _)| i).collect();
        assert_eq!(q.missing_hops, missing);
        assert_eq!(q.pk_answerable, missing.is_empty());
        assert_eq!(q.min_searches, missing.len());
        assert_eq!(q.hops, q.chain.len());
        let last = &w.facts[*q.chain.last().unwrap()];
        assert_eq!(q.answer, w.entity(last.object).name);
        // Consecutive hops connect.
        for pair in q.chain.windows(2) {
            assert_eq!(w.facts[pair[0]].object, w.facts[pair[1]].subject);
        }
        // Every hop (PK or not) has a gold passage stating it.
        for &f in &q.chain {
            let fact = &w.facts[f];
            let p = passages[format!("e{}", fact.subject).as_str()];
            assert!(p.contents.contains(&sentence(w, fact.subject, fact.relation, fact.object)), "{}", q.question);
        }
    }
    // Every counterfactual passage contradicts its fact.
    for p in b.passages.iter().filter(|p| p.kind == PassageKind::Counterfactual) {
        let f = &w.facts[p.fact.unwrap()];
        assert_ne!(f.counterfactual, f.object);
        assert!(p.contents.contains(&sentence(w, f.subject, f.relation, f.counterfactual)));
        assert!(!p.contents.contains(&sentence(w, f.subject, f.relation, f.object)));
    }
    // The knowledge boundary exists: some questions are PK-answerable, some are not, and
    // popular subjects are known more often.
    let pk = b.questions.iter().filter(|q| q.pk_answerable).count();
    assert!(pk > 0 && pk < b.questions.len());
    let known = |popular: bool| {
        let fs: Vec<_> = w.facts.iter().filter(|f| (w.entity(f.subject).popularity >= 0.5) == popular).collect();
        fs.iter().filter(|f| f.pk).count() as f64 / fs.len() as f64
    };
    assert!(known(true) > known(false) + 0.4, "{} vs {}", known(true), known(false));
    // Look-alike names exist and differ from their originals by one character.
    let la: Vec<_> = w.entities.iter().filter(|e| e.lookalike_of.is_some()).collect();
    assert!(!la.is_empty());
    for e in la {
        let o = &w.entity(e.lookalike_of.unwrap()).name;
        assert_eq!(o.len(), e.name.len());
        assert_eq!(o.chars().zip(e.name.chars()).filter(|(a, b)| a != b).count(), 1, "{o} / {}", e.name);
    }
}

#[test]
fn splits_do_not_overlap_and_scenarios_are_consistent() {
    let b = knowrl_world::build(&small());
    let mut by_split: HashMap<Split, HashSet<&str>> = HashMap::new();
    for q in &b.questions {
        by_split.entry(q.split).or_default().insert(q.question.as_str());
    }
    assert_eq!(by_split.len(), 3);
    let (tr, va, te) = (&by_split[&Split::Train], &by_split[&Split::Valid], &by_split[&Split::Test]);
    assert!(tr.is_disjoint(te) && tr.is_disjoint(va) && va.is_disjoint(te));
    let q_by_id: HashMap<&str, &knowrl_world::questions::Question> =
        b.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    let mut seen = HashSet::new();
    for s in &b.scenarios {
        let q = q_by_id[s.question_id.as_str()];
        assert_eq!(s.context.len(), s.context_ids.len());
        let all = s.context.join("\n");
        match s.scenario.as_str() {
            "S1" | "S5" => assert!(all.contains(&q.answer), "{}: answer missing from context", s.id),
            "S2" | "S2p" => {
                let wrong = s.context_answer.as_ref().unwrap();
                assert_ne!(wrong, &q.answer);
                assert!(all.contains(wrong.as_str()), "{}", s.id);
            }
            "S3" => assert!(
                s.context_ids.iter().any(|i| i.starts_with("cf")) && s.context_ids.iter().any(|i| i.starts_with('e'))
            ),
            "S4" => {
                assert!(!all.contains(&format!(" {}.", q.answer)), "{}: irrelevant context states the answer", s.id)
            }
            other => panic!("{other}"),
        }
        if s.scenario == "S4" || s.scenario == "S5" {
            assert_eq!(s.context.len(), b.config.context_size, "{}", s.id);
        }
        seen.insert((s.scenario.clone(), s.variant.clone()));
    }
    for sc in knowrl_world::suites::SCENARIOS {
        for v in ["qa", "mr"] {
            assert!(seen.contains(&(sc.to_string(), v.to_string())), "{sc}-{v} missing");
        }
    }
    assert!(seen.contains(&("S2".into(), "mc".into())) && seen.contains(&("S3".into(), "mc".into())));
    assert!(seen.contains(&("S2p".into(), "mc".into())));
}

#[test]
fn s2p_is_s2_without_the_made_up_source() {
    let b = knowrl_world::build(&small());
    let of = |name: &str| b.scenarios.iter().filter(|s| s.scenario == name).collect::<Vec<_>>();
    let (s2, s2p) = (of("S2"), of("S2p"));
    assert_eq!(s2.len(), s2p.len());
    let sources = ["fan wiki", "travel blog", "forum post", "newsletter", "pamphlet", "almanac"];
    for (a, p) in s2.iter().zip(&s2p) {
        assert_eq!(p.id, a.id.replace("-s2-", "-s2p-"));
        assert_eq!(
            (&p.question_id, &p.variant, &p.context_ids, &p.context_answer, &p.golden_answers, p.split),
            (&a.question_id, &a.variant, &a.context_ids, &a.context_answer, &a.golden_answers, a.split)
        );
        for ((id, cited), plain) in a.context_ids.iter().zip(&a.context).zip(&p.context) {
            if id.starts_with("cf") {
                // Same title; the source's words are gone.
                let title = cited.split_once('\n').unwrap().0;
                assert!(plain.starts_with(&format!("{title}\n")), "{plain}");
                assert!(sources.iter().any(|s| cited.contains(s)), "{cited}");
                assert!(!sources.iter().any(|s| plain.contains(s)), "{plain}");
            } else {
                assert_eq!(cited, plain);
            }
        }
        // The last passage states what the context answers (a chain's end, for mc).
        let stated = p.context_answer.as_deref().unwrap();
        assert!(p.context.last().unwrap().ends_with(&format!(" {stated}.")), "{:?} should state {stated}", p.context);
    }
}

#[test]
fn bad_configs_are_rejected_naming_the_field() {
    let base = default_toml();
    let cases = [
        (base.replace("cities = 24", "cities = 5"), "sizes.cities"),
        (base.replace("\"formed_in\"]", "\"formed_in\", \"married_to\"]"), "relations[7]"),
        (base.replace("pk_rare = 0.15", "pk_rare = 1.5"), "knowledge.pk_rare"),
        (base.replace("test = 0.2", "test = 0.5"), "splits"),
        (base.replace("lookalike_pairs = 6", "lookalike_pairs = 1000"), "lookalike_pairs"),
        (format!("{base}\n[names]\ncountries = [\"Aldoria\", \"aldoria\"]\n"), "names.countries"),
        (base.replace("max_hops = 3", "max_hops = 3\ncolour = \"blue\""), "colour"),
        (base.replace("people = 90", "people = \"many\""), "people"),
    ];
    for (text, field) in cases {
        assert_ne!(text, base, "the `{field}` case no longer edits the default config");
        let e = WorldConfig::from_toml(&text, "w.toml").unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("w.toml"), "expected `{field}` in: {e}");
    }
}

#[test]
fn the_shipped_world_is_what_build_writes_from_its_config() {
    // assets/world (and the tests' assets/tiny-world) must be reproducible by `knowrl world build
    // --config DIR/config.toml` (an older scenarios.jsonl once outlived a generator change
    // unnoticed); assets/world is the embedded default.
    for name in ["world", "tiny-world"] {
        let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets").join(name);
        let c = WorldConfig::load(&assets.join("config.toml")).unwrap();
        if name == "world" {
            assert_eq!(c, WorldConfig::from_toml(default_toml(), "default.toml").unwrap());
        }
        let out = tmp("shipped");
        knowrl_world::build(&c).write(out.path()).unwrap();
        for f in ["config.toml", "world.json", "corpus.jsonl", "passages.jsonl", "questions.jsonl", "scenarios.jsonl"] {
            let same = std::fs::read(out.path().join(f)).unwrap() == std::fs::read(assets.join(f)).unwrap();
            assert!(
                same,
                "assets/{name}/{f} differs from a fresh build: run `knowrl world build --config assets/{name}/config.toml`"
            );
        }
    }
}
