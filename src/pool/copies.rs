//! The gateway's own copies of the scripts of pinned groups: a call runs the bytes the pin
//! hash covers, not whatever the tools folder holds when the call comes.
//!
//! The loader reads each script once and hashes it; for a pinned group, it writes those very
//! bytes here, into a
//! read-only directory per version of the group (its scripts' names and contents, its other
//! entries' names and its App files'). Beside the copies, that directory holds a symbolic link
//! to every other top-level entry of the group's folder, so a script that finds its data from
//! its own path (`dirname(__file__)`, `__dirname`) still finds `data/` there. A call executes
//! the copy; a script swapped in the folder, even for a moment, never runs until it is loaded,
//! hashed and approved. Groups that are not pinned run their folder's files, as an edit of
//! them is served at once anyway: they cost no copy.
//!
//! The copies live under a directory of this gateway process (`toolgate-scripts-<pid>-<id>`)
//! inside `--script-copies-dir`, outside the tools folder, so tool authors cannot write them. A
//! version is shared by the loads that find the same content, and removed when the last tool
//! (and the last call) using it is gone; the directories of gateways that no longer run are
//! removed at start.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use sha2::{Digest, Sha256};

/// Names of this process's directories: `<prefix><pid>-<uuid>`.
const ROOT_PREFIX: &str = "toolgate-scripts-";

/// What scripts see of their group: the copies and the links to the folder's other entries.
const FILES: &str = "files";
/// The App (UI) files the gateway serves, as hashed.
const APP: &str = "app";

/// The copies of this gateway process.
#[derive(Debug)]
pub struct ScriptCopies {
    root: PathBuf,
    /// Versions by content id; weak, so a version goes with its last user.
    live: Mutex<HashMap<String, Weak<GroupCopy>>>,
    /// The groups pinned as this gateway knows them: the loader copies theirs.
    pinned: arc_swap::ArcSwap<HashSet<String>>,
}

/// One version of one group's folder, as the gateway hashed it.
#[derive(Debug)]
pub struct GroupCopy {
    id: String,
    dir: PathBuf,
    owner: Arc<ScriptCopies>,
}

/// A file to copy: its path relative to the group's folder and the bytes that were hashed.
pub struct Hashed<'a> {
    pub rel: &'a str,
    pub bytes: &'a [u8],
}

impl ScriptCopies {
    /// Makes this process's directory under `base`, after removing those of gateways that no
    /// longer run.
    pub fn create(base: &Path) -> io::Result<Arc<Self>> {
        sweep_stale(base);
        let root = base.join(format!(
            "{ROOT_PREFIX}{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        // Readable by a `--script-user` that is not the gateway's; writable by the gateway only.
        fs::DirBuilder::new().mode(0o755).create(&root)?;
        // Hardened hosts mount the temporary directory `noexec`: no copy could run there, and
        // every call would fail. Said at start, with the way out.
        let noexec = nix::sys::statvfs::statvfs(&root)
            .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC))
            .unwrap_or(false);
        if noexec {
            let _ = fs::remove_dir(&root);
            return Err(io::Error::other(format!(
                "{} is on a filesystem mounted noexec, where no script can run; choose a directory elsewhere",
                base.display()
            )));
        }
        Ok(Arc::new(Self {
            root,
            live: Mutex::new(HashMap::new()),
            pinned: Default::default(),
        }))
    }

    /// The groups pinned now.
    pub fn set_pinned(&self, groups: HashSet<String>) {
        self.pinned.store(Arc::new(groups));
    }

    /// Whether the loader copies the scripts of `group`.
    pub fn is_pinned(&self, group: &str) -> bool {
        self.pinned.load().contains(group)
    }

