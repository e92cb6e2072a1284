//! Parity with Hugging Face on real weights: SmolLM2-135M-Instruct logits and greedy
//! continuations (transformers), all-MiniLM-L6-v2 embeddings (sentence-transformers), and
//! chat-template rendering (apply_chat_template).
mod common;
use common::*;
use knowrl_engine::encoder::Encoder;
use knowrl_engine::generate::generate;
use knowrl_engine::sampling::SamplingParams;
use knowrl_engine::tokenizer::{render_chat_template, Message};
use knowrl_engine::weights::read_all;
use knowrl_engine::{LoadOptions, Policy};
use serde_json::json;
use std::collections::BTreeMap;

fn chat(p: &Policy, user: &str) -> Vec<u32> {
    let tok = p.tokenizer().unwrap();
    let text = tok.apply_chat_template(&[Message::new("user", user)], true).unwrap();
    tok.encode(&text, false).unwrap()
}

#[test]
fn smollm2_logits_and_greedy_match_transformers() {
    tch::set_num_threads(2);
    let dir = real_model("smollm2-135m-instruct");
    let policy = Policy::load(&dir, &LoadOptions::default()).unwrap();
    let tok = policy.tokenizer().unwrap();
    // Ragged on purpose: lengths differ, so the batch is left-padded for generation.
    let prompts = vec![
        chat(&policy, "What is the capital of France?"),
        chat(&policy, "Name three colours."),
        tok.encode("The quick brown fox", false).unwrap(),
        chat(&policy, "Who wrote the novel Pride and Prejudice, and in which year was it published?"),
    ];
    let tmp = tmpdir("smollm2");
    let out = tmp.join("ref.safetensors");
    run_reference(
        &json!([{ "kind": "logits", "model": dir, "prompts": prompts, "max_new_tokens": 32,
                  "eos": tok.eos_ids, "out": out }]),
        &tmp,
    );
    let reference = read_all(&out).unwrap();

    // Logits: one right-padded batch, uncached.
    let logits = knowrl_engine::generate::full_logits(&policy.lm, &prompts);
    let (mut worst, mut scale): (f64, f64) = (0.0, 0.0);
    for (i, p) in prompts.iter().enumerate() {
        let ours = logits.get(i as i64).narrow(0, 0, p.len() as i64);
        let theirs = &reference[&format!("logits.{i}")];
        worst = worst.max(max_abs_diff(&ours, theirs));
        scale = scale.max(theirs.abs().max().double_value(&[]));
    }
    println!("smollm2 f32 logits: max |Δ| = {worst:.2e}, max |logit| = {scale:.1}");
    // Relative to the largest logit: 30 float32 layers summed in another order than
    // transformers' differ by ~1e-6 of it, and by how much depends on the CPU (MKL picks its
    // kernels per machine: 0.9e-4 on an AMD EPYC, 1.2e-4 on a Sapphire Rapids Xeon, at 38.7).
    // A wrong RoPE, norm or mask is off by 0.1 or more.
    assert!(worst <= 1e-5 * scale.max(1.0), "logit max abs diff {worst} (max |logit| {scale})");

    // Greedy: batched, KV-cached, left-padded; identical tokens.
    let gens =
        generate(&policy.lm, Some(tok), &prompts, &SamplingParams::greedy(32), &[0; 4], &tok.eos_ids, tok.pad_id)
            .unwrap();
    for (i, g) in gens.iter().enumerate() {
        let want: Vec<i64> = Vec::try_from(&reference[&format!("greedy.{i}")]).unwrap();
        let got: Vec<i64> = g.tokens.iter().map(|&t| t as i64).collect();
        assert_eq!(got, want, "prompt {i}: ours {:?} vs HF {:?}", tok.decode(&g.tokens, false), want);
    }
    println!("answer: {}", tok.decode(&gens[0].tokens, true).unwrap());
}

#[test]
fn minilm_embeddings_match_sentence_transformers() {
    tch::set_num_threads(2);
    let dir = real_model("all-minilm-l6-v2");
    let enc = Encoder::load(&dir, &LoadOptions::default()).unwrap();
    let long = "word ".repeat(400); // longer than max_seq_length: truncation must match
    let texts: Vec<String> = [
        "What is the capital of France?",
        "Paris is the capital and most populous city of France.",
        "Mitochondria are the powerhouse of the cell.",
        "a",
        long.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tmp = tmpdir("minilm");
    let out = tmp.join("emb.safetensors");
    run_reference(&json!([{ "kind": "embed", "model": dir, "texts": texts, "out": out }]), &tmp);
    let reference = &read_all(&out).unwrap()["embeddings"];
    let ours = tch::no_grad(|| enc.embed(&texts, knowrl_engine::Mode::EVAL)).unwrap();
    let cos = tch::Tensor::cosine_similarity(&ours, reference, 1, 1e-12);
    let min = cos.min().double_value(&[]);
    println!("minilm: min cosine {min:.8}");
    assert!(min >= 0.99999, "cosines {cos}");
}

const QWEN25_TEMPLATE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

fn template_cases() -> Vec<(Vec<Message>, bool)> {
    let sys = Message::new("system", "Answer with <answer> Beijing </answer> tags.");
    let u = Message::new("user", "  Where was  Ada born? \n");
    let a = Message::new("assistant", "<think>hmm</think>\n<search> Ada birthplace </search>");
    let t = Message::new("tool", "<information>Doc 1(Title: Ada) born in London</information>");
    vec![
        (vec![u.clone()], true),
        (vec![sys.clone(), u.clone()], true),
        (vec![sys.clone(), u.clone(), a.clone()], false),
        (vec![u.clone(), a.clone(), t.clone(), t.clone(), u.clone()], true),
        (vec![Message::new("user", "ünïcødé ✓ \"quotes\"")], false),
    ]
}

#[test]
fn chat_templates_render_like_transformers() {
    let tmp = tmpdir("template");
    let smol = real_model("smollm2-135m-instruct");
    let cases = template_cases();
    let jcases: Vec<_> = cases.iter().map(|(m, g)| json!({"messages": m, "add_generation_prompt": g})).collect();
    let specials = json!({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"});
    run_reference(
        &json!([
            {"kind": "template", "model": smol, "cases": jcases, "out": tmp.join("smol.json")},
            {"kind": "template", "template": QWEN25_TEMPLATE, "special_tokens": specials,
             "cases": jcases, "out": tmp.join("qwen.json")},
        ]),
        &tmp,
    );
    let smol_ref: Vec<String> = serde_json::from_str(&std::fs::read_to_string(tmp.join("smol.json")).unwrap()).unwrap();
    let qwen_ref: Vec<String> = serde_json::from_str(&std::fs::read_to_string(tmp.join("qwen.json")).unwrap()).unwrap();
    let tok = knowrl_engine::Tokenizer::from_dir(&smol).unwrap();
    let specials: BTreeMap<String, String> = serde_json::from_value(specials).unwrap();
    for (i, (m, g)) in cases.iter().enumerate() {
        assert_eq!(tok.apply_chat_template(m, *g).unwrap(), smol_ref[i], "SmolLM2 case {i}");
        assert_eq!(render_chat_template(QWEN25_TEMPLATE, m, *g, &specials).unwrap(), qwen_ref[i], "Qwen2.5 case {i}");
    }
}
