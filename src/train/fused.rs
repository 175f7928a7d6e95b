//! Fused groups: N compatible trials trained as one batched model on one backend (`split: fused`), each with its own hyperparameters, seed, data order, results and failure.

use super::{EpochStats, TrialConfig, TrialResult};
use crate::engine::Backend;
use crate::error::TrialError;

/// What trials must share to train in one fused group: the model and its shape, the batch, the
/// optimizer, whether dropout is on (a rate above 0 adds a layer), the data's shape, the
/// epochs, the step cap and the engine options. The rates (lr, momentum, weight decay, dropout
/// above 0) and the seed may differ. Equal keys mean compatible trials.
pub fn group_key(cfg: &TrialConfig) -> String {
    let h = &cfg.hyper;
    serde_json::json!({
        "model": cfg.model,
        "batch": h.batch_size,
        "optimizer": h.optimizer,
        "dropout": h.dropout > 0.0,
        "input": cfg.input,
        "classes": cfg.classes,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "engine": cfg.engine,
    })
    .to_string()
}

/// Trains `cfgs` (trials of one [`group_key`]) as one fused group on `be`, calling
/// `on_epoch(i, stats)` after each epoch of trial `i`. Returns each trial's end, in order: a
/// trial that fails (a non-finite loss) fails alone while the others go on.
pub fn run_group(
    be: &mut dyn Backend,
    cfgs: &[TrialConfig],
    on_epoch: &mut dyn FnMut(usize, &EpochStats),
) -> Vec<Result<TrialResult, TrialError>> {
    // One after another on the same backend until the fused step lands.
    cfgs.iter()
        .enumerate()
        .map(|(i, cfg)| super::run_trial(be, cfg, &mut |s| on_epoch(i, s)))
        .collect()
}
