//! What tool definitions cost a model, in tokens.
//!
//! Counted with a real BPE tokenizer (`o200k_base`, via tiktoken-rs, whose vocabulary ships
//! inside the crate so nothing is fetched at run time). No public tokenizer matches every
//! model exactly; o200k is a current production vocabulary and far closer than bytes/4.

use serde::Serialize;

use crate::pool::Tool;

/// Tokens of a text.
pub fn tokens(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// Tokens of the `tools/list` entries for `tools`, serialized as a client receives them.
pub fn tools_list_tokens<'a>(tools: impl IntoIterator<Item = &'a std::sync::Arc<Tool>>) -> usize {
    // Counted for the whole pool too (the admin's list cost): the schemas read are not kept.
    let defs: Vec<rmcp::model::Tool> = tools
        .into_iter()
        .map(|t| t.mcp_definition_with(t.input_schema.read()))
        .collect();
    definitions_tokens(&defs)
}

/// Tokens of already-built MCP tool definitions.
pub fn definitions_tokens(defs: &[rmcp::model::Tool]) -> usize {
    tokens(&serde_json::to_string(&serde_json::json!({"tools": defs})).unwrap_or_default())
}

/// An agent's `tools/list` cost next to the whole pool's.
#[derive(Debug, Clone, Serialize)]
pub struct ListCost {
    pub visible_tools: usize,
    pub visible_tokens: usize,
    pub pool_tools: usize,
    pub pool_tokens: usize,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_real_tokenizer_counts_words_not_bytes() {
        let n = super::tokens("Get the current weather for a city.");
        assert!((6..=10).contains(&n), "{n}");
    }
}
