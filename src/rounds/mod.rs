//! What the runners share: the round context of a built-in model, the batch check, and their output lines; the rows they write are in `rows.rs`.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::cancel::Cancel;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::report;
use crate::run::Resolved;
use crate::sched::{BuiltinWork, RoundContext, Workload};

mod rows;
pub use rows::{
    counts_line, progress_row, trial_row, unless_progress_lost, CsvFile, LostRow, LostRows,
};

/// Writes one line of a command's output.
pub fn say(out: &mut dyn Write, line: impl std::fmt::Display) -> Result<()> {
    writeln!(out, "{line}").map_err(Error::io("stdout"))
}

/// A batch larger than the training split is a job error, found before anything starts.
pub fn check_batch(job: &Job, data: &Dataset, trials: &[u32]) -> Result<()> {
    for &i in trials {
        let h = job.hyper(i as usize)?;
        if h.batch_size as usize > data.train.len() {
            let key = if job.file.parameters.contains_key("batch_size") {
                "parameters.batch_size"
            } else {
                "train.batch_size"
            };
            return Err(job
                .invalid(
                    key,
                    format!(
                        "{} is larger than the {} training samples of {}",
                        h.batch_size,
                        data.train.len(),
                        data.name
                    ),
                )
                .into());
        }
    }
    Ok(())
}

pub fn print_paths(paths: &report::ReportPaths, out: &mut dyn Write) -> Result<()> {
    for p in [&paths.time_per_training, &paths.samples_per_s]
        .into_iter()
        .flatten()
        .chain([&paths.summary])
    {
        say(out, format!("wrote {}", p.display()))?;
    }
    if paths.time_per_training.is_none() {
        say(out, "no charts: no round completed a trial")?;
    }
    Ok(())
}

/// The model column of a job's rows: the built-in kind, or `external`.
pub fn model_name(job: &Job) -> String {
    job.file
        .model
        .as_ref()
        .map_or_else(|| "external".to_string(), |m| m.kind.to_string())
}

/// One trial of `job`'s model on `data` outside any round (the `parallel` and `batch-scan`
/// commands): the job's epochs and seed, no fault, no step cap, no warm-up, no pruning.
pub fn lone_trial(
    job: &Job,
    data: &Dataset,
    model: crate::job::ModelSpec,
    hyper: crate::job::Hyper,
    cancel: Cancel,
) -> crate::train::TrialConfig {
    crate::train::TrialConfig {
        model,
        hyper,
        epochs: job.file.train.epochs,
        seed: job.file.seed,
        input: data.shape,
        classes: data.classes,
        fault: None,
        engine: job.engine_options(),
        max_steps: None,
        warm_up: false,
        cancel,
        prune: None,
    }
}

