//! Fused groups on the CPU backend: each trial's whole trajectory (every epoch's figures, its result and its final weights) is bit for bit the one it has trained alone, at N = 1, 2, 5 and 13, for the MLP and the CNN with mixed hyperparameters (and a reduced ResNet-50 at N = 1 and 3), and so is a trial's that took a slot freed in a group that trains on; a diverging trial fails alone.

use std::sync::Arc;

use gpumux::data::{Dataset, Samples};
use gpumux::engine::cpu::CpuBackend;
use gpumux::engine::{Backend, Region, Split};
use gpumux::job::{EngineOptions, Hyper, ModelKind, ModelSpec, Optimizer};
use gpumux::models::{self, FusedNetwork, Network};
use gpumux::rng::HostRng;
use gpumux::train::fused::{run_group, run_refilled, GroupHooks};
use gpumux::train::stop::{Failure, Stop};
use gpumux::train::{run_trial, EpochStats, Prune, TrialConfig, TrialResult};

/// Random images of `shape`, labels that a model can partly learn (the sign of one pixel).
fn data(shape: [usize; 3], train: usize, test: usize) -> Arc<Dataset> {
    let len: usize = shape.iter().product();
    let mut rng = HostRng::new(7);
    let mut samples = |n: usize| {
        let images: Vec<f32> = (0..n * len).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let labels = (0..n)
            .map(|i| {
                let v = images[i * len + len / 2];
                (((v + 1.0) * 2.0) as u32).min(3)
            })
            .collect();
        Samples { images, labels }
    };
    let (train, test) = (samples(train), samples(test));
    Arc::new(Dataset {
        name: "fused-test".into(),
        shape,
        classes: 4,
        train,
        test,
    })
}

/// Trial `i` of a mixed group: its own lr, weight decay, momentum, dropout and seed.
fn config(model: &ModelSpec, optimizer: Optimizer, d: &Dataset, i: usize) -> TrialConfig {
    TrialConfig {
        model: model.clone(),
        hyper: Hyper {
            lr: [0.05, 0.01, 0.002, 0.03, 0.007][i % 5]
                * if optimizer == Optimizer::Adam {
                    0.1
                } else {
                    1.0
                },
            batch_size: 16,
            optimizer,
            momentum: [0.0, 0.9, 0.5][i % 3],
            weight_decay: [0.0, 1e-4, 5e-3][i % 3],
            dropout: [0.1, 0.25, 0.5, 0.05][i % 4],
        },
        epochs: 2,
        seed: 1000 + 17 * i as u64,
        input: d.shape,
        classes: d.classes,
        fault: None,
        engine: EngineOptions::default(),
        max_steps: None,
        warm_up: false,
        cancel: Default::default(),
        prune: None,
    }
}

/// A trial's figures, its end and its final parameters.
struct Run {
    epochs: Vec<EpochStats>,
    end: Result<TrialResult, Stop>,
    params: Vec<f32>,
}

fn read(be: &mut CpuBackend, r: Region) -> Vec<f32> {
    let mut v = vec![0f32; r.len];
    be.read(r, &mut v).expect("read");
    v
}

fn single_net(cfg: &TrialConfig, be: &CpuBackend) -> Network {
    models::build(
        &cfg.model,
        cfg.input,
        cfg.classes,
        cfg.hyper.batch_size as usize,
        cfg.hyper.dropout as f32,
        cfg.hyper.optimizer,
        &|s| be.conv_workspace_len(s),
    )
    .expect("plan")
}

fn alone(d: &Arc<Dataset>, cfg: &TrialConfig) -> Run {
    let mut be = CpuBackend::new(Arc::clone(d), None);
    let mut epochs = Vec::new();
    let end = run_trial(&mut be, cfg, &mut |s| epochs.push(s.clone()));
    let net = single_net(cfg, &be);
    let params = read(&mut be, net.params);
    Run {
        epochs,
        end,
        params,
    }
}

fn fused(d: &Arc<Dataset>, cfgs: &[TrialConfig]) -> Vec<Run> {
    let mut be = CpuBackend::new(Arc::clone(d), None);
    let mut epochs: Vec<Vec<EpochStats>> = cfgs.iter().map(|_| Vec::new()).collect();
    let ends = run_group(&mut be, cfgs, &mut |i, s| epochs[i].push(s.clone()));
    let net = single_net(&cfgs[0], &be);
    let dropout: Vec<f32> = cfgs.iter().map(|c| c.hyper.dropout as f32).collect();
    let group = FusedNetwork::new(&net, &dropout, be.split_len(Split::Train)).expect("group");
    ends.into_iter()
        .zip(epochs)
        .zip(&group.members)
        .map(|((end, epochs), m)| Run {
            epochs,
            end,
            params: read(&mut be, m.params),
        })
        .collect()
}