    /// This process's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The copy of `folder` holding `scripts` (each at the top of the folder) and `app` files,
    /// with links to the folder's other top-level entries: the live one if a load already
    /// made it, otherwise a new one.
    pub fn group(
        self: &Arc<Self>,
        folder: &Path,
        scripts: &[Hashed<'_>],
        app: &[Hashed<'_>],
    ) -> io::Result<Arc<GroupCopy>> {
        let script_names: Vec<&str> = scripts.iter().map(|s| s.rel).collect();
        let mut others: Vec<std::ffi::OsString> = fs::read_dir(folder)?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|n| !n.to_str().is_some_and(|n| script_names.contains(&n)))
            .collect();
        others.sort();
        let id = version_id(folder, scripts, app, &others);
        // A live version whose files something outside the gateway removed (a cleaner of the
        // temporary directory) is made anew, not handed out again.
        let intact = |c: &GroupCopy| {
            scripts.iter().all(|s| c.script(s.rel).is_file())
                && app.iter().all(|a| c.app(a.rel).is_file())
        };
        if let Some(live) = self.lookup(&id).filter(|c| intact(c)) {
            return Ok(live);
        }
        // Built outside the lock: two loads of the same version at once each build one, and
        // the second keeps the first's.
        let dir = self.root.join(format!(
            "{}-{}",
            readable(folder),
            uuid::Uuid::new_v4().simple()
        ));
        if let Err(e) = build(&dir, folder, scripts, app, &others) {
            remove_tree(&dir);
            return Err(e);
        }
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(other) = live.get(&id).and_then(Weak::upgrade).filter(|c| intact(c)) {
            drop(live);
            remove_tree(&dir);
            return Ok(other);
        }
        let copy = Arc::new(GroupCopy {
            id: id.clone(),
            dir,
            owner: self.clone(),
        });
        live.insert(id, Arc::downgrade(&copy));
        Ok(copy)
    }

    fn lookup(&self, id: &str) -> Option<Arc<GroupCopy>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .and_then(Weak::upgrade)
    }
}

impl Drop for ScriptCopies {
    fn drop(&mut self) {
        // Every version holds its owner, so none is left: only the empty root.
        let _ = fs::remove_dir(&self.root);
    }
}

impl GroupCopy {
    /// The directory a script of this version sees as its own: the copies and the links.
    pub fn files(&self) -> PathBuf {
        self.dir.join(FILES)
    }

    /// The copy of the script `file` (a name at the top of the folder).
    pub fn script(&self, file: &str) -> PathBuf {
        self.dir.join(FILES).join(file)
    }

    /// The copy of the App file at `rel` in the folder.
    pub fn app(&self, rel: &str) -> PathBuf {
        self.dir.join(APP).join(rel)
    }
}

impl Drop for GroupCopy {
    fn drop(&mut self) {
        {
            let mut live = self
                .owner
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A newer version with the same content may have taken the entry already.
            if live.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
                live.remove(&self.id);
            }
        }
        let dir = std::mem::take(&mut self.dir);
        let remove = move || remove_tree(&dir);
        // Off the path of whatever dropped the last tool of this version.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Names a version by everything its directory holds.
fn version_id(
    folder: &Path,
    scripts: &[Hashed<'_>],
    app: &[Hashed<'_>],
    others: &[std::ffi::OsString],
) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(folder.as_os_str().as_encoded_bytes());
    for (kind, files) in [(&b"script"[..], scripts), (&b"app"[..], app)] {
        part(kind);
        for f in files {
            part(f.rel.as_bytes());
            part(&Sha256::digest(f.bytes));
        }
    }
    part(b"others");
    for o in others {
        part(o.as_encoded_bytes());
    }
    hex::encode(h.finalize())
}

/// The folder's name, for people reading the directory (the id makes it unique).
fn readable(folder: &Path) -> String {
    folder
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("group")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(40)
        .collect::<String>()
        .trim_start_matches('.')
        .to_owned()
}

fn build(
    dir: &Path,
    folder: &Path,
    scripts: &[Hashed<'_>],
    app: &[Hashed<'_>],
    others: &[std::ffi::OsString],
) -> io::Result<()> {
    let files = dir.join(FILES);
    fs::DirBuilder::new().mode(0o755).create(dir)?;
    fs::DirBuilder::new().mode(0o755).create(&files)?;
    for s in scripts {
        if !is_plain_name(s.rel) {
            return Err(io::Error::other(format!(
                "script name `{}` is not a file name",
                s.rel
            )));
        }
        write_new(&files.join(s.rel), s.bytes, 0o555)?;
    }
    for name in others {
        std::os::unix::fs::symlink(folder.join(name), files.join(name))?;
    }
    let app_dir = dir.join(APP);
    fs::DirBuilder::new().mode(0o755).create(&app_dir)?;
    let mut made = vec![app_dir.clone()];
    for a in app {
        let rel = Path::new(a.rel);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(io::Error::other(format!(
                "App file `{}` is not a path inside the folder",
                a.rel
            )));
        }
        let path = app_dir.join(rel);
        if let Some(parent) = path.parent()
            && !parent.exists()
        {
            fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(parent)?;
            let mut p = parent;
            while p != app_dir {
                made.push(p.to_path_buf());
                match p.parent() {
                    Some(up) => p = up,
                    None => break,
                }
            }
        }
        write_new(&path, a.bytes, 0o444)?;
    }
    // Read-only from now on, to the gateway's uid too (root aside): nothing here changes.
    made.push(files);
    made.push(dir.to_path_buf());
    for d in made {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o555))?;
    }
    Ok(())
}

fn is_plain_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none()
}

