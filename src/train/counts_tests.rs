//! The structure of a training step, counted on the CPU backend ([`crate::engine::Counted`]): launches per step, equal for a fused group of any width, and no host wait inside an epoch.

use std::sync::Arc;

use super::fused::run_group;
use super::{run_trial, TrialConfig, TrialResult};
use crate::data::Dataset;
use crate::engine::cpu::CpuBackend;
use crate::engine::EngineOptions;
use crate::models::{Hyper, ModelKind, ModelSpec, Optimizer};

fn config(model: ModelKind, optimizer: Optimizer, seed: u64, dropout: f64) -> TrialConfig {
    TrialConfig {
        model: ModelSpec::of(model),
        hyper: Hyper {
            lr: 0.001 * (1 + seed % 3) as f64,
            batch_size: 16,
            optimizer,
            momentum: 0.9,
            weight_decay: 0.0,
            dropout,
        },
        epochs: 2,
        seed,
        input: [1, 28, 28],
        classes: 10,
        fault: None,
        engine: EngineOptions {
            // A look at the loss every few steps, which must not wait either.
            check_every: 3,
            ..EngineOptions::default()
        },
        max_steps: None,
        warm_up: false,
        cancel: Default::default(),
        prune: None,
    }
}

fn backend() -> CpuBackend {
    let data = Dataset::zeros("zeros", [1, 28, 28], 10, 96, 40);
    CpuBackend::new(Arc::new(data), None)
}

fn alone(cfg: &TrialConfig) -> TrialResult {
    run_trial(&mut backend(), cfg, &mut |_| {}).unwrap()
}

fn group(n: u64, model: ModelKind, optimizer: Optimizer) -> Vec<TrialResult> {
    let cfgs: Vec<_> = (0..n).map(|s| config(model, optimizer, s, 0.0)).collect();
    run_group(&mut backend(), &cfgs, &mut |_, _| {})
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn an_mlp_step_is_at_most_eight_launches_and_an_epoch_never_waits() {
    for optimizer in [Optimizer::Adam, Optimizer::Sgd] {
        let r = alone(&config(ModelKind::Mlp, optimizer, 1, 0.0));
        let launches = r.launches_per_step.expect("counted");
        // gather, two dense layers (the first with its ReLU), the loss with the last bias
        // gradient, two weight gradients, the input gradient through the ReLU with the first
        // bias gradient, and the optimizer with the step's advance.
        assert_eq!(launches, 8, "{optimizer:?}");
        assert_eq!(r.host_syncs, Some(0), "{optimizer:?}");
    }
}

#[test]
fn a_fused_group_takes_as_many_launches_per_step_at_two_trials_as_at_thirty_four() {
    for optimizer in [Optimizer::Adam, Optimizer::Sgd] {
        let two = group(2, ModelKind::Mlp, optimizer);
        let many = group(34, ModelKind::Mlp, optimizer);
        let launches = |rs: &[TrialResult]| {
            let l: Vec<_> = rs.iter().map(|r| r.launches_per_step).collect();
            assert!(l.windows(2).all(|w| w[0] == w[1]), "{l:?}");
            l[0].expect("counted")
        };
        assert_eq!(launches(&two), launches(&many), "{optimizer:?}");
        assert!(launches(&two) <= 8, "{}", launches(&two));
        for r in two.iter().chain(&many) {
            assert_eq!(r.host_syncs, Some(0), "{optimizer:?}");
        }
    }
}

#[test]
fn a_fused_cnn_with_dropout_takes_as_many_launches_per_step_at_two_trials_as_at_eight() {
    let launches = |n: u64| {
        let cfgs: Vec<_> = (0..n)
            .map(|s| {
                let mut c = config(ModelKind::Cnn, Optimizer::Sgd, s, 0.1 + 0.05 * s as f64);
                c.epochs = 1;
                c.max_steps = Some(2);
                c
            })
            .collect();
        let ends = run_group(&mut backend(), &cfgs, &mut |_, _| {});
        let l: Vec<_> = ends
            .into_iter()
            .map(|r| r.unwrap().launches_per_step)
            .collect();
        assert!(l.windows(2).all(|w| w[0] == w[1]), "{l:?}");
        l[0].expect("counted")
    };
    assert_eq!(launches(2), launches(8));
}

#[test]
fn a_fused_resnet_takes_as_many_launches_per_step_at_two_trials_as_at_three() {
    // Batch norm, convolutions, residual adds and pooling each one call over the group.
    let launches = |n: u64| {
        let cfgs: Vec<_> = (0..n)
            .map(|s| {
                let mut c = config(ModelKind::Resnet50, Optimizer::Sgd, s, 0.0);
                c.model.width = Some(1.0 / 64.0);
                c.epochs = 1;
                c.max_steps = Some(2);
                c
            })
            .collect();
        let ends = run_group(&mut backend(), &cfgs, &mut |_, _| {});
        let l: Vec<_> = ends
            .into_iter()
            .map(|r| r.unwrap().launches_per_step)
            .collect();
        assert!(l.windows(2).all(|w| w[0] == w[1]), "{l:?}");
        l[0].expect("counted")
    };
    assert_eq!(launches(2), launches(3));
}

#[test]
fn no_built_in_model_waits_inside_an_epoch() {
    let cnn = alone(&config(ModelKind::Cnn, Optimizer::Sgd, 2, 0.25));
    assert_eq!(cnn.host_syncs, Some(0));
    assert!(cnn.launches_per_step.is_some_and(|l| l > 8));
    for r in group(3, ModelKind::Cnn, Optimizer::Adam) {
        assert_eq!(r.host_syncs, Some(0));
    }
}

#[test]
fn a_warm_up_evaluates_one_batch_after_its_capped_steps_and_a_probe_none() {
    for fused in [false, true] {
        let run = |warm_up: bool| {
            let mut cfg = config(ModelKind::Mlp, Optimizer::Adam, 4, 0.0);
            cfg.max_steps = Some(2);
            cfg.warm_up = warm_up;
            if fused {
                let cfgs = vec![cfg.clone(), cfg];
                let ends = run_group(&mut backend(), &cfgs, &mut |_, _| {});
                ends.into_iter().next().unwrap().unwrap()
            } else {
                alone(&cfg)
            }
        };
        let (warm, probe) = (run(true), run(false));
        assert!(
            warm.test_acc.is_finite(),
            "fused {fused}: {}",
            warm.test_acc
        );
        assert!(probe.test_acc.is_nan(), "fused {fused}: {}", probe.test_acc);
        assert_eq!(warm.host_syncs, Some(0));
    }
}
