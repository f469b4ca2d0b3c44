//! Starts a script the way `posix_spawn` does, with the sandbox's steps between clone and exec:
//! `clone(CLONE_VM | CLONE_VFORK)` lends the child the gateway's memory until it calls `exec`,
//! instead of copying the gateway's page tables as `fork` does.
//!
//! Why not std's `Command`: it forks as soon as a `pre_exec` hook is set, and the sandbox needs
//! one. A fork costs about 0.08 ms per MiB the gateway holds (25 ms at 300 MiB, measured with
//! a bare C loop), so every call's price grew with the pool. Here it does not.
//!
//! What sharing the memory demands of the child, which runs until `exec` on a small stack of
//! its own inside the gateway's address space, with every signal blocked:
//! - it only reads values built before the clone, and writes only its own stack and the one
//!   error slot;
//! - it makes system calls and nothing else: no allocation, no lock, no unwinding;
//! - it never calls libc functions that act on the whole process: glibc's `setuid` signals
//!   every thread of the gateway, so the child uses the raw system calls, which change only
//!   its own credentials.

// The one module whose job is unsafe: every block says why it holds.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The sandbox's steps in the child, in the order they are taken.
#[derive(Debug, Default)]
pub struct Confine {
    /// The script is the init of a new PID namespace: when it ends, the kernel kills
    /// everything it started.
    pub pid_namespace: bool,
    /// The user namespace owning the two below, entered first (a gateway without root).
    pub owner_namespace: Option<Arc<OwnedFd>>,
    /// A mount namespace to enter (its root becomes the script's), before the working
    /// directory is set.
    pub mount_namespace: Option<Arc<OwnedFd>>,
    /// A network namespace to enter.
    pub net_namespace: Option<Arc<OwnedFd>>,
    /// uid, gid and supplementary groups (the primary one included) to switch to.
    pub user: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
    /// A user namespace of its own, entered after the switch and before the limits: the
    /// kernel counts `RLIMIT_NPROC` per user namespace, so the limit binds this call alone.
    pub user_namespace: bool,
    /// `setrlimit` calls: resource, soft, hard.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// A Landlock ruleset to enforce (with `no_new_privs`) just before `exec`.
    pub landlock: Option<OwnedFd>,
}

/// A running script: its pipes, and its exit status once [`Child::wait`] saw it.
/// Dropped before that, it kills the script (the caller went away).
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

