//! External trials: a user's training command run in its own process group, its last stdout line read as JSON metrics, with cancellation, bounded output and a GPU-memory watchdog.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::cancel::Cancel;
use super::end::{Failure, Stop};
use super::lines::{self, Tail};
use super::reap;
use crate::error::JobError;
use crate::job::Job;
use crate::plan::{SliceSpec, MIB};
use crate::space::ParamValue;

/// The watchdog's default tolerance above the cap.
pub const DEFAULT_MARGIN: f64 = 0.05;
/// How many stderr lines are kept for error messages.
const STDERR_KEEP: usize = 20;
/// How many of them an error message quotes.
const STDERR_QUOTE: usize = 5;
/// The longest stdout line kept whole (the metrics line included); the rest of a longer one is
/// read and dropped, so one endless line holds no more than this.
pub const LINE_MAX: usize = 1 << 20;
/// Batches of stdout lines read ahead of the supervisor at most: a command that prints faster
/// than they are handled waits on its pipe.
const QUEUE_BATCHES: usize = 16;
/// The longest stderr line kept, in characters.
const STDERR_LINE_CHARS: usize = 1000;

/// Where and how an external trial runs.
#[derive(Clone, Debug)]
pub struct ExternalEnv {
    /// Value for CUDA_VISIBLE_DEVICES (the device's UUID on a GPU); None leaves the variable as inherited.
    pub cuda_visible_devices: Option<String>,
    /// The device's total memory, to turn the cap into XLA_PYTHON_CLIENT_MEM_FRACTION.
    pub device_mem_bytes: Option<u64>,
    /// NVML UUID of the device to watch; None disables the watchdog (no GPU).
    pub watch_uuid: Option<String>,
    /// Kill when the process's GPU memory exceeds cap × (1 + margin); default 0.05.
    pub watchdog_margin: f64,
    /// Working directory for the command (default: the current one).
    pub cwd: Option<PathBuf>,
}

impl Default for ExternalEnv {
    fn default() -> Self {
        ExternalEnv {
            cuda_visible_devices: None,
            device_mem_bytes: None,
            watch_uuid: None,
            watchdog_margin: DEFAULT_MARGIN,
            cwd: None,
        }
    }
}

/// What an external trial reported.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalOutcome {
    pub metrics: BTreeMap<String, f64>,
    pub wall_s: f64,
    pub peak_mem_mib: Option<f64>,
}

/// Fills `{name}` in the template from the trial's params (numbers printed as Rust's f64 Display,
/// so 0.001 stays 0.001 and 64.0 prints as 64; words as they are; `{{`/`}}` are literal braces),
/// splits it into words with shell-words (no shell runs), and returns argv. A `{name}` with no
/// such parameter is an error naming it and listing the known names.
///
/// The template is split into words first and each word is then filled, so a value lands whole
/// inside the word where its `{name}` stands: spaces or quotes in a value never split it.
pub fn render(
    template: &str,
    params: &BTreeMap<String, ParamValue>,
) -> Result<Vec<String>, String> {
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    fill_template(template, &mut |name| match params.get(name) {
        Some(v) => Ok(v.to_string()),
        None => Err(unknown(name, &known)),
    })
    .map_err(|e| format!("the command {e}"))
}

/// Checks a template against the names its trials will have (a sweep checks its job's command
/// with this when it loads it): its words split, its braces pair, and every `{name}` is one of
/// `known`. The error says what is wrong, as in "uses `{lr_max}`, which is not a parameter
/// (known: batch_size, lr)".
pub fn check_template(template: &str, known: &[&str]) -> Result<(), String> {
    fill_template(template, &mut |name| {
        if known.contains(&name) {
            Ok(String::new())
        } else {
            Err(unknown(name, known))
        }
    })
    .map(|_| ())
}

/// Checks a job's `command` (when it has one) against the values its trials are given: an
/// unknown `{name}` is a job error (exit 2) found before anything runs.
pub fn check_job(job: &Job) -> Result<(), JobError> {
    let Some(template) = &job.file.command else {
        return Ok(());
    };
    let params = job.params(0)?;
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    check_template(template, &known).map_err(|e| job.invalid("command", e))
}

