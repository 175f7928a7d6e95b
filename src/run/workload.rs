//! What a round trains, built from the job: a built-in model with its data, or an external command with each device's environment.

use std::path::Path;
use std::sync::Arc;

use crate::cancel::Cancel;
use crate::data::Dataset;
use crate::engine::cuda::CudaEngine;
use crate::error::Result;
use crate::job::Job;
use crate::plan;
use crate::sched::external::ExternalEnv;
use crate::sched::{BuiltinWork, Device, Devices, ExternalTrials, RoundContext, Workload};

use super::Resolved;

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

/// An external command's trials: no dataset or model of ours; the command gets the device by
/// UUID (CUDA_VISIBLE_DEVICES), its cap, and an NVML watchdog on a GPU.
pub fn external_context(
    job: &Job,
    template: &str,
    worker_exe: &Path,
    r: &Resolved,
    cancel: &Cancel,
    trials_dir: &Path,
) -> RoundContext {
    let env_of = |engine: Option<&Arc<CudaEngine>>| {
        let info = engine.map(|e| e.info());
        ExternalEnv {
            cuda_visible_devices: info.map(|i| i.uuid.clone()),
            device_mem_bytes: info.map(|i| i.total_mem_bytes),
            watch_uuid: info.map(|i| i.uuid.clone()),
            cwd: None,
            on_gpu: info.is_some(),
            ..ExternalEnv::default()
        }
    };
    let more = r.more.iter().map(|(d, e)| (*d, env_of(Some(e)))).collect();
    let envs = plan::PerDevice::with(env_of(r.engine.as_ref()), more);
    RoundContext {
        work: Workload::External(ExternalTrials {
            template: template.to_string(),
            program: job.file.program.clone(),
            swept: swept_names(job),
            trials_dir: trials_dir.to_path_buf(),
            envs,
            // Set once the round's concurrency is known (see the sweep's runner).
            stream: false,
        }),
        // An external command finds its own device through CUDA_VISIBLE_DEVICES.
        devices: Devices::one(Device::Cpu),
        worker_exe: worker_exe.to_path_buf(),
        cancel: cancel.clone(),
        max_steps: None,
        warm_up: false,
        metric: None,
        prune: None,
    }
}

/// The names of the sweep's own parameters (its space's), in name order.
pub fn swept_names(job: &Job) -> Vec<String> {
    job.space.dists.keys().cloned().collect()
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

    /// The built-in context of `job` on the CPU.
    fn context(job: &Job, data: &Arc<Dataset>, r: &Resolved) -> RoundContext {
        let exe = std::path::Path::new("gpumux");
        builtin_context(job, data, r, None, exe, &Cancel::new()).unwrap()
    }

    #[test]
    fn a_trial_runs_on_its_slices_device_and_fails_alone_where_there_is_none() {
        let (job, data, r) = on_cpu(
            "model: {kind: mlp, hidden: [16]}\ndata: {source: synthetic, train_samples: 512, test_samples: 128}\ntrain: {epochs: 1, batch_size: 64}\n",
        );
        let mut ctx = context(&job, &data, &r);
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
        let ctx = context(&job, &data, &r);
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
        // Each member's time runs from the group's start to its own end.
        assert!((o[2].wall_s - o[3].wall_s).abs() < 0.5, "{o:?}");
    }

    #[test]
    fn a_fused_group_takes_the_next_trial_into_a_slot_its_pruned_trial_freed() {
        use crate::sched::{Event, Pruning, TrialState};
        let (job, data, r) = on_cpu(
            "model: {kind: mlp, hidden: [8]}\ndata: {source: synthetic, train_samples: 256, test_samples: 64}\ntrain: {epochs: 3, batch_size: 64}\n",
        );
        let mut ctx = context(&job, &data, &r);
        // Even trials stop after their first epoch.
        ctx.prune = Some(Pruning(Arc::new(|t, s| t.index % 2 == 0 && s.epoch == 1)));
        // Two at a time on one slice: one group of two slots.
        let round = Round {
            index: 0,
            n: 2,
            split: SplitMode::Fused,
            slices: vec![SliceSpec::at(0, 0).capped(64 << 20)],
            trials: crate::plan::trials(&job, 6).unwrap(),
        };
        let mut log = Vec::new();
        let (mut running, mut most) = (0, 0);
        let out = run_round(&round, &ctx, &mut |e| match e {
            Event::Started { trial, .. } => {
                running += 1;
                most = most.max(running);
                log.push(format!("start t{}", trial.index));
            }
            Event::Finished(o) => {
                running -= 1;
                log.push(format!("end t{}", o.trial.index));
            }
            _ => {}
        });
        assert_eq!(out.outcomes.len(), 6, "{log:?}");
        for o in &out.outcomes {
            let (state, epochs) = if o.trial.index % 2 == 0 {
                (TrialState::Pruned, 1)
            } else {
                (TrialState::Complete, 3)
            };
            assert_eq!(o.state(), state, "t{}: {:?}", o.trial.index, o.error());
            assert_eq!(o.result().map(|r| r.epochs), Some(epochs), "{log:?}");
        }
        assert_eq!(most, 2, "never more than the group's slots: {log:?}");
        // t0 is pruned after the group's first epoch and t2 takes its slot while t1 trains on.
        let at = |what: &str| log.iter().position(|l| l == what).unwrap();
        assert!(at("start t2") < at("end t1"), "{log:?}");
        assert!(at("end t0") < at("start t2"), "{log:?}");
    }
}
