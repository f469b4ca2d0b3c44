//! The policies-as-code reader (`policy::files::read_dir`) on an `agent.md` that is the input,
//! then `check` against a small catalog and `plan` against an empty database.
//!
//! Invariants beyond "no panic": a problem is located at a line of the file; an agent that
//! reads back is written out the way `policy export` writes it and reads back the same (so
//! export → apply changes nothing).

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use toolgate::policy::files::{FrontMatter, check, plan, read_dir};
use toolgate::policy::snapshot::Discovery;
use toolgate::pool::Catalog;
use toolgate::pool::loader::{LoaderSettings, load_pool};

struct Fixture {
    policies: PathBuf,
    catalog: Catalog,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let root = toolgate_fuzz::scratch("agent-md");
    let group = root.join("tools/weather");
    std::fs::create_dir_all(&group).unwrap();
    let op = |id: &str| json!({"post": {"operationId": id, "summary": id, "responses": {"200": {"description": "ok"}}}});
    let doc = json!({"openapi": "3.1.0", "info": {"title": "w", "version": "1"},
        "paths": {"/current": op("current"), "/forecast": op("forecast")}});
    std::fs::write(group.join("openapi.json"), doc.to_string()).unwrap();
    for s in ["current.sh", "forecast.sh"] {
        toolgate_fuzz::script(&group.join(s), "#!/bin/sh\necho '{}'\n");
    }
    let catalog = load_pool(&root.join("tools"), None, &LoaderSettings::default());
    assert_eq!(catalog.len(), 2, "the fixture catalog loads");
    let policies = root.join("policies");
    std::fs::create_dir_all(policies.join("agents/a")).unwrap();
    Fixture { policies, catalog }
});

/// What the database keeps of an agent file.
fn kept(front: &FrontMatter, body: &str) -> impl PartialEq + std::fmt::Debug {
    (
        front.description.clone(),
        front.tools.iter().cloned().collect::<BTreeSet<_>>(),
        front.discovery.unwrap_or_default(),
        front.pinned.clone(),
        front.rate_limit,
        front.tool_limits.clone(),
        body.to_owned(),
    )
}

fuzz_target!(|data: &[u8]| {
    let f = &*FIXTURE;
    let file = f.policies.join("agents/a/agent.md");
    std::fs::write(&file, data).unwrap();
    let (dir, problems) = read_dir(&f.policies);
    let lines = data.split(|b| *b == b'\n').count().max(1);
    for p in &problems {
        assert!(
            (1..=lines + 1).contains(&p.line),
            "problem at line {} of a {lines}-line file: {p}",
            p.line
        );
    }
    let Some(agent) = dir.agents.first() else {
        return;
    };
    for p in check(&dir, &f.catalog) {
        assert!(p.line >= 1 && !p.message.is_empty(), "{p:?}");
    }
    let _ = plan(&dir, &[], &[], &BTreeMap::new());

    // Rendered as `policy export` renders an agent.
    let mut front = agent.front.clone();
    front.tools = front
        .tools
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if front.discovery == Some(Discovery::Full) {
        front.discovery = None;
    }
    let mut text = format!("---\n{}---\n", serde_yaml::to_string(&front).unwrap());
    if !agent.body.is_empty() {
        text.push('\n');
        text.push_str(&agent.body);
        text.push('\n');
    }
    std::fs::write(&file, &text).unwrap();
    let (again, problems) = read_dir(&f.policies);
    assert!(
        problems.is_empty(),
        "export wrote a file that does not read back: {problems:?}\n{text}"
    );
    let back = &again.agents[0];
    assert_eq!(
        kept(&back.front, &back.body),
        kept(&agent.front, &agent.body),
        "export changed the agent:\n{text}"
    );
});
