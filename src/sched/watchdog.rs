//! The GPU-memory watchdog of external trials: samples the device's processes (NVML), records the peak of the trial's, and kills them all once they use more than the cap with its margin.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::reap;
use crate::plan::MIB;

/// The watchdog's default tolerance above the cap.
pub const DEFAULT_MARGIN: f64 = 0.05;

/// Opens a device's process list by its UUID, on the watchdog's thread.
pub(crate) type Open = fn(&str) -> Result<Box<dyn ProcSource>, String>;

/// A usable margin: the default where the given one is negative or not a number.
pub(crate) fn margin_of(m: f64) -> f64 {
    if m.is_finite() && m >= 0.0 {
        m
    } else {
        DEFAULT_MARGIN
    }
}

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
pub(crate) fn open_nvml(uuid: &str) -> Result<Box<dyn ProcSource>, String> {
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
pub(crate) struct WatchReport {
    /// The most the group used at one reading, MiB.
    pub peak_mib: Option<f64>,
    /// (used, cap, margin) when it killed the group.
    pub tripped: Option<(f64, f64, f64)>,
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
pub(crate) struct Watchdog {
    stop: Sender<()>,
    thread: JoinHandle<WatchReport>,
}

impl Watchdog {
    /// Starts watching the trial whose leader is `pgid` on the device `uuid`, every `period`;
    /// with `limit` (cap MiB, margin), its processes are killed once over it.
    pub(crate) fn start(
        uuid: &str,
        pgid: u32,
        limit: Option<(f64, f64)>,
        period: Duration,
        open: Open,
    ) -> Watchdog {
        let (stop, stop_rx) = bounded(1);
        let uuid = uuid.to_string();
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
    pub(crate) fn finish(self) -> WatchReport {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::end::Failure;

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
}
