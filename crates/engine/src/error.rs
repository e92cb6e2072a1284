//! One error type for the engine. Every variant names the file, field or tensor at fault,
//! because a user facing a 7B checkpoint that does not load needs to know *which* tensor.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    // The OS error is part of the message, not a `source`: anyhow would print it twice.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{file}: field `{field}`: {msg}")]
    Config { file: PathBuf, field: String, msg: String },
    #[error("{file}: tensor `{tensor}`: {msg}")]
    Weights { file: PathBuf, tensor: String, msg: String },
    #[error("{file}: not a valid safetensors file: {msg}")]
    Safetensors { file: PathBuf, msg: String },
    #[error("{file}: tokenizer: {msg}")]
    Tokenizer { file: PathBuf, msg: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("{file}: checksum mismatch (expected sha256 {expected}, found {actual}); the file is corrupt or was changed after it was written")]
    Checksum { file: PathBuf, expected: String, actual: String },
    #[error("{0}")]
    Invalid(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io { path: path.into(), err: source }
    }
    pub fn config(file: impl Into<PathBuf>, field: &str, msg: impl Into<String>) -> Self {
        EngineError::Config { file: file.into(), field: field.to_string(), msg: msg.into() }
    }
    pub fn weights(file: impl Into<PathBuf>, tensor: &str, msg: impl Into<String>) -> Self {
        EngineError::Weights { file: file.into(), tensor: tensor.to_string(), msg: msg.into() }
    }
}

/// Reads a whole file, naming it in the error.
pub fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| EngineError::io(path, e))
}

/// Parses a JSON file; a syntax error names the file, line and column.
pub fn read_json(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| {
        EngineError::config(path, "<document>", format!("invalid JSON at line {} column {}: {e}", e.line(), e.column()))
    })
}
