//! `gpumux devices`: what this machine has, and with `--n` the slice plan for N trials.

use std::io::Write;
use std::path::Path;

use gpumux::engine::cuda;
use gpumux::error::Error;
use gpumux::gpu::{self, Discovery};
use gpumux::job::{
    BackendChoice, EngineOptions, Job, JobFile, MemorySpec, ModelKind, ModelSpec, SplitMode,
};
use gpumux::plan::{self, MIB};
use gpumux::rounds::say;
use gpumux::run::{self, Unavailable};
use gpumux::runners::parallel::{slice_table, sm_notes};

use super::flags::SplitArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of trials (slices) to plan for.
    #[arg(long)]
    n: Option<u32>,
    /// Split mode of the plan.
    #[arg(long, value_enum, default_value = "logical")]
    split: SplitArg,
    /// Cap each slice at this many MiB.
    #[arg(long, conflicts_with = "fraction")]
    mib_per_slice: Option<f64>,
    /// Share this fraction of device memory equally between slices (default 0.9).
    #[arg(long)]
    fraction: Option<f64>,
    /// Plan slices of unequal size in these proportions (caps, and SMs in green mode), e.g. 5,3.
    #[arg(long, value_delimiter = ',')]
    ratios: Option<Vec<f64>>,
    /// The backend to describe: auto (the GPU when one works), or cuda, which exits with
    /// code 4 when no GPU can be used.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendChoice,
}

pub fn run(a: Args, out: &mut dyn Write) -> Result<(), Error> {
    let found = gpu::discover();
    describe_machine(&found, out)?;
    let r = run::resolve_backend(a.backend, &found, &EngineOptions::default())?;
    say(out, r.note.clone())?;
    if let Some(engine) = &r.engine {
        describe_cuda(engine, &found, out)?;
    }
    let Some(n) = a.n.or(a.ratios.as_ref().map(|r| r.len() as u32)) else {
        return Ok(());
    };
    let split = SplitMode::from(a.split);
    // The planner's job, made of typed values.
    let file = JobFile {
        name: Some("devices".into()),
        model: Some(ModelSpec::of(ModelKind::Mlp)),
        data: Some(gpumux::data::DataSpec::of(gpumux::data::Source::Synthetic)),
        n: vec![n],
        splits: vec![split],
        memory: MemorySpec {
            mib_per_slice: a.mib_per_slice,
            fraction: a.mib_per_slice.is_none().then_some(a.fraction).flatten(),
        },
        ratios: a.ratios.clone(),
        ..JobFile::default()
    };
    let job = Job::from_file(file, Path::new("<flags>"))?;
    match run::unavailable(split, &r) {
        Some(Unavailable::NeedsGpu) => {
            say(
                out,
                format!("split {split} needs a GPU; on the CPU backend it is not available"),
            )?;
            return Ok(());
        }
        Some(why) => say(out, format!("note: split {split} cannot run here: {why}"))?,
        None => {}
    }
    let slices = plan::slices(&job, n, split, &r.budgets)?;
    let plan_words = match &a.ratios {
        Some(r) => format!(
            "{} unequal slices (ratios {}) for N={n}",
            slices.len(),
            r.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
        None => format!("N={n}"),
    };
    say(
        out,
        format!("slice plan: {plan_words}, split {split}, on {}", r.device),
    )?;
    for line in slice_table(&slices) {
        say(out, line)?;
    }
    for note in sm_notes(&job, split, r.kind, &slices) {
        say(out, note)?;
    }
    Ok(())
}

/// The GPUs NVML sees, and the host.
fn describe_machine(found: &Discovery, out: &mut dyn Write) -> Result<(), Error> {
    if found.gpus.is_empty() {
        say(
            out,
            format!(
                "GPUs: none ({})",
                found.no_gpu_reason.as_deref().unwrap_or("unknown reason")
            ),
        )?;
    } else {
        if let Some(d) = &found.driver_version {
            say(out, format!("driver {d}"))?;
        }
        for g in &found.gpus {
            let sms = g
                .sm_count
                .map(|s| format!("{s} SMs"))
                .unwrap_or_else(|| "SMs: n/a without CUDA".into());
            say(
                out,
                format!(
                    "GPU {}: {} [{}] {:.0} MiB, {sms}",
                    g.index,
                    g.name,
                    g.uuid,
                    g.memory_bytes as f64 / MIB
                ),
            )?;
        }
    }
    say(out, format!("host: {}", found.host.device_line()))
}

/// CUDA device 0 as opened, the libraries bound, and the other devices.
fn describe_cuda(
    engine: &cuda::CudaEngine,
    found: &Discovery,
    out: &mut dyn Write,
) -> Result<(), Error> {
    say(out, cuda_device_line(engine.info(), found))?;
    // The files the CUDA libraries were really bound from, by absolute path.
    for b in gpu::libs::bound() {
        say(out, b.line())?;
    }
    let loading = cuda::module_loading().unwrap_or("unknown");
    let var = std::env::var("CUDA_MODULE_LOADING").unwrap_or_default();
    say(
        out,
        format!("module loading: {loading} (CUDA_MODULE_LOADING={var})"),
    )?;
    if engine.conv_engine() == "gemm" {
        say(
            out,
            "library cudnn: none (convolutions run as im2col kernels and cuBLAS GEMMs)",
        )?;
    }
    // The other devices a job's `slices` may name, described without opening them.
    match cuda::describe_all() {
        Ok(all) => {
            for info in all.iter().filter(|i| i.ordinal != 0) {
                say(out, cuda_device_line(info, found))?;
            }
        }
        Err(e) => say(
            out,
            format!("note: cannot list the other CUDA devices: {e}"),
        )?,
    }
    Ok(())
}

/// A CUDA device in one line: what it is, how green contexts split it, and its NVML match.
fn cuda_device_line(i: &cuda::CudaDeviceInfo, found: &Discovery) -> String {
    let nvml = found.gpus.iter().find(|g| g.uuid == i.uuid);
    let green = match &i.green {
        Some(g) => format!(
            "green contexts: partitions of at least {} SMs, aligned to {}; {}",
            g.min_sms,
            g.sm_alignment,
            g.groups.map_or_else(
                || "the driver did not say how many groups it makes".to_string(),
                |n| format!("the driver makes {n} groups of {} SMs", g.unit())
            )
        ),
        None => "green contexts: not supported".into(),
    };
    format!(
        "CUDA device {}: {} [{}], compute capability {}.{}, {} SMs, {:.0} MiB; {green}; NVML match by UUID: {}",
        i.ordinal,
        i.name,
        i.uuid,
        i.compute_capability.0,
        i.compute_capability.1,
        i.sm_count,
        i.total_mem_bytes as f64 / MIB,
        nvml.map(|g| format!("NVML index {}", g.index))
            .unwrap_or_else(|| "none".into())
    )
}
