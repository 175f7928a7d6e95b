//! One child process supervised: started as the leader of its own process group, its output read in bounded memory, ended with SIGTERM and then SIGKILL after [`TERM_GRACE`], and how it exited described.
//!
//! Both kinds of trial process go through here: a `process`-mode worker (see
//! [`super::process`]) and an external command (see [`super::external`]).
//!
//! - Start: [`Supervised::spawn`] makes the child the leader of a new process group and a child
//!   subreaper (see [`reap::spawn`]), with stdout and stderr piped.
//! - Output: stdout is read on a thread of its own in lines cut at [`LINE_MAX`] bytes, at most
//!   [`QUEUE_BATCHES`] batches ahead (a child that prints faster than its lines are handled
//!   waits on its pipe); stderr is read on another thread, and only its last [`STDERR_KEEP`]
//!   lines are kept, each cut at [`STDERR_LINE_CHARS`] characters.
//! - End: when the run is aborted, or once the child has exited, everything it started (its
//!   group, its descendants and what escaped both) gets SIGTERM, and whatever is left
//!   [`TERM_GRACE`] later gets SIGKILL (see [`reap::end_trial`]).
//! - Exit: [`describe_exit`] turns its status into an [`Exit`], a code or a signal (named by
//!   [`signal_name`]).

use std::io::{self, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};

use super::lines::{self, Tail};
use super::reap;
use crate::cancel::Cancel;
pub use crate::train::stop::{signal_name, Exit};

/// How long a child being ended has between SIGTERM and SIGKILL: long enough for a training
/// script to flush and close its files, short enough that a stopped run ends promptly.
pub const TERM_GRACE: Duration = Duration::from_secs(5);
/// The longest stdout line kept whole; the rest of a longer one is read and dropped, so one
/// endless line holds no more than this.
pub const LINE_MAX: usize = 1 << 20;
/// Batches of stdout lines read ahead of the supervisor at most.
pub const QUEUE_BATCHES: usize = 16;
/// How many stderr lines are kept, for the message of a child that fails.
pub const STDERR_KEEP: usize = 20;
/// The longest stderr line kept, in characters.
pub const STDERR_LINE_CHARS: usize = 1000;
/// The most bytes of one stderr line read into memory (the kept part is cut further).
const STDERR_LINE_BYTES: usize = 4 * STDERR_LINE_CHARS;

/// How a child with this status exited.
pub fn describe_exit(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (_, Some(signal)) => Exit::Signal(signal),
        (Some(code), _) => Exit::Code(code),
        _ => Exit::Unknown,
    }
}

/// The timings of a supervision (tests shorten them).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How often the cancel flag and the child are checked.
    pub poll: Duration,
    /// How long a child being ended has between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How long output is still read after the child exits.
    pub drain: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            poll: Duration::from_millis(100),
            grace: TERM_GRACE,
            drain: Duration::from_secs(1),
        }
    }
}

/// How the supervised child ended.
#[derive(Debug)]
pub enum End {
    /// It exited by itself (or was killed from elsewhere).
    Exited(ExitStatus),
    /// The run was aborted, and the child was ended.
    Interrupted,
}

/// Sees each stderr line as it comes, on the reader's thread.
pub type OnStderr = Box<dyn FnMut(&str) + Send>;

/// A running child, its output read on two threads in bounded memory.
pub struct Supervised {
    child: Child,
    /// Registers the child as one of gpumux's own until it has been waited for.
    _ours: reap::Ours,
    timing: Timing,
    /// Stdout lines as they come, in batches; disconnected at end of file.
    lines: Receiver<Vec<String>>,
    /// The last stderr lines.
    stderr: Arc<Mutex<Tail>>,
    /// Disconnected when stderr reaches end of file.
    stderr_done: Receiver<()>,
}

