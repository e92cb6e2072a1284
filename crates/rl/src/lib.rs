//! RL for retrieval-augmented agents. Data flows one way: rollout (`agent`) → reward
//! (`reward`) → advantage (`advantage`, a method's own in its file) → loss terms (`update`,
//! equations in `loss`) → optimiser step (`trainer`). One file per method, each implementing
//! the step contract of `method`: `grpo` (GRPO / DAPO / GSPO on the agent loop),
//! `knowledgeable_r1`, `akbe`, `bridge` (its retriever state in `query_adapter`); `config`
//! lists them.
pub mod advantage;
pub mod agent;
pub mod akbe;
pub mod bridge;
pub mod config;
pub mod data_parallel;
pub mod grpo;
pub mod knowledgeable_r1;
pub mod loss;
pub mod method;
pub mod prompts;
pub mod query_adapter;
pub mod reward;
pub mod sections;
pub mod task;
pub mod tensorboard;
pub mod trainer;
pub mod update;
