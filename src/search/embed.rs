//! An optional static embedding model: a table of word pieces and one vector each, either
//! WordLlama's own static table (the default of `bench/embeddings/setup.sh`) or one distilled
//! from multilingual-e5-small (model2vec's recipe). A text's vector is the weighted mean of
//! its pieces' vectors, so embedding a query is a few table look-ups: no transformer runs in
//! the gateway.
//!
//! Why: requests describe a task in other words than the tool's; a model trained on sentence
//! similarity places "approve" near "review" without a lexicon entry for every pair.
//!
//! The table is not shipped and not fetched: a setup step makes it from a PyPI package, and
//! the gateway reads it only when given the file (`--search-embeddings`). Without it, search is
//! the word ranker alone. The file is read as hostile input: every length is checked against
//! what is left before anything is allocated.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Magic of the table format written by `bench/embeddings/distill.py`.
const MAGIC: &[u8; 4] = b"TGE1";
/// Bounds on what a table may claim, so a corrupt or hostile file cannot make us allocate
/// without limit.
const MAX_PIECES: usize = 1_000_000;
const MAX_DIM: usize = 1024;
/// The longest word that is cut into pieces; longer ones are cut at this many characters.
const MAX_WORD_CHARS: usize = 48;
/// SentencePiece's word-start mark.
const WORD_START: char = '\u{2581}';
/// Smooth inverse frequency (Arora et al. 2017): a piece's weight is a / (a + p(piece)), so
/// frequent pieces ("the", "de", "-s") count little.
const SIF_A: f32 = 1e-4;

/// A loaded table.
pub struct StaticModel {
    dim: usize,
    pieces: HashMap<Box<str>, u32>,
    /// Per piece: its weight in a mean.
    weight: Vec<f32>,
    /// Per piece: its log-probability in the unigram model (the tokenizer's score).
    logp: Vec<f32>,
    /// Row-major, pieces × dim.
    vectors: Vec<f32>,
    max_piece_chars: usize,
}

impl std::fmt::Debug for StaticModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticModel")
            .field("pieces", &self.logp.len())
            .field("dim", &self.dim)
            .finish()
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("embedding table is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array(&mut self) -> Result<[u8; 4], String> {
        self.take(4)?
            .try_into()
            .map_err(|_| "embedding table is truncated".to_owned())
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn f32(&mut self) -> Result<f32, String> {
        Ok(f32::from_le_bytes(self.array()?))
    }
}

