//! Text to search terms: tool definitions are analyzed as English; queries may be in English,
//! French, German or Spanish and are analyzed in their language, then mapped onto English terms.
//!
//! **Documents.** Split on anything that is not a letter or digit (so `_`, `__`, `-`, `.`,
//! spaces and punctuation all separate words) and at camelCase boundaries (`perPage`,
//! `HTTPServer`), lowercase, fold accents, drop English stop words and one-letter fragments, and
//! stem (Snowball English), so that "merged pull requests" meets `merge_pull_request`.
//!
//! **Queries.** The same words, plus:
//! - people type "¿qué ramas locales tengo?", and the tool says "List Git branches": function
//!   words of English, French, German and Spanish are dropped, and so are the words about the
//!   conversation rather than the task ("can you show me what I have");
//! - every other word keeps its English stem (weight 1: cognates, product names and identifiers
//!   such as "commit", "Slack", "PR" work in any language);
//! - every word that the [lexicon](lexicon.txt) knows, in any of the four languages (matched
//!   after that language's Snowball stemmer), also searches the lexicon's English targets, at a
//!   lower weight ("dossier" → directory, folder; "ticket" → issue); a request with more
//!   English function words than any other language's uses the English column only, and a
//!   function word is looked up in its own language's column only;
//! - a German compound the lexicon does not know is split where both parts are known
//!   ("Ordnerstruktur" → Ordner + Struktur), or else reduced to its known head
//!   ("Anmeldeseite" → Seite).
//!
//! Each term carries the highest weight any word gave it. Nothing here depends on the catalog,
//! so a query's terms are the same for every caller.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::UnicodeNormalization;

/// Lucene's English stop set (`EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`): short and standard,
/// so that words such as "show", "find" or "who" stay searchable.
const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

/// Words of a request that are about the conversation, not the task ("can you show me what
/// I have"). Queries only: `get_me` keeps its name.
const CONVERSATION_STOP: &[&str] = &[
    "i", "me", "my", "mine", "we", "our", "us", "you", "your", "what", "which", "please", "can",
    "could", "would", "do", "does", "did", "have", "has", "had", "just", "so", "any", "some",
    "there", "here", "want", "need", "let", "lets", "s", "m", "re", "ve", "ll", "d", "hey", "hi",
    "hello", "thanks", "thank", "pls", "plz", "ok", "okay", "also", "really", "actually", "even",
    "maybe", "those", "them", "its", "am", "been", "being", "were", "should", "might", "must",
    "shall", "may", "how", "why", "whether", "quickly",
];

