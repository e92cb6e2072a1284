use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    // The OS error is part of the message, not a `source`: anyhow would print it twice.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    BadLine { path: PathBuf, line: usize, msg: String },
    #[error("{0}")]
    Invalid(String),
    #[error("index {path}: {msg}")]
    Index { path: PathBuf, msg: String },
    #[error("retrieval service: {0}")]
    Http(String),
    #[error(transparent)]
    Engine(#[from] knowrl_engine::EngineError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = RetrievalError> = std::result::Result<T, E>;

pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> RetrievalError {
    RetrievalError::Io { path: path.into(), err: source }
}

pub fn index_err(path: impl Into<PathBuf>, msg: impl ToString) -> RetrievalError {
    RetrievalError::Index { path: path.into(), msg: msg.to_string() }
}
