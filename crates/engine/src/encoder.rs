//! Sentence encoder for dense retrieval: BertModel + pooling (mean over real tokens, or CLS) +
//! optional L2 normalisation + the model family's prefixes (`query: ` / `passage: ` for E5).
//! Reads sentence-transformers' `1_Pooling/config.json`, `modules.json` and
//! `sentence_bert_config.json` when present, so it embeds as sentence-transformers does.
use crate::config::BertConfig;
use crate::error::{read_json, EngineError, Result};
use crate::layers::{LoraConfig, Mode};
use crate::models::bert::Bert;
use crate::policy::{build, is_lora_param, LoadOptions};
use crate::tokenizer::Tokenizer;
use crate::weights;
use serde_json::Value;
use std::path::Path;
use tch::nn::VarStore;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
}

pub struct Encoder {
    pub bert: Bert,
    pub vs: VarStore,
    pub tokenizer: Tokenizer,
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_len: usize,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub lora: Option<LoraConfig>,
}

impl Encoder {
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Encoder> {
        let cfg = BertConfig::from_dir(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        tch::manual_seed(opts.seed); // a fresh query LoRA's draw (see LoadOptions::seed)
        let (vs, bert) = build(opts, |root| Bert::new(root, &cfg, opts.lora.as_ref(), false));
        let files = weights::weight_files(dir)?;
        // Checkpoints saved from BertForX carry a `bert.` prefix; strip it by aliasing.
        let mut named = vs.variables();
        let prefixed = has_prefix(&files[0], "bert.")?;
        if prefixed {
            named = named.into_iter().map(|(k, v)| (format!("bert.{k}"), v)).collect();
        }
        weights::load_into(&files, &named, is_lora_param, |n| {
            n.contains("pooler.") || n.ends_with("position_ids") || n.starts_with("cls.")
        })?;
        let pooling = match read_opt(&dir.join("1_Pooling/config.json"))? {
            Some(p) if p.get("pooling_mode_cls_token").and_then(Value::as_bool) == Some(true) => Pooling::Cls,
            _ => Pooling::Mean,
        };
        let normalize = match read_opt(&dir.join("modules.json"))? {
            Some(m) => m.as_array().is_some_and(|a| {
                a.iter().any(|x| x.get("type").and_then(Value::as_str).is_some_and(|t| t.ends_with("Normalize")))
            }),
            None => true,
        };
        let max_len = read_opt(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .unwrap_or(cfg.max_position_embeddings as u64) as usize;
        Ok(Encoder {
            bert,
            vs,
            tokenizer,
            pooling,
            normalize,
            max_len: max_len.min(cfg.max_position_embeddings as usize),
            query_prefix: String::new(),
            passage_prefix: String::new(),
            lora: opts.lora.clone(),
        })
    }

    /// A randomly initialised encoder (the world's tiny retriever before training).
    pub fn random(cfg: &BertConfig, tokenizer: Tokenizer, opts: &LoadOptions, seed: i64) -> Encoder {
        tch::manual_seed(seed);
        let (vs, bert) = build(opts, |root| Bert::new(root, cfg, opts.lora.as_ref(), true));
        Encoder {
            bert,
            vs,
            tokenizer,
            pooling: Pooling::Mean,
            normalize: true,
            max_len: cfg.max_position_embeddings as usize,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            lora: opts.lora.clone(),
        }
    }

    /// Saves weights (+ `config`) as a BertModel directory that `Encoder::load` and
    /// transformers' `BertModel` read; the caller adds tokenizer files.
    pub fn save(&self, dir: &Path, config: &Value) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        let params = weights::by_name(self.vs.variables().into_iter().filter(|(n, _)| !is_lora_param(n)));
        weights::write_atomic(&dir.join("model.safetensors"), &params)?;
        crate::fsutil::write_atomic(&dir.join("config.json"), serde_json::to_string_pretty(config).unwrap().as_bytes())
    }

    /// E5 models need `query: ` / `passage: ` prefixes; MiniLM and BGE-en need none.
    pub fn with_prefixes(mut self, query: &str, passage: &str) -> Self {
        self.query_prefix = query.into();
        self.passage_prefix = passage.into();
        self
    }

    /// Token ids (with [CLS]/[SEP]), truncated to `max_len`, right-padded, and the mask.
    pub fn tokenize(&self, texts: &[String]) -> Result<(Tensor, Tensor)> {
        let mut rows = vec![];
        for t in texts {
            let mut ids = self.tokenizer.encode(t, true)?;
            if ids.len() > self.max_len {
                let last = *ids.last().unwrap();
                ids.truncate(self.max_len - 1);
                ids.push(last); // keep [SEP] as a truncating tokenizer does
            }
            rows.push(ids);
        }
        let l = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut ids = vec![0i64; rows.len() * l];
        let mut mask = vec![0i64; rows.len() * l];
        for (r, row) in rows.iter().enumerate() {
            for (i, &t) in row.iter().enumerate() {
                ids[r * l + i] = t as i64;
                mask[r * l + i] = 1;
            }
        }
        let dev = self.vs.device();
        let shape = [rows.len() as i64, l as i64];
        Ok((Tensor::from_slice(&ids).view(shape).to_device(dev), Tensor::from_slice(&mask).view(shape).to_device(dev)))
    }

    /// Embeddings [N, D] (float32). Differentiable in `Mode::TRAIN` (query-side LoRA training).
    pub fn embed(&self, texts: &[String], mode: Mode) -> Result<Tensor> {
        if texts.is_empty() {
            return Err(EngineError::Invalid("embed: no texts".into()));
        }
        let (ids, mask) = self.tokenize(texts)?;
        let h = self.bert.forward(&ids, &mask, mode).to_kind(Kind::Float);
        let pooled = match self.pooling {
            Pooling::Cls => h.select(1, 0),
            Pooling::Mean => {
                let m = mask.to_kind(Kind::Float).unsqueeze(-1);
                (h * &m).sum_dim_intlist(1, false, Kind::Float)
                    / m.sum_dim_intlist(1, false, Kind::Float).clamp_min(1e-9)
            }
        };
        Ok(if self.normalize {
            let n = pooled.norm_scalaropt_dim(2.0, [-1], true).clamp_min(1e-12);
            pooled / n
        } else {
            pooled
        })
    }

    pub fn embed_queries(&self, queries: &[&str], mode: Mode) -> Result<Tensor> {
        let t: Vec<String> = queries.iter().map(|q| format!("{}{q}", self.query_prefix)).collect();
        self.embed(&t, mode)
    }

    /// Passages are always encoded without adapters: the index is built once from the frozen
    /// encoder (BRIDGE adapts only the query tower).
    pub fn embed_passages(&self, passages: &[&str]) -> Result<Tensor> {
        let t: Vec<String> = passages.iter().map(|p| format!("{}{p}", self.passage_prefix)).collect();
        tch::no_grad(|| self.embed(&t, Mode::REFERENCE))
    }
}

impl Encoder {
    /// The adapter tensors (LoRA A/B), sorted by name.
    pub fn adapter_parameters(&self) -> Vec<(String, Tensor)> {
        weights::by_name(self.vs.variables().into_iter().filter(|(n, _)| is_lora_param(n)))
    }

    /// Saves only the adapter (a few hundred KB): the base encoder and the passage index are
    /// untouched by query-side training, so this file is all a trained retriever adds.
    pub fn save_adapter(&self, path: &Path) -> Result<()> {
        let params = self.adapter_parameters();
        if params.is_empty() {
            return Err(EngineError::Invalid("save_adapter: the encoder has no LoRA adapter".into()));
        }
        weights::write_atomic(path, &params)
    }

    /// Loads an adapter saved by [`Encoder::save_adapter`] (the encoder must have been loaded
    /// with the same LoRA configuration).
    pub fn load_adapter(&self, path: &Path) -> Result<()> {
        let named: std::collections::HashMap<String, Tensor> = self.adapter_parameters().into_iter().collect();
        weights::load_into(&[path.to_path_buf()], &named, |_| false, |_| false)
    }
}

fn read_opt(p: &Path) -> Result<Option<Value>> {
    if p.exists() {
        read_json(p).map(Some)
    } else {
        Ok(None)
    }
}

fn has_prefix(file: &Path, prefix: &str) -> Result<bool> {
    let mut found = false;
    weights::for_each_header(file, |name| found |= name.starts_with(prefix))?;
    Ok(found)
}
