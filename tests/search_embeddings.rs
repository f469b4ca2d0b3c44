//! `serve --search-embeddings FILE` with a valid table: the start installs it, and a search
//! index built afterwards ranks with it, so a request that shares no word with a tool still
//! finds it, and only among the caller's visible tools. Its own test binary, so its own
//! process: a table is installed once per process, and the API tests check that a bad table
//! installs nothing.

// Test code: a panic is a failed test with its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use serde_json::json;
use toolgate::config::{Cli, Command};
use toolgate::search::{self, SearchIndex};
use toolgate::state::Settings;

/// A table in the format `bench/embeddings/*.py` write: pieces with a log-probability, then
/// one i8 vector and one f32 scale each.
fn table(pieces: &[(&str, [i8; 2])]) -> Vec<u8> {
    let mut b = b"TGE1".to_vec();
    b.extend((pieces.len() as u32).to_le_bytes());
    b.extend(2u32.to_le_bytes());
    for (p, _) in pieces {
        b.push(p.len() as u8);
        b.extend(p.as_bytes());
        b.extend((-9.0f32).to_le_bytes());
    }
    for (_, v) in pieces {
        b.extend(v.iter().map(|x| *x as u8));
    }
    for _ in pieces {
        b.extend(0.01f32.to_le_bytes());
    }
    b
}

#[test]
fn a_table_given_at_start_finds_a_tool_that_shares_no_word_with_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("table.bin");
    // No tool says "zorblax"; the table puts it where "forecast" is.
    std::fs::write(
        &file,
        table(&[
            ("\u{2581}zorblax", [100, 0]),
            ("\u{2581}forecast", [100, 0]),
            ("\u{2581}archive", [0, 100]),
            ("\u{2581}files", [0, 100]),
        ]),
    )
    .unwrap();
    let catalog = search::catalog_from_definitions(&json!([
        {"name": "weather__forecast", "description": "The forecast for a city",
         "inputSchema": {"type": "object"}},
        {"name": "store__archive", "description": "Archive old files",
         "inputSchema": {"type": "object"}},
    ]))
    .unwrap();
    let all: Vec<_> = catalog.tools().cloned().collect();
    let request = "zorblax please";

    let words_only = SearchIndex::build(&catalog, None);
    assert!(words_only.search(&all, request, 5).is_empty());

    let args = [
        "toolgate",
        "serve",
        "--search-embeddings",
        file.to_str().unwrap(),
    ];
    let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
        unreachable!()
    };
    Settings::from_args(&serve).unwrap();
    assert_eq!(search::embed::installed().map(|m| m.dim()), Some(2));

    let index = SearchIndex::build(&catalog, None);
    let names = |hits: Vec<search::Hit>| -> Vec<String> {
        hits.iter()
            .map(|h| h.tool.name.as_str().to_owned())
            .collect()
    };
    let found = names(index.search(&all, request, 5));
    assert_eq!(found[0], "weather__forecast", "{found:?}");
    // A hidden tool is not found, however near the request it is.
    let store: Vec<_> = all
        .iter()
        .filter(|t| t.name.as_str() == "store__archive")
        .cloned()
        .collect();
    let found = names(index.search(&store, request, 5));
    assert!(found.iter().all(|n| n == "store__archive"), "{found:?}");
}
