//! The CNN of the Keras MNIST example: conv32-conv64-maxpool-(dropout)-fc128-(dropout)-fc10.

use super::LayerDef;
use super::{ModelSpec, Padding};
use crate::engine::{Conv2dShape, PoolShape};

/// The layer list for inputs `[c, h, w]`; an error when the input is too small for the kernels.
pub fn layers(
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    dropout: f32,
) -> Result<Vec<LayerDef>, String> {
    let k = spec.kernel();
    let pad = match spec.padding() {
        Padding::Valid => 0,
        Padding::Same => (k - 1) / 2,
    };
    let [mut c, mut h, mut w] = input;
    let mut out = Vec::new();
    for &c_out in &spec.channels() {
        if h + 2 * pad < k || w + 2 * pad < k {
            return Err(format!(
                "a {h}×{w} input is too small for a {k}×{k} convolution"
            ));
        }
        out.push(LayerDef::Conv {
            shape: Conv2dShape {
                n: 1,
                c_in: c,
                h,
                w,
                c_out,
                k,
                pad,
                stride: 1,
            },
            bias: true,
        });
        out.push(LayerDef::Relu);
        c = c_out;
        h = h + 2 * pad + 1 - k;
        w = w + 2 * pad + 1 - k;
    }
    if h < 2 || w < 2 {
        return Err(format!(
            "a {h}×{w} feature map is too small for 2×2 max-pooling"
        ));
    }
    out.push(LayerDef::MaxPool(PoolShape::square(1, c, h, w, 2)));
    if dropout > 0.0 {
        out.push(LayerDef::Dropout { p: dropout });
    }
    let flat = c * (h / 2) * (w / 2);
    out.push(LayerDef::Dense {
        inputs: flat,
        outputs: spec.fc(),
    });
    out.push(LayerDef::Relu);
    if dropout > 0.0 {
        out.push(LayerDef::Dropout { p: dropout });
    }
    out.push(LayerDef::Dense {
        inputs: spec.fc(),
        outputs: classes,
    });
    Ok(out)
}
