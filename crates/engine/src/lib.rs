//! knowrl's policy engine on libtorch (tch): Hugging Face decoder and encoder models, batched
//! KV-cached generation, teacher-forced scoring, and the training primitives (AdamW, clipping,
//! schedules, LoRA, checkpoints, HF export) the RL crates build on.
pub mod adapter;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod encoder;
pub mod error;
pub mod flops;
pub mod fsutil;
pub mod generate;
pub mod kernels;
pub mod layers;
pub mod memory;
pub mod models;
pub mod optim;
pub mod policy;
pub mod sampling;
pub mod score;
pub mod tokenizer;
pub mod weights;

pub use error::{EngineError, Result};
pub use layers::{LoraConfig, Mode};
pub use policy::{LoadOptions, Policy};
pub use sampling::{Rng, SamplingParams};
pub use tokenizer::{Message, Tokenizer};
