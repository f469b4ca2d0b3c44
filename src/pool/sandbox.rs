//! Confines a tool script to what it needs, with whatever the kernel offers:
//!
//! - **Landlock**: read and execute its own folder, the system paths and the directories on
//!   `PATH`; write only a per-call temporary directory (`TMPDIR`, removed after the call);
//!   no `/proc` at all (the gateway's command line there is world-readable); no signals to and
//!   no abstract sockets of processes outside the sandbox; optionally no TCP.
//! - **A jail per group** ([`super::jail`]): a mount namespace whose root holds only the paths
//!   above, and a network namespace with only loopback, left only through the pairs the group
//!   lists in `egress` ([`super::egress`]).
//! - **An unprivileged identity**: `--script-user`, or `nobody` for a gateway running as root.
//! - **A user namespace per call**, entered after the uid change: the process limit
//!   (`RLIMIT_NPROC`), which the kernel counts per user *and* user namespace since Linux
//!   5.14, binds each call on its own, not every call of the same user together.
//! - **A PID namespace whose init is the script**: when the script exits or is killed, the
//!   kernel kills everything it started, `setsid` or not.
//! - **`PR_SET_PDEATHSIG`**: a script dies with the gateway, even after `kill -9`.
//! - **Resource limits** per group.
//!
//! Everything is built in the parent; [`super::spawn`] takes the steps between clone and `exec`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::sys::resource::Resource;
use nix::unistd::{Gid, Pid, Uid};

use super::egress::Egress;
use super::jail::{DEVICES, Jail, JailKey, TMP_PREFIX};
use super::spawn::Confine;
use serde::Deserialize;

/// The Landlock ABI whose rights are asked for: filesystem (with truncate and device ioctls),
/// TCP, and signal and abstract-socket scoping. An older kernel enforces what it has.
const ABI_WANTED: ABI = ABI::V6;

/// Read-only system paths; missing ones are skipped.
const SYSTEM_PATHS: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// How hard the gateway tries to confine scripts (`--script-sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Use what the kernel has; warn at start about what it lacks.
    #[default]
    Auto,
    /// Refuse to start unless every layer is available.
    Required,
    /// Run scripts unconfined, as before the sandbox existed.
    Off,
}

/// The gateway-wide part of the sandbox, from the command line.
#[derive(Debug, Clone, Default)]
pub struct SandboxSettings {
    pub mode: Mode,
    /// Scripts run under this uid and gid when set (`--script-user`).
    pub user: Option<ScriptUser>,
    /// Who scripts run as when no `--script-user` is given: `nobody` for a gateway running as
    /// root, so that root-only files (`/etc/shadow`) are out of their reach.
    pub default_user: Option<ScriptUser>,
    /// Read-only paths besides the system ones: `PATH` entries, their prefixes, extra paths.
    pub read_paths: Vec<PathBuf>,
    /// The system paths and `read_paths`: what a group's minimal root holds besides its own
    /// folder.
    pub jail_read_paths: Arc<[PathBuf]>,
    /// The layers of the perimeter: the jail, the per-call user namespace and the default
    /// unprivileged identity. Always on in the gateway; off only to measure what they cost.
    pub isolate: bool,
}

impl SandboxSettings {
    /// Settings for `mode`: the read paths come from the gateway's `PATH` plus `extra`.
    pub fn new(mode: Mode, user: Option<ScriptUser>, extra: &[PathBuf]) -> Self {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut read_paths = path_read_paths(&path);
        read_paths.extend(extra.iter().cloned());
        read_paths.sort();
        read_paths.dedup();
        let jail_read_paths = SYSTEM_PATHS
            .iter()
            .map(PathBuf::from)
            .chain(read_paths.iter().cloned())
            .collect();
        let default_user = (user.is_none() && Uid::effective().is_root()).then(ScriptUser::nobody);
        Self {
            mode,
            user,
            default_user,
            read_paths,
            jail_read_paths,
            isolate: true,
        }
    }

    /// Who scripts run as, if not as the gateway's own user.
    pub fn identity(&self) -> Option<&ScriptUser> {
        self.user.as_ref().or(if self.isolate {
            self.default_user.as_ref()
        } else {
            None
        })
    }
}