/// The template split into words, each filled with `value(name)` for its `{name}`s.
fn fill_template(
    template: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<String>, String> {
    let words =
        shell_words::split(template).map_err(|e| format!("cannot be split into words: {e}"))?;
    if words.is_empty() {
        return Err("is empty".into());
    }
    words.iter().map(|w| fill(w, value)).collect()
}

/// One word with its `{name}`s replaced and `{{`/`}}` unescaped.
fn fill(
    word: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let name = take_name(&mut chars).ok_or_else(|| {
                    format!("has an unclosed `{{` in `{word}` (write `{{{{` for a brace)")
                })?;
                out.push_str(&value(name.trim())?);
            }
            '}' => {
                return Err(format!(
                    "has an unmatched `}}` in `{word}` (write `}}}}` for a brace)"
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The characters up to the next `}` (consumed); `None` when there is none.
fn take_name(chars: &mut dyn Iterator<Item = char>) -> Option<String> {
    let mut name = String::new();
    for c in chars {
        if c == '}' {
            return Some(name);
        }
        name.push(c);
    }
    None
}

/// The error for a `{name}` that is not a parameter, listing the known names.
fn unknown(name: &str, known: &[&str]) -> String {
    let known = if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    };
    format!("uses `{{{name}}}`, which is not a parameter (known: {known})")
}

/// Runs the command for one trial on one slice and waits for it.
///
/// Environment: CUDA_VISIBLE_DEVICES (when given), GPUMUX_SLICE (slice index), GPUMUX_TRIAL
/// (trial id), GPUMUX_MEM_CAP_MIB (when capped), XLA_PYTHON_CLIENT_MEM_FRACTION (cap / device
/// memory, 3 decimals rounded down, when both are known; also as XLA_CLIENT_MEM_FRACTION, its
/// newer name) and XLA_PYTHON_CLIENT_PREALLOCATE=false.
/// Each stdout line goes to `on_line` as it comes (lines longer than [`LINE_MAX`] cut there);
/// the metrics are the last non-empty stdout line, a JSON object whose numeric values are kept.
/// Output is held in bounded memory: a few lines queued, the last stderr lines kept. A non-zero
/// exit or a signal is a failure quoting the end of stderr. When `cancel.aborted()` turns true
/// the trial is ended (SIGTERM, then SIGKILL 5 s later) and the result is
/// [`Stop::Interrupted`]. With `watch_uuid`, NVML is sampled at 5 Hz for the processes of the
/// trial (its peak is `peak_mem_mib`); with a cap too, they are killed once they use more than
/// cap × (1 + margin). Whatever the command leaves running when it ends (its group, and what
/// escaped it, such as a `setsid` daemon) is ended the same way: see [`reap`].
pub fn run(
    argv: &[String],
    trial_id: &str,
    slice: &SliceSpec,
    env: &ExternalEnv,
    cancel: &Cancel,
    on_line: &mut dyn FnMut(&str),
) -> Result<ExternalOutcome, Stop> {
    let knobs = Knobs {
        poll: Duration::from_millis(100),
        term_grace: Duration::from_secs(5),
        watch_period: Duration::from_millis(200),
        drain: Duration::from_secs(1),
        open: open_nvml,
    };
    run_with(argv, trial_id, slice, env, cancel, on_line, &knobs)
}

/// The timings of [`run`] and where the watchdog reads the device (tests shorten and fake them).
struct Knobs {
    /// How often the cancel flag and the child are checked.
    poll: Duration,
    /// How long a trial being ended has between SIGTERM and SIGKILL.
    term_grace: Duration,
    /// The watchdog's sampling period.
    watch_period: Duration,
    /// How long output is still read after the command ends.
    drain: Duration,
    /// Opens the device's process list (NVML), on the watchdog's thread.
    open: fn(&str) -> Result<Box<dyn ProcSource>, String>,
}

/// How the supervised command ended.
enum End {
    Exited(ExitStatus),
    Interrupted,
}

fn run_with(
    argv: &[String],
    trial_id: &str,
    slice: &SliceSpec,
    env: &ExternalEnv,
    cancel: &Cancel,
    on_line: &mut dyn FnMut(&str),
    knobs: &Knobs,
) -> Result<ExternalOutcome, Stop> {
    if cancel.aborted() {
        return Err(Stop::Interrupted);
    }
    let started = Instant::now();
    let (mut child, _ours) = spawn(argv, &env_vars(trial_id, slice, env), env.cwd.as_ref())?;
    let leader = child.id();
    let streams = Streams::start(&mut child);
    let watchdog = env.watch_uuid.as_ref().map(|uuid| {
        let limit = slice
            .cap_mib()
            .map(|cap| (cap, margin_of(env.watchdog_margin)));
        Watchdog::start(uuid, leader, limit, knobs)
    });
    let mut last = String::new();
    let mut feed = |line: String| {
        on_line(&line);
        if !line.trim().is_empty() {
            last = line;
        }
    };
    let end = supervise(&mut child, &streams.lines, cancel, knobs, &mut feed);
    if matches!(end, Ok(End::Exited(_))) {
        // What is still in the pipes is read; what holds them open after `drain` is ended first.
        if !streams.drain_until(Instant::now() + knobs.drain, &mut feed) {
            reap::end_trial(&mut child, knobs.term_grace);
            streams.drain_until(Instant::now() + knobs.drain, &mut feed);
        }
    }
    // The trial is over: whatever it left running is ended.
    reap::end_trial(&mut child, knobs.term_grace);
    let wall_s = started.elapsed().as_secs_f64();
    let report = watchdog.map(Watchdog::finish).unwrap_or_default();
    match end.map_err(Failure::Command)? {
        End::Interrupted => Err(Stop::Interrupted),
        End::Exited(status) => {
            let metrics = judge(status, &report, &streams, &last)?;
            Ok(ExternalOutcome {
                metrics,
                wall_s,
                peak_mem_mib: report.peak_mib,
            })
        }
    }
}

/// The metrics of a command that ended by itself, or why there are none: the watchdog killed
/// it, it failed, or its last line is not metrics.
fn judge(
    status: ExitStatus,
    report: &WatchReport,
    streams: &Streams,
    last: &str,
) -> Result<BTreeMap<String, f64>, Failure> {
    if let Some((used_mib, cap_mib, margin)) = report.tripped {
        return Err(Failure::MemoryCap {
            used_mib,
            cap_mib,
            margin,
        });
    }
    if !status.success() {
        return Err(describe_exit(status, streams.stderr_tail()));
    }
    parse_metrics(last).map_err(Failure::Command)
}

/// The variables the command is given.
fn env_vars(trial_id: &str, slice: &SliceSpec, env: &ExternalEnv) -> Vec<(String, String)> {
    let mut vars = vec![
        ("GPUMUX_SLICE".to_string(), slice.index.to_string()),
        ("GPUMUX_TRIAL".to_string(), trial_id.to_string()),
        (
            "XLA_PYTHON_CLIENT_PREALLOCATE".to_string(),
            "false".to_string(),
        ),
    ];
    if let Some(dev) = &env.cuda_visible_devices {
        vars.push(("CUDA_VISIBLE_DEVICES".into(), dev.clone()));
    }
    if let Some(cap) = slice.mem_cap_bytes {
        vars.push((
            "GPUMUX_MEM_CAP_MIB".into(),
            ((cap as f64 / MIB).floor() as u64).to_string(),
        ));
    }
    if let (Some(cap), Some(total)) = (slice.mem_cap_bytes, env.device_mem_bytes) {
        let f = mem_fraction(cap, total);
        // JAX reads the newer name; older releases read the one with PYTHON in it.
        vars.push(("XLA_CLIENT_MEM_FRACTION".into(), f.clone()));
        vars.push(("XLA_PYTHON_CLIENT_MEM_FRACTION".into(), f));
    }
    vars
}

/// `cap / total` with 3 decimals, rounded down (so the framework stays under the cap), at least 0.001.
fn mem_fraction(cap: u64, total: u64) -> String {
    let f = (cap as f64 / total.max(1) as f64).min(1.0);
    format!("{:.3}", ((f * 1000.0).floor() / 1000.0).max(0.001))
}

/// A usable margin: the default where the given one is negative or not a number.
fn margin_of(m: f64) -> f64 {
    if m.is_finite() && m >= 0.0 {
        m
    } else {
        DEFAULT_MARGIN
    }
}

/// Starts the command as the leader of a new process group (see [`reap::spawn`]), stdout and
/// stderr piped.
fn spawn(
    argv: &[String],
    vars: &[(String, String)],
    cwd: Option<&PathBuf>,
) -> Result<(Child, reap::Ours), Failure> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| Failure::Command("the command is empty".into()))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    reap::spawn(&mut cmd).map_err(|e| {
        Failure::Command(match cwd {
            Some(dir) => format!("cannot start `{prog}` in {}: {e}", dir.display()),
            None => format!("cannot start `{prog}`: {e}"),
        })
    })
}

/// The command's output, read on two threads in bounded memory.
struct Streams {
    /// Stdout lines as they come, in batches, at most [`QUEUE_BATCHES`] ahead; disconnected at
    /// end of file.
    lines: Receiver<Vec<String>>,
    /// The last stderr lines.
    stderr: Arc<Mutex<Tail>>,
    /// Disconnected when stderr reaches end of file.
    stderr_done: Receiver<()>,
}

impl Streams {
    fn start(child: &mut Child) -> Streams {
        let lines = match child.stdout.take() {
            Some(out) => lines::spawn_line_reader(out, LINE_MAX, QUEUE_BATCHES),
            None => bounded(0).1,
        };
        let stderr = Arc::new(Mutex::new(Tail::new(STDERR_KEEP, STDERR_LINE_CHARS)));
        let (done_tx, stderr_done) = bounded::<()>(0);
        if let Some(err) = child.stderr.take() {
            let keep = Arc::clone(&stderr);
            std::thread::spawn(move || {
                // The thread owns the sender: `stderr_done` disconnects when it ends.
                let _owned = done_tx;
                let mut reader = BufReader::new(err);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match lines::read_line_bounded(&mut reader, &mut buf, 4 * STDERR_LINE_CHARS) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let text = String::from_utf8_lossy(&buf);
                            keep.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(text.trim_end_matches(['\n', '\r']));
                        }
                    }
                }
            });
        }
        Streams {
            lines,
            stderr,
            stderr_done,
        }
    }

    /// Reads stdout to its end and waits for stderr's; false when `deadline` came first.
    fn drain_until(&self, deadline: Instant, feed: &mut dyn FnMut(String)) -> bool {
        loop {
            match self.lines.recv_deadline(deadline) {
                Ok(batch) => batch.into_iter().for_each(&mut *feed),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => return false,
            }
        }
        matches!(
            self.stderr_done.recv_deadline(deadline),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    /// The last non-empty stderr lines, joined with ` | `.
    fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let lines: Vec<&str> = t.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        lines[lines.len().saturating_sub(STDERR_QUOTE)..].join(" | ")
    }
}

