//! GPU telemetry: a background NVML sampler for one device (found by UUID) and the summary of what it saw.

use std::collections::BTreeMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};
use serde::Serialize;

/// The slowest sampling rate accepted, in Hz.
pub const MIN_HZ: f64 = 10.0;
/// The fastest sampling rate accepted, in Hz (NVML calls take tens to hundreds of microseconds each).
pub const MAX_HZ: f64 = 1000.0;

const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

/// What a sampler saw, summarised. A metric is `None` when no reading of it succeeded.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Telemetry {
    /// Sampling instants (each may have failed readings).
    pub samples: u64,
    /// Mean GPU utilisation, percent.
    pub gpu_util_mean: Option<f64>,
    /// Peak device memory in use, MiB.
    pub mem_used_peak_mib: Option<f64>,
    /// Mean current SM clock, MHz.
    pub sm_clock_mhz_mean: Option<f64>,
    /// Mean power draw, W.
    pub power_w_mean: Option<f64>,
    /// peak memory per process id seen (running compute processes), MiB
    pub per_process_peak_mib: BTreeMap<u32, f64>,
}

impl Telemetry {
    /// The telemetry of a run without a GPU: no samples, every metric empty.
    pub fn null() -> Telemetry {
        Telemetry::default()
    }
}

/// The telemetry of a run without a GPU: no samples, every metric empty.
pub fn null() -> Telemetry {
    Telemetry::null()
}

/// One sampling instant. Each reading is `None` when it failed (e.g. power is not supported).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// GPU utilisation, percent.
    pub gpu_util: Option<f64>,
    /// Device memory in use, MiB.
    pub mem_used_mib: Option<f64>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: Option<f64>,
    /// Power draw, W.
    pub power_w: Option<f64>,
    /// Running compute processes and their memory (MiB; `None` where NVML does not say),
    /// or `None` when the list could not be read.
    pub processes: Option<Vec<(u32, Option<f64>)>>,
}

/// A running mean over the finite values given to it.
#[derive(Clone, Copy, Debug, Default)]
struct Mean {
    sum: f64,
    count: u64,
}

impl Mean {
    fn add(&mut self, value: Option<f64>) {
        if let Some(v) = value.filter(|v| v.is_finite()) {
            self.sum += v;
            self.count += 1;
        }
    }

    fn get(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// Raises `peak` to `value` when that is finite and higher.
fn raise(peak: &mut Option<f64>, value: Option<f64>) {
    if let Some(v) = value.filter(|v| v.is_finite()) {
        *peak = Some(peak.map_or(v, |p| p.max(v)));
    }
}

/// Folds samples one at a time, so a long run keeps a constant amount of state.
#[derive(Clone, Debug, Default)]
struct Accumulator {
    samples: u64,
    gpu_util: Mean,
    mem_used_peak: Option<f64>,
    sm_clock: Mean,
    power: Mean,
    per_process: BTreeMap<u32, f64>,
}

impl Accumulator {
    fn add(&mut self, s: &Sample) {
        self.samples += 1;
        self.gpu_util.add(s.gpu_util);
        raise(&mut self.mem_used_peak, s.mem_used_mib);
        self.sm_clock.add(s.sm_clock_mhz);
        self.power.add(s.power_w);
        for &(pid, mib) in s.processes.iter().flatten() {
            let mut peak = self.per_process.get(&pid).copied();
            raise(&mut peak, mib);
            if let Some(p) = peak {
                self.per_process.insert(pid, p);
            }
        }
    }

    fn finish(self) -> Telemetry {
        Telemetry {
            samples: self.samples,
            gpu_util_mean: self.gpu_util.get(),
            mem_used_peak_mib: self.mem_used_peak,
            sm_clock_mhz_mean: self.sm_clock.get(),
            power_w_mean: self.power.get(),
            per_process_peak_mib: self.per_process,
        }
    }
}

/// Summarises samples: means and peaks over the readings that succeeded (non-finite values count
/// as failed); a metric with no successful reading is `None`; `samples` counts every instant.
pub fn summarize(samples: &[Sample]) -> Telemetry {
    let mut acc = Accumulator::default();
    samples.iter().for_each(|s| acc.add(s));
    acc.finish()
}

/// Reads every metric of `dev` once; each reading fails on its own.
fn read_nvml(dev: &Device) -> Sample {
    let processes = dev.running_compute_processes().ok().map(|list| {
        list.into_iter()
            .map(|p| {
                let mib = match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes as f64 / BYTES_PER_MIB),
                    UsedGpuMemory::Unavailable => None,
                };
                (p.pid, mib)
            })
            .collect()
    });
    Sample {
        gpu_util: dev.utilization_rates().ok().map(|u| f64::from(u.gpu)),
        mem_used_mib: dev
            .memory_info()
            .ok()
            .map(|m| m.used as f64 / BYTES_PER_MIB),
        sm_clock_mhz: dev.clock_info(Clock::SM).ok().map(f64::from),
        power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        processes,
    }
}

