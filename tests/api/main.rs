//! Integration tests: the real router over a fresh Postgres database per test.

mod apps;
mod audit;
mod cli;
mod credentials;
mod durability;
mod helpers;
mod mcp;
mod otel;
mod perimeter;
mod policy;
mod reload;
mod rest;
mod sandbox;
mod scripts;
mod search;
mod tokens;
mod upstream;
mod web;
