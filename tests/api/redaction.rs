//! What is redacted stays redacted in every form a script may write it in, and each admin role
//! reads what it is told it reads: the attacks of a script that re-encodes a secret before
//! logging it, and of a viewer reading argument values through refusal texts and stderr.

use base64::Engine;
use serde_json::{Value, json};
use sqlx::PgPool;

use http::StatusCode;

use crate::helpers::{TestApp, single_op, write_group};
use crate::web::Browser;

/// The passphrase of the attack: non-ASCII (JSON `\u` escapes), a space (`%20` and `+`), and
/// bytes whose base64 differs between the standard and URL-safe alphabets.
const SECRET: &str = "Päss wörd/+?&=ü~~>>?? 7f";

/// Every form of [`SECRET`] the script writes, as the script's languages write them.
fn forms() -> Vec<(String, String)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let ascii_json: String = SECRET
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_string()
            } else {
                format!("\\u{:04x}", c as u32)
            }
        })
        .collect();
    let percent: String = url::form_urlencoded::byte_serialize(SECRET.as_bytes()).collect();
    let mut out = vec![
        ("raw".to_owned(), SECRET.to_owned()),
        ("json ensure_ascii".to_owned(), ascii_json),
        ("form-urlencoded".to_owned(), percent.clone()),
        ("percent-encoded".to_owned(), percent.replace('+', "%20")),
    ];
    for k in 0..3 {
        let mut bytes = b"user:"[..k].to_vec();
        bytes.extend_from_slice(SECRET.as_bytes());
        let std = b64.encode(&bytes);
        let url = b64url.encode(&bytes);
        // What any encoder writes for the secret's own bytes, whatever came before it.
        let skip = (k * 4).div_ceil(3) + 1;
        out.push((
            format!("base64 after {k} byte(s)"),
            std[skip..std.len() - 4].to_owned(),
        ));
        out.push((
            format!("base64url after {k} byte(s)"),
            url[skip..url.len() - 4].to_owned(),
        ));
    }
    out
}

/// A group whose `open` operation takes a redacted `passphrase`, logs it to stderr in the
/// forms of [`forms`] and fails (or, with `"ok": true`, answers with them).
fn vault() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_group(
        dir.path(),
        "vault",
        &single_op(
            "open",
            json!({"type": "object", "properties": {
                "user": {"type": "string"}, "passphrase": {"type": "string"}, "ok": {"type": "boolean"}}}),
            json!({}),
        ),
        &[(
            "open.py",
            r#"#!/usr/bin/python3
import base64, json, sys, urllib.parse
args = json.load(sys.stdin)
p = args["passphrase"]
lines = [
    "json: " + json.dumps(args),
    "quote: " + urllib.parse.quote(p, safe=""),
    "form: " + urllib.parse.urlencode({"p": p}),
]
for prefix in (b"", b"u", b"us"):
    lines.append("b64: " + base64.b64encode(prefix + p.encode()).decode())
    lines.append("b64url: " + base64.urlsafe_b64encode(prefix + p.encode()).decode())
    lines.append("b64 no pad: " + base64.b64encode(prefix + p.encode() + b"!").decode().rstrip("="))
lines.append("basic: " + base64.b64encode(b"ann:" + p.encode()).decode())
if args.get("ok"):
    print(json.dumps({"log": lines}))
else:
    print("\n".join(lines), file=sys.stderr)
    sys.exit(2)
"#,
        )],
    );
    let doc_path = dir.path().join("vault/openapi.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&doc_path).unwrap()).unwrap();
    doc["x-toolgate-audit"] = json!({"redact": ["passphrase"], "store_results": true});
    std::fs::write(&doc_path, doc.to_string()).unwrap();
    dir
}