/// Samples with `read` every `period` on a fixed grid of deadlines (start + k·period; a tick
/// missed because a reading was slow is skipped, not made up) until `stop` receives or disconnects.
fn sampling_loop(
    period: Duration,
    stop: &Receiver<()>,
    mut read: impl FnMut() -> Sample,
) -> Accumulator {
    let mut acc = Accumulator::default();
    let mut deadline = Instant::now();
    loop {
        acc.add(&read());
        deadline += period;
        let now = Instant::now();
        while deadline <= now {
            deadline += period;
        }
        match stop.recv_deadline(deadline) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return acc,
        }
    }
}

/// A background thread sampling one GPU through NVML.
///
/// Dropping it without [`Sampler::stop`] ends the thread too (at its next tick), discarding the samples.
pub struct Sampler {
    stop: Sender<()>,
    thread: JoinHandle<Accumulator>,
}

/// The sampling period for a rate in Hz, or why the rate is refused.
fn period_of(hz: f64) -> Result<Duration, String> {
    if !(MIN_HZ..=MAX_HZ).contains(&hz) {
        return Err(format!(
            "telemetry: sampling rate {hz} Hz is outside {MIN_HZ}..={MAX_HZ} Hz"
        ));
    }
    Ok(Duration::from_secs_f64(1.0 / hz))
}

impl Sampler {
    /// Starts a background thread sampling at `hz` (>= 10) until `stop`. Err(String) when NVML or the device is unavailable (never panics).
    ///
    /// `uuid` is the device's NVML/CUDA UUID (`GPU-…`); NVML ignores `CUDA_VISIBLE_DEVICES`, so
    /// the UUID, not an index, names the device. The first sample is taken before this returns.
    pub fn start(uuid: &str, hz: f64) -> Result<Sampler, String> {
        let period = period_of(hz)?;
        let uuid = uuid.to_string();
        Self::spawn(move |ready, stop| {
            // NVML and the device handle (which borrows it) live on the sampling thread.
            let nvml = match Nvml::init() {
                Ok(nvml) => nvml,
                Err(e) => {
                    let _ = ready.send(Err(format!("telemetry: NVML is not available: {e}")));
                    return Accumulator::default();
                }
            };
            let dev = match nvml.device_by_uuid(uuid.as_str()) {
                Ok(dev) => dev,
                Err(e) => {
                    let _ = ready.send(Err(format!("telemetry: no GPU with UUID {uuid}: {e}")));
                    return Accumulator::default();
                }
            };
            let _ = ready.send(Ok(()));
            sampling_loop(period, &stop, || read_nvml(&dev))
        })
    }

    /// Runs `body` on a new thread and waits until it reports that it is ready (or why not).
    fn spawn<F>(body: F) -> Result<Sampler, String>
    where
        F: FnOnce(Sender<Result<(), String>>, Receiver<()>) -> Accumulator + Send + 'static,
    {
        let (ready_tx, ready_rx) = bounded(1);
        let (stop_tx, stop_rx) = bounded(1);
        let thread = std::thread::Builder::new()
            .name("gpumux-telemetry".into())
            .spawn(move || body(ready_tx, stop_rx))
            .map_err(|e| format!("telemetry: cannot start the sampling thread: {e}"))?;
        let ready = ready_rx
            .recv()
            .map_err(|_| "telemetry: the sampling thread ended before it started".to_string())
            .and_then(|r| r);
        match ready {
            Ok(()) => Ok(Sampler {
                stop: stop_tx,
                thread,
            }),
            Err(e) => {
                drop(stop_tx);
                let _ = thread.join();
                Err(e)
            }
        }
    }

