//! Turning retrieved passages into the observation appended to the trajectory: Search-R1's
//! `<information>` block (and verl's variant of its passage list), or AKBE's `<result>` block.
use crate::Hit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PassageStyle {
    /// Search-R1 `_passages2string`: `Doc {i}(Title: {title}) {text}\n`, title keeping its quotes.
    #[default]
    SearchR1,
    /// verl's `search_r1_like_utils`: `Doc {i} (Title: {title})\n{text}\n\n`.
    Verl,
    /// AKBE's search tool (`search_tool.py`): duplicate passages dropped, `Page {i}: {contents}`
    /// with contents cut at 1,000 characters, one per line; "No search results found." if none.
    Akbe,
}

pub fn passages_to_string(hits: &[Hit], style: PassageStyle) -> String {
    if style == PassageStyle::Akbe {
        let mut seen = std::collections::HashSet::new();
        let pages: Vec<String> = hits
            .iter()
            .map(|h| h.contents.trim())
            .filter(|c| !c.is_empty() && seen.insert(*c))
            .enumerate()
            .map(|(i, c)| format!("Page {}: {}", i + 1, c.chars().take(1000).collect::<String>()))
            .collect();
        return if pages.is_empty() { "No search results found.".into() } else { pages.join("\n") };
    }
    let mut s = String::new();
    for (i, h) in hits.iter().enumerate() {
        let (title, text) = h.contents.split_once('\n').unwrap_or((h.contents.as_str(), ""));
        match style {
            PassageStyle::SearchR1 => s.push_str(&format!("Doc {}(Title: {title}) {text}\n", i + 1)),
            PassageStyle::Verl => s.push_str(&format!("Doc {} (Title: {title})\n{text}\n\n", i + 1)),
            PassageStyle::Akbe => unreachable!("handled above"),
        }
    }
    s
}

/// The observation appended to the trajectory: `\n\n<information>{…}</information>\n\n`, or
/// AKBE's ` <result>\n{…}\n</result>`.
pub fn information_block(hits: &[Hit], style: PassageStyle) -> String {
    match style {
        PassageStyle::Akbe => format!(" <result>\n{}\n</result>", passages_to_string(hits, style)),
        _ => format!("\n\n<information>{}</information>\n\n", passages_to_string(hits, style).trim()),
    }
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
        // AKBE: duplicates dropped, contents (title line included) cut at 1,000 characters.
        let long = Hit { id: "2".into(), contents: format!("\"T\"\n{}", "é".repeat(1200)), score: 0.1 };
        let akbe = information_block(&[hits[0].clone(), hits[0].clone(), long], PassageStyle::Akbe);
        let want = format!(
            " <result>\nPage 1: \"Evan Morris\"\nEvan L. Morris was a lobbyist.\nPage 2: \"T\"\n{}\n</result>",
            "é".repeat(996)
        );
        assert_eq!(akbe, want);
        assert_eq!(information_block(&[], PassageStyle::Akbe), " <result>\nNo search results found.\n</result>");
    }
}
