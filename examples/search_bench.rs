//! Tool search benchmark: how well `search_tools` finds the right tool, what deferred loading
//! costs in context, and how fast one search is.
//!
//! ```text
//! cargo run --release --example search_bench                # every set, test misses listed
//! cargo run --release --example search_bench -- --dev       # tuning: reference and public dev only
//! cargo run --release --example search_bench -- --ablation  # also the variants that were tried
//! cargo run --release --example search_bench -- --catalog DIR   # one folder: tools.json + queries.json
//! ```
//!
//! Sets: `bench/catalogs/reference` (its own 70 queries) and `bench/catalogs/public` (published
//! MCP tool definitions; `dev.json` for tuning, `test.json` held out). Every query ranks the
//! whole catalog. A query is a hit at k if any of its relevant tools is in the first k (recall@k);
//! MRR uses the rank of the first relevant tool; nDCG@5 has binary gains over all relevant tools.
//! Beside each figure: a plain BM25 over name + description (lowercased words, no stemming, no
//! stop words, no field weights), the baseline any ranking must beat.
//!
//! Tokens are counted with the gateway's tokenizer (`toolgate::cost`, o200k_base), on what the
//! model gets: the full `tools/list`, against the search-mode `tools/list` plus the text block
//! of one `search_tools` result at `--limit` (the structured content carries the same JSON; a
//! client passes the model one of them, so it is counted once).

// A measuring tool run by hand: a panic says which step failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

use toolgate::cost;
use toolgate::pool::{Catalog, GroupSummaries, Tool};
use toolgate::search::{self, SearchIndex, SearchOptions};

#[derive(Deserialize, Clone)]
struct Query {
    query: String,
    relevant: Vec<String>,
    #[serde(default = "english")]
    lang: String,
}

fn english() -> String {
    "en".into()
}