fn bits(e: &EpochStats) -> [u64; 4] {
    [e.train_loss, e.train_acc, e.test_loss, e.test_acc].map(f64::to_bits)
}

/// Every trial of a fused group of `cfgs` against the same trial alone.
fn check(d: &Arc<Dataset>, cfgs: &[TrialConfig]) {
    let group = fused(d, cfgs);
    assert_eq!(group.len(), cfgs.len());
    for (i, (cfg, got)) in cfgs.iter().zip(&group).enumerate() {
        let want = alone(d, cfg);
        let what = format!(
            "trial {i} of {} (lr {}, seed {})",
            cfgs.len(),
            cfg.hyper.lr,
            cfg.seed
        );
        assert_eq!(got.epochs.len(), want.epochs.len(), "{what}: epochs");
        for (g, w) in got.epochs.iter().zip(&want.epochs) {
            assert_eq!(
                bits(g),
                bits(w),
                "{what}: epoch {}: {g:?} vs {w:?}",
                w.epoch
            );
        }
        match (&got.end, &want.end) {
            (Ok(g), Ok(w)) => {
                assert_eq!(g.test_acc.to_bits(), w.test_acc.to_bits(), "{what}");
                assert_eq!(g.final_loss.to_bits(), w.final_loss.to_bits(), "{what}");
                assert_eq!(g.metrics, w.metrics, "{what}");
                assert_eq!(
                    (g.epochs, g.param_count),
                    (w.epochs, w.param_count),
                    "{what}"
                );
            }
            (
                Err(Stop::Failed(Failure::NonFiniteLoss { epoch, step, .. })),
                Err(Stop::Failed(Failure::NonFiniteLoss {
                    epoch: we,
                    step: ws,
                    ..
                })),
            ) => assert_eq!((epoch, step), (we, ws), "{what}"),
            (g, w) => panic!("{what}: fused {g:?}, alone {w:?}"),
        }
        if want.end.is_ok() {
            let same = got
                .params
                .iter()
                .zip(&want.params)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: the final weights differ");
        }
    }
}

fn mlp() -> ModelSpec {
    ModelSpec {
        hidden: Some(vec![24, 12]),
        ..ModelSpec::of(ModelKind::Mlp)
    }
}

fn cnn() -> ModelSpec {
    ModelSpec {
        channels: Some(vec![4, 6]),
        fc: Some(16),
        ..ModelSpec::of(ModelKind::Cnn)
    }
}

#[test]
fn fused_mlp_trials_match_their_runs_alone_bit_for_bit() {
    let d = data([1, 6, 6], 96, 40);
    for (n, optimizer) in [
        (1, Optimizer::Adam),
        (2, Optimizer::Sgd),
        (5, Optimizer::Adam),
        (13, Optimizer::Sgd),
    ] {
        let cfgs: Vec<_> = (0..n).map(|i| config(&mlp(), optimizer, &d, i)).collect();
        check(&d, &cfgs);
    }
}

#[test]
fn fused_cnn_trials_match_their_runs_alone_bit_for_bit() {
    let d = data([1, 10, 10], 64, 24);
    for (n, optimizer) in [
        (1, Optimizer::Sgd),
        (2, Optimizer::Adam),
        (5, Optimizer::Sgd),
        (13, Optimizer::Adam),
    ] {
        let cfgs: Vec<_> = (0..n).map(|i| config(&cnn(), optimizer, &d, i)).collect();
        check(&d, &cfgs);
    }
}

#[test]
fn fused_resnet_trials_match_their_runs_alone_bit_for_bit() {
    // Batch norm over the group's channels, residual adds and global pooling.
    let d = data([3, 8, 8], 48, 20);
    let resnet = ModelSpec {
        width: Some(1.0 / 64.0),
        ..ModelSpec::of(ModelKind::Resnet50)
    };
    for (n, optimizer) in [(1, Optimizer::Sgd), (3, Optimizer::Adam)] {
        let cfgs: Vec<_> = (0..n).map(|i| config(&resnet, optimizer, &d, i)).collect();
        check(&d, &cfgs);
    }
}

#[test]
fn a_diverging_trial_fails_alone_and_the_others_still_match() {
    let d = data([1, 6, 6], 96, 40);
    let mut cfgs: Vec<_> = (0..4)
        .map(|i| config(&mlp(), Optimizer::Sgd, &d, i))
        .collect();
    cfgs[2].hyper.lr = 1e6;
    let group = fused(&d, &cfgs);
    assert!(
        matches!(
            group[2].end,
            Err(Stop::Failed(Failure::NonFiniteLoss { .. }))
        ),
        "{:?}",
        group[2].end
    );
    for i in [0, 1, 3] {
        assert!(group[i].end.is_ok(), "trial {i}: {:?}", group[i].end);
    }
    check(&d, &cfgs);
}

