//! RL for retrieval-augmented agents. Data flows one way: rollout (`agent`) → reward
//! (`reward`) → advantage (`advantage`, a method's own in its file) → loss rows (`update`)
//! → optimiser step (`trainer`). One file per method: `grpo` (GRPO / DAPO / GSPO on the agent
//! loop), `knowledgeable_r1`, `akbe`, `bridge`.
pub mod advantage;
pub mod agent;
pub mod akbe;
pub mod bridge;
pub mod config;
pub mod grpo;
pub mod knowledgeable_r1;
pub mod loss;
pub mod prompts;
pub mod reward;
pub mod task;
pub mod trainer;
pub mod update;
