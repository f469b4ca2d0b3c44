//! Text to search terms: the same analyzer for tool definitions and for queries.
//!
//! Split on anything that is not a letter or digit (so `_`, `__`, `-`, `.`, spaces and
//! punctuation all separate words) and at camelCase boundaries (`perPage`, `HTTPServer`),
//! lowercase, drop English stop words and one-letter fragments, and stem (Snowball English), so
//! that "merged pull requests" meets `merge_pull_request`.

use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};

/// Lucene's English stop set (`EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`): short and standard,
/// so that words such as "show", "find" or "who" stay searchable.
const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// Appends the words of `text` to `out`, lowercased, split on non-alphanumerics and camelCase.
pub fn words(text: &str, out: &mut Vec<String>) {
    for run in text.split(|c: char| !c.is_alphanumeric()) {
        if run.is_empty() {
            continue;
        }
        let chars: Vec<char> = run.chars().collect();
        let mut start = 0;
        for i in 1..chars.len() {
            let (prev, cur) = (chars[i - 1], chars[i]);
            let next_lower = chars.get(i + 1).is_some_and(|c| c.is_lowercase());
            // `perPage` -> per|Page, `v2Api` -> v2|Api, `HTTPServer` -> HTTP|Server.
            let boundary = ((prev.is_lowercase() || prev.is_numeric()) && cur.is_uppercase())
                || (prev.is_uppercase() && cur.is_uppercase() && next_lower);
            if boundary {
                out.push(chars[start..i].iter().collect::<String>().to_lowercase());
                start = i;
            }
        }
        out.push(chars[start..].iter().collect::<String>().to_lowercase());
    }
}

/// The search terms of `text`, in order, repeats kept (they are term frequencies).
pub fn terms(text: &str) -> Vec<String> {
    let mut ws = Vec::new();
    words(text, &mut ws);
    ws.into_iter()
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        // One letter is the tail of "won't" or "Dana's", not a word; a lone digit may be a number.
        .filter(|w| w.chars().count() > 1 || w.chars().all(char::is_numeric))
        .map(|w| STEMMER.stem(&w).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        words(s, &mut out);
        out
    }

    #[test]
    fn names_split_on_separators_and_case() {
        assert_eq!(
            ws("github__merge_pull-request.v2"),
            ["github", "merge", "pull", "request", "v2"]
        );
        assert_eq!(ws("perPage"), ["per", "page"]);
        assert_eq!(ws("HTTPServer"), ["http", "server"]);
        assert_eq!(ws("getV2Api"), ["get", "v2", "api"]);
        assert_eq!(ws("p99 5xx"), ["p99", "5xx"]);
    }

    #[test]
    fn terms_drop_stop_words_and_stem() {
        assert_eq!(
            terms("Merged the pull requests"),
            ["merg", "pull", "request"]
        );
        assert_eq!(terms("merge_pull_request"), ["merg", "pull", "request"]);
        assert_eq!(terms("won't fix #311"), ["won", "fix", "311"]);
    }
}
