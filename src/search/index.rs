//! The BM25 index of one catalog, searched through any caller's visible subset.
//!
//! Built once per catalog (tools analyzed into weighted term frequencies, and postings per
//! term), reused by every policy-only snapshot rebuild, and rebuilt incrementally when the
//! catalog changes: a tool whose `content_hash` did not change keeps its analysis.
//!
//! **Statistics are computed per request, over the caller's visible tools only.** Document
//! frequency, the number of documents and the average length all come from the visible set, so
//! a search ranks exactly as an index built over that caller's tools alone would (a property test
//! checks this bit for bit). The ranking of one agent's tools therefore never depends on tools
//! it may not see, which would otherwise leak, through the order of results, which words occur
//! in other agents' tools. The cost is one pass over the postings of the query's terms and one
//! over the visible tools: microseconds for thousands of tools.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::analyze;
use crate::pool::{Catalog, Tool};

/// Ranking parameters. The defaults were fixed from the literature and prior art before the
/// benchmark ever ran, and were not tuned to its queries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// Term-frequency saturation (Robertson's and Lucene's default).
    pub k1: f64,
    /// Length normalisation (Robertson's and Lucene's default).
    pub b: f64,
    /// Weight of a term in the tool's name: names are short and say what the tool does.
    pub name_weight: f64,
    /// Weight of a term in the title and description.
    pub description_weight: f64,
    /// Weight of a term in parameter names and descriptions: useful, but repetitive across
    /// tools ("page", "owner", "limit"), so they count half.
    pub parameter_weight: f64,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            k1: 1.2,
            b: 0.75,
            name_weight: 3.0,
            description_weight: 1.0,
            parameter_weight: 0.5,
        }
    }
}

impl SearchOptions {
    /// One line for the benchmark's header.
    pub fn summary(&self) -> String {
        format!(
            "BM25 k1={} b={}, field weights name {} / description {} / parameters {}",
            self.k1, self.b, self.name_weight, self.description_weight, self.parameter_weight
        )
    }

    /// The variants the benchmark's `--ablation` compares, by label.
    pub fn variants() -> Vec<(&'static str, SearchOptions)> {
        let o = SearchOptions::default();
        vec![
            ("3 / 1 / 0.5 (default)", o),
            (
                "1 / 1 / 1 (one bag of words)",
                SearchOptions {
                    name_weight: 1.0,
                    parameter_weight: 1.0,
                    ..o
                },
            ),
            (
                "3 / 1 / 0 (no parameters)",
                SearchOptions {
                    parameter_weight: 0.0,
                    ..o
                },
            ),
            (
                "0 / 1 / 0 (description only)",
                SearchOptions {
                    name_weight: 0.0,
                    parameter_weight: 0.0,
                    ..o
                },
            ),
        ]
    }
}

/// How deep into nested parameter objects names and descriptions are indexed.
const MAX_SCHEMA_DEPTH: usize = 3;

/// One tool, analyzed: its weighted term frequencies and weighted length.
#[derive(Debug)]
struct Analyzed {
    content_hash: String,
    /// Sorted by term.
    terms: Vec<(String, f64)>,
    len: f64,
}

fn analyze_tool(tool: &Tool, o: &SearchOptions) -> Analyzed {
    let mut tf: HashMap<String, f64> = HashMap::new();
    let mut len = 0.0;
    let mut add = |text: &str, weight: f64| {
        for t in analyze::terms(text) {
            *tf.entry(t).or_default() += weight;
            len += weight;
        }
    };
    add(tool.name.as_str(), o.name_weight);
    for text in [&tool.title, &tool.description].into_iter().flatten() {
        add(text, o.description_weight);
    }
    schema_text(&tool.input_schema, 0, &mut |text| {
        add(text, o.parameter_weight)
    });
    let mut terms: Vec<(String, f64)> = tf.into_iter().collect();
    terms.sort_by(|a, b| a.0.cmp(&b.0));
    Analyzed {
        content_hash: tool.content_hash.clone(),
        terms,
        len,
    }
}

/// Parameter names and descriptions of an object schema, nested objects and arrays included.
fn schema_text(schema: &Map<String, Value>, depth: usize, out: &mut impl FnMut(&str)) {
    if depth >= MAX_SCHEMA_DEPTH {
        return;
    }
    let Some(Value::Object(props)) = schema.get("properties") else {
        return;
    };
    for (name, prop) in props {
        out(name);
        let Value::Object(prop) = prop else { continue };
        if let Some(Value::String(d)) = prop.get("description") {
            out(d);
        }
        schema_text(prop, depth + 1, out);
        if let Some(Value::Object(items)) = prop.get("items") {
            if let Some(Value::String(d)) = items.get("description") {
                out(d);
            }
            schema_text(items, depth + 1, out);
        }
    }
}

/// A search result: a visible tool and its BM25 score.
#[derive(Debug, Clone)]
pub struct Hit {
    pub tool: Arc<Tool>,
    pub score: f64,
}

/// The index of one catalog.
#[derive(Default)]
pub struct SearchIndex {
    options: SearchOptions,
    /// In catalog (name) order.
    docs: Vec<(Arc<Tool>, Arc<Analyzed>)>,
    by_name: HashMap<String, u32>,
    vocabulary: HashMap<String, u32>,
    /// Per term: (document, weighted term frequency), by document.
    postings: Vec<Vec<(u32, f64)>>,
}

