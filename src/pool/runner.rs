//! Runs a script tool: stdin gets the arguments as JSON, stdout is the JSON result, stderr is
//! kept (bounded) for the caller on failure, and the exit code says which it was. The script
//! runs confined (see [`super::sandbox`]) with a temporary directory of its own in `TMPDIR`.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::ScriptSpec;
use super::spawn::spawn;
use crate::telemetry::TraceContext;

/// Bounds on what a script may print.
#[derive(Debug, Clone)]
pub struct OutputLimits {
    pub max_stdout: usize,
    pub max_stderr: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_stdout: 4 * 1024 * 1024,
            max_stderr: 64 * 1024,
        }
    }
}

/// Variables every script receives from the gateway's own environment, when set (the declared
/// ones come from their own source, [`super::env`]).
const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];

/// How a script run ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ScriptOutcome {
    /// Exit 0 and JSON on stdout.
    Success { output: Value, stdout_bytes: usize },
    /// Non-zero exit (or death by signal); stderr is for the caller to read.
    Failed {
        exit_code: Option<i32>,
        stderr: String,
    },
    /// Exit 0 but stdout was not JSON.
    InvalidOutput { reason: String, stderr: String },
    /// Stdout grew beyond the cap; the script was killed.
    OutputTooLarge { limit: usize },
    /// The script ran past its timeout; its process group was killed.
    Timeout { after: Duration },
    /// Every slot for this tool stayed busy for the whole timeout.
    Busy,
    /// The script could not be started at all.
    SpawnFailed { reason: String },
}

impl ScriptOutcome {
    /// A short label for metrics and the audit log.
    pub fn label(&self) -> &'static str {
        match self {
            ScriptOutcome::Success { .. } => "success",
            ScriptOutcome::Failed { .. } => "tool_error",
            ScriptOutcome::InvalidOutput { .. } => "invalid_output",
            ScriptOutcome::OutputTooLarge { .. } => "output_too_large",
            ScriptOutcome::Timeout { .. } => "timeout",
            ScriptOutcome::Busy => "busy",
            ScriptOutcome::SpawnFailed { .. } => "spawn_failed",
        }
    }

    /// The text a model reads when the call failed.
    pub fn error_message(&self) -> Option<String> {
        Some(match self {
            ScriptOutcome::Success { .. } => return None,
            ScriptOutcome::Failed {
                exit_code: Some(code),
                stderr,
            } => {
                format!("tool failed with exit code {code}\n{stderr}")
            }
            ScriptOutcome::Failed {
                exit_code: None,
                stderr,
            } => {
                format!("tool was killed by a signal\n{stderr}")
            }
            ScriptOutcome::InvalidOutput { reason, stderr } => {
                format!("tool printed invalid output: {reason}\n{stderr}")
            }
            ScriptOutcome::OutputTooLarge { limit } => {
                format!("tool output exceeded the {limit}-byte limit; it was stopped")
            }
            ScriptOutcome::Timeout { after } => {
                format!(
                    "tool timed out after {} ms; it was stopped",
                    after.as_millis()
                )
            }
            ScriptOutcome::Busy => "tool is at its concurrency limit; retry shortly".to_owned(),
            ScriptOutcome::SpawnFailed { reason } => format!("tool could not be started: {reason}"),
        })
    }
}

