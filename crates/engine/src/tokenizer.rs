//! Tokenizer (HF `tokenizer.json` through the `tokenizers` crate, offline) and chat template
//! (`chat_template.jinja` or `tokenizer_config.json`'s `chat_template`, rendered with minijinja
//! configured the way transformers configures jinja2: trim_blocks, lstrip_blocks, loop controls,
//! `raise_exception`, `strftime_now`, and a `tojson` that matches Python's `json.dumps`).
use crate::error::{read_json, read_to_string, EngineError, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// bos_token, eos_token, pad_token, unk_token, ... as strings, passed to the template.
    special_tokens: BTreeMap<String, String>,
    /// Token ids that end generation (generation_config.json, else config.json, else eos_token).
    pub eos_ids: Vec<u32>,
    pub pad_id: u32,
    file: PathBuf,
}

fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        _ => vec![],
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`,
    /// `generation_config.json`, `config.json` when present) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let file = dir.join("tokenizer.json");
        if !file.exists() {
            return Err(EngineError::Tokenizer { file, msg: "missing (a tokenizer.json is required)".into() });
        }
        let mut inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| EngineError::Tokenizer { file: file.clone(), msg: format!("cannot parse: {e}") })?;
        // Encoders ship fixed padding/truncation for their training setup (MiniLM pads every
        // input to 128); knowrl pads batches itself and masks padding explicitly.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| EngineError::Tokenizer { file: file.clone(), msg: e.to_string() })?;

        let cfg_file = dir.join("tokenizer_config.json");
        let cfg = if cfg_file.exists() { read_json(&cfg_file)? } else { Value::Null };
        let mut special_tokens = BTreeMap::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"] {
            if let Some(s) = cfg.get(key).and_then(token_string) {
                special_tokens.insert(key.to_string(), s);
            }
        }
        let template_file = dir.join("chat_template.jinja");
        let chat_template = if template_file.exists() {
            Some(read_to_string(&template_file)?)
        } else {
            match cfg.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: transformers uses the one named "default".
                Some(Value::Array(a)) => a
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                _ => None,
            }
        };

        let mut eos_ids = vec![];
        for f in ["generation_config.json", "config.json"] {
            let p = dir.join(f);
            if eos_ids.is_empty() && p.exists() {
                eos_ids = ids_of(read_json(&p)?.get("eos_token_id"));
            }
        }
        let id_of = |s: &str| inner.token_to_id(s);
        if eos_ids.is_empty() {
            eos_ids.extend(special_tokens.get("eos_token").and_then(|s| id_of(s)));
        }
        let pad_id =
            special_tokens.get("pad_token").and_then(|s| id_of(s)).or_else(|| eos_ids.first().copied()).unwrap_or(0);
        Ok(Tokenizer { inner, chat_template, special_tokens, eos_ids, pad_id, file })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Tokenizer { file: self.file.clone(), msg: format!("encode: {e}") })?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Tokenizer { file: self.file.clone(), msg: format!("decode: {e}") })
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the chat template exactly as `tokenizer.apply_chat_template(messages,
    /// tokenize=False, add_generation_prompt=...)` does.
    pub fn apply_chat_template(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tpl = self
            .chat_template
            .as_deref()
            .ok_or_else(|| EngineError::Template(format!("{}: the model has no chat template", self.file.display())))?;
        render_chat_template(tpl, messages, add_generation_prompt, &self.special_tokens)
    }
}

/// The chat-template renderer, usable without a tokenizer (tests, prompt presets).
pub fn render_chat_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    special_tokens: &BTreeMap<String, String>,
) -> Result<String> {
    use minijinja::{Environment, Error, ErrorKind, Value as J};
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| EngineError::Template(e.to_string()))?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<J, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> String {
        let now = jiff::Zoned::now();
        now.strftime(&fmt).to_string()
    });
    env.add_filter("tojson", python_tojson);
    env.add_template("chat", template).map_err(|e| EngineError::Template(format!("parse: {e:#}")))?;
    let mut ctx: BTreeMap<String, J> = special_tokens.iter().map(|(k, v)| (k.clone(), J::from(v.clone()))).collect();
    ctx.insert("messages".into(), J::from(minijinja::value::Serde(messages)));
    ctx.insert("add_generation_prompt".into(), J::from(add_generation_prompt));
    ctx.insert("tools".into(), J::from(()));
    ctx.insert("documents".into(), J::from(()));
    env.get_template("chat").and_then(|t| t.render(ctx)).map_err(|e| EngineError::Template(format!("render: {e:#}")))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`,
/// i.e. `", "` and `": "` separators and no HTML escaping (minijinja's own escapes `<`, `>`).
fn python_tojson(
    value: minijinja::Value,
    indent: Option<usize>,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let v: Value = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_py_json(&v, indent, 0, &mut out);
    Ok(minijinja::Value::from_safe_string(out))
}

fn write_py_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let (open_sep, item_sep, close_sep) = match indent {
        Some(n) => (
            format!("\n{}", " ".repeat(n * (depth + 1))),
            format!(",\n{}", " ".repeat(n * (depth + 1))),
            format!("\n{}", " ".repeat(n * depth)),
        ),
        None => (String::new(), ", ".to_string(), String::new()),
    };
    match v {
        Value::Array(a) if !a.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                write_py_json(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        Value::Object(o) if !o.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(": ");
                write_py_json(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
        Value::Number(n) if n.is_f64() => {
            // Python prints floats with a trailing `.0` (1.0, not 1).
            let f = n.as_f64().unwrap();
            if f.fract() == 0.0 && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&n.to_string());
            }
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}
