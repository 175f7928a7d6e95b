//! The integration tests' shared setup: the gpumux binary run with a time limit, job files from a builder, temporary folders, tiny datasets, the results CSVs, and signals to a running child.
//!
//! Each test file includes it with `mod support;` and uses only part of it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpumux::data::{Dataset, Samples};

// ---------------------------------------------------------------------------------------------
// The binary and the tree.

/// The repository root (tests run with it as the current directory): `GPUMUX_ROOT` when set
/// (test binaries carried to a copy of the tree elsewhere), else where the crate was built.
pub fn root() -> PathBuf {
    std::env::var_os("GPUMUX_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The gpumux binary: `CARGO_BIN_EXE_gpumux` from the environment when set (test binaries
/// carried elsewhere, as the GPU check does), else the one built with these tests.
pub fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gpumux")
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

// ---------------------------------------------------------------------------------------------
// Running gpumux.

/// How long a run may take before it is killed and the test fails.
pub const RUN_LIMIT: Duration = Duration::from_secs(600);

/// One gpumux command line, ready to run to its end or to start.
pub struct Run {
    cmd: Command,
    what: String,
    limit: Duration,
}

/// gpumux with `args`, run in `cwd`, stdin closed.
pub fn run(cwd: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.current_dir(cwd).args(args).stdin(Stdio::null());
    Run {
        cmd,
        what: args.join(" "),
        limit: RUN_LIMIT,
    }
}

impl Run {
    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Run {
        self.cmd.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: &str) -> Run {
        self.cmd.env_remove(key);
        self
    }

    /// Kills the run and fails the test after `limit` instead of [`RUN_LIMIT`].
    pub fn timeout(mut self, limit: Duration) -> Run {
        self.limit = limit;
        self
    }

    /// Limits the child's address space to `bytes` (a run that must stay bounded then fails by
    /// running out of memory instead of growing the machine's).
    pub fn address_space(mut self, bytes: u64) -> Run {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            self.cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: bytes as libc::rlim_t,
                    rlim_max: bytes as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self
    }

    /// Runs to the end: exit status, stdout and stderr. A run past its time limit is killed
    /// and the test fails, naming the command and what it wrote to stderr.
    pub fn output(mut self) -> Output {
        let mut child = self
            .cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gpumux starts");
        let out = drain(child.stdout.take().expect("stdout"));
        let err = drain(child.stderr.take().expect("stderr"));
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if start.elapsed() > self.limit {
                let _ = child.kill();
                let _ = child.wait();
                let err = err.join().unwrap_or_default();
                panic!(
                    "gpumux {} did not end within {:?}: {}",
                    self.what,
                    self.limit,
                    String::from_utf8_lossy(&err)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }

    /// Starts it with stdout and stderr piped.
    pub fn spawn(self) -> Child {
        self.spawn_with(Stdio::piped(), Stdio::piped())
    }

    /// Starts it with the given stdout and stderr.
    pub fn spawn_with(mut self, stdout: Stdio, stderr: Stdio) -> Child {
        self.cmd
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("gpumux starts")
    }

    /// Starts it and collects its stdout and stderr as they come.
    pub fn watch(self) -> Watched {
        let mut child = self.spawn();
        let out = collect(child.stdout.take().expect("stdout"));
        let err = collect(child.stderr.take().expect("stderr"));
        Watched { child, out, err }
    }
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut src: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = src.read_to_end(&mut buf);
        buf
    })
}

/// Runs gpumux with `args` in `cwd` to its end.
pub fn gpumux(cwd: &Path, args: &[&str]) -> Output {
    run(cwd, args).output()
}

/// Starts gpumux with `args` in `cwd`, stdout and stderr piped.
pub fn spawn(cwd: &Path, args: &[&str]) -> Child {
    run(cwd, args).spawn()
}

pub fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether this machine has a GPU that gpumux uses: `devices` picks the CUDA backend.
pub fn gpu_usable() -> bool {
    stdout(&gpumux(&root(), &["devices"])).contains("backend: cuda")
}

// ---------------------------------------------------------------------------------------------
// Temporary folders.

/// A temporary folder that tests run in, removed when dropped.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

pub fn sandbox() -> Sandbox {
    Sandbox {
        dir: tempfile::tempdir().expect("tempdir"),
    }
}

impl Sandbox {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Writes a job file named `name` here (a text, or a [`JobYaml`]) and returns its path.
    pub fn job(&self, name: &str, text: impl std::fmt::Display) -> PathBuf {
        write_job(self.path(), name, &text.to_string())
    }

    /// gpumux with `args`, run here.
    pub fn run(&self, args: &[&str]) -> Run {
        run(self.path(), args)
    }

    /// Runs gpumux with `args` here to its end.
    pub fn gpumux(&self, args: &[&str]) -> Output {
        gpumux(self.path(), args)
    }

    /// Starts gpumux with `args` here, stdout and stderr piped.
    pub fn spawn(&self, args: &[&str]) -> Child {
        spawn(self.path(), args)
    }

    /// Runs `gpumux <command> <job> --out <out> <more…>` here to its end.
    pub fn run_into(&self, command: &str, job: &Path, out: &Path, more: &[&str]) -> Output {
        let mut args = vec![command, s(job), "--out", s(out)];
        args.extend(more);
        self.gpumux(&args)
    }
}

/// Writes a job file into `dir` and returns its path.
pub fn write_job(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("job written");
    p
}

/// Writes an executable file (a script with its `#!` line) at `path`.
pub fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("script written");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod +x");
}

// ---------------------------------------------------------------------------------------------
// Job files.

/// A job file built key by key, written in the order the keys were first set. A key set again
/// keeps its place and takes the new value; list keys (`parameters`, `faults`, `slices`) gather
/// their items in one block.
#[derive(Clone, Debug, Default)]
pub struct JobYaml {
    entries: Vec<(String, Value)>,
}

#[derive(Clone, Debug)]
enum Value {
    /// `key: value` on one line.
    Inline(String),
    /// `key:` then each item on its own line, indented by two spaces.
    Block(Vec<String>),
}

/// `{kind: mlp, hidden: [..]}` (`{kind: mlp}` with no hidden sizes).
pub fn mlp(hidden: &[u32]) -> String {
    if hidden.is_empty() {
        return "{kind: mlp}".into();
    }
    let h: Vec<String> = hidden.iter().map(u32::to_string).collect();
    format!("{{kind: mlp, hidden: [{}]}}", h.join(", "))
}

/// `{source: synthetic, train_samples: .., test_samples: ..}`.
pub fn synthetic(train_samples: u32, test_samples: u32) -> String {
    format!("{{source: synthetic, train_samples: {train_samples}, test_samples: {test_samples}}}")
}

/// `{epochs: .., batch_size: ..}`.
pub fn epochs(epochs: u32, batch_size: u32) -> String {
    format!("{{epochs: {epochs}, batch_size: {batch_size}}}")
}

/// `{values: [..]}`: a parameter's values.
pub fn values(values: &[&str]) -> String {
    format!("{{values: [{}]}}", values.join(", "))
}

impl JobYaml {
    pub fn new() -> JobYaml {
        JobYaml::default()
    }

    /// Sets `key: value` (replacing its value where it is already set).
    pub fn set(mut self, key: &str, value: impl std::fmt::Display) -> JobYaml {
        let value = Value::Inline(value.to_string());
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.entries.push((key.to_string(), value)),
        }
        self
    }

    /// Adds one line under the block `key`.
    pub fn item(mut self, key: &str, line: impl std::fmt::Display) -> JobYaml {
        let line = line.to_string();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, Value::Block(lines))) => lines.push(line),
            Some((_, v)) => *v = Value::Block(vec![line]),
            None => self
                .entries
                .push((key.to_string(), Value::Block(vec![line]))),
        }
        self
    }

    /// Leaves `key` out.
    pub fn without(mut self, key: &str) -> JobYaml {
        self.entries.retain(|(k, _)| k != key);
        self
    }

    pub fn name(self, v: &str) -> JobYaml {
        self.set("name", v)
    }
    pub fn model(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("model", v)
    }
    pub fn data(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("data", v)
    }
    pub fn train(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("train", v)
    }
    pub fn backend(self, v: &str) -> JobYaml {
        self.set("backend", v)
    }
    pub fn split(self, v: &str) -> JobYaml {
        self.set("split", v)
    }
    /// fib's split modes, e.g. `[shared, logical]`.
    pub fn splits(self, v: &str) -> JobYaml {
        self.set("splits", v)
    }
    /// fib's numbers of trials, e.g. `[1, 2]`.
    pub fn n(self, v: &str) -> JobYaml {
        self.set("n", v)
    }
    pub fn seed(self, v: u64) -> JobYaml {
        self.set("seed", v)
    }
    pub fn run_cap(self, v: u64) -> JobYaml {
        self.set("run_cap", v)
    }
    pub fn method(self, v: &str) -> JobYaml {
        self.set("method", v)
    }
    pub fn concurrency(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("concurrency", v)
    }
    pub fn memory(self, v: &str) -> JobYaml {
        self.set("memory", v)
    }
    /// An external command, written as a double-quoted YAML string.
    pub fn command(self, v: &str) -> JobYaml {
        self.set("command", format!("{v:?}"))
    }
    /// One parameter of the space: `name: spec` under `parameters`.
    pub fn param(self, name: &str, spec: impl std::fmt::Display) -> JobYaml {
        self.item("parameters", format!("{name}: {spec}"))
    }
    /// One injected fault, e.g. `{trial: 1, kind: nan}`.
    pub fn fault(self, spec: &str) -> JobYaml {
        self.item("faults", format!("- {spec}"))
    }
    /// One slice of an explicit slice plan, e.g. `{mem_mib: 300}`.
    pub fn slice(self, spec: &str) -> JobYaml {
        self.item("slices", format!("- {spec}"))
    }

    /// The job file's text.
    pub fn text(&self) -> String {
        let mut t = String::new();
        for (key, value) in &self.entries {
            match value {
                Value::Inline(v) => t.push_str(&format!("{key}: {v}\n")),
                Value::Block(lines) => {
                    t.push_str(&format!("{key}:\n"));
                    for l in lines {
                        t.push_str(&format!("  {l}\n"));
                    }
                }
            }
        }
        t
    }

    /// Writes it as `dir/name` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        write_job(dir, name, &self.text())
    }
}