/// Passes lines on while the command runs; stops when it exits or the sweep is aborted.
fn supervise(
    child: &mut Child,
    lines: &Receiver<Vec<String>>,
    cancel: &Cancel,
    knobs: &Knobs,
    feed: &mut dyn FnMut(String),
) -> Result<End, String> {
    let mut open = true;
    loop {
        if cancel.aborted() {
            reap::end_trial(child, knobs.term_grace);
            return Ok(End::Interrupted);
        }
        let polled = child
            .try_wait()
            .map_err(|e| format!("cannot wait for the command: {e}"))?;
        if let Some(status) = polled {
            return Ok(End::Exited(status));
        }
        if !open {
            std::thread::sleep(knobs.poll);
            continue;
        }
        match lines.recv_timeout(knobs.poll) {
            Ok(batch) => batch.into_iter().for_each(&mut *feed),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
    }
}

/// Why a command that did not exit with status 0 failed.
fn describe_exit(status: ExitStatus, stderr: String) -> Failure {
    match (status.code(), status.signal()) {
        (_, Some(signal)) => Failure::CommandSignal { signal, stderr },
        (Some(code), _) => Failure::CommandExit { code, stderr },
        _ => Failure::Command("the command ended abnormally".into()),
    }
}

/// The metrics of the command's last non-empty stdout line: a JSON object's numeric values.
fn parse_metrics(last: &str) -> Result<BTreeMap<String, f64>, String> {
    if last.trim().is_empty() {
        return Err(
            "the command printed nothing on stdout; its last line must be a JSON object of metrics"
                .into(),
        );
    }
    let bad = || {
        format!(
            "the command's last stdout line is not a JSON object of metrics: `{}`",
            quote(last)
        )
    };
    let value: serde_json::Value = serde_json::from_str(last.trim()).map_err(|_| bad())?;
    let obj = value.as_object().ok_or_else(bad)?;
    Ok(obj
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect())
}

/// A line cut to a readable length for an error message.
fn quote(line: &str) -> String {
    const MAX: usize = 200;
    let line = line.trim();
    match line.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The watchdog.

/// The device's running compute processes: pid and MiB used (`None` where the driver does not say).
pub(crate) type ProcList = Vec<(u32, Option<f64>)>;

/// Where the watchdog reads the device's processes (NVML, or a fake in tests).
pub(crate) trait ProcSource {
    /// One reading; `None` when it failed.
    fn processes(&mut self) -> Option<ProcList>;
}

/// NVML, with the device looked up by UUID at each reading.
struct NvmlSource {
    nvml: nvml_wrapper::Nvml,
    uuid: String,
}

impl ProcSource for NvmlSource {
    fn processes(&mut self) -> Option<ProcList> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let dev = self.nvml.device_by_uuid(self.uuid.as_str()).ok()?;
        let list = dev.running_compute_processes().ok()?;
        Some(
            list.into_iter()
                .map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => (p.pid, Some(bytes as f64 / MIB)),
                    UsedGpuMemory::Unavailable => (p.pid, None),
                })
                .collect(),
        )
    }
}

