//! External trials: a user's training command run in its own process group, its last stdout line read as JSON metrics, with cancellation, bounded output and a GPU-memory watchdog.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::child::{describe_exit, End, OnStderr, Supervised, Timing};
use super::end::{ChildKind, Failure, Stop};
use super::metric_line;
use super::signals::Cancel;
use super::watchdog::{margin_of, open_nvml, Open, WatchReport, Watchdog};
use crate::plan::{SliceSpec, TrialSpec, MIB};

pub use super::template::{check_job, check_template, placeholders, received, render, TrialNames};
pub use super::watchdog::DEFAULT_MARGIN;

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
    /// The trial runs on a GPU: only then does it get the GPU-only variables (its memory cap,
    /// the XLA memory fraction and preallocation).
    pub on_gpu: bool,
    /// How many trials run at once, sharing the host's cores (see [`thread_share`]).
    pub concurrency: u32,
}

impl ExternalEnv {
    /// This environment for a trial that runs beside `concurrency - 1` others.
    pub fn shared_by(&self, concurrency: u32) -> ExternalEnv {
        ExternalEnv {
            concurrency,
            ..self.clone()
        }
    }
}

/// The variables that size a trial's CPU thread pools, each given [`thread_share`]: OpenMP (and
/// so PyTorch's intra-op pool), MKL, OpenBLAS, Accelerate (vecLib), numexpr, TensorFlow's
/// intra- and inter-op pools, and XLA's CPU client (JAX reads `PJRT_NPROC` for its pool size).
pub const THREAD_VARS: [&str; 8] = [
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "PJRT_NPROC",
];

/// A trial's share of the cores: the cores this process may use (affinity and cgroup limits
/// count) divided by the trials that run at once, at least 1.
pub fn thread_share(concurrency: u32) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores = u32::try_from(cores).unwrap_or(u32::MAX);
    (cores / concurrency.max(1)).max(1)
}

