//! The engine's parsers of untrusted files under seeded mutations of valid inputs (flipped,
//! deleted, inserted and duplicated bytes, truncations, random bytes): a safetensors file, a
//! model's config.json and a tokenizer.json. No input panics; every rejection names the file.
mod common;
use common::*;
use knowrl_engine::config::DecoderConfig;
use knowrl_engine::{weights, Tokenizer};

#[test]
fn safetensors_headers_never_panic_and_errors_name_the_file() {
    let dir = tmpdir("fuzz-safetensors");
    let valid = dir.join("valid.safetensors");
    let t = |n: i64| tch::Tensor::arange(n, (tch::Kind::Float, tch::Device::Cpu)).view([2, n / 2]);
    weights::write_atomic(&valid, &[("a.weight".into(), t(8)), ("b.bias".into(), t(4))]).unwrap();
    let bytes = std::fs::read(&valid).unwrap();
    let file = dir.join("mutant.safetensors");
    let (tried, rejected) = fuzz(
        &mutations(&bytes, 2000, 1),
        |b| {
            std::fs::write(&file, b).unwrap();
            weights::read_all(&file).map(|_| ())
        },
        |msg| msg.contains("mutant.safetensors"),
    );
    println!("safetensors: {tried} inputs, {rejected} rejected");
    assert!(rejected > tried / 2, "most mutations of a header are invalid ({rejected}/{tried})");
}

#[test]
fn config_json_never_panics_and_errors_name_the_file() {
    let dir = tmpdir("fuzz-config");
    let valid = std::fs::read(repo_root().join("assets/tiny-world/policy/config.json")).unwrap();
    let (tried, rejected) = fuzz(
        &mutations(&valid, 2000, 2),
        |b| {
            std::fs::write(dir.join("config.json"), b).unwrap();
            DecoderConfig::from_dir(&dir).map(|_| ())
        },
        |msg| msg.contains("config.json"),
    );
    println!("config.json: {tried} inputs, {rejected} rejected");
    assert!(rejected > tried / 4);
}

#[test]
fn tokenizer_json_never_panics_and_errors_name_the_file() {
    let dir = tmpdir("fuzz-tokenizer");
    let src = repo_root().join("assets/tiny-world/policy");
    std::fs::copy(src.join("tokenizer_config.json"), dir.join("tokenizer_config.json")).unwrap();
    let valid = std::fs::read(src.join("tokenizer.json")).unwrap();
    let (tried, rejected) = fuzz(
        &mutations(&valid, 300, 3),
        |b| {
            std::fs::write(dir.join("tokenizer.json"), b).unwrap();
            Tokenizer::from_dir(&dir).map(|_| ())
        },
        |msg| msg.contains("tokenizer.json"),
    );
    println!("tokenizer.json: {tried} inputs, {rejected} rejected");
    assert!(rejected > 0);
}