/// Opens NVML and checks that the device exists.
fn open_nvml(uuid: &str) -> Result<Box<dyn ProcSource>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML is not available: {e}"))?;
    nvml.device_by_uuid(uuid)
        .map_err(|e| format!("no GPU with UUID {uuid}: {e}"))?;
    Ok(Box::new(NvmlSource {
        nvml,
        uuid: uuid.to_string(),
    }))
}

/// Whether `used_mib` is above the cap with its margin.
pub(crate) fn over_cap(used_mib: f64, cap_mib: f64, margin: f64) -> bool {
    used_mib > cap_mib * (1.0 + margin)
}

/// The group of `pid` for the watchdog: `leader`'s when `pid` is in the trial (in its process
/// group, or a descendant of its leader that left the group, such as a `setsid` daemon), else
/// its own process group.
fn trial_of(pid: u32, leader: u32) -> Option<u32> {
    let p = reap::proc_of(pid)?;
    if p.pgid == leader || reap::descends_from(pid, leader) {
        Some(leader)
    } else {
        Some(p.pgid)
    }
}

/// The MiB used by the processes of group `pgid` (`None` when none of them is listed).
fn group_usage(
    procs: &[(u32, Option<f64>)],
    pgid: u32,
    group_of: &dyn Fn(u32) -> Option<u32>,
) -> Option<f64> {
    let mut seen = false;
    let mut sum = 0.0;
    for &(pid, mib) in procs {
        if pid == pgid || group_of(pid) == Some(pgid) {
            seen = true;
            sum += mib.unwrap_or(0.0);
        }
    }
    seen.then_some(sum)
}

/// What the watchdog saw.
#[derive(Clone, Debug, Default, PartialEq)]
struct WatchReport {
    /// The most the group used at one reading, MiB.
    peak_mib: Option<f64>,
    /// (used, cap, margin) when it killed the group.
    tripped: Option<(f64, f64, f64)>,
}

/// What one watchdog loop watches and how it acts.
struct Watch<'a> {
    pgid: u32,
    /// (cap MiB, margin) to enforce; `None` only records the peak.
    limit: Option<(f64, f64)>,
    period: Duration,
    group_of: &'a dyn Fn(u32) -> Option<u32>,
    kill: &'a mut dyn FnMut(),
}

