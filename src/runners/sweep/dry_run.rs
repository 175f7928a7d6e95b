//! `sweep --dry-run`: the trials, the slices and their caps, how fused trials group, and the `sbatch` line that fits the job, without running anything.

use std::io::Write;
use std::path::Path;

use crate::error::Result;
use crate::job::{BackendChoice, Concurrency, Job, SplitMode};
use crate::plan::{self, TrialSpec};
use crate::rounds::say;

/// `--dry-run`: the trials, the slices and their caps, without running anything.
pub(super) fn dry_run(
    job: &Job,
    todo: &[TrialSpec],
    split: SplitMode,
    concurrency: Concurrency,
    dir: &Path,
    out: &mut dyn Write,
) -> Result<()> {
    let found = crate::gpu::discover();
    let memory = |bytes: u64| plan::DeviceBudget {
        memory_bytes: bytes,
        sm_count: None,
        sm_granularity: None,
        sm_groups: None,
        mem_granularity: None,
    };
    // NVML's numbers stand in for CUDA's here: nothing is opened in a dry run.
    let mut budget = plan::Budgets {
        first: memory(
            found
                .gpus
                .first()
                .map_or(found.host.memory_bytes, |g| g.memory_bytes),
        ),
        more: job
            .devices()
            .into_iter()
            .filter(|&d| d != 0)
            .filter_map(|d| Some((d, memory(found.gpus.get(d as usize)?.memory_bytes))))
            .collect(),
    };
    let device = found
        .gpus
        .first()
        .map_or_else(|| found.host.device_line(), |g| g.name.clone());
    if split == SplitMode::Fused && job.file.backend != BackendChoice::Cpu {
        // A fused round on a GPU has one slice (see `plan::fused_slices`): mark the GPU as one.
        if let Some(g) = found.gpus.first() {
            budget.first.sm_count = Some(g.sm_count.unwrap_or(0));
        }
    }
    match concurrency {
        Concurrency::Fixed(n) => {
            let n = n.min(todo.len().max(1) as u32);
            let slices = plan::slices(job, n, split, &budget)?;
            let cap = slices.first().and_then(|s| s.cap_mib()).map_or("none".into(), |c| format!("{c:.0} MiB"));
            // Under fused, N trials train at once in groups on fewer slices.
            let what = if split == SplitMode::Fused { "trials" } else { "slices" };
            say(out, format!("{n} {what} at a time on {device}, split {split}, cap per slice {cap}"))?;
            if split == SplitMode::Fused {
                let cpu = budget.first.sm_count.is_none();
                say(out, fused_groups(job, todo, n, slices.len(), cpu)?)?;
            }
        }
        Concurrency::Auto(_) => say(out, format!(
            "concurrency auto: a short probe over N = 1, 2, 3, 5, 8, ... picks it on {device}, split {split}"
        ))?,
    }
    say(out, format!("results would go to {}", dir.display()))?;
    for t in todo.iter().take(DRY_RUN_LISTED) {
        say(
            out,
            format!(
                "  {} seed {:>20} {}",
                t.id,
                t.seed,
                serde_json::to_string(&t.params).unwrap_or_default()
            ),
        )?;
    }
    if todo.len() > DRY_RUN_LISTED {
        say(
            out,
            format!(
                "  ... and {} more trials ({} to run in all)",
                todo.len() - DRY_RUN_LISTED,
                todo.len()
            ),
        )?;
    }
    Ok(())
}

/// How `todo` gathers into fused groups, `n` at a time on `slices` slices, in words. The data is
/// not loaded in a dry run: its shape, the same for every trial, is left out of the keys.
fn fused_groups(job: &Job, todo: &[TrialSpec], n: u32, slices: usize, cpu: bool) -> Result<String> {
    let model = job.model()?;
    let keys = todo
        .iter()
        .map(|t| {
            crate::train::group_key(&crate::train::TrialConfig {
                model: model.clone(),
                hyper: t.hyper.clone(),
                epochs: job.file.train.epochs,
                seed: t.seed,
                input: [0; 3],
                classes: 0,
                fault: None,
                engine: job.file.engine.clone(),
                max_steps: None,
                warm_up: false,
                cancel: Default::default(),
                prune: None,
            })
        })
        .collect();
    Ok(crate::sched::group::describe(keys, n as usize, slices, cpu))
}

/// The `sbatch` line of `jobs/slurm/sweep.sbatch` that fits a job with `trials` trials to run:
/// up to [`SLURM_SHARDS`] array tasks (one per trial when there are fewer), one CPU per trial
/// running at once (8 for `concurrency: auto`), and a GPU unless the job's backend is the CPU
/// (or is `auto` on a machine without one).
pub(super) fn slurm_line(job: &Job, concurrency: Concurrency, trials: usize) -> String {
    let shards = trials.clamp(1, SLURM_SHARDS);
    let cpus = match concurrency {
        Concurrency::Fixed(n) => n.max(1),
        Concurrency::Auto(_) => 8,
    };
    let gpu = match job.file.backend {
        BackendChoice::Cpu => false,
        BackendChoice::Cuda => true,
        BackendChoice::Auto => !crate::gpu::discover().gpus.is_empty(),
    };
    slurm_command(shards, cpus, gpu, &job.path)
}

/// The words of [`slurm_line`].
pub(super) fn slurm_command(shards: usize, cpus: u32, gpu: bool, job: &Path) -> String {
    format!(
        "on Slurm: mkdir -p logs && sbatch --array=0-{} --cpus-per-task={cpus} --gres={} jobs/slurm/sweep.sbatch {}{}",
        shards - 1,
        if gpu { "gpu:1" } else { "none" },
        job.display(),
        if gpu { "" } else { "   (--gres=gpu:1 on a GPU partition)" }
    )
}

/// The most array tasks the dry run's `sbatch` line proposes.
pub const SLURM_SHARDS: usize = 4;

/// The most trials `--dry-run` lists one by one; it counts the others.
pub const DRY_RUN_LISTED: usize = 50;