#[test]
fn a_group_over_its_cap_trains_in_parts_that_fit() {
    let d = data([1, 6, 6], 96, 40);
    let cfgs: Vec<_> = (0..6)
        .map(|i| config(&mlp(), Optimizer::Adam, &d, i))
        .collect();
    let probe = CpuBackend::new(Arc::clone(&d), None);
    let net = single_net(&cfgs[0], &probe);
    let one = FusedNetwork::new(&net, &[0.1], 96)
        .expect("one")
        .plan
        .bytes() as u64;
    // Room for two trials and a half: the six train as three groups of two.
    let mut be = CpuBackend::new(Arc::clone(&d), Some(one * 5 / 2));
    let mut seen = vec![0; cfgs.len()];
    let ends = run_group(&mut be, &cfgs, &mut |i, _| seen[i] += 1);
    for (i, (end, cfg)) in ends.iter().zip(&cfgs).enumerate() {
        let want = alone(&d, cfg);
        let (Ok(g), Ok(w)) = (end, &want.end) else {
            panic!("trial {i}: {end:?} / {:?}", want.end)
        };
        assert_eq!(g.test_acc.to_bits(), w.test_acc.to_bits(), "trial {i}");
        assert_eq!(seen[i], 2, "trial {i} reported each epoch once");
    }
}

/// A group's hooks that hand out `queue` to freed slots and record what each trial did.
struct Refill {
    queue: std::collections::VecDeque<TrialConfig>,
    /// Every trial, in the group's numbering: the first ones, then those taken.
    trials: Vec<TrialConfig>,
    epochs: Vec<Vec<EpochStats>>,
    ends: Vec<Option<Result<TrialResult, Stop>>>,
    /// When each trial was taken: the epochs the group's other trials had then reported.
    taken_after: Vec<usize>,
}

impl Refill {
    /// A group's first trials, and the trials queued for its freed slots.
    fn new(first: &[TrialConfig], queue: &[TrialConfig]) -> Refill {
        Refill {
            queue: queue.iter().cloned().collect(),
            trials: first.to_vec(),
            epochs: vec![Vec::new(); first.len()],
            ends: first.iter().map(|_| None).collect(),
            taken_after: vec![0; first.len()],
        }
    }
}

impl Refill {
    /// Trial `id`'s every epoch and its result, bit for bit those of its run alone.
    fn same_as_alone(&self, d: &Arc<Dataset>, id: usize, what: &str) {
        let cfg = &self.trials[id];
        let what = format!("{what}: trial {id} (seed {})", cfg.seed);
        let want = alone(d, cfg);
        let got = &self.epochs[id];
        assert_eq!(got.len(), want.epochs.len(), "{what}: epochs");
        for (g, w) in got.iter().zip(&want.epochs) {
            assert_eq!(g.epoch, w.epoch, "{what}");
            assert_eq!(
                bits(g),
                bits(w),
                "{what}: epoch {}: {g:?} vs {w:?}",
                w.epoch
            );
        }
        let end = self.ends[id].as_ref().expect("every trial ends");
        let (Ok(g), Ok(w)) = (end, &want.end) else {
            panic!("{what}: {end:?} / {:?}", want.end)
        };
        assert_eq!(g.epochs, w.epochs, "{what}");
        assert_eq!(g.test_acc.to_bits(), w.test_acc.to_bits(), "{what}");
        assert_eq!(g.final_loss.to_bits(), w.final_loss.to_bits(), "{what}");
    }
}

impl GroupHooks for Refill {
    fn epoch(&mut self, id: usize, stats: &EpochStats) {
        self.epochs[id].push(stats.clone());
    }
    fn end(&mut self, id: usize, end: Result<TrialResult, Stop>) {
        assert!(self.ends[id].is_none(), "trial {id} ended twice");
        self.ends[id] = Some(end);
    }
    fn next(&mut self) -> Option<TrialConfig> {
        let cfg = self.queue.pop_front()?;
        self.trials.push(cfg.clone());
        self.epochs.push(Vec::new());
        self.ends.push(None);
        self.taken_after
            .push(self.epochs.iter().map(Vec::len).sum());
        Some(cfg)
    }
}

