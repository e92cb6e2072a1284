//! Dataset parsers under seeded mutations of valid files: FlashRAG / Search-R1 jsonl rows and a
//! Search-R1 parquet file (the record reader on corrupted pages, footers and snappy blocks).
//! No input panics; every rejection names the file.
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;
use engine_common::{fuzz, mutations, tmpdir};
use knowrl_eval::data::jsonl_tasks;

#[test]
fn dataset_jsonl_never_panics_and_errors_name_the_file_and_line() {
    let dir = tmpdir("fuzz-jsonl");
    let valid = concat!(
        r#"{"id": "test_0", "question": "who wrote hamlet?", "golden_answers": ["Shakespeare", "W. Shakespeare"]}"#,
        "\n",
        r#"{"prompt": [{"role": "user", "content": "Question: q?"}], "reward_model": {"ground_truth": {"target": ["a"]}}}"#,
        "\n",
    );
    let file = dir.join("mutant.jsonl");
    let (tried, rejected) = fuzz(
        &mutations(valid.as_bytes(), 3000, 4),
        |b| {
            std::fs::write(&file, b).unwrap();
            jsonl_tasks(&file).map(|_| ())
        },
        |msg| msg.contains("mutant.jsonl"),
    );
    println!("dataset jsonl: {tried} inputs, {rejected} rejected");
    assert!(rejected > tried / 2);
}

#[test]
fn dataset_parquet_never_panics_and_errors_name_the_file() {
    let dir = tmpdir("fuzz-parquet");
    let valid =
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/search_r1_nq_sample.parquet"))
            .unwrap();
    let file = dir.join("mutant.parquet");
    let (tried, rejected) = fuzz(
        &mutations(&valid, 1500, 5),
        |b| {
            std::fs::write(&file, b).unwrap();
            jsonl_tasks(&file).map(|_| ())
        },
        |msg| msg.contains("mutant.parquet"),
    );
    println!("dataset parquet: {tried} inputs, {rejected} rejected");
    assert!(rejected > 0);
}
