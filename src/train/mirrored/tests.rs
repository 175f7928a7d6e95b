//! Data-parallel training against single-slice training on the same global batch, on the CPU backend.

use std::sync::Arc;

use super::*;
use crate::data::{synthetic, Dataset};
use crate::engine::cpu::CpuBackend;
use crate::models::{ModelKind, Optimizer};
use crate::units::shares;

/// Synthetic 1×12×12 images in 10 classes: big enough for 10 steps of a global batch of 50.
fn data() -> Arc<Dataset> {
    let (train, test) = synthetic::generate([1, 12, 12], 10, 600, 100, 7).expect("synthetic data");
    Arc::new(Dataset::in_memory(
        "synthetic",
        [1, 12, 12],
        10,
        train,
        test,
    ))
}

fn model(kind: ModelKind) -> ModelSpec {
    let mut m = ModelSpec::of(kind);
    match kind {
        ModelKind::Mlp => m.hidden = Some(vec![32, 16]),
        ModelKind::Cnn => {
            m.channels = Some(vec![4, 8]);
            m.fc = Some(16);
        }
        // Not compared with one slice: batch norm takes its statistics over each shard.
        ModelKind::Resnet50 => m.width = Some(0.0625),
    }
    m
}

fn hyper(optimizer: Optimizer, batch: usize) -> Hyper {
    Hyper {
        lr: match optimizer {
            Optimizer::Sgd => 0.05,
            Optimizer::Adam => 0.002,
        },
        batch_size: batch as u32,
        optimizer,
        momentum: 0.9,
        weight_decay: 1e-4,
        dropout: 0.0,
    }
}

fn config(
    kind: ModelKind,
    optimizer: Optimizer,
    shards: Vec<usize>,
    steps: usize,
) -> ParallelConfig {
    let global = shards.iter().sum();
    let d = data();
    ParallelConfig {
        trial: TrialConfig {
            model: model(kind),
            hyper: hyper(optimizer, global),
            epochs: 1,
            seed: 42,
            input: d.shape,
            classes: d.classes,
            fault: None,
            engine: Default::default(),
            max_steps: Some(steps),
            warm_up: false,
            cancel: Default::default(),
            prune: None,
        },
        shards,
    }
}

/// `steps` single-slice training steps on the global batch, through `Network::train_step`.
fn single(cfg: &ParallelConfig, steps: usize) -> Vec<f32> {
    // As `run_trial` and the replicas' threads train.
    let _flush = crate::engine::cpu::denormals::FlushGuard::new();
    let d = data();
    let global: usize = cfg.shards.iter().sum();
    let mut be = CpuBackend::new(Arc::clone(&d), None);
    let t = &cfg.trial;
    let mut net = plan_on(&mut be, &t.model, t.input, t.classes, global, &t.hyper).expect("plan");
    net.init(&mut be, seeds::init(t.seed)).expect("init");
    let n = d.train.len();
    let order = seeds::epoch_order(t.seed, 1, n);
    be.set_train_order(&order).expect("order");
    for _ in 0..steps {
        net.train_step(&mut be, n / global, seeds::dropout(t.seed), &t.hyper)
            .expect("step");
    }
    let mut p = vec![0f32; net.params.len];
    be.read(net.params, &mut p).expect("read");
    p
}

/// `n` uncapped CPU backends on `d`, one for each of slices 0..n.
fn cpu_backends(d: &Arc<Dataset>, n: u32) -> Vec<(u32, Box<dyn Backend>)> {
    (0..n)
        .map(|i| {
            (
                i,
                Box::new(CpuBackend::new(Arc::clone(d), None)) as Box<dyn Backend>,
            )
        })
        .collect()
}

fn mirrored(cfg: &ParallelConfig) -> ParallelOutcome {
    let backends = cpu_backends(&data(), cfg.shards.len() as u32);
    train(backends, cfg, &mut |_| {}).expect("parallel training")
}

/// `‖a − b‖ / ‖b‖` and the largest `|a_i − b_i| / max(|b_i|, 1e-3)`.
fn errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut d2, mut b2, mut worst) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        d2 += (x - y).powi(2);
        b2 += y * y;
        worst = worst.max((x - y).abs() / y.abs().max(1e-3));
    }
    ((d2 / b2).sqrt(), worst)
}