/// Directories on `PATH`, and for each `…/bin`, `…/sbin` or `…/shims` its prefix: an
/// interpreter finds its libraries beside its `bin` (`/usr/local/lib`, a pyenv root). The root
/// directory is never a prefix.
fn path_read_paths(path: &std::ffi::OsStr) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::env::split_paths(path) {
        if !dir.is_absolute() {
            continue;
        }
        let is_bin = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| matches!(n, "bin" | "sbin" | "shims"));
        if is_bin
            && let Some(prefix) = dir.parent()
            && prefix != Path::new("/")
        {
            out.push(prefix.to_path_buf());
        }
        out.push(dir);
    }
    out
}

/// The account scripts run under (`--script-user`).
#[derive(Debug, Clone)]
pub struct ScriptUser {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<Gid>,
}

impl ScriptUser {
    /// `nobody` without supplementary groups: the user that owns nothing (65534 where the
    /// system does not name it).
    pub fn nobody() -> Self {
        let user = nix::unistd::User::from_name("nobody").ok().flatten();
        let (uid, gid) = user.map_or((Uid::from_raw(65534), Gid::from_raw(65534)), |u| {
            (u.uid, u.gid)
        });
        Self {
            name: "nobody".into(),
            uid,
            gid,
            groups: vec![gid],
        }
    }

    pub fn lookup(name: &str) -> Result<Self, String> {
        let user = nix::unistd::User::from_name(name)
            .map_err(|e| format!("cannot look up script user `{name}`: {e}"))?
            .ok_or_else(|| format!("script user `{name}` does not exist"))?;
        let cname = std::ffi::CString::new(name)
            .map_err(|_| format!("script user `{name}` contains a NUL byte"))?;
        let groups = nix::unistd::getgrouplist(&cname, user.gid)
            .map_err(|e| format!("cannot list the groups of script user `{name}`: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            uid: user.uid,
            gid: user.gid,
            groups,
        })
    }
}

/// Per-group limits: the `x-toolgate-sandbox` object of a group's `openapi.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupLimits {
    /// Address space of each process, in MiB (`RLIMIT_AS`).
    pub address_space_mb: u64,
    /// Processes (and threads) of one call (`RLIMIT_NPROC`, counted per call in the call's
    /// own user namespace; without one, per uid, and not at all for root).
    pub processes: u64,
    /// Largest file a script may write, in MiB (`RLIMIT_FSIZE`).
    pub file_size_mb: u64,
    /// CPU time of each process, in seconds (`RLIMIT_CPU`).
    pub cpu_seconds: u64,
    /// TCP connect and bind; `false` refuses both (Landlock), even on the jail's loopback.
    pub network: bool,
    /// The `host:port` pairs the scripts may reach over TCP, or `["*"]` for the host's whole
    /// network; none by default.
    pub egress: Egress,
}

impl Default for GroupLimits {
    fn default() -> Self {
        Self {
            address_space_mb: 4096,
            processes: 256,
            file_size_mb: 256,
            cpu_seconds: 300,
            network: true,
            egress: Egress::default(),
        }
    }
}

impl GroupLimits {
    /// Parses and checks `x-toolgate-sandbox`, saying which field is wrong and why.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let limits: Self = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        let check = |field: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(format!(
                    "`{field}` must be an integer from {min} to {max}, found {value}"
                ))
            }
        };
        // Below these floors no interpreter starts, and the failure would look like a tool bug.
        check("address_space_mb", limits.address_space_mb, 64, 1 << 20)?;
        check("processes", limits.processes, 1, 1 << 20)?;
        check("file_size_mb", limits.file_size_mb, 1, 1 << 20)?;
        check("cpu_seconds", limits.cpu_seconds, 1, 86_400)?;
        if !limits.network && limits.egress != Egress::default() {
            return Err(
                "`egress` says where TCP may go and `network: false` refuses all TCP: keep one"
                    .into(),
            );
        }
        Ok(limits)
    }

    fn rlimits(&self) -> [(Resource, u64, u64); 5] {
        const MIB: u64 = 1024 * 1024;
        [
            (
                Resource::RLIMIT_AS,
                self.address_space_mb * MIB,
                self.address_space_mb * MIB,
            ),
            (Resource::RLIMIT_NPROC, self.processes, self.processes),
            (
                Resource::RLIMIT_FSIZE,
                self.file_size_mb * MIB,
                self.file_size_mb * MIB,
            ),
            // SIGXCPU at the soft limit lets a script clean up; SIGKILL a second later.
            (Resource::RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 1),
            // A core file would land in the script's folder, which it may not write anyway.
            (Resource::RLIMIT_CORE, 0, 0),
        ]
    }
}

