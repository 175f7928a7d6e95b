//! Every process a trial starts ends with the trial: its process group, its descendants, and what escapes both (a `setsid` daemon), caught by making gpumux and each trial's leader child subreapers.
//!
//! How it holds together (Linux):
//! - Each trial's process (an external command, or a `process`-mode worker) leads a process
//!   group of its own, and is a child subreaper (`PR_SET_CHILD_SUBREAPER`, kept across exec):
//!   while it lives, every process it starts stays in its tree, even one whose parent exits.
//! - gpumux itself is a child subreaper: when a trial's leader exits, what it leaves (a
//!   daemon that left the group with `setsid`, a double fork) is re-parented to gpumux instead
//!   of init. So a direct child of gpumux that gpumux did not start ([`spawn`]) and that is not
//!   in gpumux's own process group is always the leftover of a trial that has ended, and is
//!   ended too.
//! - Ending a trial: SIGTERM to its group, its leader's descendants and the leftovers; after a
//!   grace period, SIGKILL to whatever is left, until nothing is.

use std::collections::HashSet;
use std::io;
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The pids of the children gpumux started itself, while they are not yet waited for. Held
/// while spawning and while looking for leftovers, so that a child just forked is never taken
/// for a leftover.
static OURS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn ours() -> MutexGuard<'static, Vec<u32>> {
    OURS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes gpumux a child subreaper, once; false where the kernel refuses (not Linux ≥ 3.4).
pub fn become_subreaper() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: prctl(2) with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
        let ok = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0;
        if !ok {
            tracing::warn!(
                "cannot become a child subreaper ({}): a trial's setsid daemons may outlive it",
                io::Error::last_os_error()
            );
        }
        ok
    })
}

/// A child that gpumux started: registered as one of its own until dropped (after it was
/// waited for).
#[derive(Debug)]
pub struct Ours(u32);

impl Drop for Ours {
    fn drop(&mut self) {
        let mut list = ours();
        if let Some(i) = list.iter().position(|&p| p == self.0) {
            list.swap_remove(i);
        }
    }
}

/// Starts a trial's process as the leader of a new process group that dies with gpumux
/// (`PR_SET_PDEATHSIG`) and keeps its descendants in its tree (`PR_SET_CHILD_SUBREAPER`);
/// gpumux becomes a subreaper first. Keep the [`Ours`] until the child has been waited for.
pub fn spawn(cmd: &mut Command) -> io::Result<(Child, Ours)> {
    use std::os::unix::process::CommandExt;
    become_subreaper();
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // signal(2), which are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                || libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // gpumux ignores SIGXFSZ (see `outdir::file_size_limit_as_error`); a trial's
            // command gets the default, as it would without gpumux.
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut list = ours();
    let child = cmd.spawn()?;
    let pid = child.id();
    list.push(pid);
    Ok((child, Ours(pid)))
}

/// One process, as `/proc/<pid>/stat` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    pub zombie: bool,
}

/// Fields 3 to 5 of a `/proc/<pid>/stat` line: state, ppid, pgrp. The name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(pid: u32, stat: &str) -> Option<Proc> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgid,
        zombie: state == "Z" || state == "X",
    })
}

/// The process `pid`, if it exists.
pub fn proc_of(pid: u32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Every process this one can see.
pub fn snapshot() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_of)
        .collect()
}

/// The descendants of `root` in `procs` (not `root` itself).
pub fn descendants(root: u32, procs: &[Proc]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    let mut seen: HashSet<u32> = HashSet::from([root]);
    while let Some(p) = frontier.pop() {
        for c in procs.iter().filter(|c| c.ppid == p) {
            if seen.insert(c.pid) {
                out.push(c.pid);
                frontier.push(c.pid);
            }
        }
    }
    out
}

/// Whether `pid` descends from `root` (by its chain of parents, read now).
pub fn descends_from(pid: u32, root: u32) -> bool {
    let mut at = pid;
    for _ in 0..4096 {
        match proc_of(at) {
            Some(p) if p.ppid == root => return true,
            Some(p) if p.ppid > 1 && p.ppid != at => at = p.ppid,
            _ => return false,
        }
    }
    false
}

/// The leftovers of ended trials in `procs`: direct children of gpumux that it did not start
/// and that are not in its own process group (see the module's notes).
fn leftovers(procs: &[Proc], ours: &[u32]) -> Vec<Proc> {
    let me = std::process::id();
    // SAFETY: getpgrp only reads this process's group.
    let my_group = unsafe { libc::getpgrp() } as u32;
    procs
        .iter()
        .filter(|p| p.ppid == me && p.pgid != my_group && !ours.contains(&p.pid))
        .copied()
        .collect()
}

