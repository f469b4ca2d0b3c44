//! A group's jail: the mount and network namespaces its scripts enter at every call, built
//! on the group's first call and kept for the next ones (at most [`MAX_JAILS`], the least
//! recently used going first).
//!
//! - **A minimal root**: an empty read-only tmpfs holding, at their own paths, read-only bind
//!   mounts of exactly the paths a script may read (the system paths, the directories on
//!   `PATH`, `--script-read-path`s, its own folder), the five device nodes, and the group's
//!   directory of per-call `TMPDIR`s. Nothing else exists there: no `/proc`, `/run`, `/var`,
//!   `/tmp`, no other group's folder, so no pathname socket (PostgreSQL's, Redis') can be
//!   reached and no other path can even be `stat`ed. Directories on the way to a bound path are
//!   the tmpfs's own (mode 0755), so a path under `/root` (a pyenv) is reachable by an
//!   unprivileged script user when the path itself is readable to it.
//! - **A network namespace with only loopback** (unless the group opts out with `"egress":
//!   ["*"]`), where the gateway listens for each `host:port` the group lists (see
//!   [`super::egress`]).
//!
//! A call enters both with `setns` before it drops root (see [`super::spawn`]): a few
//! microseconds, against about 0.7 ms to create a network namespace per call, whose teardown
//! the kernel defers and which would pile up under load.
//!
//! A gateway running as root builds jails on a thread of its own. A gateway without root
//! builds them in a forked child that first enters a user namespace of its own, mapping only
//! the gateway's uid and gid (after `deny` to `setgroups`): that namespace owns the jail's, and
//! every call enters it first. Where neither works (user namespaces disabled, a container's
//! seccomp filter, a root without `CAP_SYS_ADMIN`), there is no jail: [`probe`] says why.

// Mount and netlink system calls; every block says why it holds.
#![allow(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::libc;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::egress::{self, Egress, EgressHost};

/// The namespaces of one group's scripts, and what serves them.
#[derive(Debug)]
pub struct Jail {
    /// The user namespace that owns the others, for a gateway without root; calls enter it
    /// first.
    pub user: Option<Arc<OwnedFd>>,
    /// The mount namespace whose root is the minimal root.
    pub mnt: Arc<OwnedFd>,
    /// The network namespace; `None` for a group with `"egress": ["*"]`.
    pub net: Option<Arc<OwnedFd>>,
    /// Where the group's per-call temporary directories go (writable inside the root).
    pub tmp_base: PathBuf,
    forwarders: Vec<tokio::task::AbortHandle>,
}

impl Drop for Jail {
    fn drop(&mut self) {
        for f in &self.forwarders {
            f.abort();
        }
        let base = std::mem::take(&mut self.tmp_base);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&base)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %base.display(), error = %e, "cannot remove a group's temporary directory");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// At most this many jails are kept: each costs about 200 KiB of kernel memory, mostly its
/// network namespace. Past it the least recently used one goes (the calls running in it keep
/// it until they end), and its group builds a new one at its next call, in a millisecond or
/// two.
pub const MAX_JAILS: usize = 512;

/// What makes two jails the same. A reload of the tool pool rebuilds every group, and a group
/// whose jail would be identical uses the one already built. Cheap to clone and to look up:
/// its hash is computed once.
#[derive(Debug, Clone)]
pub struct JailKey(Arc<KeyParts>);

#[derive(Debug, PartialEq, Eq, Hash)]
struct KeyParts {
    folder: PathBuf,
    /// The folder's device and inode: a folder removed and made again at the same path (a
    /// checkout, a copy) is another directory, which the old jail's bind mount does not show.
    folder_id: (u64, u64),
    read_paths: Arc<[PathBuf]>,
    egress: Egress,
}

impl JailKey {
    pub fn new(folder: &Path, read_paths: Arc<[PathBuf]>, egress: Egress) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(folder)?;
        Ok(Self(Arc::new(KeyParts {
            folder: folder.to_path_buf(),
            folder_id: (meta.dev(), meta.ino()),
            read_paths,
            egress,
        })))
    }
}

impl PartialEq for JailKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for JailKey {}

impl std::hash::Hash for JailKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.folder.hash(state);
        self.0.folder_id.hash(state);
    }
}

