//! What a tool does to its object, and what a request asks to have done: read, create, update
//! or delete.
//!
//! A catalog holds families of tools on one object that differ only in their verb
//! (`create_entities`, `delete_entities`, `read_graph`; `get_gist`, `update_gist`,
//! `create_gist`), and BM25 ranks such twins by length and by the object's words, which they
//! share. The verb is the one word that tells them apart, and requests say it in many ways
//! ("get rid of", "supprime", "what's in …?"). Both sides are reduced to a set of four actions:
//!
//! - a tool's, from the verbs of its operation name, or when the name has none
//!   (`git_log`, `browser_click`), from the first verb among the first words of its
//!   description ("Shows the commit logs");
//! - a request's, from its English terms as the query analysis made them (so the lexicon's
//!   French, German and Spanish verbs count through their English targets), and a question
//!   ("what's …?", "quels …", "welche …", "¿qué …?") asks to read.
//!
//! A tool whose action the request asks for has its score raised. Both sets depend on the
//! tool's definition and the request only, so visibility stays exact.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::analyze::{self, Lang};
use crate::pool::Tool;

/// A set of actions, as bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Actions(u8);

impl Actions {
    pub const READ: Actions = Actions(1);
    pub const CREATE: Actions = Actions(2);
    pub const UPDATE: Actions = Actions(4);
    pub const DELETE: Actions = Actions(8);

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn intersects(self, other: Actions) -> bool {
        self.0 & other.0 != 0
    }

    fn union(self, other: Actions) -> Actions {
        Actions(self.0 | other.0)
    }
}

/// English verbs (as tool definitions and the lexicon's targets spell them) and their actions.
/// "write" creates or replaces (`issue_write`, `write_file`); "open", "set up" and "star" are
/// left out: their action depends on the object.
const VERBS: &[(&str, Actions)] = &[
    ("get", Actions::READ),
    ("read", Actions::READ),
    ("list", Actions::READ),
    ("search", Actions::READ),
    ("find", Actions::READ),
    ("show", Actions::READ),
    ("view", Actions::READ),
    ("display", Actions::READ),
    ("retrieve", Actions::READ),
    ("fetch", Actions::READ),
    ("query", Actions::READ),
    ("look", Actions::READ),
    ("lookup", Actions::READ),
    ("check", Actions::READ),
    ("inspect", Actions::READ),
    ("describe", Actions::READ),
    ("explain", Actions::READ),
    ("download", Actions::READ),
    ("create", Actions::CREATE),
    ("add", Actions::CREATE),
    ("new", Actions::CREATE),
    ("make", Actions::CREATE),
    ("generate", Actions::CREATE),
    ("post", Actions::CREATE),
    ("send", Actions::CREATE),
    ("reply", Actions::CREATE),
    ("push", Actions::CREATE),
    ("fork", Actions::CREATE),
    ("upload", Actions::CREATE),
    ("insert", Actions::CREATE),
    ("append", Actions::CREATE),
    ("attach", Actions::CREATE),
    ("init", Actions::CREATE),
    ("initialize", Actions::CREATE),
    ("remember", Actions::CREATE),
    ("memorize", Actions::CREATE),
    ("write", Actions(Actions::CREATE.0 | Actions::UPDATE.0)),
    ("save", Actions(Actions::CREATE.0 | Actions::UPDATE.0)),
    ("update", Actions::UPDATE),
    ("edit", Actions::UPDATE),
    ("patch", Actions::UPDATE),
    ("set", Actions::UPDATE),
    ("change", Actions::UPDATE),
    ("modify", Actions::UPDATE),
    ("rename", Actions::UPDATE),
    ("move", Actions::UPDATE),
    ("replace", Actions::UPDATE),
    ("mark", Actions::UPDATE),
    ("assign", Actions::UPDATE),
    ("delete", Actions::DELETE),
    ("remove", Actions::DELETE),
    ("erase", Actions::DELETE),
    ("drop", Actions::DELETE),
    ("discard", Actions::DELETE),
    ("purge", Actions::DELETE),
    ("trash", Actions::DELETE),
    ("dismiss", Actions::DELETE),
    ("unstar", Actions::DELETE),
    ("forget", Actions::DELETE),
    ("destroy", Actions::DELETE),
    ("wipe", Actions::DELETE),
];

/// `VERBS` by English stem, the form both tool terms and query terms have.
static BY_STEM: LazyLock<HashMap<String, Actions>> = LazyLock::new(|| {
    let mut m: HashMap<String, Actions> = HashMap::new();
    for (verb, actions) in VERBS {
        let e = m.entry(Lang::En.key(verb)).or_default();
        *e = e.union(*actions);
    }
    m
});

fn of_stem(stem: &str) -> Actions {
    BY_STEM.get(stem).copied().unwrap_or_default()
}

/// How many words of a description may come before its verb ("Notion | Retrieve a block",
/// "Shows the commit logs", "Perform click on a web page").
const DESCRIPTION_LEAD: usize = 4;