/// Writes a file that must not exist yet, with `mode`, to the disk's cache (a copy is read
/// back only by this machine's kernel; a crash takes the whole directory anyway).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    // `mode` is filtered by the umask at creation.
    f.set_permissions(fs::Permissions::from_mode(mode))
}

/// Removes a directory tree made read-only: write permission back on every directory first
/// (a gateway that is not root cannot unlink from a read-only directory), links not followed.
pub(crate) fn remove_tree(dir: &Path) {
    fn writable(dir: &Path) {
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o755));
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.filter_map(Result::ok) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    writable(&e.path());
                }
            }
        }
    }
    if fs::symlink_metadata(dir).is_err() {
        return;
    }
    writable(dir);
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a directory of script copies");
    }
}

/// Removes the copies of gateways that are gone (killed, say): a directory whose gateway pid
/// no longer runs belongs to nobody.
fn sweep_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(ROOT_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            remove_tree(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("run.py"), "print(1)").unwrap();
        fs::create_dir(d.path().join("data")).unwrap();
        fs::write(d.path().join("data/x.json"), "{}").unwrap();
        d
    }

    #[test]
    fn a_version_holds_the_hashed_bytes_and_links_to_the_rest() {
        let base = tempfile::tempdir().unwrap();
        let copies = ScriptCopies::create(base.path()).unwrap();
        let f = folder();
        let scripts = [Hashed {
            rel: "run.py",
            bytes: b"print('hashed')",
        }];
        let app = [Hashed {
            rel: "ui/a.html",
            bytes: b"<p>",
        }];
        let v = copies.group(f.path(), &scripts, &app).unwrap();
        // The hashed bytes, not the folder's.
        assert_eq!(
            fs::read(v.script("run.py")).unwrap(),
            b"print('hashed')".to_vec()
        );
        assert_eq!(fs::read(v.app("ui/a.html")).unwrap(), b"<p>".to_vec());
        assert_eq!(fs::read(v.files().join("data/x.json")).unwrap(), b"{}");
        let mode = fs::metadata(v.script("run.py"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o555);
        // The same content is the same version; other content, another one.
        let again = copies.group(f.path(), &scripts, &app).unwrap();
        assert!(Arc::ptr_eq(&v, &again));
        let other = copies
            .group(
                f.path(),
                &[Hashed {
                    rel: "run.py",
                    bytes: b"print('other')",
                }],
                &app,
            )
            .unwrap();
        assert_ne!(other.files(), v.files());
        // Removed from outside: made anew, not handed out again.
        remove_tree(&v.dir);
        let anew = copies.group(f.path(), &scripts, &app).unwrap();
        assert!(!Arc::ptr_eq(&v, &anew));
        assert_eq!(
            fs::read(anew.script("run.py")).unwrap(),
            b"print('hashed')".to_vec()
        );
        drop(anew);
        // The last user gone, the version goes.
        let dir = other.dir.clone();
        drop(other);
        assert!(!dir.exists());
        drop((v, again));
        assert_eq!(fs::read_dir(copies.root()).unwrap().count(), 0);
    }

    #[test]
    fn the_directories_of_dead_gateways_are_swept() {
        let base = tempfile::tempdir().unwrap();
        // A pid that cannot run: above the kernel's maximum.
        let dead = base.path().join(format!("{ROOT_PREFIX}2147483647-x"));
        fs::create_dir_all(dead.join("g/files")).unwrap();
        fs::set_permissions(dead.join("g"), fs::Permissions::from_mode(0o555)).unwrap();
        let mine = ScriptCopies::create(base.path()).unwrap();
        assert!(!dead.exists());
        assert!(mine.root().exists());
    }
}