impl std::fmt::Display for JobYaml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

// ---------------------------------------------------------------------------------------------
// Results files.

/// One CSV record keyed by its header.
pub type Row = HashMap<String, String>;

/// Reads a CSV file into records keyed by header.
pub fn read_csv(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let headers = r.headers().expect("headers").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("record");
            headers
                .iter()
                .map(String::from)
                .zip(rec.iter().map(String::from))
                .collect()
        })
        .collect()
}

/// The rows of `out/trials.csv`.
pub fn trials_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("trials.csv"))
}

/// The rows of `out/progress.csv`.
pub fn progress_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("progress.csv"))
}

/// The rows of `out/runs.csv`.
pub fn runs_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("runs.csv"))
}

/// Each trial's id and state, in the order of `out/trials.csv`.
pub fn states(out: &Path) -> Vec<(String, String)> {
    trials_csv(out)
        .into_iter()
        .map(|r| (r["trial_id"].clone(), r["state"].clone()))
        .collect()
}

/// Whole lines of a file after its header (a cut last line counts as nothing); 0 for a file
/// not there yet.
pub fn rows_in(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count().saturating_sub(1))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Tiny datasets.

/// An IDX file of unsigned bytes: its header for `dims`, then `data`.
pub fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

/// An IDX folder `dir/set` of `n` 4×4 images whose labels cycle through 0..10.
pub fn idx_folder(dir: &Path, n: usize) -> PathBuf {
    let folder = dir.join("set");
    std::fs::create_dir_all(&folder).expect("folder");
    let pixels: Vec<u8> = (0..n * 16).map(|i| (i % 251) as u8).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    std::fs::write(
        folder.join("images-idx3-ubyte"),
        idx(&[n as u32, 4, 4], &pixels),
    )
    .expect("images");
    std::fs::write(folder.join("labels-idx1-ubyte"), idx(&[n as u32], &labels)).expect("labels");
    folder
}