impl Supervised {
    /// Starts `cmd` as the leader of a new process group, stdout and stderr piped (stdin as
    /// `cmd` sets it). `on_stderr` sees every stderr line as it comes.
    pub fn spawn(
        cmd: &mut Command,
        timing: Timing,
        on_stderr: Option<OnStderr>,
    ) -> io::Result<Supervised> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let (mut child, ours) = reap::spawn(cmd)?;
        let lines = match child.stdout.take() {
            Some(out) => lines::spawn_line_reader(out, LINE_MAX, QUEUE_BATCHES),
            None => bounded(0).1,
        };
        let stderr = Arc::new(Mutex::new(Tail::new(STDERR_KEEP, STDERR_LINE_CHARS)));
        let (done_tx, stderr_done) = bounded::<()>(0);
        if let Some(err) = child.stderr.take() {
            let keep = Arc::clone(&stderr);
            let mut each = on_stderr;
            std::thread::spawn(move || {
                // The thread owns the sender: `stderr_done` disconnects when it ends.
                let _owned = done_tx;
                read_stderr(err, &keep, &mut |line| {
                    if let Some(f) = each.as_mut() {
                        f(line)
                    }
                });
            });
        }
        Ok(Supervised {
            child,
            _ours: ours,
            timing,
            lines,
            stderr,
            stderr_done,
        })
    }

    /// The child's pid, which is also its process group's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdin, when it was piped (dropping it closes it).
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Passes stdout lines to `feed` while the child runs; returns when it exits, or when
    /// `cancel` is aborted, after ending it.
    pub fn supervise(&mut self, cancel: &Cancel, feed: &mut dyn FnMut(String)) -> io::Result<End> {
        let mut open = true;
        // Once stdout has closed, the child is most often exiting: its status is looked for
        // again after 1 ms, then after twice as long each time, up to `poll` (a whole poll
        // here cost each short trial up to 100 ms).
        let mut wait = Duration::from_millis(1);
        loop {
            if cancel.aborted() {
                reap::end_trial(&mut self.child, self.timing.grace);
                return Ok(End::Interrupted);
            }
            if let Some(status) = self.child.try_wait()? {
                return Ok(End::Exited(status));
            }
            if !open {
                std::thread::sleep(wait);
                wait = (wait * 2).min(self.timing.poll);
                continue;
            }
            match self.lines.recv_timeout(self.timing.poll) {
                Ok(batch) => batch.into_iter().for_each(&mut *feed),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
    }

    /// Ends the supervision: after a child that exited by itself, what is still in its pipes
    /// goes to `feed` (what holds them open longer than the drain time is ended first); then
    /// whatever the child left running is ended.
    pub fn finish(&mut self, end: &io::Result<End>, feed: &mut dyn FnMut(String)) {
        if matches!(end, Ok(End::Exited(_)))
            && !self.drain_until(Instant::now() + self.timing.drain, feed)
        {
            reap::end_trial(&mut self.child, self.timing.grace);
            self.drain_until(Instant::now() + self.timing.drain, feed);
        }
        reap::end_trial(&mut self.child, self.timing.grace);
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

    /// The last stderr lines kept, oldest first.
    pub fn stderr_lines(&self) -> Vec<String> {
        let t = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        t.lines().map(str::to_string).collect()
    }
}

/// Reads a child's stderr to its end into `keep`, each line read cut at
/// [`STDERR_LINE_BYTES`]; `each` sees every line as it comes.
fn read_stderr(err: impl Read, keep: &Mutex<Tail>, each: &mut dyn FnMut(&str)) {
    let mut reader = BufReader::new(err);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match lines::read_line_bounded(&mut reader, &mut buf, STDERR_LINE_BYTES) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let line = text.trim_end_matches(['\n', '\r']);
                each(line);
                keep.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_stderr_is_kept_bounded() {
        // 100 lines, one of them endless: the last 20 are kept, each cut at 1,000 characters.
        let mut text = String::new();
        for i in 0..100 {
            if i == 95 {
                text.push_str(&"x".repeat(200_000));
                text.push('\n');
            } else {
                text.push_str(&format!("line {i}\n"));
            }
        }
        text.push_str("last, without a newline");
        let keep = Mutex::new(Tail::new(STDERR_KEEP, STDERR_LINE_CHARS));
        let mut seen = 0;
        read_stderr(text.as_bytes(), &keep, &mut |_| seen += 1);
        assert_eq!(seen, 101);
        let tail = keep.into_inner().unwrap();
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), STDERR_KEEP);
        assert_eq!(lines[0], "line 81");
        assert_eq!(lines[14].len(), 1000);
        assert_eq!(lines[19], "last, without a newline");
    }

    #[test]
    fn an_exit_is_a_code_or_a_named_signal() {
        let status = |raw: i32| ExitStatus::from_raw(raw);
        assert_eq!(describe_exit(status(3 << 8)), Exit::Code(3));
        assert_eq!(describe_exit(status(0)), Exit::Code(0));
        assert_eq!(describe_exit(status(libc::SIGSEGV)), Exit::Signal(11));
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(1000), "unknown signal");
    }

    #[test]
    fn an_aborted_child_is_ended_and_its_lines_stop() {
        let cancel = Cancel::new();
        let timing = Timing {
            poll: Duration::from_millis(20),
            grace: Duration::from_millis(300),
            drain: Duration::from_millis(300),
        };
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; sleep 30"]);
        let mut child = Supervised::spawn(&mut cmd, timing, None).unwrap();
        let mut lines = Vec::new();
        let end = child.supervise(&cancel, &mut |l| {
            lines.push(l);
            cancel.abort();
        });
        assert!(matches!(end, Ok(End::Interrupted)), "{end:?}");
        child.finish(&end, &mut |l| lines.push(l));
        assert_eq!(lines, ["one"]);
    }
}
