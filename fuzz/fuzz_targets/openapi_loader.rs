//! The tool-group loader (`pool::loader::load_group`): a group folder whose `openapi.json` is
//! the input, beside an executable `echo.sh`, a non-executable `plain.py` and a UI file
//! `ui/app.html`.
//!
//! Invariants beyond "no panic": a load error names a file of the folder and says why; a
//! loaded group has tools named `<group>__<operationId>` with an object input schema that
//! validates, lists as an MCP definition and indexes for search.

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolgate::policy::snapshot::{PolicySnapshot, PolicyState};
use toolgate::pool::Catalog;
use toolgate::pool::loader::{LoaderSettings, load_group};

static FOLDER: LazyLock<PathBuf> = LazyLock::new(|| {
    let folder = toolgate_fuzz::scratch("openapi").join("g");
    std::fs::create_dir_all(folder.join("ui")).unwrap();
    toolgate_fuzz::script(&folder.join("echo.sh"), "#!/bin/sh\necho '{}'\n");
    std::fs::write(folder.join("plain.py"), "print('{}')\n").unwrap();
    std::fs::write(folder.join("ui/app.html"), "<html></html>\n").unwrap();
    folder
});

fuzz_target!(|data: &[u8]| {
    let folder = &*FOLDER;
    std::fs::write(folder.join("openapi.json"), data).unwrap();
    let tools = match load_group(folder, "g", &LoaderSettings::default()) {
        Ok(tools) => tools,
        Err(e) => {
            assert_eq!(e.folder, "g");
            assert!(e.file.starts_with("g"), "error names a file outside: {e}");
            assert!(!e.reason.trim().is_empty(), "error without a reason");
            return;
        }
    };
    assert!(!tools.is_empty());
    for tool in &tools {
        let name = tool.name.as_str();
        assert_eq!(
            name.strip_prefix(&format!("{}__", tool.group())),
            Some(tool.operation())
        );
        assert!(
            matches!(tool.input_schema.get("type"), Some(Value::String(t)) if t == "object"),
            "input schema of {name} is not an object schema"
        );
        let _ = tool.violations(&json!({}));
        let _ = tool.violations(&json!({"a": [1, "x", null], "b": {"c": 1.5}}));
        serde_json::to_string(&tool.mcp_definition()).unwrap();
    }
    let catalog = Arc::new(Catalog::new(tools.clone(), Vec::new()));
    assert_eq!(
        catalog.len(),
        tools.len(),
        "two tools of a group share a name"
    );
    let snapshot = PolicySnapshot::build(catalog, &PolicyState::default());
    let _ = snapshot
        .search_index()
        .search(&tools, "echo weather search", 5);
});