/// `n` samples of `len` values each drawn from `value`, their labels cycling through `classes`.
pub fn samples(n: usize, len: usize, classes: usize, mut value: impl FnMut() -> f32) -> Samples {
    Samples {
        images: (0..n * len).map(|_| value()).collect(),
        labels: (0..n as u32).map(|i| i % classes as u32).collect(),
    }
}

/// A dataset held in memory.
pub fn dataset(
    name: &str,
    shape: [usize; 3],
    classes: usize,
    train: Samples,
    test: Samples,
) -> Dataset {
    Dataset {
        name: name.into(),
        shape,
        classes,
        train,
        test,
    }
}

// ---------------------------------------------------------------------------------------------
// Signals and waiting.

/// Sends `sig` to `child`.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Sends SIGTERM and waits for the end; the output is for the test to check.
pub fn terminate(child: Child) -> Output {
    signal(&child, libc::SIGTERM);
    child.wait_with_output().expect("waits")
}

/// Waits until `cond` holds (checked every few ms); false after `limit`, or when `child` ended
/// first and `cond` does not hold then.
pub fn wait_for(child: &mut Child, limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return cond();
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    false
}

/// Reads `reader` line by line up to the first line for which `stop` holds (or its end), and
/// returns what it read.
pub fn read_until(reader: &mut impl BufRead, stop: impl Fn(&str) -> bool) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("read") == 0 {
            return seen;
        }
        seen.push_str(&line);
        if stop(&line) {
            return seen;
        }
    }
}