#[test]
fn mirrored_training_matches_one_slice_on_the_same_global_batch() {
    const STEPS: usize = 10;
    let splits: [&[f64]; 4] = [&[1.0, 1.0], &[3.0, 2.0], &[1.0; 4], &[5.0, 3.0, 2.0, 1.0]];
    let mut report = Vec::new();
    for kind in [ModelKind::Mlp, ModelKind::Cnn] {
        for optimizer in [Optimizer::Sgd, Optimizer::Adam] {
            let reference = single(&config(kind, optimizer, vec![50], STEPS), STEPS);
            for w in splits {
                let shards = shares(50, w, false);
                let cfg = config(kind, optimizer, shards.clone(), STEPS);
                let out = mirrored(&cfg);
                assert_eq!(out.replica_spread, 0.0, "replicas drifted apart");
                assert_ne!(
                    out.params,
                    reference.iter().map(|_| 0.0).collect::<Vec<_>>()
                );
                let (norm, worst) = errors(&out.params, &reference);
                report.push(format!(
                    "{kind} {optimizer} {shards:?}: ‖Δ‖/‖w‖ {norm:.2e}, worst element {worst:.2e}"
                ));
                assert!(norm < 1e-5 && worst < 1e-4, "{}", report.join("\n"));
            }
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn with_dropout_the_shards_apply_their_part_of_the_whole_batchs_mask() {
    const STEPS: usize = 10;
    let mut report = Vec::new();
    for kind in [ModelKind::Mlp, ModelKind::Cnn] {
        let with = |shards: Vec<usize>| {
            let mut cfg = config(kind, Optimizer::Sgd, shards, STEPS);
            cfg.trial.hyper.dropout = 0.3;
            cfg
        };
        let reference = single(&with(vec![50]), STEPS);
        // Dropout is really there: the weights differ from training without it.
        let plain = single(&config(kind, Optimizer::Sgd, vec![50], STEPS), STEPS);
        assert!(
            errors(&plain, &reference).0 > 1e-3,
            "{kind}: dropout changed nothing"
        );
        for w in [&[1.0, 1.0][..], &[3.0, 2.0], &[5.0, 3.0, 2.0, 1.0]] {
            let shards = shares(50, w, false);
            let out = mirrored(&with(shards.clone()));
            let (norm, worst) = errors(&out.params, &reference);
            report.push(format!(
                "{kind} {shards:?} with dropout 0.3: ‖Δ‖/‖w‖ {norm:.2e}, worst element {worst:.2e}"
            ));
            assert!(norm < 1e-5 && worst < 1e-4, "{}", report.join("\n"));
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn one_replica_is_single_slice_training_bit_for_bit() {
    let cfg = config(ModelKind::Mlp, Optimizer::Adam, vec![50], 10);
    assert_eq!(mirrored(&cfg).params, single(&cfg, 10));
}

#[test]
fn training_really_moves_the_weights() {
    // The equality above would hold trivially if nothing trained.
    let cfg = config(ModelKind::Mlp, Optimizer::Sgd, vec![30, 20], 10);
    let before = single(&cfg, 0);
    let (norm, _) = errors(&mirrored(&cfg).params, &before);
    assert!(norm > 1e-3, "the weights moved by only {norm:.2e}");
}

#[test]
fn speeds_and_losses_are_reported_per_slice() {
    let mut cfg = config(ModelKind::Mlp, Optimizer::Adam, vec![30, 20], 5);
    cfg.trial.max_steps = None;
    cfg.trial.epochs = 2;
    let mut seen = Vec::new();
    let out = train(cpu_backends(&data(), 2), &cfg, &mut |e| {
        seen.push(e.clone())
    })
    .expect("training");
    assert_eq!(seen.len(), 2);
    let e = &seen[1];
    assert_eq!(e.steps, 600 / 50);
    assert!(e.stats.test_acc.is_finite() && e.stats.train_loss.is_finite());
    assert!(e.stats.train_loss < seen[0].stats.train_loss * 1.5);
    let line = e.speed_line();
    assert!(
        line.starts_with("slice 0 [30] ")
            && line.contains(" · slice 1 [20] ")
            && line.contains(" · total [50] "),
        "{line}"
    );
    let ratio = e.slices[0].samples_per_s / e.slices[1].samples_per_s;
    assert!(
        (ratio - 1.5).abs() < 1e-9,
        "synchronous steps: sps follow the shards, got {ratio}"
    );
    assert_eq!(out.result.train_samples, 2 * 12 * 50);
}

#[test]
fn bad_shards_are_errors_not_panics() {
    let d = data();
    let two = || cpu_backends(&d, 2);
    let e = train(
        two(),
        &config(ModelKind::Mlp, Optimizer::Sgd, vec![50, 0], 1),
        &mut |_| {},
    );
    assert!(e.unwrap_err().to_string().contains("no rows"));
    let e = train(
        two(),
        &config(ModelKind::Mlp, Optimizer::Sgd, vec![50], 1),
        &mut |_| {},
    );
    assert!(e.unwrap_err().to_string().contains("1 shards for 2 slices"));
    let e = train(
        two(),
        &config(ModelKind::Mlp, Optimizer::Sgd, vec![500, 500], 1),
        &mut |_| {},
    );
    assert!(e.unwrap_err().to_string().contains("larger than the 600"));
    // A slice whose arena exceeds its cap says which slice.
    let capped: Vec<(u32, Box<dyn Backend>)> = vec![
        (0, Box::new(CpuBackend::new(Arc::clone(&d), None))),
        (1, Box::new(CpuBackend::new(Arc::clone(&d), Some(1024)))),
    ];
    let e = train(
        capped,
        &config(ModelKind::Mlp, Optimizer::Sgd, vec![25, 25], 1),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("slice 1") && e.contains("slice cap"), "{e}");
}
