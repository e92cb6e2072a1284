//! RL for retrieval-augmented agents. Data flows one way: rollout (`agent`) → reward
//! (`reward`) → advantage → loss → optimiser step. This file set grows with the RL issues.
pub mod advantage;
pub mod agent;
pub mod config;
pub mod loss;
pub mod reward;
pub mod trainer;