impl Watch<'_> {
    /// Samples until `stop` is signalled or dropped, or until the group goes over its cap.
    fn run(&mut self, source: &mut dyn ProcSource, stop: &Receiver<()>) -> WatchReport {
        let mut report = WatchReport::default();
        loop {
            let used = source
                .processes()
                .and_then(|p| group_usage(&p, self.pgid, self.group_of));
            if let Some(u) = used {
                report.peak_mib = Some(report.peak_mib.map_or(u, |p| p.max(u)));
                if let Some((cap, margin)) = self.limit.filter(|&(c, m)| over_cap(u, c, m)) {
                    report.tripped = Some((u, cap, margin));
                    (self.kill)();
                    return report;
                }
            }
            if !matches!(
                stop.recv_timeout(self.period),
                Err(RecvTimeoutError::Timeout)
            ) {
                return report;
            }
        }
    }
}

/// The watchdog's thread.
struct Watchdog {
    stop: Sender<()>,
    thread: JoinHandle<WatchReport>,
}

impl Watchdog {
    fn start(uuid: &str, pgid: u32, limit: Option<(f64, f64)>, knobs: &Knobs) -> Watchdog {
        let (stop, stop_rx) = bounded(1);
        let (uuid, open, period) = (uuid.to_string(), knobs.open, knobs.watch_period);
        let thread = std::thread::spawn(move || {
            let mut source = match open(&uuid) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("no GPU memory watchdog for this trial: {e}");
                    return WatchReport::default();
                }
            };
            let mut kill = || {
                let procs = reap::snapshot();
                reap::kill_group(pgid, libc::SIGKILL);
                for pid in reap::descendants(pgid, &procs) {
                    if let Ok(pid) = libc::pid_t::try_from(pid) {
                        // SAFETY: kill(2) only sends a signal, to a process of this trial.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            };
            let group_of = |pid| trial_of(pid, pgid);
            let mut watch = Watch {
                pgid,
                limit,
                period,
                group_of: &group_of,
                kill: &mut kill,
            };
            watch.run(source.as_mut(), &stop_rx)
        });
        Watchdog { stop, thread }
    }

    /// Stops the thread and returns what it saw (nothing if it panicked).
    fn finish(self) -> WatchReport {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, ParamValue)]) -> BTreeMap<String, ParamValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn num(x: f64) -> ParamValue {
        ParamValue::Num(x)
    }

    fn word(s: &str) -> ParamValue {
        ParamValue::Word(s.into())
    }

    fn slice(cap: Option<u64>) -> SliceSpec {
        SliceSpec {
            index: 3,
            device: 0,
            mem_cap_bytes: cap,
            sm_count: None,
            partition: None,
        }
    }

    /// Fast timings, and a process list read from /proc: every process uses `FAKE_MIB`.
    fn knobs() -> Knobs {
        Knobs {
            poll: Duration::from_millis(20),
            term_grace: Duration::from_millis(300),
            watch_period: Duration::from_millis(30),
            drain: Duration::from_millis(500),
            open: open_fake,
        }
    }

    const FAKE_MIB: f64 = 400.0;

    struct AllProcesses;

    impl ProcSource for AllProcesses {
        fn processes(&mut self) -> Option<ProcList> {
            let dir = std::fs::read_dir("/proc").ok()?;
            Some(
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .map(|pid| (pid, Some(FAKE_MIB)))
                    .collect(),
            )
        }
    }

    fn open_fake(_uuid: &str) -> Result<Box<dyn ProcSource>, String> {
        Ok(Box::new(AllProcesses))
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn go(
        argv: &[String],
        s: &SliceSpec,
        env: &ExternalEnv,
    ) -> (Result<ExternalOutcome, Stop>, Vec<String>) {
        let mut lines = Vec::new();
        let res = run_with(
            argv,
            "t007",
            s,
            env,
            &Cancel::new(),
            &mut |l| lines.push(l.to_string()),
            &knobs(),
        );
        (res, lines)
    }

    #[test]
    fn render_prints_numbers_as_display_and_words_as_they_are() {
        let p = params(&[
            ("lr", num(0.001)),
            ("batch_size", num(64.0)),
            ("opt", word("adam")),
            ("wd", num(1e-5)),
        ]);
        let argv = render(
            "train.py --lr {lr} --bs={batch_size} --opt {opt} --wd {wd}",
            &p,
        )
        .unwrap();
        assert_eq!(
            argv,
            ["train.py", "--lr", "0.001", "--bs=64", "--opt", "adam", "--wd", "0.00001"]
        );
    }

    #[test]
    fn render_keeps_escaped_braces_and_quoted_words() {
        let p = params(&[("lr", num(0.5)), ("name", word("two words"))]);
        let argv = render(
            r#"python3 -c 'print({{"lr": {lr}}})' "--tag {name}" {name}"#,
            &p,
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "python3",
                "-c",
                r#"print({"lr": 0.5})"#,
                "--tag two words",
                "two words"
            ]
        );
        let quoted = params(&[("q", word("it's \"x\""))]);
        assert_eq!(render("echo {q}", &quoted).unwrap(), ["echo", "it's \"x\""]);
    }

    #[test]
    fn render_names_an_unknown_parameter_and_lists_the_known_ones() {
        let p = params(&[("lr", num(0.1)), ("batch_size", num(8.0))]);
        let e = render("train --m {momentum}", &p).unwrap_err();
        assert!(e.contains("{momentum}"), "{e}");
        assert!(e.contains("known: batch_size, lr"), "{e}");
        assert!(render("train {lr", &p).unwrap_err().contains("unclosed"));
        assert!(render("train lr}", &p).unwrap_err().contains("unmatched"));
        assert!(render("train 'open", &p).unwrap_err().contains("split"));
        assert!(render("   ", &p).unwrap_err().contains("empty"));
    }

    #[test]
    fn progress_lines_stream_and_the_last_line_is_the_metrics() {
        let argv = sh(
            r#"echo 'epoch 1'; echo '{"epoch": 1}'; echo '{"test_acc": 0.91, "final_loss": 0.2, "note": "ok"}'; echo"#,
        );
        let (res, lines) = go(&argv, &slice(None), &ExternalEnv::default());
        let out = res.unwrap();
        assert_eq!(out.metrics.len(), 2);
        assert_eq!(out.metrics["test_acc"], 0.91);
        assert_eq!(out.metrics["final_loss"], 0.2);
        assert_eq!(out.peak_mem_mib, None);
        assert!(out.wall_s > 0.0 && out.wall_s < 5.0);
        assert_eq!(lines[..2], ["epoch 1", r#"{"epoch": 1}"#]);
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn the_child_sees_its_variables_and_directory() {
        let dir = tempfile::tempdir().unwrap();
        let script = "import json, os; print(json.dumps({k: os.environ.get(k) for k in \
            ['CUDA_VISIBLE_DEVICES', 'GPUMUX_SLICE', 'GPUMUX_TRIAL', 'GPUMUX_MEM_CAP_MIB', \
            'XLA_PYTHON_CLIENT_MEM_FRACTION', 'XLA_CLIENT_MEM_FRACTION', \
            'XLA_PYTHON_CLIENT_PREALLOCATE']})); \
            print(json.dumps({'cwd': os.getcwd()})); print('{\"ok\": 1}')";
        let argv = vec!["python3".into(), "-c".into(), script.into()];
        let env = ExternalEnv {
            cuda_visible_devices: Some("GPU-1234".into()),
            device_mem_bytes: Some(16 << 30),
            cwd: Some(dir.path().to_path_buf()),
            ..ExternalEnv::default()
        };
        let (res, lines) = go(&argv, &slice(Some(3 << 30)), &env);
        assert_eq!(res.unwrap().metrics["ok"], 1.0);
        let vars: BTreeMap<String, Option<String>> = serde_json::from_str(&lines[0]).unwrap();
        let get = |k: &str| vars[k].clone().unwrap_or_default();
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), "GPU-1234");
        assert_eq!(get("GPUMUX_SLICE"), "3");
        assert_eq!(get("GPUMUX_TRIAL"), "t007");
        assert_eq!(get("GPUMUX_MEM_CAP_MIB"), "3072");
        assert_eq!(get("XLA_PYTHON_CLIENT_MEM_FRACTION"), "0.187");
        assert_eq!(get("XLA_CLIENT_MEM_FRACTION"), "0.187");
        assert_eq!(get("XLA_PYTHON_CLIENT_PREALLOCATE"), "false");
        let cwd: BTreeMap<String, String> = serde_json::from_str(&lines[1]).unwrap();
        let want = dir.path().canonicalize().unwrap();
        assert_eq!(PathBuf::from(&cwd["cwd"]).canonicalize().unwrap(), want);
    }

    #[test]
    fn uncapped_slices_get_no_cap_variables() {
        let vars = env_vars("t1", &slice(None), &ExternalEnv::default());
        let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!names.contains(&"GPUMUX_MEM_CAP_MIB"));
        assert!(!names.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION"));
        assert!(!names.contains(&"CUDA_VISIBLE_DEVICES"));
        assert_eq!(mem_fraction(1 << 30, 80 << 30), "0.012");
        assert_eq!(mem_fraction(1, 80 << 30), "0.001");
        assert_eq!(mem_fraction(90 << 30, 80 << 30), "1.000");
    }

    #[test]
    fn a_nonzero_exit_is_an_error_with_the_stderr_tail() {
        let argv =
            sh("echo '{\"test_acc\": 1}'; echo early >&2; echo 'ValueError: bad lr' >&2; exit 3");
        let e = go(&argv, &slice(None), &ExternalEnv::default())
            .0
            .unwrap_err()
            .to_string();
        assert!(e.contains("exited with code 3"), "{e}");
        assert!(e.contains("early | ValueError: bad lr"), "{e}");
    }

    #[test]
    fn death_by_a_signal_is_named() {
        let e = go(
            &sh("echo x >&2; kill -SEGV $$"),
            &slice(None),
            &ExternalEnv::default(),
        )
        .0
        .unwrap_err()
        .to_string();
        assert!(e.contains("signal 11 (SIGSEGV)"), "{e}");
        assert!(e.contains("stderr: x"), "{e}");
    }

    #[test]
    fn a_last_line_that_is_not_json_is_quoted() {
        let e = go(
            &sh("echo '{\"a\": 1}'; echo 'done: acc=0.9'"),
            &slice(None),
            &ExternalEnv::default(),
        )
        .0
        .unwrap_err()
        .to_string();
        assert!(e.contains("`done: acc=0.9`"), "{e}");
        let e = go(&sh("echo '[1, 2]'"), &slice(None), &ExternalEnv::default())
            .0
            .unwrap_err()
            .to_string();
        assert!(e.contains("`[1, 2]`"), "{e}");
        let e = go(&sh("true"), &slice(None), &ExternalEnv::default())
            .0
            .unwrap_err()
            .to_string();
        assert!(e.contains("printed nothing"), "{e}");
        let e = go(
            &["/nonexistent/prog".to_string()],
            &slice(None),
            &ExternalEnv::default(),
        )
        .0
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot start `/nonexistent/prog`"), "{e}");
    }

    /// Runs `argv`, aborts the sweep when its first stdout line comes, and returns the result,
    /// the time from the abort to the return, and the lines.
    fn cancelled(argv: &[String]) -> (Result<ExternalOutcome, Stop>, Duration, Vec<String>) {
        let cancel = Cancel::new();
        let mut aborted_at = None;
        let mut lines = Vec::new();
        let mut on_line = |l: &str| {
            lines.push(l.to_string());
            if aborted_at.is_none() {
                aborted_at = Some(Instant::now());
                cancel.abort();
            }
        };
        let env = ExternalEnv::default();
        let res = run_with(
            argv,
            "t0",
            &slice(None),
            &env,
            &cancel,
            &mut on_line,
            &knobs(),
        );
        let took = aborted_at.expect("no line came").elapsed();
        (res, took, lines)
    }

    fn gone(pid: u32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.is_empty()
            || stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    }

    fn wait_gone(pid: u32) -> bool {
        (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            gone(pid)
        })
    }

    #[test]
    fn cancel_terminates_the_command_and_its_children() {
        let (res, took, lines) = cancelled(&sh("sleep 30 & echo $!; sleep 30"));
        assert_eq!(res.unwrap_err(), Stop::Interrupted);
        assert!(took < Duration::from_secs(3), "{took:?}");
        let pid: u32 = lines[0].parse().unwrap();
        assert!(wait_gone(pid), "background child {pid} survived");
    }

    #[test]
    fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
        let script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(30)";
        let (res, took, lines) = cancelled(&["python3".into(), "-c".into(), script.into()]);
        assert_eq!(res.unwrap_err(), Stop::Interrupted);
        assert!(
            took >= Duration::from_millis(300),
            "SIGKILL came before the grace: {took:?}"
        );
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert_eq!(lines, ["ready"]);
    }

    #[test]
    fn what_the_command_leaves_behind_is_killed() {
        // The shell exits at once; its background sleep keeps stdout open until it is killed.
        let argv = sh("sleep 30 & echo $!; echo '{\"a\": 3}'");
        let started = Instant::now();
        let (res, lines) = go(&argv, &slice(None), &ExternalEnv::default());
        assert_eq!(res.unwrap().metrics["a"], 3.0);
        assert!(started.elapsed() < Duration::from_secs(3));
        let pid: u32 = lines[0].parse().unwrap();
        assert!(wait_gone(pid), "background child {pid} survived");
    }

    #[test]
    fn an_aborted_sweep_starts_nothing() {
        let cancel = Cancel::new();
        cancel.abort();
        let res = run_with(
            &sh("echo started >&2"),
            "t0",
            &slice(None),
            &ExternalEnv::default(),
            &cancel,
            &mut |_| {},
            &knobs(),
        );
        assert_eq!(res.unwrap_err(), Stop::Interrupted);
    }

    #[test]
    fn over_cap_allows_the_margin_and_no_more() {
        assert!(!over_cap(1000.0, 1000.0, 0.05));
        assert!(!over_cap(1050.0, 1000.0, 0.05));
        assert!(over_cap(1050.5, 1000.0, 0.05));
        assert!(over_cap(1000.5, 1000.0, 0.0));
        assert!(!over_cap(0.0, 0.0, 0.05));
        assert_eq!(margin_of(f64::NAN), DEFAULT_MARGIN);
        assert_eq!(margin_of(-1.0), DEFAULT_MARGIN);
        assert_eq!(margin_of(0.0), 0.0);
        let tripped = Failure::MemoryCap {
            used_mib: 2100.4,
            cap_mib: 2000.0,
            margin: 0.05,
        };
        assert_eq!(
            tripped.to_string(),
            "the command exceeded its memory cap: used 2100 MiB, cap 2000 MiB (+5%)"
        );
    }

    #[test]
    fn group_usage_sums_the_group_and_ignores_the_rest() {
        let procs = vec![
            (10, Some(100.0)),
            (11, Some(50.0)),
            (12, None),
            (99, Some(7000.0)),
        ];
        let group_of = |pid: u32| if pid < 20 { Some(10) } else { Some(99) };
        assert_eq!(group_usage(&procs, 10, &group_of), Some(150.0));
        assert_eq!(group_usage(&procs, 5, &group_of), None);
        // A pid NVML lists but /proc no longer knows still counts when it is the leader.
        assert_eq!(group_usage(&[(10, Some(3.0))], 10, &|_| None), Some(3.0));
    }

    struct Script(Vec<ProcList>);

    impl ProcSource for Script {
        fn processes(&mut self) -> Option<ProcList> {
            (!self.0.is_empty()).then(|| self.0.remove(0))
        }
    }

    fn watch(source: &mut dyn ProcSource, limit: Option<(f64, f64)>) -> (WatchReport, u32) {
        let (_keep, stop) = bounded(1);
        let mut kills = 0;
        let mut kill = || kills += 1;
        let mut w = Watch {
            pgid: 7,
            limit,
            period: Duration::from_millis(1),
            group_of: &|pid| (pid < 10).then_some(7),
            kill: &mut kill,
        };
        let report = w.run(source, &stop);
        (report, kills)
    }

    #[test]
    fn the_watch_kills_once_over_the_cap_and_keeps_the_peak() {
        let mut source = Script(vec![
            vec![(7, Some(500.0)), (30, Some(9000.0))],
            vec![(7, Some(900.0)), (8, Some(150.0))],
            vec![(7, Some(900.0)), (8, Some(160.0))],
            vec![(7, Some(5000.0))],
        ]);
        let (report, kills) = watch(&mut source, Some((1000.0, 0.05)));
        assert_eq!(report.tripped, Some((1060.0, 1000.0, 0.05)));
        assert_eq!(report.peak_mib, Some(1060.0));
        assert_eq!(kills, 1);
        assert_eq!(source.0.len(), 1, "it went on sampling after the kill");
    }

    #[test]
    fn without_a_cap_the_watch_only_records_the_peak() {
        let mut source = Script(vec![vec![(7, Some(500.0))], vec![(8, Some(1e6))], vec![]]);
        let (keep, stop) = bounded(1);
        let mut kill = || panic!("killed without a cap");
        let mut w = Watch {
            pgid: 7,
            limit: None,
            period: Duration::from_millis(1),
            group_of: &|pid| (pid < 10).then_some(7),
            kill: &mut kill,
        };
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(keep);
        });
        let report = w.run(&mut source, &stop);
        t.join().unwrap();
        assert_eq!(report.peak_mib, Some(1e6));
        assert_eq!(report.tripped, None);
    }

    #[test]
    fn the_watchdog_kills_the_whole_group_over_its_cap() {
        // Every process "uses" 400 MiB: the shell and its first sleep are 800 MiB, under 1000 + 5%;
        // with the second sleep they are 1200, over it (`; true` keeps sh from exec-ing the sleep).
        let argv = sh("sleep 30 & echo $!; sleep 30; true");
        let env = ExternalEnv {
            watch_uuid: Some("GPU-fake".into()),
            ..ExternalEnv::default()
        };
        let started = Instant::now();
        let (res, lines) = go(&argv, &slice(Some(1000 << 20)), &env);
        let e = res.unwrap_err().to_string();
        assert!(
            e.ends_with("exceeded its memory cap: used 1200 MiB, cap 1000 MiB (+5%)"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid: u32 = lines[0].parse().unwrap();
        assert!(wait_gone(pid), "background child {pid} survived");
    }

    #[test]
    fn the_watchdog_reports_the_peak_and_spares_an_uncapped_command() {
        let env = ExternalEnv {
            watch_uuid: Some("GPU-fake".into()),
            ..ExternalEnv::default()
        };
        let (res, _) = go(&sh("sleep 0.2; echo '{\"a\": 2}'"), &slice(None), &env);
        let out = res.unwrap();
        assert!(out.peak_mem_mib >= Some(FAKE_MIB), "{:?}", out.peak_mem_mib);
    }

    #[test]
    fn without_nvml_the_watchdog_stands_down() {
        let env = ExternalEnv {
            watch_uuid: Some("GPU-00000000-0000-0000-0000-000000000000".into()),
            ..ExternalEnv::default()
        };
        let k = Knobs {
            open: open_nvml,
            ..knobs()
        };
        let argv = sh("echo '{\"a\": 1}'");
        let res = run_with(
            &argv,
            "t0",
            &slice(Some(1 << 20)),
            &env,
            &Cancel::new(),
            &mut |_| {},
            &k,
        );
        assert_eq!(res.unwrap().peak_mem_mib, None);
    }

    #[test]
    fn the_shipped_sweep_runs_the_fake_trainer() {
        let root = crate::test_root();
        let job = crate::job::Job::load(&root.join("jobs/sweep-external.yaml")).unwrap();
        let argv = render(
            job.file.command.as_deref().unwrap(),
            &job.params(0).unwrap(),
        )
        .unwrap();
        assert_eq!(argv[..2], ["python3", "examples/fake_train.py"]);
        let env = ExternalEnv {
            cwd: Some(root),
            ..ExternalEnv::default()
        };
        let (res, lines) = go(&argv, &slice(None), &env);
        let out = res.unwrap();
        let acc = out.metrics["test_acc"];
        assert!((0.0..=1.0).contains(&acc), "{acc}");
        assert!(lines.len() >= 2, "{lines:?}");
    }
}