struct Args {
    catalog: Option<PathBuf>,
    limit: usize,
    dev_only: bool,
    misses: bool,
    ablation: bool,
    embeddings: Option<PathBuf>,
    variants: Option<String>,
    quick: bool,
    /// Only the speed of a search through a shared pool (`--share`).
    share: bool,
    /// Print the index-mode index of the catalog, as the model reads it (`--index`).
    index: bool,
    /// One query to show the terms and the best 15 (or `--limit`, if more) of (`--explain QUERY`).
    explain: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        catalog: None,
        limit: search::DEFAULT_LIMIT,
        dev_only: false,
        misses: false,
        ablation: false,
        embeddings: None,
        variants: None,
        quick: false,
        share: false,
        index: false,
        explain: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--catalog" => a.catalog = Some(it.next().context("--catalog needs a folder")?.into()),
            "--limit" => a.limit = it.next().context("--limit needs a number")?.parse()?,
            "--dev" => a.dev_only = true,
            "--misses" => a.misses = true,
            "--ablation" => a.ablation = true,
            "--embeddings" => {
                a.embeddings = Some(it.next().context("--embeddings needs a file")?.into())
            }
            "--variants" => {
                a.ablation = true;
                a.variants = Some(it.next().context("--variants needs a label substring")?)
            }
            "--quick" => a.quick = true,
            "--share" => a.share = true,
            "--index" => a.index = true,
            "--explain" => a.explain = Some(it.next().context("--explain needs a query")?),
            "-h" | "--help" => {
                println!(
                    "search_bench [--dev] [--misses] [--ablation] [--variants TEXT] [--quick] \
                     [--embeddings FILE] [--limit N] [--catalog DIR]\n\
                     --dev       leave the held-out sets (public test, fresh, fresh2 … fresh5) out, for tuning\n\
                     --misses    also list the misses of the reference and dev sets\n\
                     --ablation  quality of the ranking variants that were tried\n\
                     --variants  only the variants whose label contains TEXT (implies --ablation)\n\
                     --quick     quality only: no tokens, no speed\n\
                     --share     only the speed of a search through a pool shared with others\n\
                     --index     print the catalog's index, as index mode's search_tools carries it\n\
                     --explain QUERY  the query's terms and its best 15 tools (more with --limit), then exit\n\
                     --embeddings  a static embedding table (bench/embeddings/setup.sh)\n\
                     --catalog   one folder of tools.json (MCP tool definitions) and \
                     queries.json ([{{query, relevant: [tool names], lang?}}])"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument `{other}` (try --help)"),
        }
    }
    Ok(a)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// One catalog and the query sets labelled on it.
struct Bench {
    name: String,
    catalog: Catalog,
    defs: Value,
    all: Vec<Arc<Tool>>,
    sets: Vec<(String, Vec<Query>)>,
}

fn load(dir: &Path, name: &str, sets: &[(&str, &str)]) -> anyhow::Result<Bench> {
    let defs: Value = read_json(&dir.join("tools.json"))?;
    // The groups' one-line summaries, as an operator would write an upstream's `description`
    // (a folder of bare definitions has no group documents).
    let summaries: GroupSummaries = match std::fs::metadata(dir.join("groups.json")) {
        Ok(_) => read_json(&dir.join("groups.json"))?,
        Err(_) => GroupSummaries::new(),
    };
    let catalog = search::catalog_from_definitions(&defs)
        .map_err(|e| anyhow::anyhow!(e))?
        .with_summaries(summaries);
    let mut loaded = Vec::new();
    for (set, file) in sets {
        let queries: Vec<Query> = read_json(&dir.join(file))?;
        anyhow::ensure!(!queries.is_empty(), "{file}: no queries");
        for q in &queries {
            for r in &q.relevant {
                anyhow::ensure!(
                    catalog.get(r).is_some(),
                    "query `{}` names unknown tool {r}",
                    q.query
                );
            }
        }
        loaded.push((set.to_string(), queries));
    }
    let all = catalog.tools().cloned().collect();
    Ok(Bench {
        name: name.into(),
        catalog,
        defs,
        all,
        sets: loaded,
    })
}

/// A ranking under test: the names of the visible tools, best first.
trait Ranker {
    fn rank(&self, visible: &[Arc<Tool>], query: &str, limit: usize) -> Vec<String>;
}

impl Ranker for SearchIndex {
    fn rank(&self, visible: &[Arc<Tool>], query: &str, limit: usize) -> Vec<String> {
        self.search(visible, query, limit)
            .into_iter()
            .map(|h| h.tool.name.to_string())
            .collect()
    }
}

/// The baseline: Okapi BM25 (k1 1.2, b 0.75) over the tool name and description as one bag
/// of lowercased words, split on anything not a letter or digit. No stemming, no stop words.
struct PlainBm25 {
    docs: Vec<(String, HashMap<String, f64>, f64)>,
    by_name: HashMap<String, usize>,
}

fn plain_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

impl PlainBm25 {
    fn build(tools: &[Arc<Tool>]) -> Self {
        let mut docs = Vec::new();
        let mut by_name = HashMap::new();
        for t in tools {
            let mut tf: HashMap<String, f64> = HashMap::new();
            let text = format!(
                "{} {}",
                t.name.as_str(),
                t.description.as_deref().unwrap_or("")
            );
            let mut len = 0.0;
            for w in plain_words(&text) {
                *tf.entry(w).or_default() += 1.0;
                len += 1.0;
            }
            by_name.insert(t.name.to_string(), docs.len());
            docs.push((t.name.to_string(), tf, len));
        }
        Self { docs, by_name }
    }
}

impl Ranker for PlainBm25 {
    fn rank(&self, visible: &[Arc<Tool>], query: &str, limit: usize) -> Vec<String> {
        let (k1, b) = (1.2, 0.75);
        let docs: Vec<&(String, HashMap<String, f64>, f64)> = visible
            .iter()
            .filter_map(|t| self.by_name.get(t.name.as_str()).map(|&i| &self.docs[i]))
            .collect();
        let n = docs.len() as f64;
        let avg = docs.iter().map(|d| d.2).sum::<f64>() / n.max(1.0);
        let terms: BTreeSet<String> = plain_words(query).collect();
        let mut scores = vec![0.0; docs.len()];
        for term in &terms {
            let df = docs.iter().filter(|d| d.1.contains_key(term)).count() as f64;
            if df == 0.0 {
                continue;
            }
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for (i, d) in docs.iter().enumerate() {
                if let Some(tf) = d.1.get(term) {
                    scores[i] += idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * d.2 / avg));
                }
            }
        }
        let mut ranked: Vec<(f64, &str)> = docs
            .iter()
            .zip(scores)
            .filter(|(_, s)| *s > 0.0)
            .map(|(d, s)| (s, d.0.as_str()))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        ranked
            .into_iter()
            .take(limit)
            .map(|(_, n)| n.to_owned())
            .collect()
    }
}