    /// Stops the thread and summarises what it saw.
    ///
    /// Returns within about one NVML reading; a sampling thread that panicked gives [`null`].
    pub fn stop(self) -> Telemetry {
        let _ = self.stop.send(());
        match self.thread.join() {
            Ok(acc) => acc.finish(),
            Err(_) => null(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(util: f64, mem: f64, clock: f64, power: f64) -> Sample {
        Sample {
            gpu_util: Some(util),
            mem_used_mib: Some(mem),
            sm_clock_mhz: Some(clock),
            power_w: Some(power),
            processes: Some(Vec::new()),
        }
    }

    #[test]
    fn summary_has_means_and_peaks() {
        let mut a = sample(50.0, 1000.0, 1980.0, 300.0);
        a.processes = Some(vec![(11, Some(400.0)), (12, Some(100.0))]);
        let mut b = sample(100.0, 3000.5, 1410.0, 500.0);
        b.processes = Some(vec![(11, Some(900.25)), (13, None)]);
        let mut c = sample(0.0, 2000.0, 1755.0, 100.0);
        c.processes = Some(vec![(11, Some(50.0)), (12, Some(300.0))]);
        let t = summarize(&[a, b, c]);
        assert_eq!(t.samples, 3);
        assert_eq!(t.gpu_util_mean, Some(50.0));
        assert_eq!(t.mem_used_peak_mib, Some(3000.5));
        assert_eq!(t.sm_clock_mhz_mean, Some(1715.0));
        assert_eq!(t.power_w_mean, Some(300.0));
        let peaks: Vec<(u32, f64)> = t.per_process_peak_mib.into_iter().collect();
        assert_eq!(
            peaks,
            vec![(11, 900.25), (12, 300.0)],
            "13 never had a size"
        );
    }

    #[test]
    fn failed_readings_do_not_count_and_missing_metrics_are_none() {
        let mut a = sample(10.0, 500.0, 1000.0, 0.0);
        a.power_w = None;
        a.processes = None;
        let mut b = sample(30.0, 700.0, 1000.0, 0.0);
        b.power_w = None;
        b.gpu_util = None;
        let c = Sample {
            sm_clock_mhz: Some(f64::NAN),
            gpu_util: Some(f64::INFINITY),
            ..Sample::default()
        };
        let t = summarize(&[a, b, c]);
        assert_eq!(t.samples, 3, "every instant counts, failed or not");
        assert_eq!(
            t.gpu_util_mean,
            Some(10.0),
            "only the finite reading counts"
        );
        assert_eq!(t.mem_used_peak_mib, Some(700.0));
        assert_eq!(t.sm_clock_mhz_mean, Some(1000.0), "NaN is a failed reading");
        assert_eq!(t.power_w_mean, None);
        assert!(t.per_process_peak_mib.is_empty());
    }

    #[test]
    fn no_samples_is_the_null_telemetry() {
        assert_eq!(summarize(&[]), null());
        assert_eq!(null(), Telemetry::default());
        let failed = summarize(&[Sample::default(), Sample::default()]);
        assert_eq!(
            failed,
            Telemetry {
                samples: 2,
                ..null()
            }
        );
    }

    #[test]
    fn telemetry_serialises_with_its_field_names() {
        let mut t = null();
        t.per_process_peak_mib.insert(7, 12.5);
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"sm_clock_mhz_mean\":null"), "{json}");
        assert!(
            json.contains("\"per_process_peak_mib\":{\"7\":12.5}"),
            "{json}"
        );
    }

    #[test]
    fn start_with_a_bogus_uuid_is_an_error_not_a_panic() {
        let started = Instant::now();
        let err = match Sampler::start("GPU-00000000-0000-0000-0000-000000000000", 20.0) {
            Err(e) => e,
            Ok(s) => panic!("a sampler started on a bogus UUID: {:?}", s.stop()),
        };
        assert!(err.starts_with("telemetry: "), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(Sampler::start("not-a-uuid", 10.0).is_err());
    }

    #[test]
    fn rates_outside_the_range_are_refused() {
        for hz in [0.0, 9.99, -5.0, f64::NAN, f64::INFINITY, 1e6] {
            let err = Sampler::start("GPU-x", hz).err();
            assert!(err.is_some_and(|e| e.contains("Hz")), "{hz}");
        }
        assert_eq!(period_of(10.0), Ok(Duration::from_millis(100)));
        assert_eq!(period_of(1000.0), Ok(Duration::from_millis(1)));
    }

    /// A sampler whose readings come from a counter instead of NVML.
    fn fake(period: Duration) -> Sampler {
        Sampler::spawn(move |ready, stop| {
            let _ = ready.send(Ok(()));
            let mut k = 0.0;
            sampling_loop(period, &stop, || {
                k += 1.0;
                Sample {
                    gpu_util: Some(k),
                    ..Sample::default()
                }
            })
        })
        .unwrap()
    }

    #[test]
    fn stop_returns_promptly_and_keeps_the_samples() {
        // A 10 s period: stop must not wait for the next tick.
        let sampler = fake(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
        let asked = Instant::now();
        let t = sampler.stop();
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(t.samples, 1, "one sample at the start");
        assert_eq!(t.gpu_util_mean, Some(1.0));
    }

    #[test]
    fn the_period_is_kept_on_a_deadline_grid() {
        let period = Duration::from_millis(10);
        let sampler = fake(period);
        std::thread::sleep(Duration::from_millis(300));
        let t = sampler.stop();
        // About 31 ticks; a loaded machine may skip some, but never adds extra ones.
        assert!((5..=32).contains(&t.samples), "{}", t.samples);
        // Readings 1..=n: their mean is (n + 1) / 2.
        assert_eq!(t.gpu_util_mean, Some((t.samples as f64 + 1.0) / 2.0));
    }

    #[test]
    fn a_slow_reading_skips_ticks_instead_of_bursting() {
        let (tx, rx) = bounded::<()>(1);
        let mut calls = 0u32;
        let started = Instant::now();
        let acc = sampling_loop(Duration::from_millis(5), &rx, || {
            calls += 1;
            if calls == 1 {
                std::thread::sleep(Duration::from_millis(50));
            }
            if calls == 3 {
                let _ = tx.send(());
            }
            Sample::default()
        });
        // After the slow first reading the next tick is the next grid point, not ten at once:
        // the third call comes at least two periods after the first one ended.
        assert_eq!(acc.samples, 3);
        assert!(started.elapsed() >= Duration::from_millis(55));
    }

    #[test]
    fn a_dropped_sampler_ends_its_thread() {
        let sampler = fake(Duration::from_millis(1));
        let Sampler { stop, thread } = sampler;
        drop(stop);
        let acc = thread.join().unwrap();
        assert!(acc.samples >= 1);
    }
}
