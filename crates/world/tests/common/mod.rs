//! A small world for tests: the default config, shrunk.
use knowrl_world::config::{default_toml, WorldConfig};

pub fn small(people: usize, cities: usize, orgs: usize, bands: usize, lookalikes: usize) -> WorldConfig {
    let mut c = WorldConfig::from_toml(default_toml(), "default.toml").unwrap();
    c.sizes.people = people;
    c.sizes.cities = cities;
    c.sizes.organisations = orgs;
    c.sizes.bands = bands;
    c.lookalike_pairs = lookalikes;
    c.filler_passages = 10;
    c
}
