//! Pronounceable names from syllables, deterministic from the world's generator.
use knowrl_engine::Rng;
use std::collections::HashSet;

const ONSETS: [&str; 20] =
    ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "sh"];
const VOWELS: [&str; 8] = ["a", "e", "i", "o", "u", "ai", "ou", "ea"];
const CODAS: [&str; 10] = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "x"];

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

fn word(rng: &mut Rng, syllables: usize) -> String {
    let mut w = String::new();
    for i in 0..syllables {
        w.push_str(ONSETS[rng.below(ONSETS.len())]);
        w.push_str(VOWELS[rng.below(VOWELS.len())]);
        if i + 1 == syllables {
            w.push_str(CODAS[rng.below(CODAS.len())]);
        }
    }
    capitalise(&w)
}

/// A name generator that never repeats a name (case-insensitively) within a world.
pub struct Names {
    pub used: HashSet<String>,
}

impl Names {
    pub fn new() -> Names {
        Names { used: HashSet::new() }
    }

    pub fn claim(&mut self, name: &str) -> bool {
        self.used.insert(name.to_lowercase())
    }

    fn fresh(&mut self, rng: &mut Rng, make: impl Fn(&mut Rng) -> String) -> String {
        loop {
            let n = make(rng);
            if self.claim(&n) {
                return n;
            }
        }
    }

    pub fn place(&mut self, rng: &mut Rng, suffixes: &[&str]) -> String {
        self.fresh(rng, |r| {
            let n = 2 + r.below(2);
            let base = word(r, n);
            let suf = suffixes[r.below(suffixes.len())];
            format!("{base}{suf}")
        })
    }

    pub fn given(rng: &mut Rng) -> String {
        word(rng, 2)
    }

    pub fn surname(rng: &mut Rng) -> String {
        let n = 2 + rng.below(2);
        word(rng, n)
    }

    pub fn person(&mut self, rng: &mut Rng, surname: Option<&str>) -> String {
        self.fresh(rng, |r| {
            let s = surname.map(str::to_string).unwrap_or_else(|| Names::surname(r));
            format!("{} {s}", Names::given(r))
        })
    }

    /// A near-duplicate of `name`: one vowel changed (e.g. "Doran Velk" → "Doran Valk").
    pub fn lookalike(&mut self, rng: &mut Rng, name: &str) -> Option<String> {
        let chars: Vec<char> = name.chars().collect();
        let vowels: Vec<usize> =
            chars.iter().enumerate().filter(|(_, c)| "aeiou".contains(**c)).map(|(i, _)| i).collect();
        for _ in 0..20 {
            let &pos = vowels.get(rng.below(vowels.len().max(1)))?;
            let mut c = chars.clone();
            c[pos] = ['a', 'e', 'i', 'o', 'u'][rng.below(5)];
            let n: String = c.into_iter().collect();
            if self.claim(&n) {
                return Some(n);
            }
        }
        None
    }

    pub fn org(&mut self, rng: &mut Rng) -> String {
        const KIND: [&str; 6] = ["Industries", "Labs", "Group", "Works", "Systems", "Trading Company"];
        self.fresh(rng, |r| format!("{} {}", word(r, 2), KIND[r.below(KIND.len())]))
    }

    pub fn band(&mut self, rng: &mut Rng) -> String {
        const NOUNS: [&str; 8] = ["Echoes", "Lanterns", "Wolves", "Tides", "Engines", "Saints", "Comets", "Ravens"];
        self.fresh(rng, |r| format!("The {} {}", word(r, 2), NOUNS[r.below(NOUNS.len())]))
    }
}

impl Default for Names {
    fn default() -> Self {
        Self::new()
    }
}