/// Function words (accents folded): articles, pronouns, prepositions, auxiliaries. They tell
/// the language and carry no task.
const FRENCH_STOP: &[&str] = &[
    "le", "la", "les", "un", "une", "des", "du", "de", "et", "ou", "en", "au", "aux", "ce", "cet",
    "cette", "ces", "mon", "ma", "mes", "ton", "ta", "tes", "son", "sa", "ses", "notre", "nos",
    "votre", "vos", "leur", "leurs", "je", "tu", "il", "elle", "on", "nous", "vous", "ils",
    "elles", "me", "moi", "te", "toi", "se", "que", "qui", "quoi", "dont", "est", "sont", "suis",
    "etre", "avons", "ont", "pour", "par", "sur", "dans", "avec", "sans", "sous", "chez", "pas",
    "ne", "plus", "quel", "quelle", "quels", "quelles", "qu", "ca", "cela", "ici", "si", "deja",
    "encore", "tres", "aussi", "mais", "comme", "peux", "peut", "pourrais", "pourriez", "pouvez",
    "veux", "voudrais", "aimerais", "merci", "stp", "svp", "ai", "as", "avez", "etait", "sera",
    "serait", "ceci", "celui", "celle", "ceux", "lequel", "laquelle", "lesquels", "juste", "alors",
    "donc", "puis", "bien", "vraiment", "quelque", "quelques", "chose", "faut",
];
const GERMAN_STOP: &[&str] = &[
    "der",
    "die",
    "das",
    "den",
    "dem",
    "des",
    "ein",
    "eine",
    "einen",
    "einem",
    "einer",
    "eines",
    "und",
    "oder",
    "im",
    "ist",
    "sind",
    "bin",
    "bist",
    "war",
    "wer",
    "was",
    "wie",
    "wo",
    "mit",
    "auf",
    "aus",
    "zu",
    "zum",
    "zur",
    "von",
    "vom",
    "fuer",
    "bei",
    "nach",
    "ich",
    "du",
    "er",
    "sie",
    "es",
    "wir",
    "ihr",
    "mir",
    "mich",
    "dir",
    "dich",
    "uns",
    "euch",
    "mein",
    "meine",
    "meinen",
    "meiner",
    "meines",
    "meinem",
    "dein",
    "deine",
    "sein",
    "seine",
    "ihre",
    "unser",
    "unsere",
    "unserer",
    "unseren",
    "nicht",
    "kein",
    "keine",
    "auch",
    "noch",
    "schon",
    "ob",
    "dass",
    "da",
    "dann",
    "hat",
    "habe",
    "haben",
    "wird",
    "werden",
    "kann",
    "soll",
    "bitte",
    "mal",
    "gibt",
    "dazu",
    "damit",
    "diese",
    "dieser",
    "dieses",
    "welche",
    "welcher",
    "welches",
    "ueberhaupt",
    "gerade",
    "darfst",
    "wurde",
    "bisher",
    "alles",
    "kannst",
    "koenntest",
    "moechte",
    "moechtest",
    "will",
    "willst",
    "wuerde",
    "wuerdest",
    "muss",
    "musst",
    "sollst",
    "doch",
    "eigentlich",
    "gern",
    "gerne",
    "eben",
    "einfach",
    "denn",
    "sich",
    "ihm",
    "ihn",
    "ihnen",
    "man",
    "wenn",
    "als",
    "um",
    "am",
    "dort",
    "etwas",
    "jemand",
    "hast",
    "habt",
    "ja",
    "nun",
    "wohl",
];
const SPANISH_STOP: &[&str] = &[
    "el", "la", "los", "las", "lo", "un", "una", "unos", "unas", "y", "o", "de", "del", "al", "en",
    "con", "por", "para", "que", "es", "son", "soy", "esta", "estan", "este", "estos", "estas",
    "ese", "esa", "mi", "mis", "tu", "tus", "su", "sus", "nuestro", "nuestra", "nuestros",
    "nuestras", "me", "te", "se", "le", "les", "nos", "yo", "hay", "como", "cual", "cuales",
    "donde", "cuando", "todavia", "ya", "muy", "mas", "pero", "si", "sin", "sobre", "tengo",
    "tiene", "he", "ha", "han", "lo", "algun", "alguna", "quien", "quienes", "puedes", "podrias",
    "puede", "podria", "quiero", "quisiera", "necesito", "favor", "gracias", "porfa", "mismo",
    "misma", "eso", "esto", "aqui", "alli", "entonces", "tambien", "algo", "nada", "ti", "usted",
    "ustedes", "nosotros", "ella", "ellos", "ellas", "estoy", "sea", "ser", "fue", "era", "has",
    "hemos", "tienes", "tenemos", "uno", "cada",
];

/// A query language other than English.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    En,
    Fr,
    De,
    Es,
}

impl Lang {
    const ALL: [Lang; 4] = [Lang::En, Lang::Fr, Lang::De, Lang::Es];

    fn stemmer(self) -> &'static Stemmer {
        static STEMMERS: LazyLock<[Stemmer; 4]> = LazyLock::new(|| {
            [
                Stemmer::create(Algorithm::English),
                Stemmer::create(Algorithm::French),
                Stemmer::create(Algorithm::German),
                Stemmer::create(Algorithm::Spanish),
            ]
        });
        &STEMMERS[self as usize]
    }

    fn stop_words(self) -> &'static [&'static str] {
        match self {
            Lang::En => &STOP_WORDS,
            Lang::Fr => FRENCH_STOP,
            Lang::De => GERMAN_STOP,
            Lang::Es => SPANISH_STOP,
        }
    }

    fn is_stop(self, word: &str) -> bool {
        self.stop_words().contains(&word)
    }

    /// The stem the lexicon is keyed by: that language's Snowball stem of the folded word.
    pub(super) fn key(self, folded: &str) -> String {
        self.stemmer().stem(folded).into_owned()
    }
}