/// Waits for (reaps) the leftovers that have exited, and returns those still running.
fn reap_leftovers(procs: &[Proc], ours: &[u32]) -> Vec<u32> {
    let mut alive = Vec::new();
    for p in leftovers(procs, ours) {
        let mut status = 0;
        // SAFETY: waitpid on a child of this process that no `Child` handle owns.
        let r = unsafe { libc::waitpid(p.pid as libc::pid_t, &mut status, libc::WNOHANG) };
        if r == 0 {
            alive.push(p.pid);
        }
    }
    alive
}

/// The processes of a trial still running: its leader (when `leader_alive`), the leader's
/// descendants, the members of its process group, and every leftover of an ended trial.
fn members(leader: u32, leader_alive: bool) -> Vec<u32> {
    let list = ours();
    let procs = snapshot();
    let mut out: Vec<u32> = reap_leftovers(&procs, &list);
    drop(list);
    if leader_alive {
        out.push(leader);
        out.extend(descendants(leader, &procs));
    }
    out.extend(
        procs
            .iter()
            .filter(|p| p.pgid == leader && p.pid != leader)
            .map(|p| p.pid),
    );
    let me = std::process::id();
    let alive: HashSet<u32> = procs.iter().filter(|p| !p.zombie).map(|p| p.pid).collect();
    let mut seen = HashSet::new();
    out.retain(|&p| p != me && p > 1 && alive.contains(&p) && seen.insert(p));
    out
}

fn signal_all(pids: &[u32], group: u32, sig: libc::c_int) {
    kill_group(group, sig);
    for &p in pids {
        if let Ok(pid) = libc::pid_t::try_from(p) {
            if pid > 1 {
                // SAFETY: kill(2) only sends a signal, to a process of the trial being ended.
                unsafe { libc::kill(pid, sig) };
            }
        }
    }
}

/// Sends `sig` to every process of group `pgid` (a group that is gone is no error).
pub fn kill_group(pgid: u32, sig: libc::c_int) {
    let Ok(id) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if id > 1 {
        // SAFETY: killpg only sends a signal; the group is a trial's own (its leader's pid).
        unsafe {
            libc::killpg(id, sig);
        }
    }
}

/// Ends a trial whose leader is `child` (the leader of process group `child.id()`), whether it
/// still runs or has exited: SIGTERM to everything of it, `grace` to go, then SIGKILL until
/// nothing is left. The leader is reaped. Returns whether anything had to be killed.
pub fn end_trial(child: &mut Child, grace: Duration) -> bool {
    let leader = child.id();
    let alive = |c: &mut Child| matches!(c.try_wait(), Ok(None));
    let first = members(leader, alive(child));
    if first.is_empty() {
        let _ = child.try_wait();
        return false;
    }
    signal_all(&first, leader, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        let left = members(leader, alive(child));
        if left.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..200 {
        let left = members(leader, alive(child));
        if left.is_empty() {
            break;
        }
        signal_all(&left, leader, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
    true
}

/// Kills at once every process of every trial: each child gpumux started, their descendants
/// and groups, and the leftovers. For a forced exit; the caller exits right after.
pub fn kill_everything() {
    let list = ours().clone();
    for _ in 0..20 {
        let procs = snapshot();
        let mut pids = leftovers(&procs, &list)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>();
        for &leader in &list {
            pids.push(leader);
            pids.extend(descendants(leader, &procs));
            kill_group(leader, libc::SIGKILL);
        }
        pids.retain(|&p| procs.iter().any(|q| q.pid == p && !q.zombie));
        if pids.is_empty() {
            return;
        }
        signal_all(&pids, 0, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_after_the_name() {
        let p = parse_stat(42, "42 (py (x) y) S 7 4040 4040 0 -1").unwrap();
        assert_eq!((p.ppid, p.pgid, p.zombie), (7, 4040, false));
        assert!(parse_stat(1, "1 (z) Z 0 1 1").unwrap().zombie);
        assert_eq!(parse_stat(1, "garbage"), None);
        let me = proc_of(std::process::id()).unwrap();
        // SAFETY: getpgrp only reads this process's group.
        assert_eq!(me.pgid, unsafe { libc::getpgrp() } as u32);
    }

    #[test]
    fn descendants_follow_the_parent_links() {
        let p = |pid, ppid| Proc {
            pid,
            ppid,
            pgid: pid,
            zombie: false,
        };
        let procs = [p(10, 1), p(11, 10), p(12, 11), p(13, 1), p(14, 12)];
        let mut d = descendants(10, &procs);
        d.sort_unstable();
        assert_eq!(d, vec![11, 12, 14]);
        assert!(descendants(13, &procs).is_empty());
    }
}