/// Whether process `pid` is alive (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Waits up to `limit` for `pid` to be gone (a killed process is reaped by its new parent).
pub fn gone_within(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A running gpumux whose stdout and stderr are collected as they come.
pub struct Watched {
    pub child: Child,
    pub out: Arc<Mutex<String>>,
    pub err: Arc<Mutex<String>>,
}

fn collect(src: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let keep = Arc::clone(&text);
    std::thread::spawn(move || {
        for line in BufReader::new(src).lines() {
            let Ok(line) = line else { break };
            let mut t = keep.lock().expect("lock");
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

impl Watched {
    /// Waits until `ready` holds (checked every few ms); false when the process ended first or
    /// after two minutes.
    pub fn wait_for(&mut self, ready: &dyn Fn(&Watched) -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            if ready(self) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return ready(self);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Whether stdout or stderr holds `text` so far.
    pub fn said(&self, text: &str) -> bool {
        self.out.lock().expect("lock").contains(text)
            || self.err.lock().expect("lock").contains(text)
    }

    /// Its stderr so far.
    pub fn err(&self) -> String {
        self.err.lock().expect("lock").clone()
    }

    pub fn signal(&self, sig: i32) {
        signal(&self.child, sig);
    }

    /// Waits for the end (two minutes at most, then kills it and fails): the exit code, stdout
    /// and stderr.
    pub fn finish(mut self) -> (Option<i32>, String, String) {
        let start = Instant::now();
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("gpumux did not end: {}", self.err());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The readers end with the pipes.
        std::thread::sleep(Duration::from_millis(50));
        let out = self.out.lock().expect("lock").clone();
        (status.code(), out, self.err())
    }
}
