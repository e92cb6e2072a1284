//! Verifiable rewards: Search-R1's answer normalisation, exact match, sub-EM, token F1, and
//! answer extraction from the *response only* (the prompt's example `<answer> Beijing </answer>`
//! must never count).

/// Search-R1 `normalize_answer`: lower-case, drop ASCII punctuation, drop the articles
/// a/an/the as words, collapse whitespace.
pub fn normalize(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower.chars().filter(|c| !c.is_ascii_punctuation()).collect();
    no_punct.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).collect::<Vec<_>>().join(" ")
}

pub fn exact_match(prediction: &str, golds: &[String]) -> bool {
    let p = normalize(prediction);
    golds.iter().any(|g| normalize(g) == p)
}

/// Sub-EM: a normalised gold answer is a substring of the normalised prediction.
pub fn sub_exact_match(prediction: &str, golds: &[String]) -> bool {
    let p = normalize(prediction);
    golds.iter().any(|g| {
        let g = normalize(g);
        !g.is_empty() && p.contains(&g)
    })
}

/// Token-level F1 against the best gold.
pub fn f1(prediction: &str, golds: &[String]) -> f64 {
    let p: Vec<String> = normalize(prediction).split_whitespace().map(str::to_string).collect();
    golds
        .iter()
        .map(|g| {
            let g: Vec<String> = normalize(g).split_whitespace().map(str::to_string).collect();
            let mut pool = g.clone();
            let mut common = 0usize;
            for t in &p {
                if let Some(i) = pool.iter().position(|x| x == t) {
                    pool.swap_remove(i);
                    common += 1;
                }
            }
            if common == 0 {
                return 0.0;
            }
            let (pr, rc) = (common as f64 / p.len() as f64, common as f64 / g.len() as f64);
            2.0 * pr * rc / (pr + rc)
        })
        .fold(0.0, f64::max)
}

/// The trajectory-level reward a run trains on (`[reward] name` in the train config).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// 1 if the extracted answer exactly matches a gold answer (Search-R1), else 0.
    #[default]
    Em,
    /// Token F1 against the best gold answer.
    F1,
    /// AKBE's format-aware EM: −1 when the response has no answer, else EM.
    EmFormat,
}

/// Reward of a response whose extracted answer is `answer` (None = no answer given).
pub fn reward(kind: RewardKind, answer: Option<&str>, golds: &[String]) -> f64 {
    match (kind, answer) {
        (RewardKind::EmFormat, None) => -1.0,
        (RewardKind::F1, a) => f1(a.unwrap_or(""), golds),
        (_, a) => exact_match(a.unwrap_or(""), golds) as u8 as f64,
    }
}

/// OTC-PO-style tool-productivity factor (Wang et al. 2025, OTC-GRPO): with m the tool calls of a
/// response and n the fewest calls among the group's correct responses,
/// r_tool = cos(mπ / (2m + c)) if n = 0, else sin(f(m, n) π / (2n)) with f = 2nm / (m + n):
/// 1 at m = n, falling to 0 for no calls (when n > 0) and for many calls. The shaped reward is
/// r_tool × correctness, so only correct answers are paid, more for fewer calls.
pub fn otc_tool_factor(m: usize, n: usize, c: f64) -> f64 {
    let (m, nf) = (m as f64, n as f64);
    if n == 0 {
        (m * std::f64::consts::PI / (2.0 * m + c)).cos()
    } else {
        let f = if m == 0.0 { 0.0 } else { 2.0 * nf * m / (m + nf) };
        (f * std::f64::consts::PI / (2.0 * nf)).sin()
    }
}

/// The last `<answer>…</answer>` of a response (None when there is none).
pub fn extract_answer(response: &str) -> Option<String> {
    let mut out = None;
    let mut rest = response;
    while let Some(s) = rest.find("<answer>") {
        let after = &rest[s + "<answer>".len()..];
        match after.find("</answer>") {
            Some(e) => {
                out = Some(after[..e].trim().to_string());
                rest = &after[e + "</answer>".len()..];
            }
            None => break,
        }
    }
    out
}

