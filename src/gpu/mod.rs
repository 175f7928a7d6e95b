//! Device discovery: the physical GPUs through NVML (matched by UUID), or the host when there is none.

pub mod libs;
use serde::Serialize;

/// One physical GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuInfo {
    /// NVML's index (NVML ignores CUDA_VISIBLE_DEVICES; the UUID is what CUDA and NVML agree on).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_bytes: u64,
    /// Streaming multiprocessors, when known (NVML does not report them; CUDA does).
    pub sm_count: Option<u32>,
}

/// The host, which the CPU backend runs on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostInfo {
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
}

impl HostInfo {
    /// The device line used in reports.
    pub fn device_line(&self) -> String {
        format!(
            "cpu: {} ({} cores, {:.0} GiB)",
            self.cpu_model,
            self.cores,
            self.memory_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// What discovery found.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub gpus: Vec<GpuInfo>,
    /// Why no GPU is listed (no driver, no NVML library, no device), when none is.
    pub no_gpu_reason: Option<String>,
    pub driver_version: Option<String>,
    pub host: HostInfo,
}

/// Lists the GPUs through NVML and describes the host. Never fails: a missing driver is a reason, not an error.
pub fn discover() -> Discovery {
    let host = host_info();
    match nvml_gpus() {
        Ok((gpus, driver)) if !gpus.is_empty() => Discovery {
            gpus,
            no_gpu_reason: None,
            driver_version: driver,
            host,
        },
        Ok((_, driver)) => Discovery {
            gpus: Vec::new(),
            no_gpu_reason: Some("NVML found no GPU".into()),
            driver_version: driver,
            host,
        },
        Err(reason) => Discovery {
            gpus: Vec::new(),
            no_gpu_reason: Some(reason),
            driver_version: None,
            host,
        },
    }
}

fn nvml_gpus() -> Result<(Vec<GpuInfo>, Option<String>), String> {
    // NVML is loaded at run time; without a driver this is an error, not a panic.
    let nvml = nvml_wrapper::Nvml::init().map_err(absent_driver)?;
    let driver = nvml.sys_driver_version().ok();
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML could not count devices: {e}"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML could not open device {index}: {e}"))?;
        gpus.push(GpuInfo {
            index,
            name: dev.name().unwrap_or_else(|_| "unknown GPU".into()),
            uuid: dev.uuid().unwrap_or_default(),
            memory_bytes: dev.memory_info().map(|m| m.total).unwrap_or(0),
            sm_count: None,
        });
    }
    Ok((gpus, driver))
}

/// Why NVML cannot start, in a few words. A machine with no driver library is the ordinary case
/// on the CPU: its loader's message is kept for `--verbose` (a debug line), not for every run.
fn absent_driver(e: nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::LibloadingError(why) => {
            tracing::debug!("NVML: {why}");
            "no NVIDIA driver found".into()
        }
        e => format!("no NVIDIA driver found (NVML: {e})"),
    }
}

/// The GPU memory NVML reports for process `pid` on the device `uuid`, in MiB, when it says.
/// NVML is opened once per process. In a container with process ids of its own, NVML's (the
/// host's) do not match and this is `None`.
pub fn process_gpu_mib(uuid: &str, pid: u32) -> Option<f64> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    static NVML: std::sync::OnceLock<Option<nvml_wrapper::Nvml>> = std::sync::OnceLock::new();
    let nvml = NVML
        .get_or_init(|| nvml_wrapper::Nvml::init().ok())
        .as_ref()?;
    let dev = nvml.device_by_uuid(uuid).ok()?;
    let procs = dev.running_compute_processes().ok()?;
    match procs.into_iter().find(|p| p.pid == pid)?.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => Some(bytes as f64 / (1u64 << 20) as f64),
        UsedGpuMemory::Unavailable => None,
    }
}

/// The most resident memory this process has used so far (`VmHWM`), in MiB; `None` off Linux.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The host's CPU model, core count and memory (from /proc on Linux; defaults elsewhere).
pub fn host_info() -> HostInfo {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_bytes = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30);
    HostInfo {
        cpu_model,
        cores,
        memory_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_never_fails_and_explains_an_empty_list() {
        let d = discover();
        assert!(d.host.cores >= 1);
        assert!(d.host.memory_bytes > 0);
        assert_eq!(d.gpus.is_empty(), d.no_gpu_reason.is_some());
        assert!(d.host.device_line().starts_with("cpu: "));
    }
}