/// A query whose first result is not relevant.
struct Miss {
    query: String,
    lang: String,
    relevant: Vec<String>,
    top: Vec<String>,
    /// Rank of the first relevant tool, if it was returned at all.
    rank: Option<usize>,
}

#[derive(Default, Clone, Copy)]
struct Scores {
    n: usize,
    at1: f64,
    at5: f64,
    mrr: f64,
    ndcg5: f64,
}

impl Scores {
    fn add(&mut self, ranking: &[String], relevant: &BTreeSet<&str>) {
        let rank = ranking
            .iter()
            .position(|t| relevant.contains(t.as_str()))
            .map(|p| p + 1);
        self.n += 1;
        if let Some(r) = rank {
            self.at1 += f64::from(u8::from(r <= 1));
            self.at5 += f64::from(u8::from(r <= 5));
            self.mrr += 1.0 / r as f64;
        }
        let dcg: f64 = ranking
            .iter()
            .take(5)
            .enumerate()
            .filter(|(_, t)| relevant.contains(t.as_str()))
            .map(|(i, _)| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let ideal: f64 = (0..relevant.len().min(5))
            .map(|i| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        self.ndcg5 += dcg / ideal;
    }

    fn mean(self) -> [f64; 4] {
        let n = self.n.max(1) as f64;
        [self.at1 / n, self.at5 / n, self.mrr / n, self.ndcg5 / n]
    }
}

/// Scores over a query set, overall and per language, and its misses.
struct Quality {
    all: Scores,
    by_lang: Vec<(String, Scores)>,
    misses: Vec<Miss>,
}

fn quality(ranker: &dyn Ranker, visible: &[Arc<Tool>], queries: &[Query]) -> Quality {
    let mut all = Scores::default();
    let mut by_lang: Vec<(String, Scores)> = Vec::new();
    let mut misses = Vec::new();
    for q in queries {
        let relevant: BTreeSet<&str> = q.relevant.iter().map(String::as_str).collect();
        let ranking = ranker.rank(visible, &q.query, 50);
        all.add(&ranking, &relevant);
        match by_lang.iter_mut().find(|(l, _)| *l == q.lang) {
            Some((_, s)) => s.add(&ranking, &relevant),
            None => {
                let mut s = Scores::default();
                s.add(&ranking, &relevant);
                by_lang.push((q.lang.clone(), s));
            }
        }
        let rank = ranking
            .iter()
            .position(|t| relevant.contains(t.as_str()))
            .map(|p| p + 1);
        if rank != Some(1) {
            misses.push(Miss {
                query: q.query.clone(),
                lang: q.lang.clone(),
                relevant: q.relevant.clone(),
                top: ranking.iter().take(3).cloned().collect(),
                rank,
            });
        }
    }
    let order = |l: &str| ["en", "fr", "de", "es"].iter().position(|x| *x == l);
    by_lang.sort_by_key(|(l, _)| (order(l).unwrap_or(9), l.clone()));
    Quality {
        all,
        by_lang,
        misses,
    }
}

fn row(label: &str, ours: Scores, base: Scores) {
    let [a1, a5, m, n] = ours.mean();
    let [b1, b5, bm, bn] = base.mean();
    println!(
        "  {label:<22} {:>4}   {a1:>6.3} {a5:>6.3} {m:>6.3} {n:>6.3}   | {b1:>6.3} {b5:>6.3} {bm:>6.3} {bn:>6.3}",
        ours.n
    );
}

fn print_misses(title: &str, misses: &[Miss]) {
    println!();
    println!("{title} ({}):", misses.len());
    for m in misses {
        let rank = m
            .rank
            .map_or("not in the first 50".to_owned(), |r| format!("rank {r}"));
        println!(
            "  - [{}] {:?}\n      relevant {:?} at {rank}; top 3 {:?}",
            m.lang, m.query, m.relevant, m.top
        );
    }
}

/// The token cost of search mode on one catalog at `limit`, from the text block of each
/// result over `queries`.
struct Tokens {
    full: usize,
    fixed: usize,
    mean_result: f64,
    max_result: usize,
    returned: f64,
    /// Index mode: its `tools/list` (three meta-tools, the index in search_tools), and one
    /// `load_tools` result of one tool, mean and largest over the catalog's tools.
    index_list: usize,
    mean_load: f64,
    max_load: usize,
}

fn tokens(
    catalog: &Catalog,
    index: &SearchIndex,
    all: &[Arc<Tool>],
    queries: &[&Query],
    limit: usize,
) -> Tokens {
    let full = cost::tools_list_tokens(all);
    let fixed = cost::definitions_tokens(&search::search_listing(&[], all));
    let index_list =
        cost::definitions_tokens(&search::index_listing(&[], all, catalog.group_summaries()));
    let loads: Vec<usize> = all
        .iter()
        .map(|t| cost::tokens(&search::load_body(std::slice::from_ref(t), &[]).to_string()))
        .collect();
    let mut results = Vec::new();
    let mut returned = 0usize;
    for q in queries {
        let hits = index.search(all, &q.query, limit);
        returned += hits.len();
        results.push(cost::tokens(&search::results_text(&hits)));
    }
    Tokens {
        full,
        fixed,
        mean_result: results.iter().sum::<usize>() as f64 / results.len().max(1) as f64,
        max_result: results.iter().copied().max().unwrap_or(0),
        returned: returned as f64 / queries.len().max(1) as f64,
        index_list,
        mean_load: loads.iter().sum::<usize>() as f64 / loads.len().max(1) as f64,
        max_load: loads.iter().copied().max().unwrap_or(0),
    }
}

/// `n` tools made of copies of `defs` under renamed groups (`github` -> `github7`), so that
/// the vocabulary is realistic and every name distinct.
fn scaled_catalog(defs: &Value, n: usize, summaries: &GroupSummaries) -> anyhow::Result<Catalog> {
    let base = defs.as_array().context("tools.json is not an array")?;
    let mut out = Vec::with_capacity(n);
    let mut scaled = GroupSummaries::new();
    for i in 0..n {
        let mut d = base[i % base.len()].clone();
        let copy = i / base.len();
        let name = d["name"]
            .as_str()
            .context("a tool without a name")?
            .to_owned();
        let (group, op) = name.split_once("__").context("name without __")?;
        d["name"] = Value::String(format!("{group}{copy}__{op}"));
        out.push(d);
        if let Some(s) = summaries.get(group) {
            scaled.insert(format!("{group}{copy}"), s.clone());
        }
    }
    Ok(search::catalog_from_definitions(&Value::Array(out))
        .map_err(|e| anyhow::anyhow!(e))?
        .with_summaries(scaled))
}

/// p50 of one search by an agent that sees the first `seen` tools of a `pool`-tool catalog,
/// through the pool's index (as the gateway does), against the same search through an index of
/// those `seen` tools alone: the reference doing the same work with nothing else in the pool.
fn share(defs: &Value, queries: &[&Query], pool: usize, seen: usize) -> anyhow::Result<()> {
    let everyone = scaled_catalog(defs, pool, &GroupSummaries::new())?;
    let mine: BTreeSet<String> = scaled_catalog(defs, seen, &GroupSummaries::new())?
        .tools()
        .map(|t| t.name.as_str().to_owned())
        .collect();
    // The pool's own tools, as a snapshot hands them out, for both indexes.
    let visible: Vec<Arc<Tool>> = everyone
        .tools()
        .filter(|t| mine.contains(t.name.as_str()))
        .cloned()
        .collect();
    let shared = SearchIndex::build(&everyone, None);
    let alone = SearchIndex::build(&Catalog::new(visible.clone(), Vec::new()), None);
    let rounds = (20_000 / seen).clamp(3, 50);
    // Interleaved, so that both see the same machine noise.
    let (mut through_pool, mut through_own) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for q in queries {
            for (index, times) in [(&shared, &mut through_pool), (&alone, &mut through_own)] {
                let started = Instant::now();
                std::hint::black_box(index.search(&visible, &q.query, search::DEFAULT_LIMIT));
                times.push(started.elapsed());
            }
        }
    }
    through_pool.sort_unstable();
    through_own.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (p, o) = (
        us(percentile(&through_pool, 0.5)),
        us(percentile(&through_own, 0.5)),
    );
    println!(
        "  sees {seen:>6} of {pool:>6}   p50 {p:>8.1} µs   | an index of its {seen} alone p50 {o:>8.1} µs  (ratio {:.2})",
        p / o
    );
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Build time, and p50 / p90 of one search over all `n` tools, for ours and the baseline.
fn speed(defs: &Value, queries: &[&Query], n: usize) -> anyhow::Result<()> {
    let catalog = scaled_catalog(defs, n, &GroupSummaries::new())?;
    let all: Vec<Arc<Tool>> = catalog.tools().cloned().collect();
    let started = Instant::now();
    let index = SearchIndex::build(&catalog, None);
    let build = started.elapsed();
    let plain = PlainBm25::build(&all);
    let rounds = (20_000 / n).clamp(3, 50);
    let time = |ranker: &dyn Ranker| {
        let mut times = Vec::with_capacity(rounds * queries.len());
        for _ in 0..rounds {
            for q in queries {
                let started = Instant::now();
                std::hint::black_box(ranker.rank(&all, &q.query, search::DEFAULT_LIMIT));
                times.push(started.elapsed());
            }
        }
        times.sort_unstable();
        times
    };
    let ours = time(&index);
    let base = time(&plain);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "  {n:>6} tools   build {:>8.2} ms   search p50 {:>8.1} µs  p90 {:>8.1} µs   | plain BM25 p50 {:>8.1} µs  (ratio {:.2})",
        build.as_secs_f64() * 1e3,
        us(percentile(&ours, 0.5)),
        us(percentile(&ours, 0.9)),
        us(percentile(&base, 0.5)),
        us(percentile(&ours, 0.5)) / us(percentile(&base, 0.5)),
    );
    Ok(())
}

/// The ranking variants that were tried, by label, for `--ablation`.
fn variants() -> Vec<(&'static str, SearchOptions)> {
    SearchOptions::variants()
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    if let Some(path) = &a.embeddings {
        let model = search::embed::StaticModel::load(path).map_err(|e| anyhow::anyhow!(e))?;
        println!("embeddings   {} ({model:?})", path.display());
        search::embed::install(model).map_err(|e| anyhow::anyhow!(e))?;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/catalogs");
    if let Some(query) = &a.explain {
        let dir = a.catalog.clone().unwrap_or_else(|| root.join("public"));
        let b = load(&dir, "explain", &[])?;
        let index = SearchIndex::build(&b.catalog, None);
        println!(
            "terms {:?}",
            search::query_terms(query, &SearchOptions::default())
        );
        for (k, hit) in index
            .search(&b.all, query, a.limit.max(15))
            .iter()
            .enumerate()
        {
            println!("{:>3} {:>8.3} {}", k + 1, hit.score, hit.tool.name.as_str());
        }
        return Ok(());
    }
    let benches = match &a.catalog {
        Some(dir) => vec![load(
            dir,
            &dir.display().to_string(),
            &[("queries", "queries.json")],
        )?],
        None => {
            let mut public = vec![("dev", "dev.json")];
            if !a.dev_only {
                public.push(("test", "test.json"));
                public.push(("fresh", "fresh.json"));
                public.push(("fresh2", "fresh2.json"));
                public.push(("fresh3", "fresh3.json"));
                public.push(("fresh4", "fresh4.json"));
                public.push(("fresh5", "fresh5.json"));
            }
            vec![
                load(
                    &root.join("reference"),
                    "reference",
                    &[("queries", "queries.json")],
                )?,
                load(&root.join("public"), "public", &public)?,
            ]
        }
    };

    if a.share {
        return share_speed(&benches);
    }
    if a.index {
        for b in &benches {
            println!(
                "{}",
                search::index_text(&b.all, b.catalog.group_summaries())
            );
        }
        return Ok(());
    }
    println!("toolgate tool search benchmark (limit {})", a.limit);
    println!("ranking      {}", SearchOptions::default().summary());
    println!();
    println!(
        "quality                       n   recall@1 recall@5  MRR  nDCG@5   | plain BM25 (name + description, no stemming)"
    );
    let mut held_out_misses = Vec::new();
    let mut other_misses = Vec::new();
    for b in &benches {
        let index = SearchIndex::build(&b.catalog, None);
        let plain = PlainBm25::build(&b.all);
        println!("{} ({} tools)", b.name, b.all.len());
        for (set, queries) in &b.sets {
            let ours = quality(&index, &b.all, queries);
            let base = quality(&plain, &b.all, queries);
            row(set, ours.all, base.all);
            if ours.by_lang.len() > 1 {
                for ((lang, s), (_, bs)) in ours.by_lang.iter().zip(&base.by_lang) {
                    row(&format!("  {lang}"), *s, *bs);
                }
            }
            if ["test", "fresh", "fresh2", "fresh3", "fresh4", "fresh5"].contains(&set.as_str()) {
                held_out_misses.push((format!("{} {set}", b.name), ours.misses));
            } else {
                other_misses.push((format!("{} {set}", b.name), ours.misses));
            }
        }
    }

    if !a.quick {
        tokens_and_speed(&a, &benches)?;
    }
    ablation(&a, &benches)?;

    if a.misses {
        for (title, misses) in &other_misses {
            print_misses(&format!("{title}: first result not relevant"), misses);
        }
    }
    if !a.dev_only && a.catalog.is_none() {
        for (title, misses) in &held_out_misses {
            print_misses(&format!("{title}: first result not relevant"), misses);
        }
    }
    Ok(())
}

fn tokens_and_speed(a: &Args, benches: &[Bench]) -> anyhow::Result<()> {
    println!();
    println!("tokens (o200k_base), as shares of the full tools/list: search mode (search_tools +");
    println!(
        "call_tool, and one search_tools result's text block, mean over the queries); index mode"
    );
    println!(
        "(its tools/list: three meta-tools, the index in search_tools; and one load_tools of one"
    );
    println!("tool, mean over the tools)");
    let mut rows: Vec<(String, Tokens)> = Vec::new();
    for b in benches {
        let index = SearchIndex::build(&b.catalog, None);
        let queries: Vec<&Query> = b.sets.iter().flat_map(|(_, q)| q).collect();
        rows.push((
            b.name.clone(),
            tokens(&b.catalog, &index, &b.all, &queries, a.limit),
        ));
    }
    // A 1,000-tool pool: copies of the last catalog under new group names, searched with its
    // queries.
    if let Some(b) = benches.last() {
        let catalog = scaled_catalog(&b.defs, 1_000, b.catalog.group_summaries())?;
        let all: Vec<Arc<Tool>> = catalog.tools().cloned().collect();
        let index = SearchIndex::build(&catalog, None);
        let queries: Vec<&Query> = b.sets.iter().flat_map(|(_, q)| q).collect();
        rows.push((
            "1000 tools".into(),
            tokens(&catalog, &index, &all, &queries, a.limit),
        ));
    }
    for (name, t) in &rows {
        let search = t.fixed as f64 + t.mean_result;
        let pct = |n: f64| 100.0 * n / t.full as f64;
        println!(
            "  {:<10} full {:>7}   search {:>4} + {:>7.1} = {:>7.1} ({:.1} %; largest result {}, {:.2} tools per result)",
            name,
            t.full,
            t.fixed,
            t.mean_result,
            search,
            pct(search),
            t.max_result,
            t.returned
        );
        println!(
            "  {:<10}              index list {:>7} ({:.1} %)   one load {:>6.1} ({:.2} %; largest {})",
            "",
            t.index_list,
            pct(t.index_list as f64),
            t.mean_load,
            pct(t.mean_load),
            t.max_load
        );
    }

    println!();
    println!(
        "speed: one search over n visible tools (copies of the last catalog under new group names)"
    );
    if let Some(b) = benches.last() {
        let queries: Vec<&Query> = b.sets.iter().flat_map(|(_, q)| q).collect();
        for n in [b.all.len(), 1_000, 10_000] {
            speed(&b.defs, &queries, n)?;
        }
    }
    share_speed(benches)
}

/// The speed of one agent's search through a pool shared with others, against the same search
/// through an index of its tools alone.
fn share_speed(benches: &[Bench]) -> anyhow::Result<()> {
    println!();
    println!(
        "speed when an agent sees part of a pool: its search through the pool's index, against the same search through an index of its tools alone"
    );
    if let Some(b) = benches.last() {
        let queries: Vec<&Query> = b.sets.iter().flat_map(|(_, q)| q).collect();
        for seen in [b.all.len(), 1_000] {
            share(&b.defs, &queries, 10_000, seen)?;
        }
    }
    Ok(())
}

fn ablation(a: &Args, benches: &[Bench]) -> anyhow::Result<()> {
    if a.ablation {
        println!();
        println!("ablation: recall@1 / recall@5 / MRR per set, for each variant that was tried");
        for (label, options) in variants() {
            if a.variants
                .as_ref()
                .is_some_and(|v| !label.contains(v.as_str()))
            {
                continue;
            }
            let mut line = format!("  {label:<44}");
            for b in benches {
                let index = SearchIndex::build_with(&b.catalog, None, options);
                for (set, queries) in &b.sets {
                    let [a1, a5, m, _] = quality(&index, &b.all, queries).all.mean();
                    line += &format!("  {}/{set} {a1:.3} {a5:.3} {m:.3}", &b.name[..3]);
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}
