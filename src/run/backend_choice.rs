//! The backend of a run: CPU or CUDA, why, the devices opened and what the slice plan knows of them.

use std::sync::Arc;

use crate::data::Dataset;
use crate::engine::cuda::{self, CudaEngine};
use crate::engine::BackendKind;
use crate::error::{EngineError, Error, Result};
use crate::gpu::Discovery;
use crate::job::{BackendChoice, EngineOptions, Job};
use crate::plan::{Budgets, DeviceBudget, MIB};
use crate::sched::{Device, Devices};

/// The engine a run uses, and why.
#[derive(Clone)]
pub struct Resolved {
    pub kind: BackendKind,
    /// The device in words, for every report row (each device, when slices span several).
    pub device: String,
    /// A line for the user: which backend and why.
    pub note: String,
    /// What the slice plan knows of device 0 and of the further devices opened.
    pub budgets: Budgets,
    /// The CUDA engine of device 0 in this process, when the backend is `cuda`.
    pub engine: Option<Arc<CudaEngine>>,
    /// The engines of the further CUDA devices the job's slices name, by number.
    pub more: Vec<(u32, Arc<CudaEngine>)>,
}

impl Resolved {
    /// Opens the devices for this process's trials, uploading the dataset once to each GPU.
    pub fn device_for(&self, data: &Dataset) -> Result<Devices> {
        let Some(engine) = &self.engine else {
            return Ok(Devices::one(Device::Cpu));
        };
        let cuda = |e: &Arc<CudaEngine>| -> Result<Device> {
            Ok(Device::Cuda {
                engine: Arc::clone(e),
                data: e.upload(data)?,
            })
        };
        let more = self
            .more
            .iter()
            .map(|(d, e)| Ok((*d, cuda(e)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Devices::with(cuda(engine)?, more))
    }

    /// Why green contexts cannot be made on one of the CUDA devices, if they cannot.
    pub fn without_green(&self) -> Option<String> {
        let all = self
            .engine
            .iter()
            .map(|e| (0, e))
            .chain(self.more.iter().map(|(d, e)| (*d, e)));
        for (d, e) in all {
            if e.info().green.is_none() {
                return Some(if self.more.is_empty() {
                    "this device or driver has no green contexts".into()
                } else {
                    format!(
                        "device {d} ({}) or its driver has no green contexts",
                        e.info().name
                    )
                });
            }
        }
        None
    }

    /// Opens the further CUDA devices the job's slices name (`slices[i].device`), adding them
    /// to the budgets and the device words. The CPU backend has device 0 only.
    pub fn open_devices(&mut self, job: &Job) -> Result<()> {
        let key = |d: u32| {
            job.file
                .slices
                .as_ref()
                .and_then(|s| s.iter().position(|x| x.device == Some(d)))
                .map_or_else(|| "slices".to_string(), |i| format!("slices.{i}.device"))
        };
        let wanted: Vec<u32> = job.devices().into_iter().filter(|&d| d != 0).collect();
        let Some(first) = &self.engine else {
            return match wanted.first() {
                None => Ok(()),
                Some(&d) => Err(job
                    .invalid(
                        &key(d),
                        format!(
                            "names device {d}, but the CPU backend has device 0 only: drop `device`, or run where the GPUs are — {}",
                            self.note
                        ),
                    )
                    .into()),
            };
        };
        let first = Arc::clone(first);
        for d in wanted {
            if self.more.iter().any(|(n, _)| *n == d) {
                continue;
            }
            let engine = CudaEngine::open(d as usize, &job.engine_options()).map_err(|e| {
                let why = match e {
                    EngineError::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                };
                Error::NoDevice(format!(
                    "{}: {}: cannot open CUDA device {d}: {why}",
                    job.path.display(),
                    key(d)
                ))
            })?;
            self.budgets.more.push((d, budget_of(&engine)));
            self.more.push((d, engine));
        }
        if !self.more.is_empty() {
            let words = std::iter::once(format!("0: {}", device_words(&first)))
                .chain(
                    self.more
                        .iter()
                        .map(|(d, e)| format!("{d}: {}", device_words(e))),
                )
                .collect::<Vec<_>>();
            self.device = words.join(" + ");
        }
        Ok(())
    }
}

/// A CUDA device in words: name, SMs and memory.
fn device_words(engine: &CudaEngine) -> String {
    let info = engine.info();
    format!(
        "{} ({} SMs, {:.0} MiB)",
        info.name,
        info.sm_count,
        info.total_mem_bytes as f64 / MIB
    )
}

/// What the slice plan needs to know of a CUDA device.
fn budget_of(engine: &CudaEngine) -> DeviceBudget {
    let info = engine.info();
    DeviceBudget {
        memory_bytes: info.total_mem_bytes,
        sm_count: Some(info.sm_count),
        sm_granularity: info.green.as_ref().map(|g| g.unit()),
        sm_groups: info.green.as_ref().and_then(|g| g.groups),
        mem_granularity: Some(info.mem_granularity),
    }
}

/// Picks the backend for a choice on this machine, with CUDA device 0 when it is a GPU. `cuda`
/// with no usable GPU is an error. [`Resolved::open_devices`] opens the further devices a job
/// names.
pub fn resolve_backend(
    choice: BackendChoice,
    found: &Discovery,
    opts: &EngineOptions,
) -> Result<Resolved> {
    let cpu = |note: String| Resolved {
        kind: BackendKind::Cpu,
        device: found.host.device_line(),
        note,
        budgets: Budgets::one(DeviceBudget {
            memory_bytes: found.host.memory_bytes,
            sm_count: None,
            sm_granularity: None,
            sm_groups: None,
            mem_granularity: None,
        }),
        engine: None,
        more: Vec::new(),
    };
    if choice == BackendChoice::Cpu {
        return Ok(cpu("backend: cpu (asked for)".into()));
    }
    let cuda =
        cuda::available().and_then(|()| CudaEngine::open(0, opts).map_err(|e| e.to_string()));
    match (choice, cuda) {
        (_, Ok(engine)) => {
            let device = device_words(&engine);
            Ok(Resolved {
                kind: BackendKind::Cuda,
                note: format!("backend: cuda — {device}, {}", engine.info().uuid),
                device,
                budgets: Budgets::one(budget_of(&engine)),
                engine: Some(engine),
                more: Vec::new(),
            })
        }
        (BackendChoice::Cuda, Err(why)) => Err(Error::NoDevice(format!(
            "backend cuda is not usable here: {why}"
        ))),
        (_, Err(why)) => {
            // NVML's reason is the shorter one when there is no driver at all.
            let why = found.no_gpu_reason.clone().unwrap_or(why);
            Ok(cpu(format!(
                "backend: cpu — no usable GPU ({why}); running on the CPU backend"
            )))
        }
    }
}
