//! An output folder's safety: one writer at a time (an advisory lock), and whole-file replacement of results files (temporary file, fsync, rename).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::ReportError;

/// The lock file every command that writes an output folder holds while it runs.
pub const LOCK_FILE: &str = ".gpumux.lock";
/// How the temporary files of [`replace_file`] begin; those of a killed process are removed by
/// the next one that takes the folder's lock.
pub const TMP_PREFIX: &str = ".gpumux-tmp.";

/// An output folder held by this process; the lock goes when this is dropped, and the OS drops
/// it when the process dies, however it dies, so a killed run leaves no stale lock.
#[derive(Debug)]
pub struct OutLock {
    dir: PathBuf,
    /// Open for as long as the lock is held: closing it releases the lock.
    _file: File,
}

impl OutLock {
    /// The folder this lock holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Creates `dir` if needed and takes its lock, or refuses (exit 2) when another gpumux holds
/// it, naming the lock file and the process id written in it. Every command that writes an
/// output folder calls this first and keeps the guard until it is done.
///
/// On a file system without locks (some network mounts) it warns and goes on unlocked.
pub fn lock(dir: &Path) -> Result<OutLock, ReportError> {
    if let Ok(meta) = fs::metadata(dir) {
        if !meta.is_dir() {
            return Err(ReportError::Invalid(format!(
                "{}: not a folder: give a folder for the results (it is created if missing)",
                dir.display()
            )));
        }
    }
    fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(LOCK_FILE);
    let mut file = open_lock_file(&path)?;
    match try_lock_after_a_gone_holder(&mut file) {
        Ok(()) => {
            // Who holds it, for the message of a second process; the lock is what counts.
            let pid = format!("{}\n", std::process::id());
            let _ = file
                .set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)))
                .and_then(|_| file.write_all(pid.as_bytes()));
            remove_leftovers(dir);
        }
        Err(fs4::TryLockError::WouldBlock) => {
            let holder = match holder_pid(&mut file) {
                Some(pid) if !alive(pid) => format!(
                    " (pid {pid}, which has ended: a process it was starting still holds the lock)"
                ),
                Some(pid) => format!(" (pid {pid})"),
                None => String::new(),
            };
            return Err(ReportError::Locked {
                dir: dir.to_path_buf(),
                lock: path,
                holder,
            });
        }
        Err(fs4::TryLockError::Error(e)) => {
            tracing::warn!(
                "cannot lock {}: {e}; nothing stops another gpumux from writing {} at the same time",
                path.display(),
                dir.display()
            );
        }
    }
    Ok(OutLock {
        dir: dir.to_path_buf(),
        _file: file,
    })
}

