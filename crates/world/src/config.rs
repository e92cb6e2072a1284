//! The world's configuration (TOML). Every field is documented here; unknown fields are
//! rejected by name, and impossible combinations are rejected naming the field at fault.
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {msg}")]
    Parse { file: String, msg: String },
    #[error("{file}: field `{field}`: {msg}")]
    Field { file: String, field: String, msg: String },
}

/// How many entities of each kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sizes {
    pub people: usize,
    pub cities: usize,
    pub countries: usize,
    pub organisations: usize,
    pub bands: usize,
}

/// Which facts the policy is pretrained on (its parametric knowledge).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Knowledge {
    /// Probability that a fact about a popular entity (top `popular_fraction` by popularity) is in PK.
    pub pk_popular: f64,
    /// Probability for the other entities.
    pub pk_rare: f64,
    pub popular_fraction: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Splits {
    pub train: f64,
    pub valid: f64,
    pub test: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorldConfig {
    pub seed: u64,
    pub sizes: Sizes,
    /// Relation types to generate; see `Relation` for the list.
    pub relations: Vec<String>,
    /// Fraction of people who share a surname with someone else.
    pub shared_surname_fraction: f64,
    /// Number of near-duplicate name pairs among people (one letter apart, different facts).
    pub lookalike_pairs: usize,
    /// Fraction of people who belong to a band (`member_of`).
    pub band_member_fraction: f64,
    pub knowledge: Knowledge,
    pub splits: Splits,
    /// Longest composition asked (1 = single-hop only, up to 3).
    pub max_hops: usize,
    /// Passages per scenario context for S4 (irrelevant) and S5 (partially relevant, top-5).
    pub context_size: usize,
    /// Filler passages with no facts, added to the search corpus.
    pub filler_passages: usize,
    /// Optional fixed names (kind → names); generated names fill the rest.
    #[serde(default)]
    pub names: std::collections::BTreeMap<String, Vec<String>>,
}

pub const RELATIONS: [&str; 7] =
    ["born_in", "located_in", "capital", "founded_by", "headquartered_in", "member_of", "formed_in"];
const KINDS: [&str; 5] = ["people", "cities", "countries", "organisations", "bands"];

impl WorldConfig {
    pub fn from_toml(text: &str, file: &str) -> Result<WorldConfig, ConfigError> {
        let c: WorldConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { file: file.into(), msg: e.to_string() })?;
        c.validate(file)?;
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<WorldConfig, ConfigError> {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Parse { file: file.clone(), msg: e.to_string() })?;
        Self::from_toml(&text, &file)
    }

    pub fn has(&self, relation: &str) -> bool {
        self.relations.iter().any(|r| r == relation)
    }

    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let err = |field: &str, msg: String| Err(ConfigError::Field { file: file.into(), field: field.into(), msg });
        for (i, r) in self.relations.iter().enumerate() {
            if !RELATIONS.contains(&r.as_str()) {
                return err(
                    &format!("relations[{i}]"),
                    format!("unknown relation type `{r}` (known: {})", RELATIONS.join(", ")),
                );
            }
        }
        let s = &self.sizes;
        if s.countries == 0 {
            return err("sizes.countries", "must be at least 1".into());
        }
        if s.cities < s.countries {
            return err(
                "sizes.cities",
                format!("{} cities cannot give each of {} countries a capital", s.cities, s.countries),
            );
        }
        if s.people < 2 {
            return err("sizes.people", "must be at least 2".into());
        }
        if self.has("founded_by") && s.organisations > 0 && s.people == 0 {
            return err("sizes.people", "organisations need founders".into());
        }
        if self.has("member_of") && s.bands == 0 {
            return err("sizes.bands", "relation member_of needs at least one band".into());
        }
        if 2 * self.lookalike_pairs > s.people {
            return err(
                "lookalike_pairs",
                format!("{} pairs need {} people, have {}", self.lookalike_pairs, 2 * self.lookalike_pairs, s.people),
            );
        }
        for (f, v) in [
            ("shared_surname_fraction", self.shared_surname_fraction),
            ("band_member_fraction", self.band_member_fraction),
            ("knowledge.pk_popular", self.knowledge.pk_popular),
            ("knowledge.pk_rare", self.knowledge.pk_rare),
            ("knowledge.popular_fraction", self.knowledge.popular_fraction),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return err(f, format!("{v} is not a probability"));
            }
        }
        let sp = &self.splits;
        if (sp.train + sp.valid + sp.test - 1.0).abs() > 1e-9 || sp.train <= 0.0 || sp.test <= 0.0 || sp.valid < 0.0 {
            return err(
                "splits",
                format!(
                    "train {} + valid {} + test {} must sum to 1 with train, test > 0",
                    sp.train, sp.valid, sp.test
                ),
            );
        }
        if !(1..=3).contains(&self.max_hops) {
            return err("max_hops", format!("{} (1 to 3)", self.max_hops));
        }
        if self.context_size < 2 {
            return err("context_size", "must be at least 2".into());
        }
        for (kind, names) in &self.names {
            if !KINDS.contains(&kind.as_str()) {
                return err(&format!("names.{kind}"), format!("unknown entity kind (known: {})", KINDS.join(", ")));
            }
            let mut seen = std::collections::HashSet::new();
            for n in names {
                if !seen.insert(n.to_lowercase()) {
                    return err(&format!("names.{kind}"), format!("duplicate name `{n}`"));
                }
            }
        }
        Ok(())
    }
}

/// The embedded default (assets/world/config.toml holds the same values).
pub fn default_toml() -> &'static str {
    include_str!("default.toml")
}
