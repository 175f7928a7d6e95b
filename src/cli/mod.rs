//! The command line below clap: one file per subcommand, and what every command shares (logging, standard output, the exit code).

pub mod batch_scan_flags;
pub mod devices_flags;
pub mod export_flags;
pub mod fib_flags;
pub mod flags;
pub mod merge_flags;
pub mod parallel_flags;
pub mod report_flags;
pub mod sweep_flags;
pub mod train_flags;
pub mod worker_flags;

use std::io::{IsTerminal, Write};

use gpumux::error::{exit, Error};

/// Runs a parsed command as the whole process: logging on stderr, the signals watched from the
/// first moment when `long_running`, a panic and a signal mapped to their exit codes. Never
/// returns.
pub fn main(
    verbose: bool,
    long_running: bool,
    run: impl FnOnce(&mut QuietStdout) -> Result<(), Error>,
) -> ! {
    // Before any thread starts: the driver reads it in cuInit.
    gpumux::engine::cuda::choose_module_loading();
    let verbose = verbose || self::verbose();
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
    // The long-running commands watch SIGINT, SIGTERM and SIGHUP from their first moment: a signal stops
    // them with what they measured kept, and exit code 3 (see `sched::signals`).
    if long_running {
        gpumux::run::watch_signals();
    }
    let mut out = QuietStdout::default();
    // A panic is a bug, not a signal or bad input: it is exit 1 like any unexpected failure.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut out)))
        .unwrap_or_else(|payload| {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Internal(format!("panic: {text}")))
        });
    let res = match ran {
        // A signal came and the command ended without it (it watches none, or the signal came
        // after it was done): it was interrupted all the same, unless the command found all its
        // work done after the signal (a sweep whose every trial is COMPLETE).
        Ok(()) if gpumux::sched::signals::unsettled_signals() > 0 => {
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

/// Whether the command runs with `--verbose` (or GPUMUX_VERBOSE=1): [`main`] sets
/// GPUMUX_VERBOSE=1 then, before the command starts.
pub fn verbose() -> bool {
    std::env::var("GPUMUX_VERBOSE").is_ok_and(|v| v == "1")
}

/// Standard output that goes quiet when its reader has gone away (`gpumux sweep ... | head -1`):
/// a broken pipe ends the output, never the work, which finishes and exits with its own code.
#[derive(Default)]
pub struct QuietStdout {
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
