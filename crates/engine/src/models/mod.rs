//! One self-contained file per architecture, in the style of candle-transformers.
pub mod bert;
pub mod llama;
