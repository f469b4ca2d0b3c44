//! The core modules decide and store; the surfaces translate. A core module that reached for
//! the application state or a surface would let policy leak back into one surface, so the
//! rule is checked here rather than remembered.

use std::path::{Path, PathBuf};

/// Modules that must not depend on the app or a surface: the live state, the one call path, the
/// control-plane services and what they build on.
const CORE: [&str; 12] = [
    "state", "gate", "service", "search", "upstream", "pool", "policy", "audit", "db", "auth",
    "limits", "names",
];
/// What they must not name.
const FORBIDDEN: [&str; 8] = [
    "crate::app",
    "crate::mcp",
    "crate::rest",
    "crate::web",
    "crate::api",
    "crate::oauth",
    "crate::http",
    "crate::gate",
];

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn core_modules_import_neither_the_app_nor_a_surface() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for module in CORE {
        let dir = src.join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        let file = src.join(format!("{module}.rs"));
        if file.is_file() {
            files.push(file);
        }
    }
    assert!(files.len() >= CORE.len(), "the core modules were not found");
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for f in FORBIDDEN {
                // `crate::api` must not match `crate::apis`, nor `crate::app` `crate::apple`.
                let hit = code.match_indices(f).any(|(i, _)| {
                    !code[i + f.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    offences.push(format!(
                        "{}:{}: {}",
                        file.strip_prefix(&src).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "core modules reach outside the core:\n{}",
        offences.join("\n")
    );
}