/// Starts `program` (a path, never looked up on `PATH`) in `cwd` with exactly `env`, its
/// stdin, stdout and stderr piped, as the leader of its own process group, confined when
/// `confine` is given.
pub fn spawn(
    program: &Path,
    cwd: &Path,
    env: &[(OsString, OsString)],
    confine: Option<Confine>,
) -> io::Result<Child> {
    // A relative program would be found from `cwd`, after the child changed directory; a
    // relative `cwd` from the root of a mount namespace the child entered.
    let absolute = |p: &Path| -> io::Result<std::path::PathBuf> {
        if p.is_absolute() {
            Ok(p.to_path_buf())
        } else {
            Ok(std::env::current_dir()?.join(p))
        }
    };
    let program = c_string(absolute(program)?.as_os_str())?;
    let cwd = c_string(absolute(cwd)?.as_os_str())?;
    let argv = [program.as_ptr(), std::ptr::null()];
    let env: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut pair = k.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(v.as_bytes());
            CString::new(pair).map_err(|_| nul_error())
        })
        .collect::<io::Result<_>>()?;
    let envp: Vec<*const libc::c_char> = env
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();

    let (stdin_child, stdin_ours) = pipe_pair()?;
    let (stdout_ours, stdout_child) = pipe_pair()?;
    let (stderr_ours, stderr_child) = pipe_pair()?;

    let confine = confine.as_ref();
    let rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)> = confine
        .map(|c| {
            c.rlimits
                .iter()
                .map(|&(resource, soft, hard)| {
                    (
                        resource,
                        libc::rlimit {
                            rlim_cur: soft,
                            rlim_max: hard,
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let args = ChildArgs {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd.as_ptr(),
        stdio: [
            stdin_child.as_raw_fd(),
            stdout_child.as_raw_fd(),
            stderr_child.as_raw_fd(),
        ],
        confine: confine.map(|c| RawConfine {
            pid_namespace: c.pid_namespace,
            owner_namespace: c.owner_namespace.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            mount_namespace: c.mount_namespace.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            net_namespace: c.net_namespace.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            user: c.user.as_ref().map(|(uid, gid, groups)| RawUser {
                uid: *uid,
                gid: *gid,
                groups: groups.as_ptr(),
                ngroups: groups.len(),
            }),
            user_namespace: c.user_namespace,
            rlimits: rlimits.as_ptr(),
            nrlimits: rlimits.len(),
            landlock: c.landlock.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            // SAFETY: getpid has no preconditions.
            gateway: unsafe { libc::getpid() },
        }),
        error: AtomicI32::new(0),
    };
    let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    if confine.is_some_and(|c| c.pid_namespace) {
        flags |= libc::CLONE_NEWPID;
    }
    let stack = Stack::new()?;
    let mut pidfd: libc::c_int = -1;
    let pid = {
        // A handler of the gateway's must not run in the child, on the child's stack, before
        // the child reset it: block everything around the clone (this thread only).
        let _mask = BlockSignals::new();
        // SAFETY: `child_main` follows the rules of the module comment; `args` and `stack`
        // outlive the child's use of them, because CLONE_VFORK suspends this thread until the
        // child has called exec or exited.
        unsafe {
            libc::clone(
                child_main,
                stack.top(),
                flags,
                &args as *const ChildArgs as *mut libc::c_void,
                &mut pidfd as *mut libc::c_int,
            )
        }
    };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdin_child, stdout_child, stderr_child));
    let failed = args.error.load(Ordering::Acquire);
    if failed != 0 {
        // The child exited without exec: collect it.
        let mut status = 0;
        // SAFETY: `pid` is our unreaped child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(failed));
    }
    Ok(Child {
        pid,
        pidfd: watch(pidfd)?,
        status: None,
        stdin: Some(pipe::Sender::from_owned_fd(stdin_ours)?),
        stdout: Some(pipe::Receiver::from_owned_fd(stdout_ours)?),
        stderr: Some(pipe::Receiver::from_owned_fd(stderr_ours)?),
    })
}

impl Child {
    /// The script's pid, which is also its process group's id.
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the script to exit and collects it. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            if let Some(status) = self.try_reap()? {
                self.status = Some(status);
                continue;
            }
            // The pidfd turns readable when the process has exited.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }

    fn try_reap(&self) -> io::Result<Option<ExitStatus>> {
        let mut status = 0;
        loop {
            // SAFETY: `pid` is our child and not yet reaped (`status` is unset).
            match unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } {
                0 => return Ok(None),
                -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                -1 => return Err(io::Error::last_os_error()),
                _ => return Ok(Some(ExitStatus::from_raw(status))),
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let pid = self.pid;
        // Until it is reaped the pid is still ours, so this cannot hit another process.
        // SAFETY: plain system calls.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::kill(-pid, libc::SIGKILL);
        }
        if let Ok(Some(_)) = self.try_reap() {
            return;
        }
        let reap = move || {
            let mut status = 0;
            // SAFETY: `pid` is our unreaped child; it was just killed, so this returns soon.
            while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(reap)),
            Err(_) => reap(),
        }
    }
}

/// Everything the child reads, as plain pointers into values the parent keeps alive.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    confine: Option<RawConfine>,
    /// The errno of the step that failed, 0 if exec was reached.
    error: AtomicI32,
}

struct RawConfine {
    pid_namespace: bool,
    owner_namespace: RawFd,
    mount_namespace: RawFd,
    net_namespace: RawFd,
    user: Option<RawUser>,
    user_namespace: bool,
    rlimits: *const (libc::__rlimit_resource_t, libc::rlimit),
    nrlimits: usize,
    landlock: RawFd,
    gateway: libc::pid_t,
}

struct RawUser {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    ngroups: usize,
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while this thread of execution runs.
    let args = unsafe { &*(arg as *const ChildArgs) };
    // SAFETY: see `child_steps`.
    let errno = unsafe { child_steps(args) };
    args.error.store(errno.max(1), Ordering::Release);
    // SAFETY: leaves without running anything of the parent's (no atexit handlers).
    unsafe { libc::_exit(127) }
}

/// Returns only on failure, with the errno of the step that failed.
///
/// # Safety
/// Runs in the cloned child; see the module comment.
unsafe fn child_steps(a: &ChildArgs) -> libc::c_int {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    };
    macro_rules! check {
        ($call:expr) => {
            if $call == -1 {
                return errno();
            }
        };
    }
    // SAFETY (whole body): system calls on values prepared by the parent.
    unsafe {
        // The child's ends were moved above 2 by `pipe_pair`, so none is overwritten here, and
        // dup2 clears close-on-exec on the copy.
        for (target, fd) in a.stdio.iter().enumerate() {
            check!(libc::dup2(*fd, target as libc::c_int));
        }
        // The namespaces are entered while the child still has the gateway's privileges.
        // Entering a mount namespace moves to its root; the working directory comes after.
        if let Some(c) = &a.confine {
            if c.owner_namespace >= 0 {
                check!(libc::setns(c.owner_namespace, libc::CLONE_NEWUSER));
            }
            if c.mount_namespace >= 0 {
                check!(libc::setns(c.mount_namespace, libc::CLONE_NEWNS));
            }
            if c.net_namespace >= 0 {
                check!(libc::setns(c.net_namespace, libc::CLONE_NEWNET));
            }
        }
        check!(libc::chdir(a.cwd));
        // Its own process group, so a timeout can kill everything the script started.
        check!(libc::setpgid(0, 0));
        if let Some(c) = &a.confine {
            if let Some(u) = &c.user {
                check!(libc::syscall(libc::SYS_setgroups, u.ngroups, u.groups));
                check!(libc::syscall(libc::SYS_setgid, u.gid));
                check!(libc::syscall(libc::SYS_setuid, u.uid));
            }
            // After the uid change: created by the script's own uid, the namespace holds none
            // of root's privileges, and its process count (the one `RLIMIT_NPROC` bounds) is
            // this call's. Before the limits: the kernel caps the namespace's share of the
            // uid's processes at the creator's limit, which must still be the gateway's.
            // Its ids are not mapped: the script sees itself as the overflow uid (65534).
            if c.user_namespace {
                check!(libc::unshare(libc::CLONE_NEWUSER));
            }
            // After the uid change, which clears it. The kernel fires it when the parent
            // *thread* ends: scripts are spawned from runtime worker threads, which live as
            // long as the gateway.
            check!(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL));
            // Outside a new PID namespace the parent is visible: if it is already gone, the
            // death signal will never come. (Inside, getppid is 0.)
            if !c.pid_namespace && libc::getppid() != c.gateway {
                return libc::ESRCH;
            }
            for i in 0..c.nrlimits {
                let (resource, limit) = &*c.rlimits.add(i);
                check!(libc::setrlimit(*resource, limit));
            }
            if c.landlock >= 0 {
                check!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
                check!(libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    c.landlock,
                    0
                ));
            }
        }
        // The script starts with default dispositions and nothing blocked, as std's `Command`
        // gives: the gateway ignores SIGPIPE, and a handler of its own would run here on the
        // wrong stack (exec resets handlers, not ignored signals).
        let mut old: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..libc::SIGRTMAX() + 1 {
            if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && (signal == libc::SIGPIPE || old.sa_sigaction != libc::SIG_IGN)
                && old.sa_sigaction != libc::SIG_DFL
            {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let failed = libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if failed != 0 {
            return failed;
        }
        libc::execve(a.program, a.argv, a.envp);
        errno()
    }
}

