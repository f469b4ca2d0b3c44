//! Integration tests: the real router over a fresh Postgres database per test.

// Test code: a panic is a failed test with its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod accounts;
mod approvals;
mod apps;
mod arguments;
mod audit;
mod authcode;
mod checkpoints;
mod cli;
mod credentials;
mod drain;
mod durability;
mod fast_list;
mod helpers;
mod hostile;
mod jail;
mod limits;
mod mcp;
mod openapi;
mod otel;
mod perimeter;
mod pins;
mod policy;
mod redaction;
mod registration;
mod reload;
mod rest;
mod sandbox;
mod scripts;
mod search;
mod shared;
mod siem;
mod sinks;
mod stored_credentials;
mod strangers;
mod token_exchange;
mod tokens;
mod upstream;
mod upstream_credentials;
mod upstream_oauth_attacks;
mod upstream_oauth_support;
mod web;