/// How long a lock whose recorded holder has ended is waited for: a gpumux killed while it was
/// starting a trial leaves the lock with that child until the child's exec closes it, which
/// under load can take a moment (a resumed run started at once would otherwise be refused).
const GONE_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`fs4::FileExt::try_lock`], tried again every 10 ms for up to [`GONE_HOLDER_WAIT`] while the
/// gpumux whose pid the lock file names no longer runs; a live holder is refused at once.
fn try_lock_after_a_gone_holder(file: &mut File) -> Result<(), fs4::TryLockError> {
    let until = std::time::Instant::now() + GONE_HOLDER_WAIT;
    loop {
        match fs4::FileExt::try_lock(&*file) {
            Err(fs4::TryLockError::WouldBlock)
                if std::time::Instant::now() < until
                    && holder_pid(file).is_some_and(|pid| !alive(pid)) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The process id written in the lock file by the gpumux that took it, if any.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    let _ = (&*file).take(64).read_to_string(&mut text);
    text.trim().parse().ok()
}

/// Whether process `pid` exists (a process of another user counts as existing).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Makes a write past the file-size limit (`ulimit -f`, which batch systems set) an `EFBIG`
/// error, which names the file it was written to, instead of SIGXFSZ, which would end the
/// process with no message and a row cut short. Trials' commands get the default back.
pub fn file_size_limit_as_error() {
    // SAFETY: signal(2) with SIG_IGN installs no handler of ours; it is called once at start.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Opens (or creates) the lock file without following a symbolic link, and only as a regular
/// file: a link or a FIFO put there must not be written through.
fn open_lock_file(path: &Path) -> Result<File, ReportError> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_a_file = || {
        ReportError::Invalid(format!(
            "{}: the lock file is not a regular file (a link, a folder or a device): remove it",
            path.display()
        ))
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::EISDIR) | Some(libc::ENXIO) => not_a_file(),
            _ => ReportError::Write {
                path: path.to_path_buf(),
                source,
            },
        })?;
    match file.metadata() {
        Ok(meta) if meta.is_file() => Ok(file),
        Ok(_) => Err(not_a_file()),
        Err(source) => Err(ReportError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Removes the temporary files a killed process left in `dir`: with its lock held, no other
/// process is writing them.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(TMP_PREFIX) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Replaces the file at `path` with what `write` writes, so that the file is always either
/// the old one or the whole new one: `write` fills a temporary file in the same folder, which
/// is flushed and fsynced, then renamed over `path`, and the folder is fsynced. On an error the
/// old file is left as it was and the temporary file is removed.
pub fn replace_file(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), ReportError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let failed = |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The new file gets the old one's mode, or a new file's usual mode (0666 less the umask),
    // not the private 0600 of a temporary file.
    let mode = fs::metadata(path).ok().map(|m| m.permissions());
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{TMP_PREFIX}{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(&dir)
        .map_err(failed)?;
    if let Some(mode) = mode {
        tmp.as_file().set_permissions(mode).map_err(failed)?;
    }
    // Large writes: a rewrite of millions of rows makes few system calls. The disk starts
    // on what is written while the rest is still being made, so the fsync waits for little.
    let mut out = BufWriter::with_capacity(1 << 20, WriteAhead::new(tmp));
    write(&mut out).map_err(failed)?;
    let tmp = out.into_inner().map_err(|e| failed(e.into_error()))?.file;
    tmp.as_file().sync_all().map_err(failed)?;
    tmp.persist(path).map_err(|e| failed(e.error))?;
    sync_dir(&dir).map_err(failed)
}

/// How many bytes are written before the disk is asked to start on them.
const WRITE_AHEAD: u64 = 8 << 20;

/// A file being written whose bytes are handed to the disk every [`WRITE_AHEAD`] bytes
/// (`sync_file_range` without waiting, on Linux), rather than all at the final fsync: the
/// writing of a large file and its way to the disk overlap. Nothing is promised until the
/// fsync; a failure to start early is left for the fsync to report.
struct WriteAhead<F> {
    file: F,
    /// Bytes written, and how many of them the disk was asked to start on.
    written: u64,
    started: u64,
}

impl<F: std::os::fd::AsRawFd> WriteAhead<F> {
    fn new(file: F) -> Self {
        WriteAhead {
            file,
            written: 0,
            started: 0,
        }
    }

    fn start_some(&mut self) {
        let len = self.written - self.started;
        if len < WRITE_AHEAD {
            return;
        }
        #[cfg(target_os = "linux")]
        // SAFETY: a plain system call on the descriptor of the file this value owns; it reads
        // and writes no memory of this process.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                self.started as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.started = self.written;
    }
}

impl<F: Write + std::os::fd::AsRawFd> Write for WriteAhead<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        self.start_some();
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// [`replace_file`] with the whole content at hand.
pub fn replace_bytes(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    replace_file(path, |w| w.write_all(bytes))
}

/// Makes the folder `root/parts[0]/parts[1]/…` (each part made when missing) without following
/// a link at any part: each is made and opened under the descriptor of the one before
/// (`mkdirat`, then `openat` with `O_NOFOLLOW | O_DIRECTORY`), so a link planted inside `root`
/// (`trials/` pointing elsewhere) is refused with an error naming it, never written through.
/// `root` itself may be a link (an output folder on scratch space). A part that is not one
/// plain name (empty, `.`, `..`, with a `/`) is refused. Returns the folder's path.
pub fn make_dir_within(root: &Path, parts: &[&str]) -> io::Result<PathBuf> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let root = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    let mut path = root.to_path_buf();
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
    };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: open(2) with a NUL-terminated path; the descriptor is owned at once.
    let fd = unsafe { libc::open(c(root)?.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function alone holds.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    for part in parts {
        path.push(part);
        if part.is_empty() || *part == "." || *part == ".." || part.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: `{part}` is no plain folder name", path.display()),
            ));
        }
        let name = c(Path::new(part))?;
        // SAFETY: mkdirat(2) and openat(2) under a descriptor this function holds, with a
        // NUL-terminated name.
        let made = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) };
        if made != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a link or a file, not a folder: folders are made inside the output folder only; move it away",
                        path.display()
                    ),
                ),
                _ => e,
            });
        }
        // SAFETY: as above.
        dir = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    Ok(path)
}

/// Writes `bytes` as the new file `path`, replacing a regular file there, but never through a
/// link (`O_NOFOLLOW`): a link in its place is refused.
pub fn write_no_follow(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a link: files are written inside the output folder only; move it away",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    file.write_all(bytes)
}

