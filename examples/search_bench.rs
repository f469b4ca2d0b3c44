//! Tool search benchmark: what deferred loading saves in tokens, and how well search finds the
//! right tool, on a reference catalog of MCP tool definitions and labelled task queries.
//!
//! ```text
//! cargo run --release --example search_bench
//! cargo run --release --example search_bench -- --catalog bench/catalogs/reference --limit 5 --misses --ablation
//! ```
//!
//! Tokens are counted with the gateway's own tokenizer (`toolgate::cost`, o200k_base):
//! - full: the `tools/list` result of an agent that sees the whole catalog;
//! - search: the search-mode `tools/list` (search_tools + call_tool) plus the text of one
//!   `search_tools` result at `--limit`, averaged over the queries.
//!
//! Quality over the labelled queries, ranking the whole catalog: a query is a hit at k if any
//! of its relevant tools is in the first k; MRR uses the rank of the first relevant tool.
//! The ranking parameters are the defaults; `--ablation` reruns quality with other field
//! weights, for information only.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;

use toolgate::cost;
use toolgate::pool::{Catalog, Tool};
use toolgate::search::{self, SearchIndex, SearchOptions};

#[derive(Deserialize)]
struct Query {
    query: String,
    relevant: Vec<String>,
}

struct Args {
    catalog: PathBuf,
    limit: usize,
    misses: bool,
    ablation: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        catalog: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/catalogs/reference"),
        limit: search::DEFAULT_LIMIT,
        misses: false,
        ablation: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--catalog" => a.catalog = it.next().context("--catalog needs a folder")?.into(),
            "--limit" => a.limit = it.next().context("--limit needs a number")?.parse()?,
            "--misses" => a.misses = true,
            "--ablation" => a.ablation = true,
            "-h" | "--help" => {
                println!(
                    "search_bench [--catalog DIR] [--limit N] [--misses] [--ablation]\n\
                     DIR holds tools.json (MCP tool definitions) and queries.json \
                     ([{{query, relevant: [tool names]}}])"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument `{other}` (try --help)"),
        }
    }
    Ok(a)
}

/// A query whose first result is not relevant.
struct Miss {
    query: String,
    relevant: Vec<String>,
    top: Vec<String>,
    /// Rank of the first relevant tool, if it matched at all.
    rank: Option<usize>,
}

/// Recall at 1, at 5 and at the limit, and MRR, of `index` over `queries`.
struct Quality {
    at1: f64,
    at5: f64,
    at_limit: f64,
    mrr: f64,
    misses: Vec<Miss>,
}