#[test]
fn a_trial_that_takes_a_freed_slot_trains_as_it_would_alone() {
    // Trials pruned after their first epoch free their slots; a slot empty at the start takes
    // a trial at the first boundary. Adam's bias correction and the dropout masks count each
    // trial's own steps, and batch norm's running figures start afresh.
    for (model, d, optimizer) in [
        (mlp(), data([1, 6, 6], 96, 40), Optimizer::Adam),
        (mlp(), data([1, 6, 6], 96, 40), Optimizer::Sgd),
        (cnn(), data([1, 10, 10], 64, 24), Optimizer::Adam),
    ] {
        let prune = || Some(Prune::new(Arc::new(|s: &EpochStats| s.epoch == 1)));
        let mut cfgs: Vec<_> = (0..7)
            .map(|i| TrialConfig {
                epochs: 3,
                ..config(&model, optimizer, &d, i)
            })
            .collect();
        // Trials 0 and 3 stop after epoch 1; the rest train their 3 epochs.
        cfgs[0].prune = prune();
        cfgs[3].prune = prune();
        let mut hooks = Refill::new(&cfgs[..2], &cfgs[2..]);
        let mut be = CpuBackend::new(Arc::clone(&d), None);
        run_refilled(&mut be, cfgs[..2].to_vec(), 3, &mut hooks);
        assert!(hooks.queue.is_empty(), "every trial was taken");
        assert_eq!(hooks.trials.len(), cfgs.len());
        // Slots 0 (pruned) and 2 (empty) take trials 2 and 3 after the group's first epoch.
        assert_eq!(hooks.taken_after[2..4], [2, 2], "{:?}", hooks.taken_after);
        for id in 0..hooks.trials.len() {
            hooks.same_as_alone(&d, id, &format!("{model:?} {optimizer:?}"));
        }
    }
}

#[test]
fn a_group_whose_epochs_are_capped_takes_no_trial_into_a_freed_slot() {
    // With capped steps the group's data position does not restart at a boundary.
    let d = data([1, 6, 6], 96, 40);
    let mut cfgs: Vec<_> = (0..3)
        .map(|i| TrialConfig {
            max_steps: Some(2),
            ..config(&mlp(), Optimizer::Sgd, &d, i)
        })
        .collect();
    cfgs[0].prune = Some(Prune::new(Arc::new(|s: &EpochStats| s.epoch == 1)));
    let mut hooks = Refill::new(&cfgs[..2], &cfgs[2..]);
    let mut be = CpuBackend::new(Arc::clone(&d), None);
    run_refilled(&mut be, cfgs[..2].to_vec(), 3, &mut hooks);
    assert_eq!(hooks.queue.len(), 1, "the trial waits for another group");
    assert!(hooks.ends.iter().all(|e| matches!(e, Some(Ok(_)))));
}

#[test]
fn a_group_whose_trials_all_end_within_an_epoch_takes_no_new_trial() {
    // The only trial diverges at a look within its first epoch: the group's step counter is
    // short of the boundary, so a trial taken there would count its steps wrong. The group
    // ends, and the queued trial waits for a group of its own.
    let d = data([1, 6, 6], 96, 40);
    let mut cfgs: Vec<_> = (0..2)
        .map(|i| config(&mlp(), Optimizer::Sgd, &d, i))
        .collect();
    cfgs[0].hyper.lr = 1e6;
    cfgs[0].engine.check_every = 1;
    let mut hooks = Refill::new(&cfgs[..1], &cfgs[1..]);
    let mut be = CpuBackend::new(Arc::clone(&d), None);
    run_refilled(&mut be, cfgs[..1].to_vec(), 2, &mut hooks);
    assert!(
        matches!(
            hooks.ends[0],
            Some(Err(Stop::Failed(Failure::NonFiniteLoss { epoch: 1, .. })))
        ),
        "{:?}",
        hooks.ends[0]
    );
    assert_eq!(hooks.queue.len(), 1, "no trial joined mid-epoch");
}

#[test]
fn a_trial_that_takes_a_diverged_trials_slot_trains_as_it_would_alone() {
    let d = data([1, 6, 6], 96, 40);
    let cfgs: Vec<_> = (0..3)
        .map(|i| {
            let mut c = TrialConfig {
                epochs: 3,
                ..config(&mlp(), Optimizer::Sgd, &d, i)
            };
            c.engine.check_every = 1;
            c
        })
        .collect();
    let mut first = cfgs[..2].to_vec();
    first[0].hyper.lr = 1e6;
    let mut hooks = Refill::new(&first, &cfgs[2..]);
    let mut be = CpuBackend::new(Arc::clone(&d), None);
    run_refilled(&mut be, first, 2, &mut hooks);
    assert!(
        matches!(
            hooks.ends[0],
            Some(Err(Stop::Failed(Failure::NonFiniteLoss { epoch: 1, .. })))
        ),
        "{:?}",
        hooks.ends[0]
    );
    assert!(hooks.queue.is_empty(), "the queued trial took the slot");
    assert_eq!(hooks.epochs[2].len(), 3);
    hooks.same_as_alone(&d, 2, "after a diverged trial");
}
