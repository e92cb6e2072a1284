//! Turning retrieved passages into the `<information>` observation, as Search-R1 does.
use crate::Hit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PassageStyle {
    /// Search-R1 `_passages2string`: `Doc {i}(Title: {title}) {text}\n`, title keeping its quotes.
    #[default]
    SearchR1,
    /// verl's `search_r1_like_utils`: `Doc {i} (Title: {title})\n{text}\n\n`.
    Verl,
}

pub fn passages_to_string(hits: &[Hit], style: PassageStyle) -> String {
    let mut s = String::new();
    for (i, h) in hits.iter().enumerate() {
        let (title, text) = h.contents.split_once('\n').unwrap_or((h.contents.as_str(), ""));
        match style {
            PassageStyle::SearchR1 => s.push_str(&format!("Doc {}(Title: {title}) {text}\n", i + 1)),
            PassageStyle::Verl => s.push_str(&format!("Doc {} (Title: {title})\n{text}\n\n", i + 1)),
        }
    }
    s
}

/// The observation appended to the trajectory: `\n\n<information>{…}</information>\n\n`.
pub fn information_block(hits: &[Hit], style: PassageStyle) -> String {
    format!("\n\n<information>{}</information>\n\n", passages_to_string(hits, style).trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn search_r1_format_keeps_title_quotes() {
        let hits = vec![
            Hit { id: "0".into(), contents: "\"Evan Morris\"\nEvan L. Morris was a lobbyist.".into(), score: 1.0 },
            Hit { id: "1".into(), contents: "\"Paris\"\nCapital of France.\nSecond line.".into(), score: 0.5 },
        ];
        assert_eq!(
            information_block(&hits, PassageStyle::SearchR1),
            "\n\n<information>Doc 1(Title: \"Evan Morris\") Evan L. Morris was a lobbyist.\nDoc 2(Title: \"Paris\") Capital of France.\nSecond line.</information>\n\n"
        );
        assert_eq!(
            passages_to_string(&hits[..1], PassageStyle::Verl),
            "Doc 1 (Title: \"Evan Morris\")\nEvan L. Morris was a lobbyist.\n\n"
        );
    }
}
