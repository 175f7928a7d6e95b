//! ResNet-50 v1.5 (torchvision's layout): a stem, four stages of bottleneck blocks, global average pooling and a dense classifier.
//!
//! Bottleneck: 1×1 conv → BN → ReLU → 3×3 conv (the block's stride, as in v1.5) → BN → ReLU →
//! 1×1 conv (4× the width) → BN, plus the shortcut (the block's input, or a strided 1×1 conv → BN
//! where the shape changes), then ReLU. Stages have 3, 4, 6 and 3 blocks of widths 64, 128, 256
//! and 512 (times `width`), the first block of stages 2–4 striding by 2. Convolutions carry no
//! bias (the batch norm after each would cancel it).
//!
//! Stems: `imagenet` is a 7×7/2 conv (pad 3) → BN → ReLU → 3×3/2 max-pool (pad 1), for 224×224
//! inputs; `cifar` is a 3×3/1 conv (pad 1) → BN → ReLU with no pooling, for 32×32 inputs.

use super::network::{LayerDef, Node};
use super::Stem;
use crate::engine::{Conv2dShape, PlaneShape, PoolShape};

/// Blocks per stage in ResNet-50.
pub const BLOCKS: [usize; 4] = [3, 4, 6, 3];
/// Bottleneck widths per stage at `width: 1`.
pub const PLANES: [usize; 4] = [64, 128, 256, 512];
/// A bottleneck's output has this many times its width in channels.
pub const EXPANSION: usize = 4;

/// Builds the graph while tracking the shape `[c, h, w]` of the value last added.
struct Builder {
    nodes: Vec<Node>,
    shape: [usize; 3],
}

impl Builder {
    /// The value the next layer reads by default (the last one added).
    fn last(&self) -> usize {
        self.nodes.len()
    }
    fn push(&mut self, def: LayerDef, src: usize) -> usize {
        self.nodes.push(Node { def, src });
        self.nodes.len()
    }
    /// A bias-less conv reading value `src` of shape `from`; returns its value and output shape.
    fn conv(
        &mut self,
        src: usize,
        from: [usize; 3],
        c_out: usize,
        k: usize,
        stride: usize,
        pad: usize,
    ) -> Result<(usize, [usize; 3]), String> {
        let [c_in, h, w] = from;
        let shape = Conv2dShape {
            n: 1,
            c_in,
            h,
            w,
            c_out,
            k,
            pad,
            stride,
        };
        if !shape.fits() {
            return Err(format!(
                "a {h}×{w} feature map is too small for ResNet's {k}×{k}/{stride} convolution; use a larger input"
            ));
        }
        let v = self.push(LayerDef::Conv { shape, bias: false }, src);
        Ok((v, [c_out, shape.h_out(), shape.w_out()]))
    }
    /// Batch norm of value `src` of shape `s`, optionally followed by ReLU; returns the last value.
    fn bn(&mut self, src: usize, s: [usize; 3], relu: bool) -> usize {
        let plane = PlaneShape {
            n: 1,
            c: s[0],
            hw: s[1] * s[2],
        };
        let v = self.push(LayerDef::BatchNorm(plane), src);
        if relu {
            self.push(LayerDef::Relu, v)
        } else {
            v
        }
    }
    /// One bottleneck block reading the current value; returns nothing, leaves `shape` updated.
    fn bottleneck(&mut self, planes: usize, stride: usize) -> Result<(), String> {
        let (x, xs) = (self.last(), self.shape);
        let out_c = planes * EXPANSION;
        let (v, s) = self.conv(x, xs, planes, 1, 1, 0)?;
        let v = self.bn(v, s, true);
        let (v, s) = self.conv(v, s, planes, 3, stride, 1)?;
        let v = self.bn(v, s, true);
        let (v, s) = self.conv(v, s, out_c, 1, 1, 0)?;
        let main = self.bn(v, s, false);
        let shortcut = if stride != 1 || xs[0] != out_c {
            let (d, ds) = self.conv(x, xs, out_c, 1, stride, 0)?;
            if ds != s {
                return Err(format!(
                    "shortcut shape {ds:?} differs from the block's {s:?}"
                ));
            }
            self.bn(d, ds, false)
        } else {
            x
        };
        let sum = self.push(LayerDef::Add { other: shortcut }, main);
        self.push(LayerDef::Relu, sum);
        self.shape = s;
        Ok(())
    }
}

/// Channels of a stage's bottleneck at width multiplier `width` (at least 1).
pub fn planes(stage: usize, width: f64) -> usize {
    ((PLANES[stage] as f64 * width).round() as usize).max(1)
}

/// The graph of ResNet-50 for inputs `[c, h, w]` and `classes` outputs.
pub fn nodes(
    input: [usize; 3],
    classes: usize,
    width: f64,
    stem: Stem,
) -> Result<Vec<Node>, String> {
    nodes_with_blocks(input, classes, width, stem, BLOCKS)
}