/// Registers a pidfd with the runtime, to wait for its exit.
fn watch(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` stays open, and is the same descriptor, until the `AsyncFd` drops it.
    unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }.map_err(io::Error::from)
}

/// A pipe as (read end, write end), both close-on-exec and numbered above 2.
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// A gateway started with stdin closed gets pipe ends numbered 0 to 2; the child's `dup2`s
/// onto 0, 1 and 2 would then overwrite one another.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl on a descriptor we own; the result is a new descriptor we then own.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: see above.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| nul_error())
}

fn nul_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "a path or variable holds a NUL byte",
    )
}

/// The child's stack: a private mapping with a guard page below it.
struct Stack {
    base: *mut libc::c_void,
}

const STACK_SIZE: usize = 128 * 1024;

impl Stack {
    fn new() -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping, then its lowest page made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                STACK_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Self { base };
            if libc::mprotect(base, page_size(), libc::PROT_NONE) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// Stacks grow down on every architecture this runs on.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, 16-byte aligned since the size is.
        unsafe { self.base.cast::<u8>().add(STACK_SIZE).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the child no longer runs on it.
        unsafe { libc::munmap(self.base, STACK_SIZE) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Blocks every signal on this thread until dropped.
struct BlockSignals {
    old: libc::sigset_t,
}

impl BlockSignals {
    fn new() -> Self {
        // SAFETY: sigset operations on local values.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            Self { old }
        }
    }
}

impl Drop for BlockSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn run(program: &Path, input: &[u8]) -> (ExitStatus, Vec<u8>, Vec<u8>) {
        let env = [(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
        let mut child = spawn(program, Path::new("/"), &env, None).unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).await.unwrap();
        drop(stdin);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        child
            .stdout
            .take()
            .unwrap()
            .read_to_end(&mut out)
            .await
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_end(&mut err)
            .await
            .unwrap();
        (child.wait().await.unwrap(), out, err)
    }

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("s.sh");
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn pipes_exit_codes_signals_and_the_environment_reach_the_script() {
        let dir = tempfile::tempdir().unwrap();
        let s = script(
            dir.path(),
            "#!/bin/sh\ncat\necho \"$PATH|$HOME|$(pwd)\" >&2\nexit 7\n",
        );
        let (status, out, err) = run(&s, b"hello").await;
        assert_eq!(out, b"hello");
        // Only the variables given; the working directory is the one asked for.
        assert_eq!(String::from_utf8(err).unwrap(), "/usr/bin:/bin||/\n");
        assert_eq!(status.code(), Some(7));

        let s = script(dir.path(), "#!/bin/sh\nkill -TERM $$\n");
        let (status, _, _) = run(&s, b"").await;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_failed_exec_is_an_error_of_spawn_not_a_child() {
        let dir = tempfile::tempdir().unwrap();
        let e = spawn(&dir.path().join("missing"), dir.path(), &[], None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = spawn(
            Path::new("/bin/true"),
            &dir.path().join("nowhere"),
            &[],
            None,
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let path = dir.path().join("not-executable");
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        let e = spawn(&path, dir.path(), &[], None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    }

    #[tokio::test]
    async fn sigpipe_is_back_to_its_default_in_the_script() {
        // The gateway ignores SIGPIPE (std does at start); a script writing to a closed pipe
        // must die of it, as under any shell, instead of looping on EPIPE.
        let dir = tempfile::tempdir().unwrap();
        let s = script(dir.path(), "#!/bin/sh\nexec yes\n");
        let env = [(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
        let mut child = spawn(&s, dir.path(), &env, None).unwrap();
        drop(child.stdout.take());
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}");
    }

    #[tokio::test]
    async fn a_dropped_child_is_killed_and_collected() {
        let dir = tempfile::tempdir().unwrap();
        let s = script(dir.path(), "#!/bin/sh\nexec sleep 1000\n");
        let child = spawn(&s, dir.path(), &[], None).unwrap();
        let pid = child.id() as libc::pid_t;
        let pidfd = child.pidfd.get_ref().try_clone().unwrap();
        drop(child);
        // The clone of the pidfd turns readable once the process is gone, reaped or not.
        let fd = watch(pidfd).unwrap();
        drop(fd.readable().await.unwrap());
        // Then the drop's reaper collects it: even a zombie keeps its /proc entry. (Not
        // waitpid here, which would collect it in the reaper's stead.)
        let proc_entry = std::path::PathBuf::from(format!("/proc/{pid}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while proc_entry.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the child was never reaped"
            );
            tokio::task::yield_now().await;
        }
    }
}