/// Runs the script once with `args` on stdin, within the caller's `trace` (passed on as
/// `TRACEPARENT` and `TRACESTATE`, the names OpenTelemetry uses for the environment).
///
/// Its slot, environment and sandbox are prepared at once; the script is started only when
/// `durable` says the call's `started` row is on disk (if it never will be, nothing starts
/// and what was prepared is undone).
pub async fn run(
    spec: &ScriptSpec,
    args: &Value,
    limits: &OutputLimits,
    trace: &TraceContext,
    credentials: &[(&str, &[u8])],
    durable: crate::audit::Durable,
) -> ScriptOutcome {
    let started = Instant::now();
    let script = spec.script();
    let slots = super::slots::for_script(&script, spec.group.max_concurrency);
    let Ok(Ok(_permit)) = tokio::time::timeout(spec.timeout, slots.acquire()).await else {
        return ScriptOutcome::Busy;
    };
    let remaining = spec.timeout.saturating_sub(started.elapsed());

    let mut env: Vec<(OsString, OsString)> =
        Vec::with_capacity(BASE_ENV.len() + spec.group.env.len() + 3);
    for name in BASE_ENV {
        if let Some(value) = std::env::var_os(name) {
            env.push((name.into(), value));
        }
    }
    // The declared variables, from their own source: never the gateway's environment.
    for name in &spec.group.env {
        let request = super::env::VarRequest {
            group: &spec.group.name,
            name,
        };
        if let Some(value) = spec.group.script_env.value(request) {
            env.push((name.as_str().into(), value));
        }
    }
    // The caller's credentials for the group's slots (the gate resolved them for this
    // principal only).
    for (name, value) in credentials {
        use std::os::unix::ffi::OsStringExt;
        env.retain(|(n, _)| n != name);
        env.push(((*name).into(), OsString::from_vec(value.to_vec())));
    }
    // Set after the allowed variables: the gateway's own TRACEPARENT, if it has one, is not
    // this call's.
    for (name, value) in [
        ("TRACEPARENT", &trace.traceparent),
        ("TRACESTATE", &trace.tracestate),
    ] {
        if let Some(v) = value {
            env.retain(|(n, _)| n != name);
            env.push((name.into(), v.into()));
        }
    }
    let program = spec.program();
    let copies = spec.group.copies.as_ref().map(|c| c.files());
    // Removed when this function returns, after everything the script started is gone.
    let (confine, _call_dir) = match spec
        .group
        .sandbox
        .prepare(spec.workdir(), copies.as_deref())
        .await
    {
        Ok(Some((confine, dir))) => {
            env.retain(|(n, _)| n != "TMPDIR");
            env.push(("TMPDIR".into(), dir.path().into()));
            (Some(confine), Some(dir))
        }
        Ok(None) => (None, None),
        Err(e) => {
            return ScriptOutcome::SpawnFailed {
                reason: format!("cannot prepare the sandbox: {e}"),
            };
        }
    };
    let input = serde_json::to_vec(args).unwrap_or_else(|_| b"{}".to_vec());
    if !durable.wait().await {
        return ScriptOutcome::SpawnFailed {
            reason: "the call could not be recorded, so the script was not started".into(),
        };
    }
    // The child is killed if this future is dropped (the caller went away).
    let mut child = match spawn(&program, spec.workdir(), &env, confine) {
        Ok(c) => c,
        Err(e) if copies.is_some() && e.kind() == std::io::ErrorKind::NotFound => {
            // The copy is the gateway's; only something outside it (a cleaner of the
            // temporary directory) removes it. The folder's file is never run in its place.
            return ScriptOutcome::SpawnFailed {
                reason: format!(
                    "the gateway's copy of the script is missing ({e}); it is made again when the group is next loaded"
                ),
            };
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // The usual cause on a first run as root: scripts run as an unprivileged user
            // (`nobody` unless `--script-user`), who cannot enter a checkout under a private
            // home folder. The operator is told where; the caller only what to ask for.
            tracing::warn!(
                folder = %spec.workdir().display(),
                error = %e,
                "a script could not be started: the user scripts run as must be able to enter every folder above it and read and execute it"
            );
            return ScriptOutcome::SpawnFailed {
                reason: format!(
                    "{e}: the user scripts run as cannot reach this script (see the gateway's log)"
                ),
            };
        }
        Err(e) => {
            return ScriptOutcome::SpawnFailed {
                reason: e.to_string(),
            };
        }
    };
    let pgid = Some(child.id() as i32);

    let mut stdin = child.stdin.take();
    let writer = tokio::spawn(async move {
        if let Some(stdin) = stdin.as_mut() {
            // A script that does not read its input closes the pipe early; that is its right.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }
    });
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let max_stdout = limits.max_stdout;
    let max_stderr = limits.max_stderr;
    let stdout_task = tokio::spawn(async move { read_capped(stdout, max_stdout).await });
    let stderr_task = tokio::spawn(async move { read_tail(stderr, max_stderr).await });

    let mut stdout_task = stdout_task;
    // Stdout overflow must stop the script at once, not at its timeout.
    let status = tokio::select! {
        s = tokio::time::timeout(remaining, child.wait()) => s,
        out = &mut stdout_task => {
            let overflow = matches!(out, Ok((_, true)));
            if overflow {
                kill_group(pgid);
                let _ = child.wait().await;
                writer.abort();
                return ScriptOutcome::OutputTooLarge { limit: max_stdout };
            }
            // Stdout closed normally: wait for exit, still within the timeout.
            let status = tokio::time::timeout(spec.timeout.saturating_sub(started.elapsed()), child.wait()).await;
            stdout_task = tokio::spawn(async move { out.unwrap_or_default() });
            status
        }
    };
    // Anything the script left running in its group goes with it.
    kill_group(pgid);
    writer.abort();
    let status = match status {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return ScriptOutcome::SpawnFailed {
                reason: e.to_string(),
            };
        }
        Err(_) => {
            let _ = child.wait().await;
            return ScriptOutcome::Timeout {
                after: spec.timeout,
            };
        }
    };
    let (out, overflow) = stdout_task.await.unwrap_or_default();
    let err = stderr_task.await.unwrap_or_default();
    if overflow {
        return ScriptOutcome::OutputTooLarge { limit: max_stdout };
    }
    let stderr_text = String::from_utf8_lossy(&err).into_owned();
    if !status.success() {
        return ScriptOutcome::Failed {
            exit_code: status.code(),
            stderr: stderr_text,
        };
    }
    if out.iter().all(u8::is_ascii_whitespace) {
        return ScriptOutcome::InvalidOutput {
            reason: "stdout was empty; a tool must print its result as JSON".into(),
            stderr: stderr_text,
        };
    }
    match serde_json::from_slice::<Value>(&out) {
        Ok(output) => ScriptOutcome::Success {
            output,
            stdout_bytes: out.len(),
        },
        Err(e) => ScriptOutcome::InvalidOutput {
            reason: format!("stdout is not JSON ({e})"),
            stderr: stderr_text,
        },
    }
}

fn kill_group(pgid: Option<i32>) {
    if let Some(pgid) = pgid {
        // ESRCH (already gone) is the normal case after a clean exit.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Reads up to `cap` bytes; reports whether the stream had more.
async fn read_capped<R: AsyncRead + Unpin>(reader: Option<R>, cap: usize) -> (Vec<u8>, bool) {
    let Some(mut reader) = reader else {
        return (Vec::new(), false);
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return (buf, false),
            Ok(n) => {
                if buf.len() + n > cap {
                    return (buf, true);
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// Reads the whole stream but keeps only its last `cap` bytes: a traceback ends at the bottom.
async fn read_tail<R: AsyncRead + Unpin>(reader: Option<R>, cap: usize) -> Vec<u8> {
    let Some(mut reader) = reader else {
        return Vec::new();
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut truncated = false;
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > 2 * cap {
                    buf.drain(..buf.len() - cap);
                    truncated = true;
                }
            }
        }
    }
    if buf.len() > cap {
        buf.drain(..buf.len() - cap);
        truncated = true;
    }
    if truncated {
        let mut out = b"[stderr truncated]\n".to_vec();
        out.extend_from_slice(&buf);
        return out;
    }
    buf
}
