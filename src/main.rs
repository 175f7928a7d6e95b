//! The `gpumux` command line: clap's parsing, and each subcommand handed to its file under `cli/`.

mod cli;

use clap::{Parser, Subcommand};

use gpumux::error::{exit, Error};

/// Multiplex one GPU among many concurrent trainings, and measure the time per training with and without the split.
#[derive(Parser, Debug)]
#[command(name = "gpumux", version, about, long_about = None)]
struct Cli {
    /// Print debug lines too: the cuDNN algorithm of each convolution, each process-mode
    /// worker's start-up time and memory, every external trial's output (also set by
    /// GPUMUX_VERBOSE=1).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the devices and the backend; with --n, print the slice plan for N trials.
    Devices(cli::devices_flags::Args),
    /// Run one training, from a job file or from flags, with loss and accuracy each epoch.
    Train(cli::train_flags::Args),
    /// Run the experiment: for each N and split mode, N trials at once; write CSVs, plots and a summary.
    Fib(cli::fib_flags::Args),
    /// Run every trial of the job's parameter space, `concurrency` at a time; resumable and shardable.
    Sweep(cli::sweep_flags::Args),
    /// Combine the results of sweep shards (or several runs) into one folder.
    Merge(cli::merge_flags::Args),
    /// Redraw the plots and summary from result folders; merge several with --out.
    Report(cli::report_flags::Args),
    /// Write a study's results (every worker's trials and epochs) as one folder, at any time.
    Export(cli::export_flags::Args),
    /// Train one model mirrored on several slices: each global batch split by ratios, gradients reduced into one update.
    Parallel(cli::parallel_flags::Args),
    /// Samples/s against batch size for one model on one slice, up to the largest batch that fits its cap.
    BatchScan(cli::batch_scan_flags::Args),
    /// Internal: the child side of `process` mode (reads a request on stdin).
    #[command(hide = true)]
    Worker,
}

fn main() {
    gpumux::outdir::file_size_limit_as_error();
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
    let long_running = matches!(
        cli.command,
        Command::Train(_)
            | Command::Fib(_)
            | Command::Sweep(_)
            | Command::Parallel(_)
            | Command::BatchScan(_)
            | Command::Merge(_)
            | Command::Report(_)
            | Command::Export(_)
    );
    cli::main(cli.verbose, long_running, |out| match cli.command {
        Command::Devices(a) => cli::devices_flags::run(a, out),
        Command::Train(a) => cli::train_flags::run(a, out),
        Command::Fib(a) => cli::fib_flags::run(a, out),
        Command::Sweep(a) => cli::sweep_flags::run(a, out),
        Command::Merge(a) => cli::merge_flags::run(a, out),
        Command::Report(a) => cli::report_flags::run(a, out),
        Command::Export(a) => cli::export_flags::run(a, out),
        Command::Parallel(a) => cli::parallel_flags::run(a, out),
        Command::BatchScan(a) => cli::batch_scan_flags::run(a, out),
        Command::Worker => cli::worker_flags::run(),
    })
}
