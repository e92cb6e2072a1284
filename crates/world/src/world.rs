//! Entities, functional relations and the parametric-knowledge (PK) split, generated
//! deterministically from the config's seed.
use crate::config::WorldConfig;
use crate::names::Names;
use knowrl_engine::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Person,
    City,
    Country,
    Organisation,
    Band,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    BornIn,
    LocatedIn,
    Capital,
    FoundedBy,
    HeadquarteredIn,
    MemberOf,
    FormedIn,
}

impl Relation {
    pub fn name(self) -> &'static str {
        match self {
            Relation::BornIn => "born_in",
            Relation::LocatedIn => "located_in",
            Relation::Capital => "capital",
            Relation::FoundedBy => "founded_by",
            Relation::HeadquarteredIn => "headquartered_in",
            Relation::MemberOf => "member_of",
            Relation::FormedIn => "formed_in",
        }
    }
    pub fn domain(self) -> (Kind, Kind) {
        match self {
            Relation::BornIn => (Kind::Person, Kind::City),
            Relation::LocatedIn => (Kind::City, Kind::Country),
            Relation::Capital => (Kind::Country, Kind::City),
            Relation::FoundedBy => (Kind::Organisation, Kind::Person),
            Relation::HeadquarteredIn => (Kind::Organisation, Kind::City),
            Relation::MemberOf => (Kind::Person, Kind::Band),
            Relation::FormedIn => (Kind::Band, Kind::City),
        }
    }
    pub const ALL: [Relation; 7] = [
        Relation::BornIn,
        Relation::LocatedIn,
        Relation::Capital,
        Relation::FoundedBy,
        Relation::HeadquarteredIn,
        Relation::MemberOf,
        Relation::FormedIn,
    ];
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entity {
    pub id: usize,
    pub kind: Kind,
    pub name: String,
    pub aliases: Vec<String>,
    /// 1.0 = most popular of its kind, 0.0 = least.
    pub popularity: f64,
    /// The entity this one is a near-duplicate of, if any.
    pub lookalike_of: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fact {
    pub id: usize,
    pub subject: usize,
    pub relation: Relation,
    pub object: usize,
    /// In the policy's parametric knowledge (pretrained on).
    pub pk: bool,
    /// A wrong object of the same kind, used by counterfactual passages.
    pub counterfactual: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct World {
    pub entities: Vec<Entity>,
    pub facts: Vec<Fact>,
}

impl World {
    pub fn entity(&self, id: usize) -> &Entity {
        &self.entities[id]
    }

    pub fn of_kind(&self, k: Kind) -> Vec<usize> {
        self.entities.iter().filter(|e| e.kind == k).map(|e| e.id).collect()
    }

    /// The fact (subject, relation) if it exists (relations are functional).
    pub fn fact(&self, subject: usize, r: Relation) -> Option<&Fact> {
        self.facts.iter().find(|f| f.subject == subject && f.relation == r)
    }

    pub fn facts_of(&self, subject: usize) -> impl Iterator<Item = &Fact> {
        self.facts.iter().filter(move |f| f.subject == subject)
    }
}

const CITY_SUFFIX: [&str; 6] = ["", "ford", "mere", "holm", "ton", "burg"];
const COUNTRY_SUFFIX: [&str; 5] = ["ia", "land", "ova", "stan", "ar"];

pub fn generate(cfg: &WorldConfig) -> World {
    let mut rng = Rng::new(cfg.seed);
    let mut names = Names::new();
    let mut entities: Vec<Entity> = vec![];
    let fixed = |kind: &str| cfg.names.get(kind).cloned().unwrap_or_default();
    for n in cfg.names.values().flatten() {
        names.claim(n);
    }
    let mut add =
        |kind: Kind, count: usize, fixed: Vec<String>, gen: &mut dyn FnMut(&mut Rng, &mut Names) -> String| {
            let start = entities.len();
            for i in 0..count {
                let name = fixed.get(i).cloned().unwrap_or_else(|| gen(&mut rng, &mut names));
                // Popularity falls with the index: entity 0 of each kind is the most popular.
                let popularity = if count > 1 { 1.0 - i as f64 / (count - 1) as f64 } else { 1.0 };
                entities.push(Entity { id: start + i, kind, name, aliases: vec![], popularity, lookalike_of: None });
            }
        };
    add(Kind::Country, cfg.sizes.countries, fixed("countries"), &mut |r, n| n.place(r, &COUNTRY_SUFFIX));
    add(Kind::City, cfg.sizes.cities, fixed("cities"), &mut |r, n| n.place(r, &CITY_SUFFIX));
    add(Kind::Organisation, cfg.sizes.organisations, fixed("organisations"), &mut |r, n| n.org(r));
    add(Kind::Band, cfg.sizes.bands, fixed("bands"), &mut |r, n| n.band(r));
    // People: some share surnames, some pairs are near-duplicates.
    let fixed_people = fixed("people");
    let first_person = entities.len();
    let mut surnames: Vec<String> = vec![];
    for i in 0..cfg.sizes.people {
        let name = match fixed_people.get(i) {
            Some(n) => n.clone(),
            None => {
                let shared = !surnames.is_empty() && rng.uniform() < cfg.shared_surname_fraction;
                let s = if shared { Some(surnames[rng.below(surnames.len())].clone()) } else { None };
                names.person(&mut rng, s.as_deref())
            }
        };
        if let Some(s) = name.split_whitespace().last() {
            surnames.push(s.to_string());
        }
        let popularity = 1.0 - i as f64 / (cfg.sizes.people.max(2) - 1) as f64;
        entities.push(Entity {
            id: entities.len(),
            kind: Kind::Person,
            name,
            aliases: vec![],
            popularity,
            lookalike_of: None,
        });
    }
    // Near-duplicates: rewrite the name of a rare person as a look-alike of a popular one.
    let people: Vec<usize> = (first_person..entities.len()).collect();
    let half = people.len() / 2;
    for p in 0..cfg.lookalike_pairs {
        let (orig, copy) = (people[p * half / cfg.lookalike_pairs.max(1)], people[people.len() - 1 - p]);
        if let Some(n) = names.lookalike(&mut rng, &entities[orig].name.clone()) {
            entities[copy].name = n;
            entities[copy].lookalike_of = Some(orig);
        }
    }
    for e in entities.iter_mut().filter(|e| e.kind == Kind::Country) {
        e.aliases.push(format!("Republic of {}", e.name));
    }

    // Facts (functional relations), then PK labels and a counterfactual object per fact.
    let mut world = World { entities, facts: vec![] };
    let ids = |k: Kind| world.of_kind(k);
    let (countries, cities, orgs, bands, people) =
        (ids(Kind::Country), ids(Kind::City), ids(Kind::Organisation), ids(Kind::Band), ids(Kind::Person));
    let mut triples: Vec<(usize, Relation, usize)> = vec![];
    let pick = |rng: &mut Rng, v: &[usize]| v[rng.below(v.len())];
    // Capitals first: country i's capital is city i, so every capital lies in its own country.
    for (i, &c) in cities.iter().enumerate() {
        let country = if i < countries.len() { countries[i] } else { pick(&mut rng, &countries) };
        if cfg.has("located_in") {
            triples.push((c, Relation::LocatedIn, country));
        }
    }
    if cfg.has("capital") {
        for (i, &k) in countries.iter().enumerate() {
            triples.push((k, Relation::Capital, cities[i]));
        }
    }
    for &p in &people {
        if cfg.has("born_in") {
            triples.push((p, Relation::BornIn, pick(&mut rng, &cities)));
        }
        if cfg.has("member_of") && !bands.is_empty() && rng.uniform() < cfg.band_member_fraction {
            triples.push((p, Relation::MemberOf, pick(&mut rng, &bands)));
        }
    }
    for &o in &orgs {
        if cfg.has("founded_by") {
            triples.push((o, Relation::FoundedBy, pick(&mut rng, &people)));
        }
        if cfg.has("headquartered_in") {
            triples.push((o, Relation::HeadquarteredIn, pick(&mut rng, &cities)));
        }
    }
    if cfg.has("formed_in") {
        for &b in &bands {
            triples.push((b, Relation::FormedIn, pick(&mut rng, &cities)));
        }
    }
    let k = &cfg.knowledge;
    for (id, (s, r, o)) in triples.into_iter().enumerate() {
        let popular = world.entities[s].popularity >= 1.0 - k.popular_fraction;
        let pk = rng.uniform() < if popular { k.pk_popular } else { k.pk_rare };
        let pool = world.of_kind(r.domain().1);
        let counterfactual = loop {
            let c = pick(&mut rng, &pool);
            if c != o || pool.len() == 1 {
                break c;
            }
        };
        world.facts.push(Fact { id, subject: s, relation: r, object: o, pk, counterfactual });
    }
    world
}
