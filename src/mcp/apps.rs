//! MCP Apps through the gateway: tools' `_meta.ui` passes through, and `ui://` resources are
//! served under the same grants as the tools that link to them.
//!
//! A script tool names an HTML file of its folder (`x-toolgate-ui`), served as
//! `ui://<group>/<path>`; an upstream's `ui://...` is rewritten as `ui://<group>/...` and read
//! from that upstream. Either way an agent may read a UI resource only if it may see a tool
//! that links to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::ErrorData as McpError;
use rmcp::model::{ReadResourceResult, Resource, ResourceContents};

use crate::gate::Gate;
use crate::pool::{Execution, Tool};
use crate::state::AppState;

/// The MIME type of an MCP App's HTML.
pub const UI_MIME: &str = "text/html;profile=mcp-app";
/// The extension identifier advertised when the caller can see a tool with a UI.
pub const UI_EXTENSION: &str = "io.modelcontextprotocol/ui";
/// Largest UI file served from a script folder.
const MAX_UI_BYTES: u64 = 2 * 1024 * 1024;

/// The UI resources `principal` may read, each with a tool that links to it.
pub fn visible_ui(gate: &Gate<'_>) -> BTreeMap<String, Arc<Tool>> {
    gate.visible()
        .into_iter()
        .filter_map(|t| t.ui_resource().map(|uri| (uri, t)))
        .collect()
}

pub fn resources(gate: &Gate<'_>) -> Vec<Resource> {
    visible_ui(gate)
        .into_iter()
        .map(|(uri, tool)| {
            Resource::new(uri, format!("{} UI", tool.name))
                .with_mime_type(UI_MIME)
                .with_description(format!("The interactive view of {}", tool.name))
        })
        .collect()
}

/// Reads a `ui://` resource for the gate's caller; anything it may not read is "not found".
pub async fn read(
    state: &AppState,
    gate: &Gate<'_>,
    uri: &str,
) -> Result<ReadResourceResult, McpError> {
    let not_found = || McpError::resource_not_found(format!("Resource not found: {uri}"), None);
    let tool = visible_ui(gate).remove(uri).ok_or_else(not_found)?;
    match &tool.exec {
        Execution::Script(spec) => {
            let rel = tool.ui.as_deref().ok_or_else(not_found)?;
            let path = match &spec.group.copies {
                // The bytes the tool's hash covers, as the gateway copied them at load.
                Some(copy) => copy.app(rel),
                None => {
                    // The file must stay inside the group folder, symlinks included.
                    let folder = std::fs::canonicalize(spec.workdir()).map_err(|_| not_found())?;
                    let path = std::fs::canonicalize(folder.join(rel)).map_err(|_| not_found())?;
                    if !path.starts_with(&folder) {
                        return Err(not_found());
                    }
                    path
                }
            };
            let meta = std::fs::metadata(&path).map_err(|_| not_found())?;
            if meta.len() > MAX_UI_BYTES {
                return Err(McpError::internal_error(
                    "the UI file is too large to serve",
                    None,
                ));
            }
            let text = tokio::fs::read_to_string(&path)
                .await
                .map_err(|_| not_found())?;
            Ok(ReadResourceResult::new(vec![
                ResourceContents::TextResourceContents {
                    uri: uri.to_owned(),
                    mime_type: Some(UI_MIME.to_owned()),
                    text,
                    meta: None,
                },
            ]))
        }
        Execution::Upstream { upstream, .. } => {
            let (group, original) = crate::upstream::upstream_ui_uri(uri).ok_or_else(not_found)?;
            if group != upstream {
                return Err(not_found());
            }
            let mut result = state
                .upstreams
                .read_resource(upstream, &original, uri)
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            // A legacy upstream sends no resultType; our caller may be modern.
            result.result_type = Some(rmcp::model::ResultType::COMPLETE);
            Ok(result)
        }
    }
}