/// What the workers of a built-in model's rounds share: the dataset (on the device too, on a
/// GPU), how a child process finds it again, the model and the engine options.
pub fn builtin_context(
    job: &Job,
    data: &Arc<Dataset>,
    r: &Resolved,
    data_dir: Option<&Path>,
    worker_exe: &Path,
    cancel: &Cancel,
) -> Result<RoundContext> {
    Ok(RoundContext {
        work: Workload::Builtin(BuiltinWork {
            data: Arc::clone(data),
            data_spec: job.data()?.clone(),
            data_base: data_dir.map(Path::to_path_buf),
            data_seed: job.file.seed,
            model: job.model()?.clone(),
            epochs: job.file.train.epochs,
            engine: job.file.engine.clone(),
        }),
        devices: r.device_for(data)?,
        worker_exe: worker_exe.to_path_buf(),
        cancel: cancel.clone(),
        max_steps: None,
        warm_up: false,
        metric: None,
        prune: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{BackendChoice, SplitMode};
    use crate::plan::{Round, SliceSpec};
    use crate::run::{load_data, resolve_backend};
    use crate::sched::{run_round, Device, Devices, TrialState};

    /// The job `yaml`, its data, and the CPU backend resolved for it.
    fn on_cpu(yaml: &str) -> (Job, Arc<Dataset>, Resolved) {
        let job = Job::parse(yaml, std::path::Path::new("j.yaml")).unwrap();
        let data = load_data(&job, None).unwrap();
        let found = crate::gpu::discover();
        let r = resolve_backend(BackendChoice::Cpu, &found, &job.file.engine).unwrap();
        (job, data, r)
    }

    #[test]
    fn a_trial_runs_on_its_slices_device_and_fails_alone_where_there_is_none() {
        let (job, data, r) = on_cpu(
            "model: {kind: mlp, hidden: [16]}\ndata: {source: synthetic, train_samples: 512, test_samples: 128}\ntrain: {epochs: 1, batch_size: 64}\n",
        );
        let mut ctx = builtin_context(
            &job,
            &data,
            &r,
            None,
            std::path::Path::new("gpumux"),
            &Cancel::new(),
        )
        .unwrap();
        ctx.devices = Devices::with(Device::Cpu, vec![(1, Device::Cpu)]);
        let slice = |index, device| SliceSpec::at(index, device).capped(64 << 20);
        let round = Round {
            index: 0,
            n: 3,
            split: SplitMode::Logical,
            slices: vec![slice(0, 0), slice(1, 1), slice(2, 2)],
            trials: crate::plan::trials(&job, 8).unwrap(),
        };
        let out = run_round(&round, &ctx, &mut |_| {});
        assert_eq!(out.outcomes.len(), 8);
        for o in &out.outcomes {
            if o.slice.device == 2 {
                assert_eq!(o.state(), TrialState::Fail);
                let e = o.error().unwrap_or_default();
                assert!(e.contains("device 2 was not opened"), "{e}");
            } else {
                assert_eq!(o.state(), TrialState::Complete, "{:?}", o.error());
            }
        }
        // Slices on device 1 alone run every trial; on device 2 alone, none.
        let on = |device: u32| Round {
            slices: vec![slice(0, device), slice(1, device)],
            trials: crate::plan::trials(&job, 3).unwrap(),
            ..round.clone()
        };
        let out = run_round(&on(1), &ctx, &mut |_| {});
        assert!(out
            .outcomes
            .iter()
            .all(|o| o.state() == TrialState::Complete && o.slice.device == 1));
        let out = run_round(&on(2), &ctx, &mut |_| {});
        assert_eq!(out.outcomes.len(), 3);
        assert!(out.outcomes.iter().all(|o| o.state() == TrialState::Fail
            && o.error()
                .is_some_and(|e| e.contains("device 2 was not opened"))));
    }

    #[test]
    fn a_fused_round_runs_its_groups_and_a_panic_fails_its_whole_group() {
        use crate::sched::{group::queued, Event};
        let (job, data, r) = on_cpu(
            "model: {kind: mlp, hidden: [8]}\ndata: {source: synthetic, train_samples: 256, test_samples: 64}\ntrain: {epochs: 2, batch_size: 64}\nfaults: [{trial: 1, kind: panic}]\n",
        );
        let ctx = builtin_context(
            &job,
            &data,
            &r,
            None,
            std::path::Path::new("gpumux"),
            &Cancel::new(),
        )
        .unwrap();
        // Four trials on two slices: groups [t0, t1] and [t2, t3].
        let round = Round {
            index: 0,
            n: 4,
            split: SplitMode::Fused,
            slices: vec![
                SliceSpec::at(0, 0).capped(64 << 20),
                SliceSpec::at(1, 0).capped(64 << 20),
            ],
            trials: crate::plan::trials(&job, 4).unwrap(),
        };
        let ids: Vec<Vec<u32>> = queued(&round, &ctx)
            .iter()
            .map(|g| g.iter().map(|t| t.index).collect())
            .collect();
        assert_eq!(ids, vec![vec![0, 1], vec![2, 3]]);
        let (mut started, mut epochs, mut finished) = (0, 0, 0);
        let out = run_round(&round, &ctx, &mut |e| match e {
            Event::Started { .. } => started += 1,
            Event::Epoch { .. } => epochs += 1,
            Event::Finished(_) => finished += 1,
            Event::Output { .. } => {}
        });
        assert_eq!((started, finished), (4, 4));
        assert!(epochs >= 4, "t2 and t3 report both their epochs: {epochs}");
        let o = &out.outcomes;
        assert_eq!(o.len(), 4);
        for failed in &o[..2] {
            assert_eq!(failed.state(), TrialState::Fail);
            assert!(
                failed.error().is_some_and(|e| e.contains("panic")),
                "{:?}",
                failed.error()
            );
        }
        for done in &o[2..] {
            assert_eq!(done.state(), TrialState::Complete, "{:?}", done.error());
            assert_eq!(done.result().map(|r| r.epochs), Some(2));
        }
        assert_eq!(o[2].wall_s, o[3].wall_s, "a group's members share its time");
    }
}