/// A jail being built or built, and when it was last asked for.
#[derive(Debug, Default)]
struct Slot {
    jail: tokio::sync::OnceCell<Arc<Jail>>,
    used: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Jails {
    slots: HashMap<JailKey, Arc<Slot>>,
    clock: u64,
}

fn jails() -> &'static Mutex<Jails> {
    static JAILS: std::sync::OnceLock<Mutex<Jails>> = std::sync::OnceLock::new();
    JAILS.get_or_init(Default::default)
}

/// Removes every jail's temporary directory: the gateway is exiting, and its scripts with it.
pub fn remove_all_directories() {
    let slots = std::mem::take(&mut jails().lock().unwrap_or_else(|p| p.into_inner()).slots);
    for slot in slots.values() {
        if let Some(jail) = slot.jail.get() {
            let _ = std::fs::remove_dir_all(&jail.tmp_base);
        }
    }
}

impl Jail {
    /// The jail for `key`: the one built already, or a new one (one build for concurrent
    /// first calls).
    pub async fn obtain(key: &JailKey) -> io::Result<Arc<Jail>> {
        use std::sync::atomic::Ordering;
        let slot = {
            let mut jails = jails().lock().unwrap_or_else(|p| p.into_inner());
            jails.clock += 1;
            let now = jails.clock;
            let slot = jails.slots.entry(key.clone()).or_default().clone();
            slot.used.store(now, Ordering::Relaxed);
            if jails.slots.len() > MAX_JAILS
                && let Some(oldest) = jails
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| s.used.load(Ordering::Relaxed))
                    .map(|(k, _)| k.clone())
            {
                jails.slots.remove(&oldest);
            }
            slot
        };
        slot.jail
            .get_or_try_init(|| async { Self::build(key).await.map(Arc::new) })
            .await
            .cloned()
    }

    async fn build(key: &JailKey) -> io::Result<Jail> {
        let kind = super::sandbox::host()
            .jail
            .clone()
            .map_err(io::Error::other)?;
        let plan = Plan::new(&key.0)?;
        let tmp_base = plan.tmp_base.clone();
        let built = match kind {
            // A thread of its own, ended after: it leaves its namespaces and root behind,
            // which must not be a runtime thread's.
            Kind::Root => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::thread::Builder::new()
                    .name("toolgate-jail".into())
                    .spawn(move || {
                        let built = plan.build(None);
                        if built.is_err() {
                            let _ = std::fs::remove_dir_all(&plan.tmp_base);
                        }
                        let _ = tx.send(built);
                    })?;
                rx.await
                    .map_err(|_| io::Error::other("the thread building the jail died"))??
            }
            // A forked child, which alone may enter a user namespace; it sends back what it
            // made and exits.
            Kind::OwnUserNamespace => tokio::task::spawn_blocking(move || {
                let ids = (
                    nix::unistd::getuid().as_raw(),
                    nix::unistd::getgid().as_raw(),
                );
                let listeners = plan.net.as_ref().map_or(0, |n| n.listen.len());
                let got = in_forked_child(|| {
                    let built = plan.build(Some(ids))?;
                    let mut fds: Vec<OwnedFd> = built.user.into_iter().collect();
                    fds.push(built.mnt);
                    fds.extend(built.net);
                    fds.extend(built.listeners.into_iter().map(|(l, _)| OwnedFd::from(l)));
                    Ok(fds)
                });
                let fds = match got {
                    Ok(fds) => fds,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&plan.tmp_base);
                        return Err(e);
                    }
                };
                let expected = 2 + usize::from(plan.net.is_some()) + listeners;
                if fds.len() != expected {
                    return Err(io::Error::other(format!(
                        "the child building the jail sent {} descriptors, not {expected}",
                        fds.len()
                    )));
                }
                let mut fds = fds.into_iter();
                let mut next = || {
                    fds.next()
                        .ok_or_else(|| io::Error::other("missing descriptor"))
                };
                let user = Some(next()?);
                let mnt = next()?;
                let net = match plan.net {
                    Some(_) => Some(next()?),
                    None => None,
                };
                let mut listeners = Vec::new();
                for (_, target) in plan.net.iter().flat_map(|n| n.listen.iter()) {
                    listeners.push((std::net::TcpListener::from(next()?), target.clone()));
                }
                Ok(Built {
                    user,
                    mnt,
                    net,
                    listeners,
                })
            })
            .await
            .map_err(|_| io::Error::other("the task building the jail died"))??,
        };
        let budget = Arc::new(tokio::sync::Semaphore::new(egress::MAX_CONNECTIONS));
        let mut forwarders = Vec::new();
        for (listener, target) in built.listeners {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            forwarders.push(
                tokio::spawn(egress::forward(listener, target, budget.clone())).abort_handle(),
            );
        }
        Ok(Jail {
            user: built.user.map(Arc::new),
            mnt: Arc::new(built.mnt),
            net: built.net.map(Arc::new),
            tmp_base,
            forwarders,
        })
    }
}