/// What this kernel lets us do, found out once.
#[derive(Debug, Clone)]
pub struct HostSupport {
    /// `Ok` when every Landlock right we ask for is enforced; otherwise what is missing.
    pub landlock: Result<(), String>,
    /// `Ok` when a PID namespace can be created; otherwise why not.
    pub pid_namespace: Result<(), String>,
    /// How jails (mount and network namespaces) are built here; otherwise why they cannot be.
    pub jail: Result<super::jail::Kind, String>,
    /// `Ok` when a script's process may enter a user namespace of its own after dropping
    /// root; otherwise why not.
    pub user_namespace: Result<(), String>,
}

impl HostSupport {
    /// What this kernel cannot confine, one line each; empty when every layer works.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        if let Err(e) = &self.landlock {
            gaps.push(format!(
                "Landlock: {e}; scripts can read and write whatever their uid may, including the gateway's /proc/<pid>/cmdline, and plant tool folders"
            ));
        }
        if let Err(e) = &self.pid_namespace {
            gaps.push(format!(
                "PID namespace: {e}; a script's process that leaves its process group (setsid) outlives the call"
            ));
        }
        if let Err(e) = &self.jail {
            gaps.push(format!(
                "mount and network namespaces: {e}; scripts reach the host's network (the gateway's database, Redis, loopback, private addresses) over TCP, UDP and pathname UNIX sockets, `egress` lists are not enforced, and any path can be `stat`ed"
            ));
        }
        if let Err(e) = &self.user_namespace {
            gaps.push(format!(
                "user namespace per call: {e}; the process limit counts every call of the script user together"
            ));
        }
        gaps
    }
}

/// Probes the kernel on first use.
pub fn host() -> &'static HostSupport {
    static HOST: OnceLock<HostSupport> = OnceLock::new();
    HOST.get_or_init(|| HostSupport {
        landlock: probe_landlock(),
        pid_namespace: probe_pid_namespace(),
        jail: super::jail::probe(),
        user_namespace: probe_user_namespace(),
    })
}

/// Enforces the full ruleset on a throwaway thread: Landlock binds only the thread that asks.
fn probe_landlock() -> Result<(), String> {
    std::thread::spawn(|| {
        let ruleset = base_ruleset(false)
            .map_err(|e| e.to_string())?
            .create()
            .map_err(|e| e.to_string())?;
        let status = ruleset.restrict_self().map_err(|e| e.to_string())?;
        match status.ruleset {
            RulesetStatus::FullyEnforced => Ok(()),
            RulesetStatus::PartiallyEnforced => Err(format!(
                "the kernel enforces only part of the rules ({:?})",
                status.landlock
            )),
            RulesetStatus::NotEnforced => Err(format!("not available ({:?})", status.landlock)),
        }
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".into()))
}

#[allow(unsafe_code)]
fn probe_pid_namespace() -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", ":"]);
    // SAFETY: unshare is a plain system call; nothing is allocated or locked after the fork.
    unsafe {
        cmd.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID).map_err(io::Error::from)
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited with {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWPID) failed: {e}")),
    }
}

