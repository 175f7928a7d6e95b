//! Cancellation: SIGINT, SIGTERM or SIGHUP first stop new launches (drain), then, after a grace period or at the next signal, stop running trials (abort); a signal after that ends the process at once.
//!
//! The signals are watched for the whole process ([`watch_signals`], called by the CLI before a
//! long-running command starts), so that one that comes early (while data loads) is neither lost
//! nor fatal: each [`Cancel`] that subscribes later (`Cancel::on_signals`) is told of the
//! signals already seen.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

pub use crate::cancel::Cancel;
use crate::cancel::Flags;
use crate::error::exit;

/// On the first SIGINT, SIGTERM or SIGHUP: drain at once, and abort `grace` later (or at a second
/// signal); a signal after the abort ends the process at once with exit code 3. Signals that
/// came before this call count. Returns an error when the handlers cannot be installed.
pub fn on_signals(cancel: &Cancel, grace: Duration) -> std::io::Result<()> {
    watch_signals()?;
    let mut subs = WATCHER
        .subscribers
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    subs.retain(|(w, _)| w.strong_count() > 0);
    subs.push((cancel.downgrade(), grace));
    match WATCHER.seen.load(Ordering::SeqCst) {
        0 => {}
        1 => cancel.begin(grace),
        _ => cancel.abort(),
    }
    Ok(())
}

/// The signals seen by this process, and the cancels to tell.
struct Watcher {
    seen: AtomicUsize,
    subscribers: Mutex<Vec<(Weak<Flags>, Duration)>>,
    installed: Mutex<bool>,
}

static WATCHER: Watcher = Watcher {
    seen: AtomicUsize::new(0),
    subscribers: Mutex::new(Vec::new()),
    installed: Mutex::new(false),
};

/// Watches SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) for the rest of the
/// process's life (once; later calls do nothing). From then on these signals no longer kill the
/// process: the first one drains every subscribed [`Cancel`] (and aborts it after its grace),
/// the next one aborts them, and one that comes when all of them are aborted (or when none has
/// subscribed and one signal came already) kills what the trials left running and exits with
/// code 3 at once. SIGHUP is left alone when the process started with it ignored (`nohup`).
pub fn watch_signals() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut installed = WATCHER.installed.lock().unwrap_or_else(|p| p.into_inner());
    if *installed {
        return Ok(());
    }
    let mut watched = vec![SIGINT, SIGTERM];
    if !ignored(SIGHUP) {
        watched.push(SIGHUP);
    }
    let mut signals = signal_hook::iterator::Signals::new(watched)?;
    std::thread::Builder::new()
        .name("gpumux-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(sig);
            }
        })?;
    *installed = true;
    Ok(())
}

/// Whether this process started with `sig` ignored (as `nohup` starts it with SIGHUP).
fn ignored(sig: i32) -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`,
    // which is plain data.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// How many SIGINT, SIGTERM or SIGHUP this process has had since [`watch_signals`].
pub fn signals_seen() -> usize {
    WATCHER.seen.load(Ordering::SeqCst)
}

/// How many signals the command had seen when it found, after them, that all its work was done
/// (see [`settle`]).
static SETTLED: AtomicUsize = AtomicUsize::new(0);

/// Says that every piece of work the command had was done, whatever signals came while it ran:
/// those signals interrupted nothing, and the command may end as if they had not come. A signal
/// after this call still counts (see [`unsettled_signals`]).
pub fn settle() {
    SETTLED.store(signals_seen(), Ordering::SeqCst);
}

/// The signals seen that no [`settle`] accounts for.
pub fn unsettled_signals() -> usize {
    signals_seen().saturating_sub(SETTLED.load(Ordering::SeqCst))
}

/// What one signal does (see [`watch_signals`]).
fn on_signal(sig: i32) {
    let name = super::child::signal_name(sig);
    let n = WATCHER.seen.fetch_add(1, Ordering::SeqCst) + 1;
    let subs: Vec<(Cancel, Duration)> = {
        let list = WATCHER
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        list.iter()
            .filter_map(|(w, g)| Cancel::upgrade(w).map(|c| (c, *g)))
            .collect()
    };
    if n > 1 && subs.iter().all(|(c, _)| c.aborted()) {
        tracing::warn!("{name} again: stopping now");
        super::reap::kill_everything();
        std::process::exit(exit::INTERRUPTED);
    }
    if n == 1 {
        match subs.iter().map(|(_, g)| *g).max() {
            None => tracing::warn!("{name}: stopping as soon as the work in progress allows"),
            Some(g) if g.is_zero() => tracing::warn!("{name}: stopping"),
            Some(g) => tracing::warn!(
                "{name}: launching no more trials; running ones get {:.0} s to finish",
                g.as_secs_f64()
            ),
        }
        for (c, g) in &subs {
            c.begin(*g);
        }
    } else {
        tracing::warn!("{name} again: stopping running trials now");
        for (c, _) in &subs {
            c.abort();
        }
    }
}