/// Fsyncs a folder, so that a rename in it survives a power loss.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_made_inside_the_root_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, away) = (tmp.path().join("out"), tmp.path().join("away"));
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&away).unwrap();
        let made = make_dir_within(&root, &["trials", "t0"]).unwrap();
        assert_eq!(made, root.join("trials/t0"));
        assert!(made.is_dir());
        // Again: the folders are there already.
        assert_eq!(make_dir_within(&root, &["trials", "t0"]).unwrap(), made);
        // A planted link, at the first part or deeper, is refused and nothing is made through it.
        std::os::unix::fs::symlink(&away, root.join("linked")).unwrap();
        let err = make_dir_within(&root, &["linked", "t1"]).unwrap_err();
        assert!(err.to_string().contains("linked is a link"), "{err}");
        std::os::unix::fs::symlink(&away, root.join("trials/t2")).unwrap();
        let err = make_dir_within(&root, &["trials", "t2", "x"]).unwrap_err();
        assert!(err.to_string().contains("t2 is a link"), "{err}");
        fs::write(root.join("trials/file"), "x").unwrap();
        assert!(make_dir_within(&root, &["trials", "file"]).is_err());
        assert_eq!(fs::read_dir(&away).unwrap().count(), 0);
        for bad in ["..", ".", "", "a/b"] {
            assert!(make_dir_within(&root, &["trials", bad]).is_err(), "{bad}");
        }
        // The root itself may be a link.
        std::os::unix::fs::symlink(&root, tmp.path().join("root-link")).unwrap();
        assert!(make_dir_within(&tmp.path().join("root-link"), &["trials", "t3"]).is_ok());
        // A file is written in place, never through a link.
        let args = made.join("args.json");
        write_no_follow(&args, b"{}").unwrap();
        write_no_follow(&args, b"{ }").unwrap();
        assert_eq!(fs::read(&args).unwrap(), b"{ }");
        std::os::unix::fs::symlink(away.join("x"), made.join("planted")).unwrap();
        assert!(write_no_follow(&made.join("planted"), b"{}").is_err());
        assert!(!away.join("x").exists());
    }

    /// A process that holds `dir`'s lock for `hold_s` seconds with `pid` written as its holder,
    /// once it says it holds it.
    fn held_by_another_process(dir: &Path, pid: u32, hold_s: f64) -> std::process::Child {
        use std::io::BufRead;
        let script = format!(
            "import fcntl, sys, time\nf = open(sys.argv[1], 'a+')\nfcntl.flock(f, fcntl.LOCK_EX)\nf.seek(0)\nf.truncate()\nf.write('{pid}\\n')\nf.flush()\nprint('held', flush=True)\ntime.sleep({hold_s})\n"
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .arg(dir.join(LOCK_FILE))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held");
        child
    }

    #[test]
    fn a_lock_left_with_a_child_of_a_gone_gpumux_is_waited_for_and_a_live_holder_refused() {
        let tmp = tempfile::tempdir().unwrap();
        // The recorded holder has ended: the lock is waited for until its child lets go.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let mut child = held_by_another_process(tmp.path(), gone_pid, 0.3);
        let started = std::time::Instant::now();
        let guard = lock(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(started.elapsed() >= std::time::Duration::from_millis(100));
        drop(guard);
        child.wait().unwrap();
        // A holder that runs is refused at once, named.
        let mut child = held_by_another_process(tmp.path(), std::process::id(), 5.0);
        let started = std::time::Instant::now();
        let Err(e) = lock(tmp.path()) else {
            panic!("a live holder's lock was taken");
        };
        let e = e.to_string();
        assert!(started.elapsed() < GONE_HOLDER_WAIT, "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_second_lock_on_the_same_folder_is_refused_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let first = lock(&dir).unwrap();
        assert_eq!(first.dir(), dir.as_path());
        let err = lock(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ReportError::Locked { .. }), "{text}");
        assert!(err.is_bad_input());
        assert!(
            text.contains(LOCK_FILE) && text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first);
        fs::write(dir.join(format!("{TMP_PREFIX}trials.csv.x1.tmp")), "half").unwrap();
        drop(lock(&dir).unwrap());
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec![LOCK_FILE.to_string()],
            "a killed run's leftovers go"
        );
    }

    #[test]
    fn a_lock_file_that_is_a_link_or_a_folder_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let precious = tmp.path().join("precious.txt");
        fs::write(&precious, "keep me\n").unwrap();
        let dir = tmp.path().join("out");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&precious, dir.join(LOCK_FILE)).unwrap();
        let err = lock(&dir).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        assert_eq!(fs::read(&precious).unwrap(), b"keep me\n");
        let other = tmp.path().join("other");
        fs::create_dir_all(other.join(LOCK_FILE)).unwrap();
        assert!(lock(&other).unwrap_err().is_bad_input());
        let file = tmp.path().join("a-file");
        fs::write(&file, "x").unwrap();
        let err = lock(&file).unwrap_err();
        assert!(
            err.is_bad_input() && err.to_string().contains("not a folder"),
            "{err}"
        );
    }

    #[test]
    fn a_replaced_file_keeps_its_mode_and_a_new_one_is_not_private() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("trials.csv");
        replace_bytes(&path, b"a\n").unwrap();
        let plain = tmp.path().join("plain");
        fs::write(&plain, "x").unwrap();
        let mode_of = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode_of(&path),
            mode_of(&plain),
            "as any new file, under the umask"
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        replace_bytes(&path, b"b\n").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn replace_keeps_the_old_file_when_writing_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("best.yaml");
        replace_bytes(&path, b"old\n").unwrap();
        let err = replace_file(&path, |w| {
            w.write_all(b"half of the new")?;
            Err(io::Error::other("the disk is full"))
        })
        .unwrap_err();
        assert!(matches!(err, ReportError::Write { .. }) && !err.is_bad_input());
        assert_eq!(fs::read(&path).unwrap(), b"old\n");
        let left: Vec<_> = fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
        replace_bytes(&path, b"new\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new\n");
    }
}
