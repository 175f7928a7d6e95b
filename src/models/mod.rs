//! Models: static shapes and a static memory plan, known before step 0, built from the job's `model:` section.

pub mod cnn;
pub mod memplan;
pub mod mlp;
pub mod network;

pub use memplan::{MemKind, MemoryPlan};
pub use network::{LayerDef, Network};

use crate::engine::Conv2dShape;
use crate::job::{ModelKind, ModelSpec, Optimizer};

/// The layer list of a model for inputs of shape `[c, h, w]` and `classes` outputs.
pub fn layers(
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    dropout: f32,
) -> Result<Vec<LayerDef>, String> {
    match spec.kind {
        ModelKind::Mlp => Ok(mlp::layers(&spec.hidden(), input, classes, dropout)),
        ModelKind::Cnn => cnn::layers(spec, input, classes, dropout),
    }
}

/// Builds a model's network and memory plan for one batch size.
pub fn build(
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    batch: usize,
    dropout: f32,
    optimizer: Optimizer,
    ws_len: &dyn Fn(&Conv2dShape) -> usize,
) -> Result<Network, String> {
    Network::new(
        &layers(spec, input, classes, dropout)?,
        input,
        classes,
        batch,
        optimizer,
        ws_len,
    )
}
