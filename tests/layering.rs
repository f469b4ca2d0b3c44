//! The core modules decide and store; the surfaces translate. A core module that reached for
//! the application state or a surface would let policy leak back into one surface, so the
//! rule is checked here rather than remembered.

// Test code: a panic is a failed test with its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Modules that must not depend on the app or a surface: the live state, the one call path, the
/// control-plane services and what they build on.
const CORE: [&str; 13] = [
    "state",
    "gate",
    "service",
    "search",
    "upstream",
    "pool",
    "policy",
    "audit",
    "db",
    "auth",
    "limits",
    "names",
    "credentials",
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

/// The surfaces: each translates requests of one kind into calls of the core and back.
const SURFACES: [&str; 5] = ["api", "web", "oauth", "mcp", "rest"];

/// The lines of code (comments left out) of `files`, with where they are.
fn code_lines(src: &Path, files: &[PathBuf]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(src).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if !code.trim().is_empty() {
                out.push((format!("{name}:{}", n + 1), code.to_owned()));
            }
        }
    }
    out
}

fn surface_files(src: &Path, surface: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&src.join(surface), &mut files);
    assert!(!files.is_empty(), "the surface {surface} was not found");
    files
}

/// An audit record or a limit kept by one surface is one the others do not keep: what is on
/// record and what is refused would then depend on the door a request came in by. Credential
/// checks audit and count themselves in `auth`, tool calls in `gate`, changes in the services.
#[test]
fn surfaces_neither_audit_nor_limit_for_themselves() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<PathBuf> = SURFACES
        .iter()
        .flat_map(|s| surface_files(&src, s))
        .collect();
    // The middleware that puts the surfaces' guards in front of them.
    files.push(src.join("http.rs"));
    const OWN_RECORDS_OR_LIMITS: [&str; 10] = [
        "AuditEvent::new",
        "AuditEvent {",
        "refusals.record(",
        "LimitedAction",
        "limits.take(",
        "limits.check(",
        "RateLimiter",
        "RateLimits::",
        "governor::",
        "db::signin",
    ];
    let offences: Vec<String> = code_lines(&src, &files)
        .into_iter()
        .filter(|(_, code)| OWN_RECORDS_OR_LIMITS.iter().any(|p| code.contains(p)))
        .map(|(at, code)| format!("{at}: {}", code.trim()))
        .collect();
    assert!(
        offences.is_empty(),
        "surfaces audit or limit for themselves:\n{}",
        offences.join("\n")
    );
}

/// What two surfaces share belongs to the core; a surface reaching into another would make
/// one door's translation another's policy.
#[test]
fn no_surface_imports_another_surface() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offences = Vec::new();
    for surface in SURFACES {
        let files = surface_files(&src, surface);
        for (at, code) in code_lines(&src, &files) {
            for other in SURFACES.iter().filter(|o| **o != surface) {
                let path = format!("crate::{other}");
                let hit = code.match_indices(&path).any(|(i, _)| {
                    !code[i + path.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    offences.push(format!("{at}: {}", code.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "surfaces import one another:\n{}",
        offences.join("\n")
    );
}