/// Device nodes every script may read and write.
pub const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Per-group temporary directories are named `<prefix><gateway pid>-<uuid>` in the system
/// temporary directory, like the per-call ones of a gateway without jails, so that the sweep
/// of a dead gateway's directories finds both.
pub const TMP_PREFIX: &str = "toolgate-call-";

/// One step of assembling the root, at `at` (an absolute path inside the root).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// A read-only bind mount of the directory tree `from` (with its submounts).
    ReadTree { at: PathBuf, from: PathBuf },
    /// An empty read-only tmpfs, covering what is beneath it in a bound tree (the tools
    /// directory, when it lies inside a system path: other groups' folders).
    Hide { at: PathBuf },
    /// A bind mount of one file: read-only, or a device node (read-write).
    File {
        at: PathBuf,
        from: PathBuf,
        device: bool,
    },
    /// A writable bind mount of a directory (the per-call temporary directories).
    WriteTree { at: PathBuf, from: PathBuf },
    /// A symbolic link, for a read path that is one (`/bin` → `/usr/bin`).
    Symlink { at: PathBuf, to: PathBuf },
}

impl Step {
    fn at(&self) -> &Path {
        match self {
            Step::ReadTree { at, .. }
            | Step::Hide { at }
            | Step::File { at, .. }
            | Step::WriteTree { at, .. }
            | Step::Symlink { at, .. } => at,
        }
    }
}

/// Everything the building thread does, decided beforehand.
#[derive(Debug)]
struct Plan {
    tmp_base: PathBuf,
    /// Where the root is assembled before it becomes `/`: inside `tmp_base`.
    stage: PathBuf,
    /// In the order taken: a path before what lies beneath it.
    steps: Vec<Step>,
    /// `None`: the host's network.
    net: Option<NetPlan>,
}

#[derive(Debug)]
struct NetPlan {
    /// Addresses to give loopback besides 127.0.0.1/8 and ::1 (the listed IPs).
    addresses: Vec<IpAddr>,
    listen: Vec<(std::net::SocketAddr, egress::EgressTarget)>,
    /// Lines to put first in the namespace's `/etc/hosts`, if any name is listed.
    hosts: Option<String>,
}

struct Built {
    user: Option<OwnedFd>,
    mnt: OwnedFd,
    net: Option<OwnedFd>,
    listeners: Vec<(std::net::TcpListener, egress::EgressTarget)>,
}