/// Lowercase, with German umlauts spelled out (ä → ae, as German does without them), other
/// accents removed (é → e, ñ → n) and ß → ss; so "löschen" meets "loeschen" and "répertoire"
/// meets "repertoire".
pub fn fold(word: &str) -> String {
    let mut spelled = String::with_capacity(word.len());
    for c in word.chars().flat_map(char::to_lowercase) {
        match c {
            'ä' => spelled.push_str("ae"),
            'ö' => spelled.push_str("oe"),
            'ü' => spelled.push_str("ue"),
            'ß' => spelled.push_str("ss"),
            'æ' => spelled.push_str("ae"),
            'œ' => spelled.push_str("oe"),
            c => spelled.push(c),
        }
    }
    if spelled.is_ascii() {
        return spelled;
    }
    spelled
        .nfd()
        .filter(|c| !unicode_normalization::char::is_combining_mark(*c))
        .collect()
}

/// Appends the words of `text` to `out`, lowercased, split on non-alphanumerics and camelCase.
pub fn words(text: &str, out: &mut Vec<String>) {
    for run in text.split(|c: char| !c.is_alphanumeric()) {
        if run.is_empty() {
            continue;
        }
        let chars: Vec<char> = run.chars().collect();
        // A capitalised word with capitals inside is a name written as one word ("GitHub",
        // "JavaScript", "PostgreSQL", "OAuth"), not an identifier; split, "GitHub" would
        // search the local `git` tools. Identifiers are `lowerCamel` or `ACRONYMWord`.
        if is_proper_name(&chars) {
            out.push(run.to_lowercase());
            continue;
        }
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

/// Whether a run of letters and digits is a name written as one word ("GitHub", "OAuth",
/// "MySQL"): letters only, an upper-case first, a lower-case one second or third, and another
/// capital after the first.
fn is_proper_name(chars: &[char]) -> bool {
    matches!(chars, [first, second, ..] if first.is_uppercase()
        && (second.is_lowercase() || chars.get(2).is_some_and(|c| c.is_lowercase())))
        && chars.iter().all(|c| c.is_alphabetic())
        && !chars.iter().skip(1).all(|c| c.is_lowercase())
}

/// One letter is the tail of "won't" or "Dana's", not a word; a lone digit may be a number.
fn is_fragment(w: &str) -> bool {
    w.chars().count() <= 1 && !w.chars().all(char::is_numeric)
}

/// The search terms of `text`, in order, repeats kept (they are term frequencies).
pub fn terms(text: &str) -> Vec<String> {
    let mut ws = Vec::new();
    words(text, &mut ws);
    ws.into_iter()
        .map(|w| fold(&w))
        .filter(|w| !STOP_WORDS.contains(&w.as_str()) && !is_fragment(w))
        .map(|w| Lang::En.key(&w))
        .collect()
}

/// Character n-grams (`min..=max` characters) of one folded word, padded with `^` and `$` so
/// that beginnings and ends count: "issue" and "issues" share most, and so do cognates such as
/// "répertoire" and "repository" or "Datei" and "data".
fn grams_of(word: &str, min: usize, max: usize, out: &mut Vec<String>) {
    let chars: Vec<char> = std::iter::once('^')
        .chain(word.chars())
        .chain(std::iter::once('$'))
        .collect();
    for n in min..=max {
        if chars.len() < n {
            break;
        }
        for w in chars.windows(n) {
            out.push(w.iter().collect());
        }
    }
}

/// The character n-grams of a tool's text, repeats kept: of its folded words that are not
/// English stop words, as [`terms`] keeps them, but unstemmed.
pub fn doc_grams(text: &str, min: usize, max: usize) -> Vec<String> {
    let mut ws = Vec::new();
    words(text, &mut ws);
    let mut out = Vec::new();
    for w in ws.into_iter().map(|w| fold(&w)) {
        if !STOP_WORDS.contains(&w.as_str()) && !is_fragment(&w) {
            grams_of(&w, min, max, &mut out);
        }
    }
    out
}

/// The character n-grams of a query, each once: of its folded words that are no stop word
/// in any of the four languages nor a conversational word.
pub fn query_grams(text: &str, min: usize, max: usize) -> Vec<String> {
    let mut ws = Vec::new();
    words(text, &mut ws);
    let mut out = Vec::new();
    for w in ws.into_iter().map(|w| fold(&w)) {
        let stop =
            CONVERSATION_STOP.contains(&w.as_str()) || Lang::ALL.iter().any(|l| l.is_stop(&w));
        if !stop && !is_fragment(&w) {
            grams_of(&w, min, max, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The words of a query that say what is wanted, lowercased but not folded (the embedding
/// table knows "löschen", not "loeschen"): no stop word of the four languages, no
/// conversational word ("can you show me").
pub fn content_words(text: &str) -> String {
    let mut ws = Vec::new();
    words(text, &mut ws);
    let kept: Vec<String> = ws
        .into_iter()
        .filter(|w| {
            let f = fold(w);
            !(CONVERSATION_STOP.contains(&f.as_str())
                || Lang::ALL.iter().any(|l| l.is_stop(&f))
                || is_fragment(&f))
        })
        .collect();
    kept.join(" ")
}

/// The parsed [lexicon](lexicon.txt): (language, stemmed source word) → English target terms.
struct Lexicon {
    targets: HashMap<(Lang, String), Vec<String>>,
}

static LEXICON: LazyLock<Lexicon> = LazyLock::new(|| Lexicon::parse(include_str!("lexicon.txt")));

impl Lexicon {
    fn parse(text: &str) -> Self {
        let mut targets: HashMap<(Lang, String), Vec<String>> = HashMap::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((to, sources)) = line.split_once(':') else {
                continue;
            };
            let to = terms(to);
            let columns = sources.split('|').map(str::trim);
            for (lang, column) in Lang::ALL.into_iter().zip(columns) {
                let mut ws = Vec::new();
                words(column, &mut ws);
                for key in ws.iter().map(|w| lang.key(&fold(w))) {
                    let entry = targets.entry((lang, key)).or_default();
                    for t in &to {
                        if !entry.contains(t) {
                            entry.push(t.clone());
                        }
                    }
                }
            }
        }
        Self { targets }
    }

    fn get(&self, lang: Lang, folded: &str) -> Option<&[String]> {
        self.targets
            .get(&(lang, lang.key(folded)))
            .map(Vec::as_slice)
    }

    /// The longest source stem of at least `min` characters that the word's stem starts
    /// with: Snowball leaves many inflected forms on another stem than the one the lexicon
    /// lists ("retenu" against "retenir", "gemergt" against "mergen").
    fn get_prefix(&self, lang: Lang, folded: &str, min: usize) -> Option<&[String]> {
        let key = lang.key(folded);
        let chars: Vec<char> = key.chars().collect();
        (min..chars.len()).rev().find_map(|n| {
            let prefix: String = chars[..n].iter().collect();
            self.targets.get(&(lang, prefix)).map(Vec::as_slice)
        })
    }
}

/// How a query is analyzed; the benchmark compares variants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryAnalysis {
    /// Analyze in English, French, German and Spanish (otherwise: English only).
    pub languages: bool,
    /// Weight of lexicon targets (0 turns the lexicon off).
    pub lexicon_weight: f64,
    /// Split unknown German compounds into known parts.
    pub decompound: bool,
    /// Weight of the terms that the shape of a token implies (0 turns them off): a URL means
    /// "url", `logo.png` or `src/main.go` "file", `acme/api` "repository", `@dana` "user".
    pub hint_weight: f64,
    /// A word the lexicon does not know also matches a source stem it starts with, of at
    /// least this many characters (0 turns this off).
    pub prefix_min: usize,
    /// Weight of the words inside a link (`https://example.com/blog/post-42`): its address
    /// (`https`, `com`, `example`) says little of the task, and the link already implies the
    /// hint "url"; but `github.com/acme/api/pull/7` names the product. 1 searches them as
    /// typed words.
    pub link_weight: f64,
}

/// The weighted search terms of a query, sorted by term, each once.
///
/// With `languages`, a word is a stop word if it is one in any of the four languages, and the
/// lexicon is looked up in all of them: a guess from a short request is often wrong ("¿qué
/// hora es?" has as many French as Spanish function words), and the languages' function words
/// are rarely task words in another.
pub fn query_terms(text: &str, a: &QueryAnalysis) -> Vec<(String, f64)> {
    let (prose, links) = split_links(text);
    let mut ws = Vec::new();
    words(&prose, &mut ws);
    // A link's words go the same way as the others (its `pull` or `issues` is looked up in
    // the lexicon too), at the link weight; `factor[i]` is word i's.
    let typed = ws.len();
    if a.link_weight > 0.0 {
        words(&links, &mut ws);
    }
    let factor = |i: usize| if i < typed { 1.0 } else { a.link_weight };
    let langs: &[Lang] = if a.languages { &Lang::ALL } else { &[Lang::En] };
    let mut out: HashMap<String, f64> = HashMap::new();
    let mut put = |t: &str, w: f64| {
        let e = out.entry(t.to_owned()).or_insert(0.0);
        *e = e.max(w);
    };
    let lexicon = &*LEXICON;
    let stop_in = |l: Lang, f: &str| match l {
        Lang::En => STOP_WORDS.contains(&f) || CONVERSATION_STOP.contains(&f),
        _ => l.is_stop(f),
    };
    // A request with more English function words than those of any other language is read
    // as English: the other columns of the lexicon are not looked up, since many of their
    // words are English words too ("page", "link", "web", "base").
    let english_led = {
        let mut counts = [0usize; 4];
        for w in &ws {
            let f = fold(w);
            for (i, l) in Lang::ALL.into_iter().enumerate() {
                if stop_in(l, &f) {
                    counts[i] += 1;
                }
            }
        }
        counts[0] > counts[1..].iter().copied().max().unwrap_or(0)
    };
    let lexicon_langs: &[Lang] = if english_led { &[Lang::En] } else { langs };
    for (i, w) in ws.iter().enumerate() {
        let f = factor(i);
        let folded = fold(w);
        if is_fragment(&folded) {
            continue;
        }
        let stop = CONVERSATION_STOP.contains(&folded.as_str())
            || langs.iter().any(|l| l.is_stop(&folded));
        if a.lexicon_weight > 0.0 {
            let mut found = false;
            for &l in lexicon_langs {
                // A function word of one language is not looked up in another's column
                // (French "mes" is not Spanish "mes", month); in its own it may be ("bitte").
                if stop && !stop_in(l, &folded) {
                    continue;
                }
                if let Some(targets) = lexicon.get(l, &folded) {
                    found = true;
                    for t in targets {
                        put(t, a.lexicon_weight * f);
                    }
                }
            }
            if !found && a.prefix_min > 0 && !stop {
                for &l in langs {
                    if let Some(targets) = lexicon.get_prefix(l, &folded, a.prefix_min) {
                        found = true;
                        for t in targets {
                            put(t, a.lexicon_weight * f);
                        }
                    }
                }
            }
            if !found && a.decompound && a.languages && !stop {
                for t in decompound(lexicon, &folded) {
                    put(&t, a.lexicon_weight * f);
                }
            }
        }
        if !stop {
            put(&Lang::En.key(&folded), f);
        }
    }
    if a.hint_weight > 0.0 {
        for hint in hints(text) {
            put(&Lang::En.key(hint), a.hint_weight);
        }
    }
    let mut terms: Vec<(String, f64)> = out.into_iter().collect();
    terms.sort_by(|a, b| a.0.cmp(&b.0));
    terms
}

/// Whether a whitespace-separated token is a link: `https://…`, `http://…`, `www.…`, with
/// any quotes or brackets around it.
fn is_link(token: &str) -> bool {
    starts_link(token.trim_start_matches(|c: char| !c.is_alphanumeric()))
}

/// Whether `t` begins as a link does, in any case.
fn starts_link(t: &str) -> bool {
    let head = t.get(..8).unwrap_or(t).to_ascii_lowercase();
    head.starts_with("http://") || head.starts_with("https://") || head.starts_with("www.")
}

/// `text` cut in two: its prose, with every link blanked out, and its links.
pub fn split_links(text: &str) -> (Cow<'_, str>, String) {
    if !text.split_whitespace().any(is_link) {
        return (Cow::Borrowed(text), String::new());
    }
    let (mut prose, mut links) = (String::with_capacity(text.len()), String::new());
    for token in text.split_whitespace() {
        let into = if is_link(token) {
            &mut links
        } else {
            &mut prose
        };
        into.push_str(token);
        into.push(' ');
    }
    (Cow::Owned(prose), links)
}

/// What the shape of each whitespace-separated token says it is, in any language: a URL, a
/// file (a name with an extension, or a dotted path), a folder (a path ending in `/`), an
/// `owner/repo` pair, a `@user`. Requests name these far more often than the tool's words.
pub fn hints(text: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for raw in text.split_whitespace() {
        let t = raw.trim_matches(|c: char| {
            matches!(
                c,
                '"' | '\'' | '`' | ',' | ';' | ':' | '?' | '!' | '(' | ')' | '«' | '»'
            )
        });
        let t = t.strip_suffix('.').unwrap_or(t);
        if t.len() < 2 || t.len() > 200 {
            continue;
        }
        if starts_link(t) {
            out.push("url");
            continue;
        }
        if let Some(user) = t.strip_prefix('@') {
            if !user.is_empty()
                && user
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '-' || c == '_')
            {
                out.push("user");
            }
            continue;
        }
        let last = t.rsplit('/').next().unwrap_or(t);
        let extension = last.rsplit_once('.').is_some_and(|(stem, ext)| {
            (1..=5).contains(&ext.len())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
                && ext.chars().any(|c| c.is_ascii_alphabetic())
                && stem
                    .chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
        });
        // Build and project files are named without an extension: `Dockerfile`, `Makefile`,
        // `Jenkinsfile` (four letters before "file" at least: "Profile" is not one).
        let named_file = last.len() >= 8
            && last.to_ascii_lowercase().ends_with("file")
            && last.chars().all(|c| c.is_ascii_alphabetic())
            && last.chars().next().is_some_and(|c| c.is_ascii_uppercase());
        if extension || named_file {
            out.push("file");
        } else if t.contains('/') && !t.contains("//") {
            let parts: Vec<&str> = t.split('/').collect();
            let words = parts.iter().all(|p| {
                p.chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
            });
            if !words {
                continue;
            }
            if t.ends_with('/') || parts.len() > 2 {
                out.push("directory");
            } else if parts.len() == 2 && parts.iter().all(|p| !p.is_empty()) {
                out.push("repository");
            }
        }
    }
    out
}

/// The lexicon targets of a German compound made of two known words, with an optional linking
/// element (`s`, `es`, `n`, `en`, `e`: "Besprechungsnotizen", "Nachrichtenverlauf"); failing
/// that, of its known head alone, the last part of at least five letters ("Anmeldeseite" →
/// Seite), since the head says what the compound is. Empty when no part is known.
fn decompound(lexicon: &Lexicon, word: &str) -> Vec<String> {
    let chars: Vec<char> = word.chars().collect();
    if chars.len() < 8 {
        return Vec::new();
    }
    for i in (4..=chars.len() - 4).rev() {
        let left: String = chars[..i].iter().collect();
        let right: String = chars[i..].iter().collect();
        let Some(r) = lexicon.get(Lang::De, &right) else {
            continue;
        };
        let l = lexicon.get(Lang::De, &left).or_else(|| {
            ["s", "es", "n", "en", "e"].iter().find_map(|link| {
                left.strip_suffix(link)
                    .filter(|l| l.chars().count() >= 3)
                    .and_then(|l| lexicon.get(Lang::De, l))
            })
        });
        if let Some(l) = l {
            return l.iter().chain(r).cloned().collect();
        }
    }
    for i in 3..=chars.len() - 5 {
        let right: String = chars[i..].iter().collect();
        if let Some(r) = lexicon.get(Lang::De, &right) {
            return r.to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_of_a_token_says_what_it_is() {
        assert_eq!(hints("lis « https://example.com/a » stp"), ["url"]);
        assert_eq!(hints("open logo.png, then src/main.go."), ["file", "file"]);
        assert_eq!(
            hints("what's in docs/ and build/out/reports"),
            ["directory", "directory"]
        );
        assert_eq!(hints("star acme/api for @dana-x"), ["repository", "user"]);
        assert_eq!(
            hints("show the Dockerfile and the Makefile"),
            ["file", "file"]
        );
        assert!(hints("Profile of Dana, a file").is_empty());
        // Versions, sentences and e-mail-like noise are not files or users.
        assert!(hints("release v1.2 and 1.29 ; a/b//c ; @ ; end.").is_empty());
        let long = "a/".repeat(500);
        assert!(hints(&long).is_empty());
    }

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
        // Names written as one word stay one word: "GitHub" is not the local `git`.
        assert_eq!(ws("on GitHub"), ["on", "github"]);
        assert_eq!(
            ws("OAuth PostgreSQL MySQL"),
            ["oauth", "postgresql", "mysql"]
        );
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

    #[test]
    fn accents_fold_and_umlauts_are_spelled_out() {
        assert_eq!(fold("Répertoire"), "repertoire");
        assert_eq!(fold("löschen"), "loeschen");
        assert_eq!(fold("Straße"), "strasse");
        assert_eq!(fold("contraseña"), "contrasena");
    }

    fn has(terms: &[(String, f64)], t: &str) -> bool {
        terms.iter().any(|(x, _)| x == t)
    }

    /// Languages, the lexicon at the default weight and compounds on; no hints or prefixes.
    fn lexicon_on() -> QueryAnalysis {
        QueryAnalysis {
            languages: true,
            lexicon_weight: 0.7,
            decompound: true,
            hint_weight: 0.0,
            prefix_min: 0,
            link_weight: 1.0,
        }
    }

    #[test]
    fn a_link_is_its_own_part_and_its_words_weigh_less() {
        let (prose, links) = split_links("read (https://Example.com/blog/post-42) for me");
        assert_eq!(
            prose.split_whitespace().collect::<Vec<_>>(),
            ["read", "for", "me"]
        );
        assert_eq!(links.trim(), "(https://Example.com/blog/post-42)");
        assert!(matches!(split_links("no link here"), (Cow::Borrowed(_), l) if l.is_empty()));
        let a = QueryAnalysis {
            link_weight: 0.3,
            hint_weight: 0.7,
            ..lexicon_on()
        };
        let q = query_terms("open www.github.com/acme/api in the browser", &a);
        let weight = |t: &str| q.iter().find(|(x, _)| x == t).map(|(_, w)| *w);
        assert_eq!(weight("browser"), Some(1.0));
        assert_eq!(weight("github"), Some(0.3));
        assert_eq!(weight("url"), Some(0.7), "the link still implies the hint");
        let off = QueryAnalysis {
            link_weight: 0.0,
            ..a
        };
        assert_eq!(
            query_terms("open www.github.com/acme/api", &off)
                .iter()
                .find(|(x, _)| x == "github"),
            None
        );
    }

    #[test]
    fn foreign_words_search_their_english_terms_below_typed_words() {
        let a = lexicon_on();
        let q = query_terms("crée un dossier dans mes documents", &a);
        assert!(has(&q, "directori") && has(&q, "folder"), "{q:?}");
        let q = query_terms("¿qué hora es ahora mismo?", &a);
        assert!(has(&q, "time"), "{q:?}");
        assert!(
            !has(&q, "dan") && !has(&q, "un"),
            "stop words dropped: {q:?}"
        );
        let q = query_terms("zeig mir die komplette Ordnerstruktur", &a);
        assert!(has(&q, "directori") && has(&q, "tree"), "{q:?}");
        let q = query_terms("file a ticket", &a);
        let weight = |t: &str| q.iter().find(|(x, _)| x == t).map(|(_, w)| *w);
        assert_eq!(weight("ticket"), Some(1.0));
        assert_eq!(weight("issu"), Some(0.7));
        // Off: English terms only, as typed.
        let plain = QueryAnalysis {
            languages: false,
            lexicon_weight: 0.0,
            decompound: false,
            hint_weight: 0.0,
            prefix_min: 0,
            link_weight: 1.0,
        };
        assert!(!has(&query_terms("file a ticket", &plain), "issu"));
    }

    #[test]
    fn english_requests_skip_the_other_columns_and_compounds_keep_their_head() {
        let a = lexicon_on();
        // "page" is a French source (of "fetch url"), but this request is English.
        let q = query_terms("is the word there anywhere on this page?", &a);
        assert!(!has(&q, "fetch"), "{q:?}");
        // "mes" is a French function word, not the Spanish month.
        let q = query_terms("range mes documents dans un dossier", &a);
        assert!(!has(&q, "month"), "{q:?}");
        // A German stop word is still a word of the German column ("bitte" → ask).
        let q = query_terms("bitte Sam, sich den Pull Request anzusehen", &a);
        assert!(has(&q, "review"), "{q:?}");
        // A compound whose head alone is known searches the head.
        let q = query_terms("die Anmeldeseite läuft in ein Timeout", &a);
        assert!(has(&q, "page"), "{q:?}");
    }
}