/// The content of the last `\boxed{…}` (AKBE's answer format), braces balanced.
pub fn extract_boxed(s: &str) -> Option<String> {
    let start = s.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1;
    for (i, c) in s[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(s[start..start + i].trim().to_string());
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_matches_search_r1_on_tricky_strings() {
        assert_eq!(normalize("  The  Eiffel-Tower!  "), "eiffeltower");
        assert_eq!(normalize("A Tale of Two Cities"), "tale of two cities");
        assert_eq!(normalize("theatre"), "theatre"); // articles only as whole words
        assert_eq!(normalize("Röntgen, W."), "röntgen w");
        assert!(exact_match("the Beatles", &g(&["Beatles"])));
        assert!(!exact_match("Beatles band", &g(&["Beatles"])));
        assert!(sub_exact_match("the band Beatles", &g(&["Beatles"])));
        assert!(!sub_exact_match("anything", &g(&[""])));
    }

    #[test]
    fn f1_hand_computed() {
        // pred {new, york, city}, gold {new, york}: P = 2/3, R = 1 → F1 = 0.8
        assert!((f1("New York City", &g(&["New York"])) - 0.8).abs() < 1e-12);
        assert_eq!(f1("Paris", &g(&["London"])), 0.0);
        // pred {x, b, b}, gold {b, b, c}: 2 common, P = R = 2/3 → F1 = 2/3; with "a" instead of
        // "x" the article is dropped first: P = 1, R = 2/3 → F1 = 0.8.
        assert!((f1("x b b", &g(&["b b c"])) - 2.0 / 3.0).abs() < 1e-12);
        assert!((f1("a b b", &g(&["b b c"])) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn answers_come_from_the_response_only_last_one_wins() {
        assert_eq!(extract_answer("no tags here"), None);
        assert_eq!(extract_answer("<answer> Paris </answer>"), Some("Paris".into()));
        assert_eq!(extract_answer("<answer>x</answer> then <answer> y </answer>"), Some("y".into()));
        assert_eq!(extract_answer("<answer> unclosed"), None);
        // The prompt's example is not part of the response: the caller passes the response only.
        let prompt = "For example, <answer> Beijing </answer>. Question: ...";
        let response = "<search> q </search>";
        assert_eq!(extract_answer(response), None);
        assert_eq!(extract_answer(prompt), Some("Beijing".into()));
        assert_eq!(extract_boxed(r"The final answer is \[ \boxed{\frac{1}{2}} \]"), Some(r"\frac{1}{2}".into()));
        assert_eq!(extract_boxed("none"), None);
    }

    #[test]
    fn otc_factor_hand_computed() {
        use std::f64::consts::PI;
        // n = 0 (the tool is not needed): m = 0 → 1; m = 1, c = 1 → cos(π/3) = 0.5.
        assert!((otc_tool_factor(0, 0, 1.0) - 1.0).abs() < 1e-12);
        assert!((otc_tool_factor(1, 0, 1.0) - 0.5).abs() < 1e-12);
        // n = 2: m = 2 → sin(π/2) = 1; m = 0 → 0; m = 6 → f = 24/8 = 3 → sin(3π/4).
        assert!((otc_tool_factor(2, 2, 1.0) - 1.0).abs() < 1e-12);
        assert_eq!(otc_tool_factor(0, 2, 1.0), 0.0);
        assert!((otc_tool_factor(6, 2, 1.0) - (3.0 * PI / 4.0).sin()).abs() < 1e-12);
    }

    #[test]
    fn reward_kinds_hand_computed() {
        let gold = g(&["New York"]);
        assert_eq!(reward(RewardKind::Em, Some("new york"), &gold), 1.0);
        assert_eq!(reward(RewardKind::Em, None, &gold), 0.0);
        assert_eq!(reward(RewardKind::EmFormat, None, &gold), -1.0);
        assert_eq!(reward(RewardKind::EmFormat, Some("Boston"), &gold), 0.0);
        assert!((reward(RewardKind::F1, Some("New York City"), &gold) - 0.8).abs() < 1e-12);
    }
}
