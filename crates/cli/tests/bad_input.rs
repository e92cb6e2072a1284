//! The binary's contract on bad input: a message naming the file and field, exit code 2.
use std::process::Command;

fn knowrl(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_knowrl")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn a_bad_pretraining_recipe_is_named_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("knowrl-bad-recipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/world/config.toml");
    std::fs::copy(assets, dir.join("config.toml")).unwrap();
    std::fs::write(dir.join("implant.toml"), "epochs = 2\nshadow_agnet = 3\n").unwrap();
    let (code, err) = knowrl(&["world", "pretrain", "--world", dir.to_str().unwrap(), "--policy-only"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("implant.toml") && err.contains("line 2") && err.contains("shadow_agnet"), "{err}");
    // The tiny from-scratch recipe is read from pretrain.toml, with the same contract.
    std::fs::write(dir.join("pretrain.toml"), "epochs = 2\nshadow_agnet = 3\n").unwrap();
    let (code, err) =
        knowrl(&["world", "pretrain", "--world", dir.to_str().unwrap(), "--policy-only", "--from-scratch"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pretrain.toml") && err.contains("line 2") && err.contains("shadow_agnet"), "{err}");
    // Nothing was trained or written over.
    assert!(!dir.join("policy").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_model_directory_is_named_and_exits_2() {
    let (code, err) = knowrl(&["eval", "--model", "/nonexistent/model", "--suite", "nq"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/model") && err.matches("not a model directory").count() == 1, "{err}");
}

#[test]
fn a_bad_train_config_is_named_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("knowrl-bad-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/world-akbe.toml");
    let text = std::fs::read_to_string(shipped).unwrap();
    let line = text.lines().position(|l| l.trim() == "[method]").unwrap() + 1;
    let file = dir.join("akbe.toml");
    std::fs::write(&file, text.replacen("n_nt = ", "n_ntt = ", 1)).unwrap();
    let (code, err) = knowrl(&["train", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("akbe.toml") && err.contains(&format!("line {line}")) && err.contains("n_ntt"), "{err}");
    // A method's own validation (BRIDGE needs more candidates than it shows) is named the same way.
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/world-bridge.toml");
    let text = std::fs::read_to_string(shipped).unwrap();
    std::fs::write(&file, text.replacen("k = 10 ", "k = 3 ", 1)).unwrap();
    let (code, err) = knowrl(&["train", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("akbe.toml") && err.contains("method.k"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_signals_checkpoint_is_named_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("knowrl-bad-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("configs/world-akbe.toml")).unwrap();
    let text = text
        .replace(
            "path = \"assets/world/policy\"",
            &format!("path = \"{}\"", root.join("assets/world/policy").display()),
        )
        .replace("world = \"assets/world\"", &format!("world = \"{}\"", root.join("assets/world").display()))
        .replacen(
            "signals = \"online\"",
            "signals = \"offline\"\nsignals_checkpoint = \"/nonexistent/run/checkpoints\"",
            1,
        );
    let file = dir.join("offline.toml");
    std::fs::write(&file, text).unwrap();
    let (code, err) = knowrl(&["train", "--config", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/run/checkpoints"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