impl StaticModel {
    /// Reads a table file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read embedding table {}: {e}", path.display()))?;
        Self::from_bytes(&bytes)
    }

    /// Parses a table (format in `bench/embeddings/distill.py`).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err("not an embedding table (bad magic)".into());
        }
        let n = r.u32()? as usize;
        let dim = r.u32()? as usize;
        if n == 0 || n > MAX_PIECES || dim == 0 || dim > MAX_DIM {
            return Err(format!(
                "embedding table claims {n} pieces of {dim} dimensions"
            ));
        }
        let mut pieces = HashMap::with_capacity(n);
        let mut logp = Vec::with_capacity(n);
        let mut max_piece_chars = 1;
        for i in 0..n {
            let len = r.take(1)?[0] as usize;
            let text = std::str::from_utf8(r.take(len)?)
                .map_err(|_| format!("embedding table: piece {i} is not UTF-8"))?;
            let p = r.f32()?;
            if !p.is_finite() {
                return Err(format!("embedding table: piece {i} has no finite score"));
            }
            max_piece_chars = max_piece_chars.max(text.chars().count());
            pieces.insert(text.into(), i as u32);
            logp.push(p);
        }
        let q = r.take(n * dim)?;
        let mut scales = Vec::with_capacity(n);
        for _ in 0..n {
            scales.push(r.f32()?);
        }
        if !r.0.is_empty() {
            return Err("embedding table has trailing bytes".into());
        }
        let mut vectors = Vec::with_capacity(n * dim);
        for (row, scale) in q.chunks_exact(dim).zip(&scales) {
            vectors.extend(row.iter().map(|&b| b as i8 as f32 * scale));
        }
        if vectors.iter().any(|v| !v.is_finite()) {
            return Err("embedding table has a non-finite component".into());
        }
        let weight = logp.iter().map(|p| SIF_A / (SIF_A + p.exp())).collect();
        Ok(Self {
            dim,
            pieces,
            weight,
            logp,
            vectors,
            max_piece_chars,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Cuts one word (lowercased, word-start mark included) into its most probable pieces
    /// (Viterbi over the unigram model, as SentencePiece does); a character no piece covers is
    /// skipped.
    fn pieces_of(&self, word: &[char], out: &mut Vec<u32>) {
        let n = word.len();
        // best[i]: score of the best cut of word[..i]; from[i]: (start, piece) of its last piece.
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        let mut from: Vec<(usize, Option<u32>)> = vec![(0, None); n + 1];
        best[0] = 0.0;
        let mut buf = String::new();
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            // A skipped character costs more than any piece.
            let skip = best[i] - 30.0;
            if skip > best[i + 1] {
                best[i + 1] = skip;
                from[i + 1] = (i, None);
            }
            buf.clear();
            for j in i..n.min(i + self.max_piece_chars) {
                buf.push(word[j]);
                if let Some(&id) = self.pieces.get(buf.as_str()) {
                    let s = best[i] + self.logp[id as usize];
                    if s > best[j + 1] {
                        best[j + 1] = s;
                        from[j + 1] = (i, Some(id));
                    }
                }
            }
        }
        let start = out.len();
        let mut i = n;
        while i > 0 {
            let (j, id) = from[i];
            if let Some(id) = id {
                out.push(id);
            }
            i = j;
        }
        out[start..].reverse();
    }

    /// The pieces of `text`: lowercased, cut into words at anything not alphanumeric
    /// (`create_issue` is two words), each word cut into pieces.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut word: Vec<char> = Vec::with_capacity(MAX_WORD_CHARS + 1);
        let flush = |word: &mut Vec<char>, out: &mut Vec<u32>| {
            if word.len() > 1 {
                self.pieces_of(word, out);
            }
            word.clear();
            word.push(WORD_START);
        };
        flush(&mut word, &mut out);
        for c in text.chars() {
            if c.is_alphanumeric() {
                if word.len() <= MAX_WORD_CHARS {
                    word.extend(c.to_lowercase());
                }
            } else {
                flush(&mut word, &mut out);
            }
        }
        flush(&mut word, &mut out);
        out
    }

    /// Adds `text`'s pieces, each weighted by `weight` times its SIF weight, to `acc`.
    pub fn accumulate(&self, text: &str, weight: f32, acc: &mut [f32]) {
        for id in self.tokenize(text) {
            let w = weight * self.weight[id as usize];
            let row = &self.vectors[id as usize * self.dim..][..self.dim];
            for (a, v) in acc.iter_mut().zip(row) {
                *a += w * v;
            }
        }
    }

    /// `text`'s unit vector, or `None` when no piece of it is known.
    pub fn embed(&self, text: &str) -> Option<Vec<f32>> {
        let mut acc = vec![0.0; self.dim];
        self.accumulate(text, 1.0, &mut acc);
        normalize(acc)
    }
}