/// Finding: a redacted value logged by the script as `json.dumps` writes it (`"P\u00e4ss…"`),
/// URL-encoded or in base64 reached the `error` of the `tool_error` row, which viewers read,
/// and the stored result.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_redacted_value_reaches_no_row_in_any_encoding(pool: PgPool) {
    let tools = vault();
    let app = TestApp::with(
        pool.clone(),
        tools.path(),
        None,
        &["--script-sandbox", "off"],
    )
    .await;
    let token = app.agent("keeper", &["vault"]).await;

    let failed = app
        .call(
            &token,
            "vault__open",
            json!({"user": "ann", "passphrase": SECRET}),
        )
        .await;
    assert_eq!(failed.body["result"]["isError"], true, "{}", failed.text);
    let ok = app
        .call(
            &token,
            "vault__open",
            json!({"user": "ann", "passphrase": SECRET, "ok": true}),
        )
        .await;
    assert_eq!(ok.body["result"]["isError"], false, "{}", ok.text);

    let (error, result): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT (SELECT error FROM audit_events WHERE tool = 'vault__open' AND outcome = 'tool_error'),
                (SELECT result FROM audit_events WHERE tool = 'vault__open' AND outcome = 'success')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let error = error.expect("the tool_error row has the stderr");
    let result = result.expect("results are stored");
    // The script did write every line, and what was taken out says so.
    for label in ["json:", "quote:", "form:", "b64:", "b64url:", "b64 no pad:"] {
        assert!(error.contains(label), "{label} missing from {error}");
        assert!(result.contains(label), "{label} missing from {result}");
    }
    assert!(error.matches("[REDACTED]").count() >= 12, "{error}");
    // An argument that is not redacted but repeats the secret is scrubbed of it too.
    let repeated = app
        .call(
            &token,
            "vault__open",
            json!({"user": format!("ann, whose passphrase is {SECRET}"), "passphrase": SECRET, "ok": true}),
        )
        .await;
    assert_eq!(
        repeated.body["result"]["isError"], false,
        "{}",
        repeated.text
    );
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT to_jsonb(a)::text FROM audit_events a WHERE tool = 'vault__open'")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (what, form) in forms() {
        assert!(
            !error.contains(&form),
            "{what} {form:?} in the error: {error}"
        );
        assert!(
            !result.contains(&form),
            "{what} {form:?} in the result: {result}"
        );
        assert_eq!(rows.len(), 6);
        for (row,) in &rows {
            assert!(!row.contains(&form), "{what} {form:?} in a row: {row}");
        }
    }
}

/// Finding: a viewer, told that tool arguments are hidden from it, read them in the error of
/// an argument-rule denial (`q: "secret-project-…" does not match …`) and in a script's
/// stderr that echoes its input. The auditor reads both; the caller is told what it sent.
#[sqlx::test(migrator = "toolgate::db::MIGRATOR")]
async fn a_viewer_reads_no_argument_value_in_refusals_or_stderr(pool: PgPool) {
    let tools = tempfile::tempdir().unwrap();
    write_group(
        tools.path(),
        "notes",
        &single_op(
            "find",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            json!({}),
        ),
        &[(
            "find.sh",
            "#!/bin/sh\necho \"searching for $(cat)\" >&2\nexit 1\n",
        )],
    );
    let app = TestApp::with(
        pool.clone(),
        tools.path(),
        None,
        &["--script-sandbox", "off"],
    )
    .await;
    let token = app.agent("reader", &["notes"]).await;
    let set = app
        .admin(
            "PUT",
            "/api/v1/agents/reader/arguments/notes__find",
            Some(json!({"q": {"pattern": "^public-"}})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text);

    let refused = app
        .call(&token, "notes__find", json!({"q": "secret-project-orion"}))
        .await;
    assert_eq!(refused.body["result"]["isError"], true, "{}", refused.text);
    // The caller learns which of its values broke which rule, to retry with a better one.
    let told = refused.body["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        told.contains("secret-project-orion") && told.contains("^public-"),
        "{told}"
    );
    let failed = app
        .call(&token, "notes__find", json!({"q": "public-orion-plans"}))
        .await;
    assert_eq!(failed.body["result"]["isError"], true, "{}", failed.text);

    let id = |outcome: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM audit_events WHERE tool = 'notes__find' AND outcome = $1",
            )
            .bind(outcome)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let denied = id("denied").await;
    let tool_error = id("tool_error").await;
    let mut viewer = Browser::signed_in(&app, "vic", "viewer").await;
    let mut auditor = Browser::signed_in(&app, "aud", "auditor").await;
    for (id, value) in [
        (denied, "secret-project-orion"),
        (tool_error, "public-orion-plans"),
    ] {
        let seen = viewer.get(&format!("/admin/audit/{id}")).await;
        assert_eq!(seen.status, StatusCode::OK, "{}", seen.text);
        assert!(
            !seen.text.contains("orion"),
            "viewer read {value}: {}",
            seen.text
        );
        let list = viewer.get("/admin/audit?tool=notes__find").await;
        assert!(!list.text.contains("orion"), "{}", list.text);
        let agent = viewer.get("/admin/agents/reader").await;
        assert!(!agent.text.contains("orion"), "{}", agent.text);
        let seen = auditor.get(&format!("/admin/audit/{id}")).await;
        assert!(
            seen.text.contains(value),
            "auditor missed {value}: {}",
            seen.text
        );
    }
    // What the viewer is shown instead: which rule refused, and that stderr is withheld.
    let seen = viewer.get(&format!("/admin/audit/{denied}")).await;
    assert!(seen.text.contains("value refused by rule"), "{}", seen.text);
    assert!(seen.text.contains("^public-"), "{}", seen.text);
    let seen = viewer.get(&format!("/admin/audit/{tool_error}")).await;
    assert!(
        seen.text.contains("Hidden for the viewer role: Error"),
        "{}",
        seen.text
    );
}