/// A child that drops root the way a script does (to `nobody`, as root) and then enters a
/// user namespace of its own.
#[allow(unsafe_code)]
fn probe_user_namespace() -> Result<(), String> {
    use nix::libc;
    use std::os::unix::process::CommandExt;
    let nobody = ScriptUser::nobody();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let root = Uid::effective().is_root();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", ":"]);
    // SAFETY: raw system calls only; nothing is allocated or locked after the fork.
    unsafe {
        cmd.pre_exec(move || {
            if root
                && (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == -1
                    || libc::syscall(libc::SYS_setgid, gid) == -1
                    || libc::syscall(libc::SYS_setuid, uid) == -1)
            {
                return Err(io::Error::last_os_error());
            }
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(io::Error::from)
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited with {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWUSER) failed: {e}")),
    }
}

fn base_ruleset(network: bool) -> Result<Ruleset, landlock::RulesetError> {
    let ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_WANTED))?
        .scope(Scope::from_all(ABI_WANTED))?;
    if network {
        Ok(ruleset)
    } else {
        ruleset.handle_access(AccessNet::from_all(ABI_WANTED))
    }
}

/// How one script runs: its group's limits under the gateway's settings.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    pub settings: Arc<SandboxSettings>,
    pub limits: GroupLimits,
    /// What the group's jail is made of; `None` when its scripts get none, an error when the
    /// folder could not be read at load.
    jail: Option<Result<JailKey, String>>,
}

/// Removes the call directories of gateways that are gone (killed with `kill -9`, say): a
/// directory whose gateway pid no longer runs belongs to nobody.
pub fn sweep_stale_call_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TMP_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let gone =
            nix::sys::signal::kill(Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH);
        if gone && let Err(e) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!(dir = %entry.path().display(), error = %e, "cannot remove a stale script temporary directory");
        }
    }
}

/// A per-call temporary directory, removed with everything in it when dropped; it also keeps
/// the group's jail (its egress forwarders) alive while the call runs.
#[derive(Debug)]
pub struct CallDir {
    path: PathBuf,
    _jail: Option<Arc<Jail>>,
}

impl CallDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CallDir {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.path);
        let remove = move || {
            // Symlinks the script left are removed, not followed.
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a script's temporary directory");
            }
        };
        // Removing a directory takes milliseconds on some journaled disks: keep it off the
        // path of the answer.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

impl Sandbox {
    /// The sandbox of a group living in `folder`, whose scripts run from the gateway's copies
    /// in `copies` (read-only in its jail, like the folder).
    pub fn new(
        settings: Arc<SandboxSettings>,
        limits: GroupLimits,
        folder: &Path,
        copies: Option<&Path>,
    ) -> Self {
        let wanted = settings.mode != Mode::Off && settings.isolate && host().jail.is_ok();
        let jail = wanted.then(|| {
            let read_paths = match copies {
                None => settings.jail_read_paths.clone(),
                Some(c) => settings
                    .jail_read_paths
                    .iter()
                    .cloned()
                    .chain(std::iter::once(c.to_path_buf()))
                    .collect(),
            };
            JailKey::new(folder, read_paths, limits.egress.clone())
                .map_err(|e| format!("cannot read {}: {e}", folder.display()))
        });
        Self {
            settings,
            limits,
            jail,
        }
    }

