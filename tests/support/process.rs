//! Signals to a running child, and waiting: for a condition, for a line, for a process to be gone.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Collects what `src` gives, line by line, as it comes.
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
    /// Watches `child`, whose stdout and stderr are piped.
    pub fn new(mut child: Child) -> Watched {
        let out = collect(child.stdout.take().expect("stdout"));
        let err = collect(child.stderr.take().expect("stderr"));
        Watched { child, out, err }
    }

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
