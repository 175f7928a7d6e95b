//! The `gpumux` command line: a thin clap layer over the library, mapping each error to a stable exit code.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use gpumux::commands::{self, FibOptions};
use gpumux::error::{exit, Error};
use gpumux::job::{
    AutoWord, BackendChoice, BatchRatios, Concurrency, Goal, Job, JobFile, ModelKind, ModelSpec,
    Optimizer, SplitMode, TrainSpec,
};
use gpumux::parallel::run::ParallelOptions;
use gpumux::parallel::scan::ScanOptions;
use gpumux::sweep::{Shard, SweepOptions};

/// Multiplex one GPU among many concurrent trainings, and measure the time per training with and without the split.
#[derive(Parser, Debug)]
#[command(name = "gpumux", version, about, long_about = None)]
struct Cli {
    /// Print debug lines too: the cuDNN algorithm of each convolution, each process-mode
    /// worker's start-up time and memory (also set by GPUMUX_VERBOSE=1).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the devices and the backend; with --n, print the slice plan for N trials.
    Devices {
        /// Number of trials (slices) to plan for.
        #[arg(long)]
        n: Option<u32>,
        /// Split mode of the plan.
        #[arg(long, default_value = "logical")]
        split: SplitMode,
        /// Cap each slice at this many MiB.
        #[arg(long, conflicts_with = "fraction")]
        mib_per_slice: Option<f64>,
        /// Share this fraction of device memory equally between slices (default 0.9).
        #[arg(long)]
        fraction: Option<f64>,
        /// Plan slices of unequal size in these proportions (caps, and SMs in green mode), e.g. 5,3.
        #[arg(long, value_delimiter = ',')]
        ratios: Option<Vec<f64>>,
        /// The backend to describe: auto (the GPU when one works), or cuda, which exits with
        /// code 4 when no GPU can be used.
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
    },
    /// Run one training, from a job file or from flags, with loss and accuracy each epoch.
    Train(TrainArgs),
    /// Run the experiment: for each N and split mode, N trials at once; write CSVs, plots and a summary.
    Fib {
        /// The job file (YAML).
        job: PathBuf,
        /// Output folder (default out/<job name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Folder that relative data paths are taken from.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Override the job's backend.
        #[arg(long, value_enum)]
        backend: Option<BackendChoice>,
        /// Override the job's N list, e.g. 1,2,3.
        #[arg(long, value_delimiter = ',')]
        n: Option<Vec<u32>>,
        /// Override the job's split modes, e.g. shared,logical.
        #[arg(long, value_delimiter = ',')]
        splits: Option<Vec<SplitMode>>,
        /// Override the job's epochs.
        #[arg(long)]
        epochs: Option<u32>,
        #[command(flatten)]
        engine: EngineFlags,
    },
    /// Run every trial of the job's parameter space, `concurrency` at a time; resumable and shardable.
    Sweep(SweepArgs),
    /// Combine the results of sweep shards (or several runs) into one folder.
    Merge {
        /// Sweep result folders holding trials.csv.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where the merged trials.csv and progress.csv go.
        #[arg(long)]
        out: PathBuf,
        /// Whether a larger or smaller metric is better, to name the best trial.
        #[arg(long, value_enum, default_value = "maximize")]
        goal: GoalArg,
    },
    /// Redraw the plots and summary from result folders; merge several with --out.
    Report {
        /// Result folders holding runs.csv and trials.csv.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Write the merged CSVs and plots here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Train one model mirrored on several slices: each global batch split by ratios, gradients reduced into one update.
    Parallel(ParallelArgs),
    /// Samples/s against batch size for one model on one slice, up to the largest batch that fits its cap.
    BatchScan(ScanArgs),
    /// Internal: the child side of `process` mode (reads a request on stdin).
    #[command(hide = true)]
    Worker,
}

#[derive(clap::Args, Debug)]
struct SweepArgs {
    /// The job file (YAML).
    job: PathBuf,
    /// Output folder (default out/<job name>-sweep[/shard-i-of-n]).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append to the results in --out and skip trials already COMPLETE there.
    #[arg(long)]
    resume: bool,
    /// Run only part i of n of the trials (by trial id), e.g. 2/4, for job arrays.
    #[arg(long)]
    shard: Option<Shard>,
    /// Print the trials, slices and caps, and run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Seconds running trials may go on after SIGINT/SIGTERM before they are stopped.
    #[arg(long, default_value_t = 30.0, value_parser = grace_seconds)]
    grace: f64,
    /// Trials at a time (a number or auto); overrides the job's `concurrency`.
    #[arg(long)]
    concurrency: Option<String>,
    /// Split mode; overrides the job's `split`.
    #[arg(long)]
    split: Option<SplitMode>,
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
    #[command(flatten)]
    engine: EngineFlags,
}

#[derive(clap::Args, Debug)]
struct ParallelArgs {
    /// The job file (YAML); its `parallel:` section, or the flags below, say how.
    job: PathBuf,
    /// Output folder (default out/<job name>-parallel).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replicas, one per slice; overrides `parallel.slices`.
    #[arg(long)]
    slices: Option<u32>,
    /// How each global batch is split: even, auto, or weights such as 3,2 (or 3:2); overrides `parallel.ratios`.
    #[arg(long)]
    ratios: Option<BatchRatios>,
    /// The global batch (the sum of the shards); overrides `train.batch_size`.
    #[arg(long)]
    batch_size: Option<u32>,
    #[arg(long)]
    epochs: Option<u32>,
    /// Split mode of the slices (shared, logical or green); overrides the job's `split`.
    #[arg(long)]
    split: Option<SplitMode>,
    /// Print the slice plan and the shards, and train nothing.
    #[arg(long)]
    dry_run: bool,
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
}

#[derive(clap::Args, Debug)]
struct ScanArgs {
    /// The job file (YAML): the model, data, optimiser and the slice plan whose cap applies.
    job: PathBuf,
    /// Output folder (default out/<job name>-batch-scan).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The first batch size; each next one doubles.
    #[arg(long, default_value_t = 1)]
    start: usize,
    /// Stop after this batch size even if larger ones fit.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Which slice of the plan gives the cap.
    #[arg(long, default_value_t = 0)]
    slice: u32,
    /// Seconds of timed training per batch size.
    #[arg(long, default_value_t = gpumux::parallel::probe::TARGET_S, value_parser = scan_seconds)]
    seconds: f64,
    /// Split mode whose slice plan gives the cap; overrides the job's `split`.
    #[arg(long)]
    split: Option<SplitMode>,
    /// Cap the slice at this many MiB; overrides `memory`.
    #[arg(long)]
    mib_per_slice: Option<f64>,
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum GoalArg {
    Maximize,
    Minimize,
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
struct TrainArgs {
    /// A job file to take the trial from (flags below override it).
    job: Option<PathBuf>,
    /// Which trial of the job's parameter space (0-based).
    #[arg(long, default_value_t = 0)]
    trial: u32,
    #[arg(long, value_enum)]
    model: Option<ModelArg>,
    /// MLP hidden widths, e.g. 256,128,100.
    #[arg(long, value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// ResNet width multiplier, e.g. 0.0625 for a reduced ResNet-50.
    #[arg(long)]
    width: Option<f64>,
    /// ResNet stem: imagenet (7×7/2 conv and max-pool) or cifar (3×3/1 conv).
    #[arg(long, value_enum)]
    stem: Option<StemArg>,
    /// Data source: mnist-10k, fashion-mnist, idx, cifar10 or synthetic.
    #[arg(long)]
    data: Option<String>,
    /// Data folder (for fashion-mnist, idx, cifar10, or a copy of mnist-10k).
    #[arg(long)]
    data_path: Option<PathBuf>,
    /// Folder that relative data paths are taken from.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    epochs: Option<u32>,
    #[arg(long)]
    batch_size: Option<u32>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, value_enum)]
    optimizer: Option<OptArg>,
    #[arg(long)]
    momentum: Option<f64>,
    #[arg(long)]
    weight_decay: Option<f64>,
    #[arg(long)]
    dropout: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
    #[command(flatten)]
    engine: EngineFlags,
}

/// Engine switches shared by `train` and `fib` (GPU only; the CPU ignores them).
#[derive(clap::Args, Debug, Default)]
struct EngineFlags {
    /// Run each training step eagerly instead of replaying a captured CUDA graph.
    #[arg(long)]
    no_graphs: bool,
    /// Let cuBLAS use TF32 tensor cores for FP32 GEMMs.
    #[arg(long)]
    tf32: bool,
}

impl EngineFlags {
    fn apply(&self, file: &mut JobFile) {
        if self.no_graphs {
            file.engine.graphs = false;
        }
        if self.tf32 {
            file.engine.tf32 = true;
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ModelArg {
    Mlp,
    Cnn,
    Resnet50,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum StemArg {
    Imagenet,
    Cifar,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum OptArg {
    Sgd,
    Adam,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are no errors (clap prints them on stdout); a bad flag is
            // bad input.
            let _ = e.print();
            std::process::exit(if e.use_stderr() {
                Error::Usage(e.kind().to_string()).exit_code()
            } else {
                exit::OK
            });
        }
    };
    // Before any thread starts: the driver reads it in cuInit.
    gpumux::engine::cuda::choose_module_loading();
    let verbose = cli.verbose || std::env::var("GPUMUX_VERBOSE").is_ok_and(|v| v == "1");
    if verbose {
        // Process-mode workers are children of this process: they log as verbosely.
        std::env::set_var("GPUMUX_VERBOSE", "1");
    }
    // Log lines go to stderr: plain when it is not a terminal (Slurm logs), coloured when it is.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(if verbose {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        })
        .init();
    // The long-running commands watch SIGINT/SIGTERM from their first moment: a signal stops
    // them with what they measured kept, and exit code 3 (see `sched::cancel`).
    if matches!(
        cli.command,
        Command::Train(_)
            | Command::Fib { .. }
            | Command::Sweep(_)
            | Command::Parallel(_)
            | Command::BatchScan(_)
    ) {
        if let Err(e) = gpumux::sched::cancel::watch_signals() {
            tracing::warn!("cannot watch for SIGINT/SIGTERM: {e}");
        }
    }
    let mut out = QuietStdout::default();
    // A panic is a bug, not a signal or bad input: it is exit 1 like any unexpected failure.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli, &mut out)))
        .unwrap_or_else(|payload| {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Internal(format!("panic: {text}")))
        });
    let res = match ran {
        // A signal came and the command ended without it (it was done, or watches none): it
        // was interrupted all the same.
        Ok(()) if gpumux::sched::cancel::signals_seen() > 0 => {
            Err(Error::Interrupted("a signal came before the end".into()))
        }
        other => other,
    };
    let _ = out.flush();
    let code = match res {
        Ok(()) => exit::OK,
        Err(e) => {
            // Not eprintln!, which panics when stderr is closed.
            let _ = writeln!(std::io::stderr(), "error: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}

/// Standard output that goes quiet when its reader has gone away (`gpumux sweep ... | head -1`):
/// a broken pipe ends the output, never the work, which finishes and exits with its own code.
#[derive(Default)]
struct QuietStdout {
    closed: bool,
}

impl QuietStdout {
    /// Runs one write; a broken pipe closes this output for good and counts as written.
    fn quietly<T>(
        &mut self,
        done: T,
        op: impl FnOnce(&mut std::io::Stdout) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        if self.closed {
            return Ok(done);
        }
        match op(&mut std::io::stdout()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(done)
            }
            other => other,
        }
    }
}

impl Write for QuietStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.quietly(buf.len(), |o| o.write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.quietly((), |o| o.write_all(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.quietly((), |o| o.flush())
    }
}

fn run(cli: Cli, stdout: &mut QuietStdout) -> Result<(), Error> {
    match cli.command {
        Command::Devices {
            n,
            split,
            mib_per_slice,
            fraction,
            ratios,
            backend,
        } => {
            let n = n.or(ratios.as_ref().map(|r| r.len() as u32));
            commands::devices(
                backend,
                n,
                split,
                mib_per_slice,
                fraction,
                ratios.as_deref(),
                stdout,
            )
        }
        Command::Train(args) => {
            let (job, trial, data_dir) = train_job(args)?;
            commands::train(&job, trial, data_dir.as_deref(), stdout)
        }
        Command::Fib {
            job,
            out,
            data_dir,
            backend,
            n,
            splits,
            epochs,
            engine,
        } => {
            let job = load_with(&job, |file| {
                if let Some(b) = backend {
                    file.backend = b;
                }
                if let Some(n) = n {
                    file.n = n;
                }
                if let Some(s) = splits {
                    file.splits = s;
                }
                if let Some(e) = epochs {
                    file.train.epochs = e;
                }
                engine.apply(file);
            })?;
            let opts = FibOptions {
                out,
                data_dir,
                worker_exe: worker_exe()?,
                command: std::env::args().collect::<Vec<_>>().join(" "),
                progress: std::io::stderr().is_terminal(),
            };
            commands::fib(&job, &opts, stdout).map(|_| ())
        }
        Command::Report { dirs, out } => commands::report(&dirs, out.as_deref(), stdout),
        Command::Worker => commands::worker(),
        Command::Parallel(a) => parallel(a, stdout),
        Command::BatchScan(a) => batch_scan(a, stdout),
        Command::Sweep(a) => sweep(a, stdout),
        Command::Merge { dirs, out, goal } => {
            let goal = match goal {
                GoalArg::Maximize => Goal::Maximize,
                GoalArg::Minimize => Goal::Minimize,
            };
            gpumux::sweep::merge::run(&dirs, &out, goal, stdout)
        }
    }
}

fn sweep(a: SweepArgs, stdout: &mut QuietStdout) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        if let Some(b) = a.backend {
            file.backend = b;
        }
        a.engine.apply(file);
    })?;
    let concurrency = match a.concurrency.as_deref() {
        None => None,
        Some("auto") => Some(Concurrency::Auto(AutoWord::Auto)),
        Some(n) => match n.parse::<u32>() {
            Ok(n) if n >= 1 => Some(Concurrency::Fixed(n)),
            _ => {
                return Err(Error::Usage(format!(
                    "--concurrency wants a number from 1, or auto, not `{n}`"
                )))
            }
        },
    };
    if !(a.grace.is_finite() && a.grace >= 0.0) {
        return Err(Error::Usage(format!(
            "--grace wants seconds, not {}",
            a.grace
        )));
    }
    let opts = SweepOptions {
        out: a.out,
        data_dir: a.data_dir,
        resume: a.resume,
        shard: a.shard,
        dry_run: a.dry_run,
        grace: std::time::Duration::try_from_secs_f64(a.grace)
            .map_err(|_| Error::Usage(format!("--grace wants seconds, not {}", a.grace)))?,
        concurrency,
        split: a.split,
        worker_exe: worker_exe()?,
        progress: std::io::stderr().is_terminal(),
    };
    gpumux::sweep::run(&job, &opts, stdout).map(|_| ())
}

fn parallel(a: ParallelArgs, stdout: &mut QuietStdout) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        if let Some(b) = a.backend {
            file.backend = b;
        }
        if let Some(b) = a.batch_size {
            file.train.batch_size = b;
            file.parameters.remove("batch_size");
        }
        if let Some(e) = a.epochs {
            file.train.epochs = e;
        }
        if a.slices.is_some() || a.ratios.is_some() {
            let p = file.parallel.get_or_insert_with(Default::default);
            if let Some(k) = a.slices {
                p.slices = Some(k);
                // Ratios listed for another number of slices no longer apply.
                if matches!(&p.ratios, Some(BatchRatios::Weights(w)) if w.len() != k as usize) {
                    p.ratios = None;
                }
            }
            if let Some(r) = a.ratios.clone() {
                p.ratios = Some(r);
            }
        }
    })?;
    let opts = ParallelOptions {
        out: a.out,
        data_dir: a.data_dir,
        split: a.split,
        dry_run: a.dry_run,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    gpumux::parallel::run::run(&job, &opts, stdout).map(|_| ())
}

fn batch_scan(a: ScanArgs, stdout: &mut QuietStdout) -> Result<(), Error> {
    let job = load_with(&a.job, |file| {
        if let Some(b) = a.backend {
            file.backend = b;
        }
        if let Some(m) = a.mib_per_slice {
            file.memory = gpumux::job::MemorySpec {
                fraction: None,
                mib_per_slice: Some(m),
            };
        }
    })?;
    let opts = ScanOptions {
        out: a.out,
        data_dir: a.data_dir,
        split: a.split,
        slice: a.slice,
        start: a.start,
        max_batch: a.max_batch,
        seconds: a.seconds,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    gpumux::parallel::scan::run(&job, &opts, stdout).map(|_| ())
}

/// The longest `--grace`, in seconds (a week).
const MAX_GRACE_S: f64 = 7.0 * 24.0 * 3600.0;
/// The longest `--seconds` of batch-scan, in seconds (an hour per batch size).
const MAX_SCAN_S: f64 = 3600.0;

/// A number of seconds given as a flag: finite, in `[min, max]` (above `min` when `open`).
fn seconds_between(s: &str, min: f64, open: bool, max: f64) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    let low_ok = if open { x > min } else { x >= min };
    if !(x.is_finite() && low_ok && x <= max) {
        let low = if open { "above" } else { "from" };
        return Err(format!("wants seconds {low} {min} up to {max}, not {s}"));
    }
    Ok(x)
}

/// `--grace`: 0 to a week.
fn grace_seconds(s: &str) -> Result<f64, String> {
    seconds_between(s, 0.0, false, MAX_GRACE_S)
}

/// `--seconds` of batch-scan: more than 0, up to an hour.
fn scan_seconds(s: &str) -> Result<f64, String> {
    seconds_between(s, 0.0, true, MAX_SCAN_S)
}

/// The gpumux executable, which `process` mode runs as `gpumux worker`.
fn worker_exe() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(Error::io("cannot find the gpumux executable"))
}

/// Loads a job file and applies flag overrides; a changed job is checked again.
fn load_with(path: &std::path::Path, overrides: impl FnOnce(&mut JobFile)) -> Result<Job, Error> {
    let loaded = Job::load(path)?;
    let mut file = loaded.file.clone();
    overrides(&mut file);
    if file == loaded.file {
        Ok(loaded)
    } else {
        rebuild(file, &loaded)
    }
}

/// A job whose fields were overridden by flags, checked again; it keeps the original name.
fn rebuild(mut file: JobFile, original: &Job) -> Result<Job, Error> {
    file.name = Some(original.name.clone());
    Ok(Job::from_file(file, &original.path)?)
}

fn train_job(a: TrainArgs) -> Result<(Job, u32, Option<PathBuf>), Error> {
    let base = match &a.job {
        Some(p) => Some(Job::load(p)?),
        None => None,
    };
    let mut file = match &base {
        Some(j) => j.file.clone(),
        None => JobFile {
            name: Some("train".into()),
            model: Some(ModelSpec::of(ModelKind::Mlp)),
            data: Some(gpumux::data::DataSpec::of(gpumux::data::Source::Mnist10k)),
            command: None,
            metric: Default::default(),
            run_cap: None,
            concurrency: Default::default(),
            split: SplitMode::Logical,
            train: TrainSpec::default(),
            seed: 0,
            method: Default::default(),
            parameters: Default::default(),
            n: vec![1],
            splits: vec![SplitMode::Shared],
            memory: Default::default(),
            backend: BackendChoice::Auto,
            engine: Default::default(),
            faults: Vec::new(),
            slices: None,
            ratios: None,
            parallel: None,
        },
    };
    if let Some(m) = a.model {
        let kind = match m {
            ModelArg::Mlp => ModelKind::Mlp,
            ModelArg::Cnn => ModelKind::Cnn,
            ModelArg::Resnet50 => ModelKind::Resnet50,
        };
        if file.model.as_ref().map(|m| m.kind) != Some(kind) {
            file.model = Some(ModelSpec::of(kind));
        }
    }
    if let Some(h) = a.hidden {
        if let Some(m) = file.model.as_mut() {
            m.hidden = Some(h);
        }
    }
    if let Some(w) = a.width {
        if let Some(m) = file.model.as_mut() {
            m.width = Some(w);
        }
    }
    if let Some(st) = a.stem {
        if let Some(m) = file.model.as_mut() {
            m.stem = Some(match st {
                StemArg::Imagenet => gpumux::job::Stem::Imagenet,
                StemArg::Cifar => gpumux::job::Stem::Cifar,
            });
        }
    }
    if let Some(d) = a.data {
        let source: gpumux::data::Source = serde_yaml::from_str(&d)
            .map_err(|_| Error::Usage(format!("--data: unknown source `{d}` (expected mnist-10k, fashion-mnist, idx, cifar10 or synthetic)")))?;
        file.data = Some(gpumux::data::DataSpec::of(source));
    }
    if let Some(p) = a.data_path {
        if let Some(d) = file.data.as_mut() {
            d.path = Some(p);
        }
    }
    let t = &mut file.train;
    let mut set = |name: &str, given: bool| {
        if given {
            file.parameters.remove(name);
        }
    };
    set("batch_size", a.batch_size.is_some());
    set("lr", a.lr.is_some());
    set("optimizer", a.optimizer.is_some());
    set("momentum", a.momentum.is_some());
    set("weight_decay", a.weight_decay.is_some());
    set("dropout", a.dropout.is_some());
    if let Some(v) = a.epochs {
        t.epochs = v;
    }
    if let Some(v) = a.batch_size {
        t.batch_size = v;
    }
    if let Some(v) = a.lr {
        t.lr = v;
    }
    if let Some(v) = a.optimizer {
        t.optimizer = match v {
            OptArg::Sgd => Optimizer::Sgd,
            OptArg::Adam => Optimizer::Adam,
        };
    }
    if let Some(v) = a.momentum {
        t.momentum = v;
    }
    if let Some(v) = a.weight_decay {
        t.weight_decay = v;
    }
    if let Some(v) = a.dropout {
        t.dropout = v;
    }
    if let Some(v) = a.seed {
        file.seed = v;
    }
    if let Some(b) = a.backend {
        file.backend = b;
    }
    a.engine.apply(&mut file);
    let job = match &base {
        Some(j) if file == j.file => j.clone(),
        Some(j) => rebuild(file, j)?,
        None => Job::from_file(file, std::path::Path::new("<flags>"))?,
    };
    Ok((job, a.trial, a.data_dir))
}
