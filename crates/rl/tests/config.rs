//! The train config: every shipped config and preset loads, `[method]` carries the method's own
//! fields (unknown ones named), and the rl crate's files import each other without a loop.
use knowrl_rl::config::{MethodConfig, TrainConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const SHARED: &str = r#"
[model]
path = "m"
[data]
world = "w"
[rollout]
prompts_per_step = 2
group_size = 4
max_turns = 2
topk = 3
max_tokens_per_turn = 8
temperature = 1.0
[algorithm]
name = "grpo"
clip_low = 0.2
clip_high = 0.2
aggregation = "token_mean"
normalisation = "mean_std"
[optim]
lr = 1e-3
weight_decay = 0.0
max_grad_norm = 1.0
micro_batch = 4
[run]
steps = 1
seed = 1
out_dir = "o"
checkpoint_every = 0
"#;

fn parse(method: &str) -> Result<TrainConfig, String> {
    let dir = std::env::temp_dir().join(format!("knowrl-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("c{}.toml", method.len()));
    std::fs::write(&file, format!("{SHARED}{method}")).unwrap();
    TrainConfig::load(&file).map_err(|e| e.to_string())
}

#[test]
fn every_shipped_config_and_preset_loads() {
    let mut files: Vec<PathBuf> = vec![];
    for d in ["configs", "configs/presets"] {
        for e in std::fs::read_dir(root().join(d)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 7, "{files:?}");
    let mut names = BTreeSet::new();
    for f in &files {
        let c = TrainConfig::load(f).unwrap_or_else(|e| panic!("{e}"));
        names.insert(c.method.name());
    }
    assert_eq!(names, ["akbe", "bridge", "grpo", "knowledgeable_r1"].map(String::from).into());
}

#[test]
fn the_method_section_holds_the_methods_fields() {
    assert_eq!(parse("").unwrap().method, MethodConfig::default());
    match parse("[method]\nname = \"akbe\"\nn_wt = 3\n").unwrap().method {
        MethodConfig::Akbe(a) => assert_eq!((a.n_wt, a.n_nt), (3, 4), "given field and default"),
        m => panic!("{m:?}"),
    }
    let e = parse("[method]\nname = \"akbe\"\nn_wtt = 3\n").unwrap_err();
    assert!(e.contains("n_wtt") && e.contains(".toml"), "{e}");
    let e = parse("[method]\nname = \"grpo\"\nlambda = 1\n").unwrap_err();
    assert!(e.contains("lambda"), "{e}");
    let e = parse("[method]\nname = \"akbee\"\n").unwrap_err();
    assert!(e.contains("akbee"), "{e}");
    // The method's own validation, against the shared sections: BRIDGE needs k > m.
    let e = parse("[method]\nname = \"bridge\"\nk = 3\n").unwrap_err();
    assert!(e.contains("method.k") && e.contains("topk = 3"), "{e}");
    assert!(parse("[method]\nname = \"bridge\"\nk = 4\n").is_ok());
}

#[test]
fn data_scenarios_accepts_the_worlds_names_and_names_the_field_otherwise() {
    let mut c = parse("").unwrap();
    c.data.scenarios = vec!["S1".into(), "S2p".into()];
    assert_eq!(c.validate(), Ok(()));
    c.data.scenarios = vec!["S1".into(), "S6".into()];
    let e = c.validate().unwrap_err();
    assert!(e.contains("data.scenarios") && e.contains("\"S6\"") && e.contains("S2p"), "{e}");
}

/// The modules a file's code names through `crate::` (`use crate::a::B`, `use crate::{a, b::C}`,
/// `crate::a::f(…)`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                // Top-level entries of the brace group.
                let (mut depth, mut start) = (0, 0);
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            out.insert(ident(&group[start..j]));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.insert(ident(&group[start..j]));
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
            }
            None => {
                out.insert(ident(rest));
            }
        }
    }
    out.remove("");
    out
}

/// Which files of crates/rl/src each file imports (lib.rs, the module list, left out).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("crates/rl/src");
    let files: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .filter(|f| f != "lib")
        .collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(src.join(format!("{f}.rs"))).unwrap();
        // Unit tests may reach anywhere; only the file's own code counts.
        let code = text.split("#[cfg(test)]").next().unwrap();
        let deps = crate_refs(code).into_iter().filter(|d| d != f && files.contains(d)).collect();
        graph.insert(f.clone(), deps);
    }
    graph
}

#[test]
fn the_rl_files_import_each_other_without_a_loop() {
    let graph = imports();
    assert_eq!(
        crate_refs("use crate::{a::B, b, c::{D, E}};\nlet x = crate::d::f();"),
        ["a", "b", "c", "d"].map(String::from).into()
    );
    assert!(graph["akbe"].contains("method") && graph["trainer"].contains("config"), "the parser sees imports");
    for m in ["grpo", "knowledgeable_r1", "akbe", "bridge"] {
        assert!(!graph[m].contains("trainer"), "{m} imports the trainer");
        assert!(!graph[m].contains("config"), "{m} imports config (which lists the methods)");
    }
    // Depth-first search for a cycle.
    fn visit<'a>(
        n: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == n) {
            panic!("import loop: {}", path[i..].join(" -> ") + " -> " + n);
        }
        if done.contains(n) {
            return;
        }
        path.push(n);
        for d in &g[n] {
            visit(d, g, path, done);
        }
        path.pop();
        done.insert(n);
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        visit(n, &graph, &mut vec![], &mut done);
    }
}

#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;

/// Train configs under seeded mutations of a shipped one: no input panics, and every rejection
/// names the file (and the line or field).
#[test]
fn mutated_configs_never_panic_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("knowrl-config-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mutant.toml");
    let mut total = (0, 0);
    for (seed, shipped) in ["configs/world-akbe.toml", "configs/world-bridge.toml"].iter().enumerate() {
        let valid = std::fs::read(root().join(shipped)).unwrap();
        let (tried, rejected) = engine_common::fuzz(
            &engine_common::mutations(&valid, 1500, 8 + seed as u64),
            |b| {
                std::fs::write(&file, b).unwrap();
                TrainConfig::load(&file).map(|_| ())
            },
            |msg| msg.contains("mutant.toml") && (msg.contains("line") || msg.contains("field") || msg.contains("UTF")),
        );
        total = (total.0 + tried, total.1 + rejected);
    }
    println!("train configs: {} inputs, {} rejected", total.0, total.1);
    assert!(total.1 > total.0 / 4);
    let _ = std::fs::remove_dir_all(&dir);
}