/// The same architecture with `blocks` bottlenecks per stage (ResNet-50 has [`BLOCKS`]).
pub fn nodes_with_blocks(
    input: [usize; 3],
    classes: usize,
    width: f64,
    stem: Stem,
    blocks: [usize; 4],
) -> Result<Vec<Node>, String> {
    let mut b = Builder {
        nodes: Vec::new(),
        shape: input,
    };
    let stem_c = planes(0, width);
    let (v, s) = match stem {
        Stem::Imagenet => b.conv(0, input, stem_c, 7, 2, 3)?,
        Stem::Cifar => b.conv(0, input, stem_c, 3, 1, 1)?,
    };
    let v = b.bn(v, s, true);
    b.shape = s;
    if stem == Stem::Imagenet {
        let pool = PoolShape {
            n: 1,
            c: s[0],
            h: s[1],
            w: s[2],
            k: 3,
            stride: 2,
            pad: 1,
        };
        if !pool.fits() {
            return Err(format!(
                "a {}×{} input is too small for the imagenet stem; use `stem: cifar`",
                input[1], input[2]
            ));
        }
        b.push(LayerDef::MaxPool(pool), v);
        b.shape = [s[0], pool.h_out(), pool.w_out()];
    }
    for (stage, &blocks) in blocks.iter().enumerate() {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            b.bottleneck(planes(stage, width), stride)?;
        }
    }
    let [c, h, w] = b.shape;
    let last = b.last();
    let pooled = b.push(
        LayerDef::GlobalAvgPool(PlaneShape { n: 1, c, hw: h * w }),
        last,
    );
    b.push(
        LayerDef::Dense {
            inputs: c,
            outputs: classes,
        },
        pooled,
    );
    Ok(b.nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::network::Network;
    use crate::models::Optimizer;

    fn count(input: [usize; 3], classes: usize, width: f64, stem: Stem) -> usize {
        let nodes = nodes(input, classes, width, stem).unwrap();
        Network::graph(&nodes, input, classes, 2, Optimizer::Sgd, &|s| s.ws_len())
            .unwrap()
            .param_count()
    }

    #[test]
    fn resnet50_has_torchvisions_parameter_count() {
        // torchvision.models.resnet50(): 25,557,032 parameters (γ and β of batch norm included).
        assert_eq!(count([3, 224, 224], 1000, 1.0, Stem::Imagenet), 25_557_032);
        // num_classes=10 replaces the 2048×1000 classifier: 23,528,522.
        assert_eq!(count([3, 224, 224], 10, 1.0, Stem::Imagenet), 23_528_522);
        // The CIFAR stem's 3×3 conv has 64·3·9 weights instead of 64·3·49.
        assert_eq!(
            count([3, 32, 32], 10, 1.0, Stem::Cifar),
            23_528_522 - 64 * 3 * 40
        );
    }

    #[test]
    fn the_graph_has_53_convolutions_and_16_residual_adds() {
        let n = nodes([3, 224, 224], 285, 1.0, Stem::Imagenet).unwrap();
        let convs = n
            .iter()
            .filter(|x| matches!(x.def, LayerDef::Conv { .. }))
            .count();
        let adds = n
            .iter()
            .filter(|x| matches!(x.def, LayerDef::Add { .. }))
            .count();
        let bns = n
            .iter()
            .filter(|x| matches!(x.def, LayerDef::BatchNorm(_)))
            .count();
        assert_eq!((convs, adds, bns), (53, 16, 53));
        // The last stage works on 7×7 maps of 2048 channels.
        let pool = n.iter().rev().find_map(|x| match x.def {
            LayerDef::GlobalAvgPool(p) => Some(p),
            _ => None,
        });
        assert_eq!(
            pool,
            Some(PlaneShape {
                n: 1,
                c: 2048,
                hw: 49
            })
        );
    }

    #[test]
    fn tiny_inputs_shrink_to_one_pixel_and_then_need_two_samples() {
        // Every conv and pool is padded, so even 4×4 images get through, ending at 1×1.
        let n = nodes([3, 4, 4], 10, 1.0, Stem::Imagenet).unwrap();
        assert!(n.iter().any(|x| x.def
            == LayerDef::GlobalAvgPool(PlaneShape {
                n: 1,
                c: 2048,
                hw: 1
            })));
        // Batch norm on 1×1 maps needs two samples.
        let nodes = nodes([1, 1, 1], 10, 0.0625, Stem::Cifar).unwrap();
        let e =
            Network::graph(&nodes, [1, 1, 1], 10, 1, Optimizer::Sgd, &|s| s.ws_len()).unwrap_err();
        assert!(e.contains("batch of at least 2"), "{e}");
    }
}
