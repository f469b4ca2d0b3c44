//! toolgate: a policy-and-audit gateway that serves a pool of tools (script folders) to AI
//! agents over MCP and REST, each agent only its granted share.
//!
//! Core (no HTTP): [`names`], [`pool`], [`policy`], [`search`], [`auth`], [`gate`], [`service`], [`db`].
//! Surfaces: [`mcp`], [`rest`], [`api`], [`oauth`], [`web`], over [`app`] and [`http`].

pub mod api;
pub mod app;
pub mod audit;
pub mod auth;
pub mod cli;
mod cli_api;
pub mod config;
pub mod cost;
pub mod credentials;
pub mod db;
pub mod gate;
pub mod http;
pub mod limits;
pub mod listen;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod oauth;
pub mod policy;
pub mod pool;
pub mod rest;
pub mod search;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod upstream;
pub mod web;
