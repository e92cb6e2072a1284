//! `knowrl train` configuration (TOML): the shared sections (`sections`) and the method's own
//! (`[method] name = "…"` plus that method's fields, defined beside its code). Every field is
//! documented where it is defined; unknown fields are rejected with their name.
use crate::method::MethodSpec;
pub use crate::sections::*;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelSection,
    pub data: DataSection,
    pub rollout: RolloutSection,
    pub algorithm: AlgorithmSection,
    pub optim: OptimSection,
    pub run: RunSection,
    /// Which method's step runs, with its fields (default: `grpo`, the plain `algorithm` on the
    /// agent loop).
    #[serde(default)]
    pub method: MethodConfig,
    #[serde(default)]
    pub reward: RewardSection,
}

/// The methods, one line each: `[method] name` → that method's section.
macro_rules! methods {
    ($($(#[$doc:meta])* $variant:ident => $config:ty,)*) => {
        #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
        #[serde(tag = "name", rename_all = "snake_case")]
        pub enum MethodConfig {
            $($(#[$doc])* $variant($config),)*
        }

        impl MethodConfig {
            pub fn spec(&self) -> &dyn MethodSpec {
                match self {
                    $(MethodConfig::$variant(c) => c,)*
                }
            }
        }
    };
}

methods! {
    /// GRPO / DAPO / GSPO (per `algorithm.name`) on the search-agent loop.
    Grpo => crate::grpo::GrpoConfig,
    /// Knowledgeable-R1 ("Resisting Contextual Interference in RAG via Parametric-Knowledge
    /// Reinforcement"): joint PK/CK sampling, single turn.
    KnowledgeableR1 => crate::knowledgeable_r1::KnowledgeableR1Config,
    /// AKBE (adaptive knowledge-boundary exploration): dual-path rollouts + CE on
    /// knowledge-boundary targets.
    Akbe => crate::akbe::AkbeConfig,
    /// BRIDGE ("Bilevel Retrieval-Credit-Aware Agentic Reinforcement Learning"): query-LoRA
    /// retriever (lower level) + GRPO policy (upper).
    Bridge => crate::bridge::BridgeConfig,
}

impl Default for MethodConfig {
    fn default() -> Self {
        MethodConfig::Grpo(crate::grpo::GrpoConfig::default())
    }
}

impl MethodConfig {
    /// The `[method] name` (as written in TOML).
    pub fn name(&self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v["name"].as_str().map(String::from)).unwrap_or_default()
    }
}

/// A train config that cannot be read, parsed or validated; the message names the file, and
/// the line or field (the CLI exits 2 on it).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The scenario names `data.scenarios` accepts: the world's (`knowrl_world::suites::SCENARIOS`,
/// which this crate does not depend on; a test holds the two equal).
const SCENARIOS: [&str; 6] = ["S1", "S2", "S2p", "S3", "S4", "S5"];

impl TrainConfig {
    /// The dotted path of the first field where `self` and `other` differ (`run.steps`), if any.
    pub fn first_difference(&self, other: &TrainConfig) -> Option<String> {
        let json = |c: &TrainConfig| serde_json::to_value(c).expect("a config serialises");
        first_difference(&json(self), &json(other), String::new())
    }

    pub fn load(path: &Path) -> Result<TrainConfig, ConfigError> {
        let err = |e: &dyn std::fmt::Display| ConfigError(format!("{}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| err(&e))?;
        let c: TrainConfig = toml::from_str(&text).map_err(|e| err(&e))?;
        c.validate().map_err(|e| err(&e))?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.model.validate()?;
        let r = &self.rollout;
        let bad = |f: &str, m: String| Err(format!("field `{f}`: {m}"));
        if r.group_size < 2 {
            return bad("rollout.group_size", format!("{} (group advantages need at least 2)", r.group_size));
        }
        if r.prompts_per_step == 0 || r.max_turns == 0 || r.topk == 0 || r.max_tokens_per_turn == 0 {
            return bad("rollout", "prompts_per_step, max_turns, topk and max_tokens_per_turn must be positive".into());
        }
        if r.max_observation_tokens == 0 {
            return bad("rollout.max_observation_tokens", "must be positive".into());
        }
        if self.optim.micro_batch == 0 {
            return bad("optim.micro_batch", "must be positive".into());
        }
        if self.algorithm.ppo_epochs == 0 {
            return bad("algorithm.ppo_epochs", "must be at least 1".into());
        }
        if self.algorithm.clip_low <= 0.0 || self.algorithm.clip_high <= 0.0 {
            return bad("algorithm.clip_low", "clip ranges must be positive".into());
        }
        if self.data.suite == Suite::Jsonl && self.data.path.is_none() {
            return bad("data.path", "suite = \"jsonl\" needs a jsonl file".into());
        }
        let known = SCENARIOS;
        if let Some(s) = self.data.scenarios.iter().find(|s| !known.contains(&s.as_str())) {
            return bad("data.scenarios", format!("unknown scenario {s:?} ({})", known.join(", ")));
        }
        self.method.spec().validate(&self.rollout)
    }
}

fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                first_difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), path)
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, format!("{at}[{i}]")))
        }
        _ => (a != b).then_some(at),
    }
}

#[cfg(test)]
mod scenario_names {
    #[test]
    fn the_accepted_scenarios_are_the_worlds() {
        assert_eq!(super::SCENARIOS, knowrl_world::suites::SCENARIOS);
    }
}