fn quality(index: &SearchIndex, all: &[Arc<Tool>], queries: &[Query], limit: usize) -> Quality {
    let (mut at1, mut at5, mut at_limit, mut rr) = (0usize, 0usize, 0usize, 0.0);
    let mut misses = Vec::new();
    for q in queries {
        let relevant: BTreeSet<&str> = q.relevant.iter().map(String::as_str).collect();
        let ranking = index.search(all, &q.query, usize::MAX);
        let rank = ranking
            .iter()
            .position(|h| relevant.contains(h.tool.name.as_str()))
            .map(|p| p + 1);
        if let Some(r) = rank {
            at1 += usize::from(r <= 1);
            at5 += usize::from(r <= 5);
            at_limit += usize::from(r <= limit);
            rr += 1.0 / r as f64;
        }
        if rank != Some(1) {
            misses.push(Miss {
                query: q.query.clone(),
                relevant: q.relevant.clone(),
                top: ranking
                    .iter()
                    .take(3)
                    .map(|h| h.tool.name.to_string())
                    .collect(),
                rank,
            });
        }
    }
    let n = queries.len() as f64;
    Quality {
        at1: at1 as f64 / n,
        at5: at5 as f64 / n,
        at_limit: at_limit as f64 / n,
        mrr: rr / n,
        misses,
    }
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let read = |f: &str| -> anyhow::Result<String> {
        let p = a.catalog.join(f);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    let defs: serde_json::Value = serde_json::from_str(&read("tools.json")?)?;
    let catalog: Catalog =
        search::catalog_from_definitions(&defs).map_err(|e| anyhow::anyhow!(e))?;
    let queries: Vec<Query> = serde_json::from_str(&read("queries.json")?)?;
    for q in &queries {
        for r in &q.relevant {
            anyhow::ensure!(
                catalog.get(r).is_some(),
                "query `{}` names unknown tool {r}",
                q.query
            );
        }
    }
    anyhow::ensure!(!queries.is_empty(), "no queries");
    let all: Vec<Arc<Tool>> = catalog.tools().cloned().collect();

    let started = Instant::now();
    let index = SearchIndex::build(&catalog, None);
    let build = started.elapsed();

    // Tokens.
    let full = cost::tools_list_tokens(&all);
    let fixed = cost::definitions_tokens(search::meta_tools());
    let mut result_tokens = Vec::with_capacity(queries.len());
    let mut returned = 0usize;
    for q in &queries {
        let hits = index.search(&all, &q.query, a.limit);
        returned += hits.len();
        result_tokens.push(cost::tokens(&search::results_body(&hits).to_string()));
    }
    result_tokens.sort_unstable();
    let mean_result = result_tokens.iter().sum::<usize>() as f64 / queries.len() as f64;
    let median_result = result_tokens[result_tokens.len() / 2];
    let search_total = fixed as f64 + mean_result;
    let reduction = 100.0 * (1.0 - search_total / full as f64);

    // Latency of one search over the whole catalog (statistics computed per request).
    let rounds = 200;
    let started = Instant::now();
    for _ in 0..rounds {
        for q in &queries {
            std::hint::black_box(index.search(&all, &q.query, a.limit));
        }
    }
    let per_search = started.elapsed() / (rounds * queries.len()) as u32;

    let q = quality(&index, &all, &queries, a.limit);
    let o = SearchOptions::default();

    println!("toolgate tool search benchmark");
    let shown = a
        .catalog
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(&a.catalog);
    println!("catalog      {}", shown.display());
    println!(
        "             {} tools, {} labelled queries; tokenizer o200k_base; limit {}",
        all.len(),
        queries.len(),
        a.limit
    );
    println!(
        "ranking      BM25 k1={} b={}, field weights name {} / description {} / parameters {}",
        o.k1, o.b, o.name_weight, o.description_weight, o.parameter_weight
    );
    println!();
    println!("tokens");
    println!("  full tools/list                          {full:>7}");
    println!("  search mode: search_tools + call_tool    {fixed:>7}");
    println!(
        "  search mode: one search_tools result     {mean_result:>9.1}  (mean; median {median_result}, min {}, max {}; {:.2} tools returned on average)",
        result_tokens[0],
        result_tokens[result_tokens.len() - 1],
        returned as f64 / queries.len() as f64
    );
    println!("  search mode: total                       {search_total:>9.1}");
    println!("  reduction                                {reduction:>8.1} %");
    println!();
    println!("quality over {} queries", queries.len());
    println!("  recall@1   {:.3}", q.at1);
    println!("  recall@5   {:.3}", q.at5);
    if a.limit != 5 && a.limit != 1 {
        println!("  recall@{}   {:.3}", a.limit, q.at_limit);
    }
    println!("  MRR        {:.3}", q.mrr);
    println!();
    println!(
        "speed        index build {:.2} ms; one search {:.1} µs (mean over {} runs)",
        ms(build),
        per_search.as_secs_f64() * 1e6,
        rounds * queries.len()
    );

    if a.misses {
        println!();
        println!(
            "queries whose first result is not relevant ({}):",
            q.misses.len()
        );
        for Miss {
            query,
            relevant,
            top,
            rank,
        } in &q.misses
        {
            let rank = rank.map_or("not found".to_owned(), |r| format!("rank {r}"));
            println!("  - {query:?}\n      relevant {relevant:?} at {rank}; top 3 {top:?}");
        }
    }

    if a.ablation {
        println!();
        println!("ablation (for information; the defaults were fixed before the first run)");
        println!("  field weights name/description/parameters     recall@1  recall@5    MRR");
        let variants = [
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
                "1 / 0 / 0 (name only)",
                SearchOptions {
                    name_weight: 1.0,
                    description_weight: 0.0,
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
        ];
        for (label, options) in variants {
            let index = SearchIndex::build_with(&catalog, None, options);
            let q = quality(&index, &all, &queries, a.limit);
            println!(
                "  {label:<44} {:>8.3}  {:>8.3}  {:>5.3}",
                q.at1, q.at5, q.mrr
            );
        }
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