/// Scales `v` to unit length; `None` for the zero vector.
pub fn normalize(mut v: Vec<f32>) -> Option<Vec<f32>> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !(norm > 0.0 && norm.is_finite()) {
        return None;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    Some(v)
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

static INSTALLED: OnceLock<Arc<StaticModel>> = OnceLock::new();

/// Makes `model` the one every index built from now on uses (once per process, at start).
pub fn install(model: StaticModel) -> Result<(), String> {
    INSTALLED
        .set(Arc::new(model))
        .map_err(|_| "an embedding table is already installed".to_string())
}

/// The installed table, if the gateway was given one.
pub fn installed() -> Option<Arc<StaticModel>> {
    INSTALLED.get().cloned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A table in the file format, made here: pieces with their log-probabilities and vectors.
    pub(crate) fn table(dim: u32, pieces: &[(&str, f32, Vec<i8>)]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend((pieces.len() as u32).to_le_bytes());
        b.extend(dim.to_le_bytes());
        for (p, s, _) in pieces {
            b.push(p.len() as u8);
            b.extend(p.as_bytes());
            b.extend(s.to_le_bytes());
        }
        for (_, _, v) in pieces {
            b.extend(v.iter().map(|x| *x as u8));
        }
        for _ in pieces {
            b.extend(0.5f32.to_le_bytes());
        }
        b
    }

    /// A table over `words` (each a word-start piece) and every letter, with vectors drawn from
    /// a hash of the piece: no meaning, but every query and tool gets a vector.
    pub(crate) fn toy(words: &[&str]) -> StaticModel {
        let mut pieces: Vec<String> = ('a'..='z').map(String::from).collect();
        pieces.extend(words.iter().map(|w| format!("\u{2581}{w}")));
        pieces.sort();
        pieces.dedup();
        let rows: Vec<(&str, f32, Vec<i8>)> = pieces
            .iter()
            .map(|p| {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                let v = (0..8)
                    .map(|_| {
                        for b in p.bytes() {
                            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
                        }
                        (h >> 56) as i8
                    })
                    .collect();
                (p.as_str(), -8.0 - p.len() as f32 / 4.0, v)
            })
            .collect();
        StaticModel::from_bytes(&table(8, &rows)).unwrap()
    }

    fn sample() -> StaticModel {
        StaticModel::from_bytes(&table(
            2,
            &[
                ("\u{2581}delete", -9.0, vec![100, 0]),
                ("\u{2581}supprim", -10.0, vec![90, 10]),
                ("er", -6.0, vec![0, 0]),
                ("\u{2581}issue", -9.0, vec![0, 100]),
                ("\u{2581}", -3.0, vec![1, 1]),
                ("d", -7.0, vec![5, 5]),
            ],
        ))
        .unwrap()
    }

    #[test]
    fn words_are_cut_into_their_most_probable_pieces() {
        let m = sample();
        let ids = m.tokenize("Supprimer the_issue");
        let names: Vec<&str> = ids
            .iter()
            .map(|id| {
                m.pieces
                    .iter()
                    .find(|(_, v)| **v == *id)
                    .map(|(k, _)| &**k)
                    .unwrap()
            })
            .collect();
        // "the" is not covered: its letters are skipped, the word-start mark is kept.
        assert_eq!(
            names,
            ["\u{2581}supprim", "er", "\u{2581}", "\u{2581}issue"]
        );
    }

    #[test]
    fn a_translation_lands_near_its_word() {
        let m = sample();
        let fr = m.embed("supprimer").unwrap();
        let en = m.embed("delete").unwrap();
        let other = m.embed("issue").unwrap();
        assert!(dot(&fr, &en) > 0.9);
        assert!(dot(&fr, &other) < 0.2);
        assert!(m.embed("   ").is_none());
    }

    #[test]
    fn a_hostile_table_is_refused_before_allocating() {
        let mut huge = MAGIC.to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        huge.extend(4u32.to_le_bytes());
        assert!(
            StaticModel::from_bytes(&huge)
                .unwrap_err()
                .contains("claims")
        );
        let good = table(2, &[("a", -1.0, vec![1, 2])]);
        assert!(StaticModel::from_bytes(&good).is_ok());
        for cut in 0..good.len() {
            assert!(
                StaticModel::from_bytes(&good[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(StaticModel::from_bytes(&trailing).is_err());
        assert!(StaticModel::from_bytes(b"GGUF\0\0\0\0").is_err());
    }
}