impl Default for ExternalEnv {
    fn default() -> Self {
        ExternalEnv {
            cuda_visible_devices: None,
            device_mem_bytes: None,
            watch_uuid: None,
            watchdog_margin: DEFAULT_MARGIN,
            cwd: None,
            on_gpu: false,
            concurrency: 1,
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

/// The argv of `trial` on `slice`: `template` filled with its parameters and names (see
/// [`render`]). Its folder, `trials_dir/<trial id>` (the same one when the trial runs again), is
/// made first when the template names `{out_dir}`; it is given as an absolute path.
pub fn command(
    ext: &super::ExternalTrials,
    trial: &TrialSpec,
    slice: &SliceSpec,
) -> Result<Vec<String>, Failure> {
    let template = ext.template.as_str();
    let dir = ext.trials_dir.join(&trial.id);
    let cannot = |e: std::io::Error| {
        Failure::Command(format!(
            "cannot make the trial's folder {}: {e}",
            dir.display()
        ))
    };
    let out_dir = std::path::absolute(&dir).map_err(cannot)?;
    let names_dir = placeholders(template).is_ok_and(|names| names.iter().any(|n| n == "out_dir"))
        || template.contains("${args_json_file}");
    if names_dir {
        // Made under the output folder's descriptor: never through a link planted in it.
        let root = ext.trials_dir.parent().unwrap_or(std::path::Path::new(""));
        let trials = ext
            .trials_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("trials");
        crate::outdir::make_dir_within(root, &[trials, trial.id.as_str()]).map_err(cannot)?;
    }
    let names = TrialNames {
        seed: trial.seed,
        trial_id: &trial.id,
        slice: slice.index,
        out_dir: &out_dir,
        program: ext.program.as_deref(),
        swept: &ext.swept,
    };
    render(template, &trial.params, &names).map_err(Failure::Command)
}

/// Runs the command for one trial on one slice and waits for it.
///
/// Environment: CUDA_VISIBLE_DEVICES (when given), GPUMUX_SLICE (slice index), GPUMUX_TRIAL
/// (trial id), GPUMUX_THREADS and the [`THREAD_VARS`] (the trial's [`thread_share`]; a variable
/// already set in gpumux's own environment is left as it is there; XLA_FLAGS is never touched:
/// XLA aborts on words it does not know, and reads PJRT_NPROC for its pool); on a GPU only: GPUMUX_MEM_CAP_MIB
/// (when capped), XLA_PYTHON_CLIENT_MEM_FRACTION (cap / device memory, 3 decimals rounded down,
/// when both are known; also as XLA_CLIENT_MEM_FRACTION, its newer name) and
/// XLA_PYTHON_CLIENT_PREALLOCATE=false.
/// Each stdout line goes to `on_line` as it comes (lines longer than [`super::child::LINE_MAX`] cut there),
/// and each stderr line to `on_stderr`, when given, on the thread that reads it;
/// the metrics are the last non-empty stdout line, an object whose numeric values are kept (see
/// [`metric_line`]).
/// Output is held in bounded memory (see [`super::child`]). A non-zero exit or a signal is a failure
/// quoting the end of stderr. When `cancel.aborted()` turns true the trial is ended (SIGTERM,
/// then SIGKILL [`super::child::TERM_GRACE`] later) and the result is [`Stop::Interrupted`]. With
/// `watch_uuid`, NVML is sampled at 5 Hz for the processes of the trial (its peak is
/// `peak_mem_mib`); with a cap too, they are killed once they use more than cap × (1 + margin).
/// Whatever the command leaves running when it ends (its group, and what escaped it, such as a
/// `setsid` daemon) is ended the same way: see [`super::reap`].
pub fn run(
    argv: &[String],
    trial_id: &str,
    slice: &SliceSpec,
    env: &ExternalEnv,
    cancel: &Cancel,
    on_line: &mut dyn FnMut(&str),
    on_stderr: Option<OnStderr>,
) -> Result<ExternalOutcome, Stop> {
    let knobs = Knobs {
        timing: Timing::default(),
        watch_period: Duration::from_millis(200),
        open: open_nvml,
        on_stderr,
    };
    run_with(argv, trial_id, slice, env, cancel, on_line, knobs)
}

/// The timings of [`run`] and where the watchdog reads the device (tests shorten and fake them).
struct Knobs {
    /// The child's supervision.
    timing: Timing,
    /// The watchdog's sampling period.
    watch_period: Duration,
    /// Opens the device's process list (NVML), on the watchdog's thread.
    open: Open,
    /// Sees each stderr line as it comes.
    on_stderr: Option<OnStderr>,
}

fn run_with(
    argv: &[String],
    trial_id: &str,
    slice: &SliceSpec,
    env: &ExternalEnv,
    cancel: &Cancel,
    on_line: &mut dyn FnMut(&str),
    mut knobs: Knobs,
) -> Result<ExternalOutcome, Stop> {
    if cancel.aborted() {
        return Err(Stop::Interrupted);
    }
    let started = Instant::now();
    let mut child = spawn(
        argv,
        &env_vars(trial_id, slice, env),
        env.cwd.as_ref(),
        &mut knobs,
    )?;
    let watchdog = env.watch_uuid.as_ref().map(|uuid| {
        let limit = slice
            .cap_mib()
            .map(|cap| (cap, margin_of(env.watchdog_margin)));
        Watchdog::start(uuid, child.id(), limit, knobs.watch_period, knobs.open)
    });
    let mut last = String::new();
    let mut feed = |line: String| {
        on_line(&line);
        if let Some(shown) = metric_line::shown(&line) {
            last = shown;
        }
    };
    let end = child.supervise(cancel, &mut feed);
    // The trial is over: what is still in its pipes is read, and whatever it left running is
    // ended.
    child.finish(&end, &mut feed);
    let wall_s = started.elapsed().as_secs_f64();
    let report = watchdog.map(Watchdog::finish).unwrap_or_default();
    let end = end.map_err(|e| Failure::Wait {
        child: ChildKind::Command,
        reason: e.to_string(),
    })?;
    match end {
        End::Interrupted => Err(Stop::Interrupted),
        End::Exited(status) => {
            let metrics = judge(status, &report, &child, &last)?;
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
    child: &Supervised,
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
        return Err(Failure::ChildExit {
            child: ChildKind::Command,
            exit: describe_exit(status),
            stderr: child.stderr_lines(),
        });
    }
    parse_metrics(last)
}

/// The variables the command is given.
fn env_vars(trial_id: &str, slice: &SliceSpec, env: &ExternalEnv) -> Vec<(String, String)> {
    env_vars_over(trial_id, slice, env, &|k| std::env::var(k).ok())
}

/// [`env_vars`], where `inherited` reads a variable of the environment the command inherits
/// (the user's settings, which gpumux's thread limits leave alone).
fn env_vars_over(
    trial_id: &str,
    slice: &SliceSpec,
    env: &ExternalEnv,
    inherited: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let threads = thread_share(env.concurrency);
    let mut vars = vec![
        ("GPUMUX_SLICE".to_string(), slice.index.to_string()),
        ("GPUMUX_TRIAL".to_string(), trial_id.to_string()),
        ("GPUMUX_THREADS".to_string(), threads.to_string()),
    ];
    for name in THREAD_VARS {
        if inherited(name).is_none() {
            vars.push((name.to_string(), threads.to_string()));
        }
    }
    if let Some(dev) = &env.cuda_visible_devices {
        vars.push(("CUDA_VISIBLE_DEVICES".into(), dev.clone()));
    }
    if !env.on_gpu {
        return vars;
    }
    vars.push(("XLA_PYTHON_CLIENT_PREALLOCATE".into(), "false".into()));
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
/// Starts the command as a [`Supervised`] child.
fn spawn(
    argv: &[String],
    vars: &[(String, String)],
    cwd: Option<&PathBuf>,
    knobs: &mut Knobs,
) -> Result<Supervised, Failure> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| Failure::Command("the command is empty".into()))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    Supervised::spawn(&mut cmd, knobs.timing, knobs.on_stderr.take()).map_err(|e| Failure::Start {
        child: ChildKind::Command,
        program: prog.clone(),
        cwd: cwd.map(|d| d.display().to_string()),
        reason: e.to_string(),
    })
}

/// The metrics of what shows of the command's last stdout line that shows anything (see
/// [`metric_line`]): an object's numeric values.
fn parse_metrics(last: &str) -> Result<BTreeMap<String, f64>, Failure> {
    metric_line::numbers(last).ok_or_else(|| Failure::NoMetrics { last: quote(last) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::watchdog::{ProcList, ProcSource};

    /// The slice the trials here run on.
    const SLICE: SliceSpec = SliceSpec::at(3, 0);

    /// Fast timings, and a process list read from /proc: every process uses `FAKE_MIB`.
    fn knobs() -> Knobs {
        Knobs {
            timing: Timing {
                poll: Duration::from_millis(20),
                grace: Duration::from_millis(300),
                drain: Duration::from_millis(500),
            },
            watch_period: Duration::from_millis(30),
            open: open_fake,
            on_stderr: None,
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
            knobs(),
        );
        (res, lines)
    }

    /// The error of a trial that runs `argv` on [`SLICE`] and fails.
    fn error_of(argv: &[String]) -> String {
        go(argv, &SLICE, &ExternalEnv::default())
            .0
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn progress_lines_stream_and_the_last_line_is_the_metrics() {
        let argv = sh(
            r#"echo 'epoch 1'; echo '{"epoch": 1}'; echo '{"test_acc": 0.91, "final_loss": 0.2, "note": "ok"}'; echo"#,
        );
        let (res, lines) = go(&argv, &SLICE, &ExternalEnv::default());
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
            on_gpu: true,
            ..ExternalEnv::default()
        };
        let (res, lines) = go(&argv, &SLICE.capped(3 << 30), &env);
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
        let vars = env_vars("t1", &SLICE, &ExternalEnv::default());
        let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!names.contains(&"GPUMUX_MEM_CAP_MIB"));
        assert!(!names.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION"));
        assert!(!names.contains(&"CUDA_VISIBLE_DEVICES"));
        assert_eq!(mem_fraction(1 << 30, 80 << 30), "0.012");
        assert_eq!(mem_fraction(1, 80 << 30), "0.001");
        assert_eq!(mem_fraction(90 << 30, 80 << 30), "1.000");
    }

    /// The variables of a trial on `slice` when the inherited environment holds `user`.
    fn vars_with(
        slice: &SliceSpec,
        env: &ExternalEnv,
        user: &[(&str, &str)],
    ) -> BTreeMap<String, String> {
        let inherited = |k: &str| {
            user.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        };
        env_vars_over("t1", slice, env, &inherited)
            .into_iter()
            .collect()
    }

    #[test]
    fn on_the_cpu_a_capped_slice_gets_no_gpu_variables() {
        let cpu = ExternalEnv::default();
        let vars = vars_with(&SLICE.capped(3 << 30), &cpu, &[]);
        for gpu_only in [
            "GPUMUX_MEM_CAP_MIB",
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_PREALLOCATE",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(!vars.contains_key(gpu_only), "{gpu_only}: {vars:?}");
        }
        assert_eq!(vars["GPUMUX_SLICE"], "3");
        let gpu = ExternalEnv {
            on_gpu: true,
            device_mem_bytes: Some(16 << 30),
            ..ExternalEnv::default()
        };
        let vars = vars_with(&SLICE.capped(3 << 30), &gpu, &[]);
        assert_eq!(vars["GPUMUX_MEM_CAP_MIB"], "3072");
        assert_eq!(vars["XLA_PYTHON_CLIENT_PREALLOCATE"], "false");
    }

    #[test]
    fn each_trial_gets_its_share_of_the_cores_unless_the_user_set_one() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert_eq!(thread_share(1), cores);
        assert_eq!(thread_share(cores * 2), 1);
        assert_eq!(thread_share(0), cores);
        let env = ExternalEnv::default().shared_by(2);
        let share = (cores / 2).max(1).to_string();
        let vars = vars_with(&SLICE, &env, &[("MKL_NUM_THREADS", "7")]);
        assert_eq!(vars["GPUMUX_THREADS"], share);
        for name in THREAD_VARS {
            if name == "MKL_NUM_THREADS" {
                // Inherited as the user set it.
                assert!(!vars.contains_key(name), "{vars:?}");
            } else {
                assert_eq!(vars[name], share, "{name}");
            }
        }
        // XLA reads PJRT_NPROC; gpumux adds nothing to XLA_FLAGS, whose words XLA may refuse.
        assert!(!vars.contains_key("XLA_FLAGS"), "{vars:?}");
    }

    #[test]
    fn a_nonzero_exit_is_an_error_with_the_stderr_tail() {
        let argv =
            sh("echo '{\"test_acc\": 1}'; echo early >&2; echo 'ValueError: bad lr' >&2; exit 3");
        let e = error_of(&argv);
        assert!(e.contains("exited with code 3"), "{e}");
        assert!(e.contains("early | ValueError: bad lr"), "{e}");
    }

    #[test]
    fn death_by_a_signal_is_named() {
        let e = error_of(&sh("echo x >&2; kill -SEGV $$"));
        assert!(e.contains("signal 11 (SIGSEGV)"), "{e}");
        assert!(e.contains("stderr: x"), "{e}");
    }

    #[test]
    fn a_last_line_that_is_not_json_is_quoted() {
        let e = error_of(&sh("echo '{\"a\": 1}'; echo 'done: acc=0.9'"));
        assert!(e.contains("`done: acc=0.9`"), "{e}");
        let e = error_of(&sh("echo '[1, 2]'"));
        assert!(e.contains("`[1, 2]`"), "{e}");
        let e = error_of(&sh("true"));
        assert!(e.contains("printed nothing"), "{e}");
        let e = error_of(&["/nonexistent/prog".to_string()]);
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
        let res = run_with(argv, "t0", &SLICE, &env, &cancel, &mut on_line, knobs());
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
        let (res, lines) = go(&argv, &SLICE, &ExternalEnv::default());
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
            &SLICE,
            &ExternalEnv::default(),
            &cancel,
            &mut |_| {},
            knobs(),
        );
        assert_eq!(res.unwrap_err(), Stop::Interrupted);
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
        let (res, lines) = go(&argv, &SLICE.capped(1000 << 20), &env);
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
        let (res, _) = go(&sh("sleep 0.2; echo '{\"a\": 2}'"), &SLICE, &env);
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
            &SLICE.capped(1 << 20),
            &env,
            &Cancel::new(),
            &mut |_| {},
            k,
        );
        assert_eq!(res.unwrap().peak_mem_mib, None);
    }

    #[test]
    fn the_shipped_sweep_runs_the_fake_trainer() {
        let root = crate::test_root();
        let job = crate::job::Job::load(&root.join("jobs/sweep-external.yaml")).unwrap();
        let trial = TrialSpec {
            id: "t0".into(),
            index: 0,
            hyper: job.hyper(0).unwrap(),
            params: job.params(0).unwrap(),
            seed: 7,
            fault: None,
        };
        let out = tempfile::tempdir().unwrap();
        let ext = super::super::ExternalTrials {
            template: job.file.command.clone().unwrap(),
            program: None,
            swept: Vec::new(),
            trials_dir: out.path().to_path_buf(),
            envs: crate::plan::PerDevice::with(ExternalEnv::default(), Vec::new()),
            stream: false,
        };
        let argv = command(&ext, &trial, &SLICE).unwrap();
        assert_eq!(argv[..2], ["python3", "examples/fake_train.py"]);
        let env = ExternalEnv {
            cwd: Some(root),
            ..ExternalEnv::default()
        };
        let (res, lines) = go(&argv, &SLICE, &env);
        let out = res.unwrap();
        let acc = out.metrics["test_acc"];
        assert!((0.0..=1.0).contains(&acc), "{acc}");
        assert!(lines.len() >= 2, "{lines:?}");
    }
}
