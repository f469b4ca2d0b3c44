//! Integration tests: the real router over a fresh Postgres database per test.

mod accounts;
mod apps;
mod arguments;
mod audit;
mod authcode;
mod cli;
mod credentials;
mod drain;
mod durability;
mod fast_list;
mod helpers;
mod limits;
mod mcp;
mod otel;
mod perimeter;
mod pins;
mod policy;
mod reload;
mod rest;
mod sandbox;
mod scripts;
mod search;
mod shared;
mod tokens;
mod upstream;
mod web;