/// The actions of a tool: its operation name's verbs, else its description's first verb.
pub fn of_tool(tool: &Tool) -> Actions {
    let name = tool.name.as_str();
    let operation = name.split_once("__").map_or(name, |(_, op)| op);
    let from_name = analyze::terms(operation)
        .iter()
        .fold(Actions::default(), |a, t| a.union(of_stem(t)));
    if !from_name.is_empty() {
        return from_name;
    }
    let Some(description) = &tool.description else {
        return Actions::default();
    };
    // The lead is in the first sentence; a description may run to kilobytes.
    let lead = description
        .char_indices()
        .nth(160)
        .map_or(description.as_str(), |(i, _)| &description[..i]);
    analyze::terms(lead)
        .iter()
        .take(DESCRIPTION_LEAD)
        .map(|t| of_stem(t))
        .find(|a| !a.is_empty())
        .unwrap_or_default()
}

/// Words that open a question in English, French, German or Spanish (accents folded).
const QUESTION_WORDS: &[&str] = &[
    "what", "whats", "which", "who", "whos", "where", "wheres", "when", "how", "is", "are", "does",
    "do", "did", "has", "have", "quel", "quels", "quelle", "quelles", "qui", "ou", "quand",
    "combien", "qu", "est", "was", "welche", "welcher", "welches", "wer", "wo", "wann", "wie",
    "gibt", "que", "cual", "cuales", "quien", "quienes", "donde", "cuando", "cuanto", "cuantos",
    "cuantas", "hay",
];

/// Whether `text` is a question: it ends with a question mark, or opens (Spanish: after `¿`)
/// with a question word.
fn is_question(text: &str) -> bool {
    let text = text.trim();
    if text.ends_with('?') || text.starts_with('¿') {
        return true;
    }
    let mut words = Vec::new();
    analyze::words(text, &mut words);
    words
        .first()
        .is_some_and(|w| QUESTION_WORDS.contains(&analyze::fold(w).as_str()))
}

/// The actions a request asks for, from its analyzed terms (English stems, lexicon targets
/// included) and its form.
pub fn of_query(text: &str, terms: &[(String, f64)]) -> Actions {
    let asked = terms
        .iter()
        .fold(Actions::default(), |a, (t, _)| a.union(of_stem(t)));
    if is_question(text) {
        asked.union(Actions::READ)
    } else {
        asked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::analyze::query_terms;

    fn query(text: &str) -> Actions {
        let a = crate::search::SearchOptions::default().query;
        of_query(text, &query_terms(text, &a))
    }

    #[test]
    fn requests_say_their_action_in_any_language() {
        assert!(query("get rid of the old staging branch").intersects(Actions::DELETE));
        assert_eq!(query("wipe the old branch"), Actions::DELETE);
        assert!(query("supprime la branche staging").intersects(Actions::DELETE));
        assert!(query("lösche den Branch staging").intersects(Actions::DELETE));
        assert!(query("borra la rama staging").intersects(Actions::DELETE));
        assert!(query("¿qué ramas hay?").intersects(Actions::READ));
        assert!(query("what branches exist").intersects(Actions::READ));
        assert!(query("welche Branches gibt es").intersects(Actions::READ));
        assert!(!query("make a branch called x").intersects(Actions::READ));
        assert!(query("make a branch called x").intersects(Actions::CREATE));
        assert!(query("the branch").is_empty());
    }

    #[test]
    fn a_tool_s_action_comes_from_its_name_or_else_its_description() {
        let catalog = crate::search::catalog_from_definitions(&serde_json::json!([
            {"name": "memory__create_entities", "description": "Create entities", "inputSchema": {"type": "object"}},
            {"name": "memory__delete_entities", "description": "Delete entities", "inputSchema": {"type": "object"}},
            {"name": "github__issue_write", "description": "Create or update an issue", "inputSchema": {"type": "object"}},
            {"name": "git__git_log", "description": "Shows the commit logs", "inputSchema": {"type": "object"}},
            {"name": "notion__retrieve_a_block", "description": "Notion | Retrieve a block", "inputSchema": {"type": "object"}},
            {"name": "playwright__browser_click", "description": "Perform click on a web page", "inputSchema": {"type": "object"}},
        ]))
        .unwrap();
        let actions = |name: &str| of_tool(catalog.get(name).unwrap());
        assert_eq!(actions("memory__create_entities"), Actions::CREATE);
        assert_eq!(actions("memory__delete_entities"), Actions::DELETE);
        assert!(actions("github__issue_write").intersects(Actions::CREATE));
        assert!(actions("github__issue_write").intersects(Actions::UPDATE));
        assert_eq!(actions("git__git_log"), Actions::READ);
        assert_eq!(actions("notion__retrieve_a_block"), Actions::READ);
        assert!(actions("playwright__browser_click").is_empty());
    }
}
