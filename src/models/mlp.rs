//! The MLP: dense layers with ReLU (and optional dropout) between them; 784-128-10 by default.

use super::LayerDef;

/// Dense → ReLU → (dropout) for each hidden width, then a dense layer to the classes.
pub fn layers(hidden: &[usize], input: [usize; 3], classes: usize, dropout: f32) -> Vec<LayerDef> {
    let mut out = Vec::new();
    let mut width = input.iter().product();
    for &h in hidden {
        out.push(LayerDef::Dense {
            inputs: width,
            outputs: h,
        });
        out.push(LayerDef::Relu);
        if dropout > 0.0 {
            out.push(LayerDef::Dropout { p: dropout });
        }
        width = h;
    }
    out.push(LayerDef::Dense {
        inputs: width,
        outputs: classes,
    });
    out
}
