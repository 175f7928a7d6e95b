//! Models: static shapes and a static memory plan, known before step 0, built from the job's `model:` section.

pub mod cnn;
pub mod memplan;
pub mod mlp;
pub mod network;
pub mod resnet;
pub mod spec;

pub use memplan::{MemKind, MemoryPlan};
pub use network::{FusedNetwork, LayerDef, Network, Node};
pub use spec::{Hyper, ModelKind, ModelSpec, Optimizer, Padding, Stem};

use crate::engine::Conv2dShape;

/// The layer graph of a model for inputs of shape `[c, h, w]` and `classes` outputs.
/// (ResNet has no dropout: `dropout` applies to the MLP and the CNN.)
pub fn nodes(
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    dropout: f32,
) -> Result<Vec<Node>, String> {
    match spec.kind {
        ModelKind::Mlp => Ok(network::chain(&mlp::layers(
            &spec.hidden(),
            input,
            classes,
            dropout,
        ))),
        ModelKind::Cnn => Ok(network::chain(&cnn::layers(spec, input, classes, dropout)?)),
        ModelKind::Resnet50 => {
            resnet::nodes(input, classes, spec.width(), spec.stem(input[1], input[2]))
        }
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
    Network::graph(
        &nodes(spec, input, classes, dropout)?,
        input,
        classes,
        batch,
        optimizer,
        ws_len,
    )
}