impl Plan {
    fn new(key: &KeyParts) -> io::Result<Self> {
        let tmp_base = canonical(&std::env::temp_dir())?.join(format!(
            "{TMP_PREFIX}{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let stage = tmp_base.join(".root");
        let folder = absolute(&key.folder)?;
        let mut reads: Vec<PathBuf> = key
            .read_paths
            .iter()
            .map(|p| absolute(p))
            .collect::<io::Result<_>>()?;
        reads.push(folder.clone());
        let mut steps = read_steps(&reads);
        // The tools directory is hidden when a wider read path brings it in (tools under
        // `/opt`): a group sees no other group's folder, not even its name.
        let own = canonical(&folder)?;
        if let Some(tools) = own.parent()
            && steps.iter().any(
                |s| matches!(s, Step::ReadTree { at, .. } if tools.starts_with(at) && tools != at),
            )
        {
            steps.push(Step::Hide {
                at: tools.to_path_buf(),
            });
            steps.push(Step::ReadTree {
                at: own.clone(),
                from: own,
            });
        }
        for dev in DEVICES {
            if Path::new(dev).exists() {
                steps.push(Step::File {
                    at: dev.into(),
                    from: dev.into(),
                    device: true,
                });
            }
        }
        steps.push(Step::WriteTree {
            at: tmp_base.clone(),
            from: tmp_base.clone(),
        });
        let net = match &key.egress {
            Egress::Any => None,
            Egress::Only(targets) => {
                let hosts = egress::hosts_lines(targets);
                let hosts = if hosts.is_empty() {
                    None
                } else {
                    steps.push(Step::File {
                        at: "/etc/hosts".into(),
                        from: tmp_base.join("hosts"),
                        device: false,
                    });
                    Some(hosts)
                };
                Some(NetPlan {
                    addresses: targets
                        .iter()
                        .filter_map(|t| match t.host {
                            EgressHost::Ip(ip) if !ip.is_loopback() => Some(ip),
                            _ => None,
                        })
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                    listen: targets
                        .iter()
                        .map(|t| (egress::listen_address(targets, t), t.clone()))
                        .collect(),
                    hosts,
                })
            }
        };
        // Parents first; a hiding tmpfs before the folder bound inside it.
        steps.sort_by(|a, b| a.at().cmp(b.at()).then(a.cmp(b)));
        Ok(Self {
            tmp_base,
            stage,
            steps,
            net,
        })
    }

    /// Runs on a thread of its own, which it leaves in the new namespaces; or, with `ids`
    /// (the gateway's uid and gid), in a forked child, which first enters a user namespace of
    /// its own where they are mapped.
    fn build(&self, ids: Option<(u32, u32)>) -> io::Result<Built> {
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&self.tmp_base)?;
        std::fs::DirBuilder::new().mode(0o700).create(&self.stage)?;
        // DirBuilder's mode is filtered by the umask.
        std::fs::set_permissions(&self.tmp_base, std::fs::Permissions::from_mode(0o711))?;
        if let Some(hosts) = self.net.as_ref().and_then(|n| n.hosts.as_ref()) {
            let original = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
            let text = hosts_file(hosts, &original);
            let path = self.tmp_base.join("hosts");
            std::fs::write(&path, text)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
        let mut flags = CloneFlags::CLONE_NEWNS;
        if self.net.is_some() {
            flags |= CloneFlags::CLONE_NEWNET;
        }
        if ids.is_some() {
            flags |= CloneFlags::CLONE_NEWUSER;
        }
        nix::sched::unshare(flags).map_err(|e| ctx(e, "unshare"))?;
        if let Some((uid, gid)) = ids {
            map_own_ids(uid, gid)?;
        }
        let ns = |name: &str| -> io::Result<OwnedFd> {
            Ok(std::fs::File::open(format!("/proc/thread-self/ns/{name}"))?.into())
        };
        let user = match ids {
            Some(_) => Some(ns("user")?),
            None => None,
        };
        let mnt = ns("mnt")?;
        let net = match self.net {
            Some(_) => Some(ns("net")?),
            None => None,
        };
        // Nothing done here may reach the host's mounts.
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| ctx(e, "making mounts private"))?;
        let listeners = match &self.net {
            Some(plan) => loopback(plan)?,
            None => Vec::new(),
        };
        self.assemble_root()?;
        Ok(Built {
            user,
            mnt,
            net,
            listeners,
        })
    }

    fn assemble_root(&self) -> io::Result<()> {
        let stage = &self.stage;
        nix::mount::mount(
            Some("tmpfs"),
            stage,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755,size=1m"),
        )
        .map_err(|e| ctx(e, "mounting the root tmpfs"))?;
        let inside = |at: &Path| stage.join(at.strip_prefix("/").unwrap_or(at));
        for step in &self.steps {
            let at = inside(step.at());
            let what = || format!("{}", step.at().display());
            match step {
                Step::ReadTree { from, .. } | Step::WriteTree { from, .. } => {
                    mkdir_p(stage, &at)?;
                    let rec = matches!(step, Step::ReadTree { .. });
                    let mut flags = MsFlags::MS_BIND;
                    if rec {
                        flags |= MsFlags::MS_REC;
                    }
                    nix::mount::mount(Some(from), &at, None::<&str>, flags, None::<&str>)
                        .map_err(|e| ctx(e, &format!("binding {}", what())))?;
                    let attrs = if rec {
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                    } else {
                        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                    };
                    set_attrs(&at, attrs, rec).map_err(|e| ctx(e, &what()))?;
                }
                Step::Hide { .. } => {
                    nix::mount::mount(
                        Some("tmpfs"),
                        &at,
                        Some("tmpfs"),
                        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                        Some("mode=0755,size=64k"),
                    )
                    .map_err(|e| ctx(e, &format!("hiding {}", what())))?;
                }
                Step::File { from, device, .. } => {
                    if !at.exists() {
                        mkdir_p(stage, at.parent().unwrap_or(stage))?;
                        std::fs::File::create(&at)?;
                    }
                    nix::mount::mount(
                        Some(from),
                        &at,
                        None::<&str>,
                        MsFlags::MS_BIND,
                        None::<&str>,
                    )
                    .map_err(|e| ctx(e, &format!("binding {}", what())))?;
                    let attrs = if *device {
                        MOUNT_ATTR_NOSUID
                    } else {
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                    };
                    set_attrs(&at, attrs, false).map_err(|e| ctx(e, &what()))?;
                }
                Step::Symlink { to, .. } => {
                    mkdir_p(stage, at.parent().unwrap_or(stage))?;
                    std::os::unix::fs::symlink(to, &at)?;
                }
            }
        }
        // Hiding tmpfses turn read-only once what they hold is in place.
        for step in &self.steps {
            if let Step::Hide { at } = step {
                set_attrs(&inside(at), MOUNT_ATTR_RDONLY, false).map_err(|e| ctx(e, "hiding"))?;
            }
        }
        std::env::set_current_dir(stage)?;
        // The old root goes beneath the new one, then away: no path leads back to it.
        nix::unistd::pivot_root(".", ".").map_err(|e| ctx(e, "pivot_root"))?;
        nix::mount::umount2(".", MntFlags::MNT_DETACH)
            .map_err(|e| ctx(e, "detaching the old root"))?;
        std::env::set_current_dir("/")?;
        set_attrs(Path::new("/"), MOUNT_ATTR_RDONLY, false).map_err(|e| ctx(e, "the root"))
    }
}

/// The namespace's `/etc/hosts`: the listed names first, then the host's lines that name none
/// of them (a listed `localhost` must not also resolve to `::1`, where nothing listens).
fn hosts_file(listed: &str, original: &str) -> String {
    let names: BTreeSet<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let mut text = listed.to_owned();
    for line in original.lines() {
        let entry = line.split('#').next().unwrap_or_default();
        if !entry
            .split_whitespace()
            .skip(1)
            .any(|n| names.contains(n.to_ascii_lowercase().as_str()))
        {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// The steps that make each read path exist in the root: a read-only bind of each directory
/// tree no other one contains, at its canonical path, and a symbolic link at a path that is
/// one (or lies under one), unless it already exists inside a bound tree.
fn read_steps(reads: &[PathBuf]) -> Vec<Step> {
    let mut canon: Vec<(PathBuf, PathBuf)> = reads
        .iter()
        // A path this machine lacks grants nothing; that is not an error.
        .filter_map(|p| canonical(p).ok().map(|c| (p.clone(), c)))
        .collect();
    canon.sort_by(|a, b| a.1.cmp(&b.1));
    let mut trees: Vec<PathBuf> = Vec::new();
    for (_, c) in &canon {
        if !trees.iter().any(|t| c.starts_with(t)) {
            trees.push(c.clone());
        }
    }
    let mut steps: Vec<Step> = trees
        .iter()
        .map(|t| Step::ReadTree {
            at: t.clone(),
            from: t.clone(),
        })
        .collect();
    let mut links: Vec<PathBuf> = Vec::new();
    let mut given: Vec<&(PathBuf, PathBuf)> = canon.iter().filter(|(p, c)| p != c).collect();
    given.sort();
    for (p, c) in given {
        let covered = trees.iter().chain(&links).any(|t| p.starts_with(t))
            || trees.iter().any(|t| t.starts_with(p));
        if !covered {
            links.push(p.clone());
            steps.push(Step::Symlink {
                at: p.clone(),
                to: c.clone(),
            });
        }
    }
    steps
}

fn canonical(p: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(p)
}

fn absolute(p: &Path) -> io::Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

fn ctx(e: impl Into<io::Error>, what: &str) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Creates `dir` and its missing parents below `stage`, each with mode 0755 whatever the umask.
fn mkdir_p(stage: &Path, dir: &Path) -> io::Result<()> {
    if dir.is_dir() || dir == stage {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        mkdir_p(stage, parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets mount flags on the mount at `path` (and its submounts with `recursive`), leaving its
/// other flags as they are. Before Linux 5.12 (no `mount_setattr`), only the mount itself gets
/// them, through a remount.
fn set_attrs(path: &Path, attrs: u64, recursive: bool) -> io::Result<()> {
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } as libc::c_uint;
    // SAFETY: a plain system call on a path and a struct that outlive it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            cpath.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    for (attr, flag) in [
        (MOUNT_ATTR_RDONLY, MsFlags::MS_RDONLY),
        (MOUNT_ATTR_NOSUID, MsFlags::MS_NOSUID),
        (MOUNT_ATTR_NODEV, MsFlags::MS_NODEV),
    ] {
        if attrs & attr != 0 {
            flags |= flag;
        }
    }
    nix::mount::mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
        .map_err(io::Error::from)
}

/// Brings loopback up in the new network namespace, gives it the listed addresses, and
/// listens at each listed pair.
fn loopback(plan: &NetPlan) -> io::Result<Vec<(std::net::TcpListener, egress::EgressTarget)>> {
    let nl = Netlink::open()?;
    // SAFETY: a NUL-terminated constant.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(ctx(io::Error::last_os_error(), "finding loopback"));
    }
    nl.link_up(lo).map_err(|e| ctx(e, "bringing loopback up"))?;
    for ip in &plan.addresses {
        nl.add_address(lo, *ip)
            .map_err(|e| ctx(e, &format!("adding {ip} to loopback")))?;
    }
    plan.listen
        .iter()
        .map(|(addr, target)| {
            std::net::TcpListener::bind(addr)
                .map(|l| (l, target.clone()))
                .map_err(|e| ctx(e, &format!("listening at {addr} for {target}")))
        })
        .collect()
}

/// Just enough rtnetlink for [`loopback`]: two requests, each acknowledged.
struct Netlink(OwnedFd);

const NLMSG_HDRLEN: usize = 16;

impl Netlink {
    fn open() -> io::Result<Self> {
        // SAFETY: socket returns a new descriptor or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// RTM_NEWLINK: sets IFF_UP on the interface.
    fn link_up(&self, index: u32) -> io::Result<()> {
        let mut body = Vec::with_capacity(16);
        body.push(libc::AF_UNSPEC as u8); // ifi_family
        body.push(0); // padding
        body.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
        body.extend_from_slice(&(index as i32).to_ne_bytes());
        body.extend_from_slice(&(libc::IFF_UP as u32).to_ne_bytes()); // ifi_flags
        body.extend_from_slice(&(libc::IFF_UP as u32).to_ne_bytes()); // ifi_change
        self.request(libc::RTM_NEWLINK, 0, &body)
    }

    /// RTM_NEWADDR: the address as a host route (/32, /128), usable at once (no DAD).
    fn add_address(&self, index: u32, ip: IpAddr) -> io::Result<()> {
        let (family, bytes, prefix) = match ip {
            IpAddr::V4(v4) => (libc::AF_INET, v4.octets().to_vec(), 32u8),
            IpAddr::V6(v6) => (libc::AF_INET6, v6.octets().to_vec(), 128u8),
        };
        const IFA_F_NODAD: u8 = 0x02;
        let mut body = vec![family as u8, prefix, IFA_F_NODAD, libc::RT_SCOPE_HOST];
        body.extend_from_slice(&index.to_ne_bytes());
        for kind in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
            let len = 4 + bytes.len();
            body.extend_from_slice(&(len as u16).to_ne_bytes());
            body.extend_from_slice(&kind.to_ne_bytes());
            body.extend_from_slice(&bytes);
            body.resize(body.len().next_multiple_of(4), 0);
        }
        self.request(
            libc::RTM_NEWADDR,
            (libc::NLM_F_CREATE | libc::NLM_F_REPLACE) as u16,
            &body,
        )
    }

    fn request(&self, kind: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let len = NLMSG_HDRLEN + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(
            &((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16 | flags).to_ne_bytes(),
        );
        msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        msg.extend_from_slice(body);
        // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0, no groups).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: the buffer and the address outlive the call.
        let sent = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut reply = [0u8; 1024];
        // SAFETY: reads into a buffer we own, at most its length.
        let got = unsafe {
            libc::recv(
                self.0.as_raw_fd(),
                reply.as_mut_ptr().cast(),
                reply.len(),
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = got as usize;
        // The acknowledgement is an NLMSG_ERROR whose error is 0, or a negative errno.
        if got < NLMSG_HDRLEN + 4 {
            return Err(io::Error::other("short netlink reply"));
        }
        let kind = u16::from_ne_bytes([reply[4], reply[5]]);
        if kind != libc::NLMSG_ERROR as u16 {
            return Err(io::Error::other(format!("unexpected netlink reply {kind}")));
        }
        let code = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        match code {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(-e)),
        }
    }
}

/// How this host builds jails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// On a thread of the gateway's, which has `CAP_SYS_ADMIN`.
    Root,
    /// In a forked child, in a user namespace of the gateway's own (a gateway without root).
    OwnUserNamespace,
}

/// Whether and how this host can build jails: an empty one, made and thrown away.
pub fn probe() -> Result<Kind, String> {
    if nix::unistd::Uid::effective().is_root() {
        return std::thread::spawn(|| probe_steps(None).map(|()| Kind::Root))
            .join()
            .unwrap_or_else(|_| Err("the probe thread panicked".into()));
    }
    let ids = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    in_forked_child(|| {
        probe_steps(Some(ids))
            .map_err(io::Error::other)
            .map(|()| Vec::new())
    })
    .map(|_| Kind::OwnUserNamespace)
    .map_err(|e| e.to_string())
}

fn probe_steps(ids: Option<(u32, u32)>) -> Result<(), String> {
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET;
    if ids.is_some() {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    nix::sched::unshare(flags).map_err(|e| format!("unshare({flags:?}) failed: {e}"))?;
    if let Some((uid, gid)) = ids {
        map_own_ids(uid, gid).map_err(|e| format!("cannot map its own uid and gid: {e}"))?;
    }
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make mounts private: {e}"))?;
    let dir = std::env::temp_dir();
    nix::mount::mount(
        Some("tmpfs"),
        &dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=64k"),
    )
    .map_err(|e| format!("cannot mount a tmpfs: {e}"))?;
    mkdir_p(&dir, &dir.join("probe")).map_err(|e| format!("cannot use a tmpfs: {e}"))?;
    let nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
    // SAFETY: a NUL-terminated constant.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    nl.link_up(lo)
        .map_err(|e| format!("cannot bring loopback up in a network namespace: {e}"))
}

/// In a user namespace just made by an unprivileged process, maps the only ids it may: its
/// own. `setgroups` must be denied first (else dropping a group could grant access).
fn map_own_ids(uid: u32, gid: u32) -> io::Result<()> {
    // The gateway is not dumpable, so neither is a fork of it, and the map files of a process
    // that is not are root's. The child's memory is its own: this changes nothing of the
    // gateway's.
    nix::sys::prctl::set_dumpable(true).map_err(|e| ctx(e, "PR_SET_DUMPABLE"))?;
    std::fs::write("/proc/self/setgroups", "deny").map_err(|e| ctx(e, "setgroups"))?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))
        .map_err(|e| ctx(e, "uid_map"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).map_err(|e| ctx(e, "gid_map"))
}

/// Runs `f` in a forked child and returns the descriptors it made (passed back over a socket),
/// or its error. Only a process with a single thread may enter a new user namespace, and the
/// gateway has many. The child uses the allocator, which glibc's `fork` leaves usable, and no
/// lock of the gateway's; it ends with `_exit`.
fn in_forked_child(f: impl FnOnce() -> io::Result<Vec<OwnedFd>>) -> io::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
    use std::io::{IoSlice, IoSliceMut};
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    // SAFETY: the child runs `f` and exits; see above for what it may do.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(ours);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err(io::Error::other("panicked")));
            let (text, fds) = match &result {
                Ok(fds) => ("ok".to_owned(), fds.iter().map(|f| f.as_raw_fd()).collect()),
                Err(e) => (e.to_string(), Vec::new()),
            };
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
            let sent = sendmsg::<()>(
                theirs.as_raw_fd(),
                &[IoSlice::new(text.as_bytes())],
                cmsgs,
                MsgFlags::empty(),
                None,
            );
            // SAFETY: leaves without running anything of the gateway's.
            unsafe { libc::_exit(if sent.is_ok() { 0 } else { 1 }) }
        }
        child => {
            drop(theirs);
            let mut text = vec![0u8; 4096];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 3 + egress::MAX_ENTRIES]);
            let received = {
                let mut iov = [IoSliceMut::new(&mut text)];
                recvmsg::<()>(
                    ours.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map(|msg| {
                    let mut fds = Vec::new();
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for cmsg in cmsgs {
                            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                                // SAFETY: descriptors the kernel just installed for us.
                                fds.extend(
                                    raw.into_iter()
                                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                                );
                            }
                        }
                    }
                    (msg.bytes, fds)
                })
            };
            let mut status = 0;
            // SAFETY: our child, not yet reaped.
            while unsafe { libc::waitpid(child, &mut status, 0) } == -1
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
            let (len, fds) = received.map_err(io::Error::from)?;
            let text = String::from_utf8_lossy(&text[..len]);
            match text.as_ref() {
                "ok" => Ok(fds),
                "" => Err(io::Error::other(format!(
                    "the child ended without a word (status {status:#x})"
                ))),
                e => Err(io::Error::other(e.to_owned())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`unprivileged_gateway_inner`] as `nobody`, in a process of its own: the gateway
    /// without root builds jails in a user namespace of its own, and its scripts reach only
    /// what their group lists. (Tests run as root; skipped otherwise.)
    #[test]
    fn a_gateway_without_root_jails_its_scripts_in_a_user_namespace_of_its_own() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root to become nobody");
            return;
        }
        // A copy nobody can execute, wherever the test binary lives.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.path().join("tests");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe)
            .args([
                "--exact",
                "pool::jail::tests::unprivileged_gateway_inner",
                "--ignored",
                "--nocapture",
            ])
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }

    #[tokio::test]
    #[ignore = "run as nobody by the test above"]
    async fn unprivileged_gateway_inner() {
        use crate::pool::sandbox::{GroupLimits, Mode, Sandbox, SandboxSettings, host};
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::AsyncReadExt;
        assert!(!nix::unistd::Uid::effective().is_root());
        assert_eq!(host().jail, Ok(Kind::OwnUserNamespace), "{:?}", host());
        let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let folder = tempfile::tempdir().unwrap();
        let script = folder.path().join("run.sh");
        std::fs::write(
            &script,
            r#"#!/bin/bash
try() { if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then echo true; else echo false; fi; }
exists() { if [ -e "$1" ]; then echo true; else echo false; fi; }
printf '{"refused": %s, "allowed": %s, "run": %s, "tmpdir": %s}'   "$(try "$REFUSED")" "$(try "$ALLOWED")" "$(exists /run)" "$(exists "$TMPDIR")"
"#,
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = |l: &std::net::TcpListener| l.local_addr().unwrap().port();
        let limits = GroupLimits::from_json(
            &serde_json::json!({"egress": [format!("127.0.0.1:{}", port(&allowed))]}),
        )
        .unwrap();
        let settings = Arc::new(SandboxSettings::new(Mode::Required, None, &[]));
        let sandbox = Sandbox::new(settings, limits, folder.path(), None);
        let (confine, dir) = sandbox.prepare(folder.path(), None).await.unwrap().unwrap();
        assert!(confine.owner_namespace.is_some() && confine.net_namespace.is_some());
        let env: Vec<(std::ffi::OsString, std::ffi::OsString)> = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("TMPDIR".into(), dir.path().into()),
            ("REFUSED".into(), port(&refused).to_string().into()),
            ("ALLOWED".into(), port(&allowed).to_string().into()),
        ];
        let mut child =
            crate::pool::spawn::spawn(&script, folder.path(), &env, Some(confine)).unwrap();
        drop(child.stdin.take());
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status:?} {out}");
        let got: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"refused": false, "allowed": true, "run": false, "tmpdir": true})
        );
        refused.set_nonblocking(true).unwrap();
        assert!(refused.accept().is_err(), "the script reached loopback");
    }

    #[test]
    fn listed_names_take_over_their_host_lines() {
        let got = hosts_file(
            "127.77.0.1 localhost\n",
            "127.0.0.1 localhost\n::1 ip6-localhost LocalHost\n# comment localhost\n10.0.0.2 db\n",
        );
        assert_eq!(
            got,
            "127.77.0.1 localhost\n# comment localhost\n10.0.0.2 db\n"
        );
    }

    #[test]
    fn read_paths_become_minimal_trees_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::create_dir_all(d.join("opt/py/shims")).unwrap();
        std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
        let steps = read_steps(&[
            d.join("usr"),
            d.join("bin"),
            d.join("usr/bin"),
            d.join("opt/py/shims"),
            d.join("opt/py"),
            d.join("missing"),
        ]);
        assert_eq!(
            steps,
            [
                Step::ReadTree {
                    at: d.join("opt/py"),
                    from: d.join("opt/py")
                },
                Step::ReadTree {
                    at: d.join("usr"),
                    from: d.join("usr")
                },
                Step::Symlink {
                    at: d.join("bin"),
                    to: d.join("usr/bin")
                },
            ]
        );
    }
}