impl fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchIndex")
            .field("tools", &self.docs.len())
            .field("terms", &self.vocabulary.len())
            .finish()
    }
}

impl SearchIndex {
    /// Indexes `catalog` with the default options.
    pub fn build(catalog: &Catalog, previous: Option<&SearchIndex>) -> Self {
        Self::build_with(catalog, previous, SearchOptions::default())
    }

    /// Indexes `catalog`, reusing the analysis of every unchanged tool of `previous`.
    pub fn build_with(
        catalog: &Catalog,
        previous: Option<&SearchIndex>,
        options: SearchOptions,
    ) -> Self {
        let reusable = |tool: &Tool| -> Option<Arc<Analyzed>> {
            let prev = previous.filter(|p| p.options == options)?;
            let (_, a) = &prev.docs[*prev.by_name.get(tool.name.as_str())? as usize];
            (a.content_hash == tool.content_hash).then(|| a.clone())
        };
        let docs: Vec<(Arc<Tool>, Arc<Analyzed>)> = catalog
            .tools()
            .map(|t| {
                let a = reusable(t).unwrap_or_else(|| Arc::new(analyze_tool(t, &options)));
                (t.clone(), a)
            })
            .collect();
        let mut vocabulary: HashMap<String, u32> = HashMap::new();
        let mut postings: Vec<Vec<(u32, f64)>> = Vec::new();
        let mut by_name = HashMap::with_capacity(docs.len());
        for (d, (tool, a)) in docs.iter().enumerate() {
            by_name.insert(tool.name.as_str().to_owned(), d as u32);
            for (term, tf) in &a.terms {
                let id = *vocabulary.entry(term.clone()).or_insert_with(|| {
                    postings.push(Vec::new());
                    (postings.len() - 1) as u32
                });
                postings[id as usize].push((d as u32, *tf));
            }
        }
        Self {
            options,
            docs,
            by_name,
            vocabulary,
            postings,
        }
    }

    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// The best `limit` matches for `query` among `visible` (the caller's tools), best first;
    /// ties in name order. Tools that match no query term are not returned. Every hit is one of
    /// `visible`, by construction: the index only scores documents `visible` names.
    pub fn search(&self, visible: &[Arc<Tool>], query: &str, limit: usize) -> Vec<Hit> {
        // Document -> position in `visible`, for the visible documents only.
        let mut slot: Vec<u32> = vec![u32::MAX; self.docs.len()];
        let mut n = 0usize;
        let mut total_len = 0.0;
        for (i, t) in visible.iter().enumerate() {
            if let Some(&d) = self.by_name.get(t.name.as_str()) {
                slot[d as usize] = i as u32;
                n += 1;
            }
        }
        // Summed in document order, so that the result does not depend on `visible`'s order.
        for (d, (_, a)) in self.docs.iter().enumerate() {
            if slot[d] != u32::MAX {
                total_len += a.len;
            }
        }
        if n == 0 || limit == 0 {
            return Vec::new();
        }
        let avg_len = (total_len / n as f64).max(f64::MIN_POSITIVE);
        let mut query_terms = analyze::terms(query);
        query_terms.sort();
        query_terms.dedup();
        let SearchOptions { k1, b, .. } = self.options;
        let mut scores = vec![0.0f64; visible.len()];
        let mut matched = vec![false; visible.len()];
        for term in &query_terms {
            let Some(&id) = self.vocabulary.get(term) else {
                continue;
            };
            let postings = &self.postings[id as usize];
            let df = postings
                .iter()
                .filter(|(d, _)| slot[*d as usize] != u32::MAX)
                .count();
            if df == 0 {
                continue;
            }
            // Lucene's non-negative IDF.
            let idf = (1.0 + (n as f64 - df as f64 + 0.5) / (df as f64 + 0.5)).ln();
            for &(d, tf) in postings {
                let i = slot[d as usize];
                if i == u32::MAX {
                    continue;
                }
                let len = self.docs[d as usize].1.len;
                let norm = k1 * (1.0 - b + b * len / avg_len);
                scores[i as usize] += idf * tf * (k1 + 1.0) / (tf + norm);
                matched[i as usize] = true;
            }
        }
        let mut hits: Vec<Hit> = visible
            .iter()
            .zip(scores)
            .zip(matched)
            .filter(|(_, m)| *m)
            .map(|((t, score), _)| Hit {
                tool: t.clone(),
                score,
            })
            .collect();
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.tool.name.cmp(&b.tool.name))
        });
        hits.truncate(limit);
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuild_reuses_the_analysis_of_unchanged_tools() {
        let defs: Value =
            serde_json::from_str(include_str!("../../bench/catalogs/reference/tools.json"))
                .unwrap();
        let catalog = crate::search::catalog_from_definitions(&defs).unwrap();
        let first = SearchIndex::build(&catalog, None);
        let second = SearchIndex::build(&catalog, Some(&first));
        assert!(
            first
                .docs
                .iter()
                .zip(&second.docs)
                .all(|(a, b)| Arc::ptr_eq(&a.1, &b.1))
        );
        // Other options: nothing is reused, since the weights are baked into the analysis.
        let other = SearchOptions {
            name_weight: 1.0,
            ..SearchOptions::default()
        };
        let third = SearchIndex::build_with(&catalog, Some(&second), other);
        assert!(
            second
                .docs
                .iter()
                .zip(&third.docs)
                .all(|(a, b)| !Arc::ptr_eq(&a.1, &b.1))
        );
    }
}
