//! The integration tests' shared setup: the gpumux binary run with a time limit, temporary folders, and (in the files beside this one) job files from a builder, tiny datasets, the results CSVs, and signals to a running child.
//!
//! Each test file includes it with `mod support;` and uses only part of it.

#![allow(dead_code)]

mod data;
mod job;
mod process;
mod results;

// Each test binary uses only some of these.
#[allow(unused_imports)]
pub use {data::*, job::*, process::*, results::*};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

// Running gpumux.

/// How long a run may take before it is killed and the test fails.
pub const RUN_LIMIT: Duration = Duration::from_secs(600);

/// One gpumux command line, ready to run to its end or to start.
pub struct Run {
    cmd: Command,
    what: String,
    limit: Duration,
}

/// gpumux with `args`, run in `cwd`, stdin closed, and SIGHUP, SIGINT and SIGTERM at their
/// default dispositions, whatever the test runner inherited: under `nohup`, or started in the
/// background by a shell (which ignores SIGINT), gpumux would rightly leave an ignored signal
/// ignored, and the tests that send it would wait in vain.
pub fn run(cwd: &Path, args: &[&str]) -> Run {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.current_dir(cwd).args(args).stdin(Stdio::null());
    // SAFETY: signal(2) is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
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
        Watched::new(self.spawn())
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

    /// Writes an executable shell script `name` here, with `body` after its `#!/bin/sh` line.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.join(name);
        write_executable(&p, &format!("#!/bin/sh\n{body}"));
        p
    }

    /// Writes a grid job `name` running `command` (YAML-quoted here) once for each value of
    /// the parameter `lr` in `lrs`, `concurrency` trials at a time.
    pub fn command_job(
        &self,
        name: &str,
        command: &str,
        lrs: &[String],
        concurrency: usize,
    ) -> PathBuf {
        let lrs: Vec<&str> = lrs.iter().map(String::as_str).collect();
        self.job(
            &format!("{name}.yaml"),
            JobYaml::new()
                .name(name)
                .command(command)
                .method("grid")
                .param("lr", values(&lrs))
                .concurrency(concurrency),
        )
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
