//! A stdio upstream's child process and the transport over its pipes, with its output read
//! through a [`LineGuard`] (the SDK's own child transport keeps the pipes to itself). The
//! child goes as the SDK's would: on close, its stdin is closed and it has a few seconds to
//! exit, then SIGTERM, then SIGKILL; dropped, it is killed.

use std::time::Duration;

use rmcp::RoleClient;
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::guard::LineGuard;

/// How long a closed child has to exit before it is signalled, and again before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

pub(super) struct ChildTransport {
    transport: AsyncRwTransport<RoleClient, LineGuard<ChildStdout>, ChildStdin>,
    child: Child,
}

impl ChildTransport {
    /// Spawns `cmd` (it must not be spawned yet) with its stdout read through a guard that
    /// refuses lines over `limit` bytes.
    pub(super) fn spawn(
        mut cmd: tokio::process::Command,
        limit: usize,
        group: &str,
    ) -> std::io::Result<Self> {
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(std::io::Error::other("the child's pipes are missing"));
        };
        // The guard keeps every line under `limit`; the SDK's own cap must not be lower.
        let transport = AsyncRwTransport::new_client(LineGuard::new(stdout, limit, group), stdin)
            .with_max_line_length(limit.saturating_add(64 * 1024));
        Ok(Self { transport, child })
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.transport.close().await?;
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
            if tokio::time::timeout(EXIT_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        self.child.kill().await
    }
}