    /// Prepares one run of a script living in `folder`, whose gateway copy (the file that is
    /// executed, beside links to the folder's entries) is in `copies`. `None` when the sandbox
    /// is off.
    pub async fn prepare(
        &self,
        folder: &Path,
        copies: Option<&Path>,
    ) -> io::Result<Option<(Confine, CallDir)>> {
        if self.settings.mode == Mode::Off {
            return Ok(None);
        }
        let host = host();
        let jail = match &self.jail {
            None => None,
            Some(Err(e)) => return Err(io::Error::other(format!("the group's jail: {e}"))),
            Some(Ok(key)) => Some(
                Jail::obtain(key)
                    .await
                    .map_err(|e| io::Error::new(e.kind(), format!("the group's jail: {e}")))?,
            ),
        };
        let parent = match &jail {
            Some(j) => j.tmp_base.clone(),
            None => std::env::temp_dir(),
        };
        let dir = CallDir {
            path: parent.join(format!(
                "{TMP_PREFIX}{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            )),
            _jail: jail.clone(),
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(dir.path())?;
        }
        let identity = self.settings.identity();
        if let Some(u) = identity {
            nix::unistd::chown(dir.path(), Some(u.uid), Some(u.gid)).map_err(io::Error::from)?;
        }
        let ruleset = match host.landlock {
            Ok(()) => Some(
                self.ruleset(folder, copies, dir.path())
                    .map_err(|e| io::Error::other(format!("Landlock rules: {e}")))?,
            ),
            Err(_) => None,
        };
        Ok(Some((
            Confine {
                pid_namespace: host.pid_namespace.is_ok(),
                user: identity.map(|u| {
                    (
                        u.uid.as_raw(),
                        u.gid.as_raw(),
                        u.groups.iter().map(|g| g.as_raw()).collect(),
                    )
                }),
                user_namespace: self.settings.isolate && host.user_namespace.is_ok(),
                owner_namespace: jail.as_ref().and_then(|j| j.user.clone()),
                mount_namespace: jail.as_ref().map(|j| j.mnt.clone()),
                net_namespace: jail.as_ref().and_then(|j| j.net.clone()),
                rlimits: self
                    .limits
                    .rlimits()
                    .iter()
                    .map(|&(resource, soft, hard)| (resource as _, soft, hard))
                    .collect(),
                landlock: ruleset.and_then(Option::<std::os::fd::OwnedFd>::from),
            },
            dir,
        )))
    }

    fn ruleset(
        &self,
        folder: &Path,
        copies: Option<&Path>,
        tmp: &Path,
    ) -> Result<RulesetCreated, String> {
        let read = AccessFs::from_read(ABI_WANTED);
        let all = AccessFs::from_all(ABI_WANTED);
        let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
        let mut ruleset = base_ruleset(self.limits.network)
            .and_then(|r| r.create())
            .map_err(|e| e.to_string())?;
        for path in self.settings.jail_read_paths.iter() {
            // A path this machine lacks grants nothing; that is not an error.
            if let Ok(fd) = PathFd::new(path) {
                ruleset = ruleset
                    .add_rule(PathBeneath::new(fd, read))
                    .map_err(|e| e.to_string())?;
            }
        }
        for dev in DEVICES {
            if let Ok(fd) = PathFd::new(dev) {
                ruleset = ruleset
                    .add_rule(PathBeneath::new(fd, device))
                    .map_err(|e| e.to_string())?;
            }
        }
        // The copy of the script that runs: read and executed like the folder.
        if let Some(copies) = copies {
            let fd = PathFd::new(copies).map_err(|e| e.to_string())?;
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, read))
                .map_err(|e| e.to_string())?;
        }
        let folder = PathFd::new(folder).map_err(|e| e.to_string())?;
        let tmp = PathFd::new(tmp).map_err(|e| e.to_string())?;
        ruleset
            .add_rule(PathBeneath::new(folder, read))
            .and_then(|r| r.add_rule(PathBeneath::new(tmp, all)))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn path_entries_bring_their_prefix_but_never_the_root() {
        let got = path_read_paths(std::ffi::OsStr::new(
            "/opt/py/shims:/usr/local/bin:/bin:relative/bin",
        ));
        let want: Vec<PathBuf> = [
            "/opt/py",
            "/opt/py/shims",
            "/usr/local",
            "/usr/local/bin",
            "/bin",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn group_limits_are_checked_field_by_field() {
        assert_eq!(
            GroupLimits::from_json(&json!({})).unwrap(),
            GroupLimits::default()
        );
        let l = GroupLimits::from_json(&json!({"cpu_seconds": 5, "network": false})).unwrap();
        assert_eq!((l.cpu_seconds, l.network), (5, false));
        let e = GroupLimits::from_json(&json!({"cpu_seconds": 0})).unwrap_err();
        assert!(e.contains("`cpu_seconds` must be an integer from 1"), "{e}");
        let e = GroupLimits::from_json(&json!({"memory": 5})).unwrap_err();
        assert!(e.contains("unknown field `memory`"), "{e}");
        let e = GroupLimits::from_json(&json!({"file_size_mb": "big"})).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
    }
}
