//! Whole-network gradient checks on graphs with residual adds and batch norm.
use super::*;
use crate::data::Dataset;
use crate::engine::cpu::ops::testing::random;
use crate::engine::cpu::CpuBackend;
use crate::engine::STATS_LEN;
use crate::models::resnet;
use crate::models::{Optimizer, Stem};
use std::sync::Arc;

fn backend() -> CpuBackend {
    let data = Dataset::zeros("none", [1, 1, 1], 2, 1, 1);
    CpuBackend::new(Arc::new(data), None)
}

/// Mean cross-entropy of the batch in training mode (batch statistics in batch norm).
fn loss(net: &Network, be: &mut CpuBackend) -> f64 {
    be.fill(net.stats, 0.0).unwrap();
    net.forward(be, net.batch, true, 0).unwrap();
    net.loss(be, net.batch).unwrap();
    let mut st = [0.0; STATS_LEN];
    be.read(net.stats, &mut st).unwrap();
    st[0] as f64 / net.batch as f64
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt()
}

/// Checks the analytic gradient of `nodes` against central differences of the loss along
/// directions in parameter space: for every parameter tensor, its own gradient's direction
/// and a random direction within it, and one random direction over all parameters.
/// Directional derivatives average out the f32 noise that single-element differences drown in.
fn check_graph(nodes: &[Node], input: [usize; 3], classes: usize, batch: usize, seed: u64) {
    let mut net = Network::graph(nodes, input, classes, batch, Optimizer::Sgd, &|s| {
        s.ws_len()
    })
    .unwrap();
    let mut be = backend();
    be.alloc_arena(net.plan.total).unwrap();
    net.init(&mut be, seed).unwrap();
    let mut rng = HostRng::new(seed ^ 0x5eed);
    let x = random(&mut rng, batch * net.sample_len, -1.0, 1.0);
    let y: Vec<f32> = (0..batch).map(|i| (i % classes) as f32).collect();
    be.write(net.input(), &x).unwrap();
    be.write(net.labels, &y).unwrap();
    // Random β so that ReLUs after batch norm are not all at the same kink statistics.
    for l in &net.layers {
        if let LayerDef::BatchNorm(_) = l.def {
            let b = random(&mut rng, l.b.len, -0.3, 0.3);
            be.write(l.b, &b).unwrap();
        }
    }
    loss(&net, &mut be);
    net.backward(&mut be, batch, 0).unwrap();
    let mut params = vec![0.0; net.params.len];
    let mut grads = vec![0.0; net.grads.len];
    be.read(net.params, &mut params).unwrap();
    be.read(net.grads, &mut grads).unwrap();

    let mut directions: Vec<(String, Vec<f32>)> = Vec::new();
    for (i, l) in net.layers.iter().enumerate() {
        for (what, r) in [("w", l.w), ("b", l.b)] {
            if r.len == 0 {
                continue;
            }
            let at = r.offset - net.params.offset;
            let g = &grads[at..at + r.len];
            let mut along = vec![0.0; params.len()];
            along[at..at + r.len].copy_from_slice(g);
            let mut random = vec![0.0; params.len()];
            for v in &mut random[at..at + r.len] {
                *v = rng.uniform_f32(-1.0, 1.0);
            }
            directions.push((format!("layer {i} {:?} {what} along dL", l.def), along));
            directions.push((format!("layer {i} {:?} {what} random", l.def), random));
        }
    }
    let all = random(&mut rng, params.len(), -1.0, 1.0);
    directions.push(("all parameters, random".into(), all));

    let mut checked = 0;
    for (what, mut d) in directions {
        let n = norm(&d);
        if n == 0.0 {
            continue;
        }
        d.iter_mut().for_each(|v| *v /= n as f32);
        let ana: f64 = d
            .iter()
            .zip(&grads)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum();
        let shifted =
            |s: f32| -> Vec<f32> { params.iter().zip(&d).map(|(&p, &v)| p + s * v).collect() };
        let mut diff = |eps: f32| {
            be.write(net.params, &shifted(eps)).unwrap();
            let up = loss(&net, &mut be);
            be.write(net.params, &shifted(-eps)).unwrap();
            let down = loss(&net, &mut be);
            (up - down) / (2.0 * eps as f64)
        };
        // Richardson extrapolation of central differences at steps 2e-3 and 1e-3 cancels
        // their O(h²) curvature error; the f32 noise in the loss (≈1e-6) over those steps
        // leaves ≈1e-3. A wrong gradient is off by a fraction of its size.
        let num = (4.0 * diff(1e-3) - diff(2e-3)) / 3.0;
        assert!(
            (num - ana).abs() <= 1e-3 + 2e-2 * num.abs().max(ana.abs()),
            "{what}: numeric {num} vs analytic {ana}"
        );
        checked += 1;
    }
    be.write(net.params, &params).unwrap();
    assert!(checked >= 3, "only {checked} directions checked");
}

#[test]
fn a_residual_block_with_batch_norm_has_the_right_gradient() {
    // conv → BN → ReLU → conv → BN, plus a shortcut conv → BN, added, ReLU, pooled, dense;
    // the block input is read by two layers, so its gradient arrives by two paths.
    let c = |c_in, c_out, k, stride, pad| LayerDef::Conv {
        shape: Conv2dShape {
            n: 1,
            c_in,
            h: 6,
            w: 6,
            c_out,
            k,
            pad,
            stride,
        },
        bias: false,
    };
    let bn = |c, hw| LayerDef::BatchNorm(PlaneShape { n: 1, c, hw });
    let c2 = LayerDef::Conv {
        shape: Conv2dShape {
            n: 1,
            c_in: 3,
            h: 3,
            w: 3,
            c_out: 4,
            k: 3,
            pad: 1,
            stride: 1,
        },
        bias: false,
    };
    let nodes = vec![
        Node {
            def: c(2, 3, 3, 1, 1),
            src: 0,
        }, // 1: 3×6×6
        Node {
            def: bn(3, 36),
            src: 1,
        }, // 2
        Node {
            def: LayerDef::Relu,
            src: 2,
        }, // 3: block input
        Node {
            def: c(3, 3, 3, 2, 1),
            src: 3,
        }, // 4: 3×3×3
        Node {
            def: bn(3, 9),
            src: 4,
        }, // 5
        Node {
            def: LayerDef::Relu,
            src: 5,
        }, // 6
        Node { def: c2, src: 6 }, // 7: 4×3×3
        Node {
            def: bn(4, 9),
            src: 7,
        }, // 8
        Node {
            def: c(3, 4, 1, 2, 0),
            src: 3,
        }, // 9: shortcut 4×3×3
        Node {
            def: bn(4, 9),
            src: 9,
        }, // 10
        Node {
            def: LayerDef::Add { other: 10 },
            src: 8,
        }, // 11
        Node {
            def: LayerDef::Relu,
            src: 11,
        }, // 12
        Node {
            def: LayerDef::GlobalAvgPool(PlaneShape { n: 1, c: 4, hw: 9 }),
            src: 12,
        },
        Node {
            def: LayerDef::Dense {
                inputs: 4,
                outputs: 3,
            },
            src: 13,
        },
    ];
    check_graph(&nodes, [2, 6, 6], 3, 4, 1);
}

#[test]
fn an_identity_shortcut_has_the_right_gradient() {
    // x → conv → BN → ReLU → conv → BN, + x, ReLU: x's gradient comes from the add and the conv.
    let conv = LayerDef::Conv {
        shape: Conv2dShape {
            n: 1,
            c_in: 2,
            h: 4,
            w: 4,
            c_out: 2,
            k: 3,
            pad: 1,
            stride: 1,
        },
        bias: false,
    };
    let bn = LayerDef::BatchNorm(PlaneShape { n: 1, c: 2, hw: 16 });
    let nodes = vec![
        Node { def: conv, src: 0 },
        Node { def: bn, src: 1 },
        Node {
            def: LayerDef::Relu,
            src: 2,
        }, // 3: x
        Node { def: conv, src: 3 },
        Node { def: bn, src: 4 },
        Node {
            def: LayerDef::Relu,
            src: 5,
        },
        Node { def: conv, src: 6 },
        Node { def: bn, src: 7 },
        Node {
            def: LayerDef::Add { other: 3 },
            src: 8,
        },
        Node {
            def: LayerDef::Relu,
            src: 9,
        },
        Node {
            def: LayerDef::GlobalAvgPool(PlaneShape { n: 1, c: 2, hw: 16 }),
            src: 10,
        },
        Node {
            def: LayerDef::Dense {
                inputs: 2,
                outputs: 2,
            },
            src: 11,
        },
    ];
    check_graph(&nodes, [2, 4, 4], 2, 3, 2);
}

#[test]
fn shallow_reduced_resnets_have_the_right_gradient() {
    // 1/16 width (bottlenecks of 4 to 32 channels), 16×16 inputs: every block kind
    // (projection shortcut with stride 1 and 2, identity shortcut) and both stems, checked by
    // finite differences. Deeper, the loss at a random start is too curved and kinked for
    // them (errors grow to 5-15% with depth while the step-size limit of the differences
    // still moves); the full depth is checked against plain backpropagation below.
    for (stem, blocks, seed) in [
        (Stem::Cifar, [1, 1, 0, 0], 3),
        (Stem::Imagenet, [1, 1, 0, 0], 4),
        (Stem::Cifar, [2, 0, 0, 0], 5),
    ] {
        let nodes = resnet::nodes_with_blocks([3, 16, 16], 5, 0.0625, stem, blocks).unwrap();
        check_graph(&nodes, [3, 16, 16], 5, 4, seed);
    }
}

/// Backpropagation over `net`'s graph done the plain way, on the host with the CPU twins:
/// every value's gradient in its own zeroed buffer, every contribution added in. Returns the
/// parameter gradients in the layout of the network's gradient block.
fn reference_grads(net: &Network, be: &mut CpuBackend) -> Vec<f32> {
    use crate::engine::cpu::ops;
    let read = |be: &mut CpuBackend, r: Region| {
        let mut v = vec![0.0; r.len];
        be.read(r, &mut v).unwrap();
        v
    };
    let rows = net.batch;
    let acts: Vec<Vec<f32>> = net.acts.iter().map(|&r| read(be, r)).collect();
    let mut g: Vec<Vec<f32>> = acts.iter().map(|a| vec![0.0; a.len()]).collect();
    let last = net.layers.len();
    g[last] = read(be, net.dacts[last]);
    let mut grads = vec![0.0; net.grads.len];
    let at = |r: Region| r.offset - net.grads.offset;
    for (i, l) in net.layers.iter().enumerate().rev() {
        let (x, y, dy) = (&acts[l.src], &acts[i + 1], g[i + 1].clone());
        let mut dx = vec![0.0; x.len()];
        match l.def {
            LayerDef::Dense { inputs, outputs } => {
                let gw = GemmShape {
                    trans_a: true,
                    ..GemmShape::nn(outputs, inputs, rows)
                };
                let (w, dw) = (read(be, l.w), &mut grads[at(l.dw)..at(l.dw) + l.dw.len]);
                ops::gemm(&gw, &dy, x, dw);
                ops::bias_grad(
                    &dy,
                    &mut grads[at(l.db)..at(l.db) + l.db.len],
                    rows,
                    outputs,
                );
                ops::gemm(&GemmShape::nn(rows, inputs, outputs), &dy, &w, &mut dx);
            }
            LayerDef::Conv { shape, bias } => {
                let s = shape.with_n(rows);
                let w = read(be, l.w);
                let mut dw = vec![0.0; l.dw.len];
                let mut db = vec![0.0; l.db.len];
                let mut ws = vec![0.0; s.ws_len()];
                let dbias = bias.then_some(&mut db[..]);
                ops::conv2d_bwd(&s, x, &w, &dy, Some(&mut dx), &mut dw, dbias, &mut ws);
                grads[at(l.dw)..at(l.dw) + l.dw.len].copy_from_slice(&dw);
                if bias {
                    grads[at(l.db)..at(l.db) + l.db.len].copy_from_slice(&db);
                }
            }
            LayerDef::Relu => ops::relu_bwd(y, &dy, &mut dx),
            LayerDef::MaxPool(p) => ops::maxpool_bwd(&p.with_n(rows), x, y, &dy, &mut dx),
            LayerDef::Dropout { .. } => dx.copy_from_slice(&dy),
            LayerDef::BatchNorm(p) => {
                let (gamma, saved) = (read(be, l.w), read(be, l.saved));
                let (mut dg, mut db) = (vec![0.0; p.c], vec![0.0; p.c]);
                let s = p.with_n(rows);
                ops::batchnorm_bwd(&s, x, &gamma, &saved, &dy, &mut dx, &mut dg, &mut db);
                grads[at(l.dw)..at(l.dw) + p.c].copy_from_slice(&dg);
                grads[at(l.db)..at(l.db) + p.c].copy_from_slice(&db);
            }
            LayerDef::GlobalAvgPool(p) => ops::avgpool_bwd(&p.with_n(rows), &dy, &mut dx),
            LayerDef::Add { other } => {
                ops::add_assign(&mut g[other], &dy);
                dx.copy_from_slice(&dy);
            }
        }
        ops::add_assign(&mut g[l.src], &dx);
    }
    grads
}

#[test]
fn full_depth_reduced_resnet50_backward_matches_plain_backpropagation() {
    // The full 16-block graph at 1/16 width: the shared gradient block, residual deliveries
    // (write, add, alias) and scratch give exactly what plain backpropagation gives. (Finite
    // differences through 50 layers this narrow at a random start are dominated by the
    // curvature and ReLU kinks of the loss; the op-level and shallow checks cover the maths.)
    for (stem, input, seed) in [(Stem::Cifar, 16, 6), (Stem::Imagenet, 32, 7)] {
        let shape = [3, input, input];
        let nodes = resnet::nodes(shape, 5, 0.0625, stem).unwrap();
        let mut net = Network::graph(&nodes, shape, 5, 4, Optimizer::Sgd, &|s| s.ws_len()).unwrap();
        let mut be = backend();
        be.alloc_arena(net.plan.total).unwrap();
        net.init(&mut be, seed).unwrap();
        let mut rng = HostRng::new(seed);
        let x = random(&mut rng, 4 * net.sample_len, -1.0, 1.0);
        be.write(net.input(), &x).unwrap();
        be.write(net.labels, &[0.0, 1.0, 2.0, 3.0]).unwrap();
        loss(&net, &mut be);
        let want = reference_grads(&net, &mut be);
        net.backward(&mut be, 4, 0).unwrap();
        let mut got = vec![0.0; net.grads.len];
        be.read(net.grads, &mut got).unwrap();
        let nonzero = got.iter().filter(|&&v| v != 0.0).count();
        assert!(
            nonzero * 2 > net.param_count(),
            "{stem:?}: {nonzero} of {} gradients nonzero",
            net.param_count()
        );
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{stem:?} gradient {k}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn gradients_share_memory_by_liveness() {
    let nodes = resnet::nodes([3, 32, 32], 10, 0.25, Stem::Cifar).unwrap();
    let net = Network::graph(&nodes, [3, 32, 32], 10, 8, Optimizer::Sgd, &|s| s.ws_len()).unwrap();
    let acts: usize = net.acts.iter().map(|r| r.len).sum();
    let block = net
        .plan
        .entries
        .iter()
        .find(|e| e.name == "activation gradients")
        .unwrap()
        .region
        .len;
    // All gradients at once would need as much as the activations; a handful at a time do.
    assert!(
        block * 5 < acts,
        "gradient block {block} vs activations {acts}"
    );
    // Every value's gradient region is inside the block and the graph runs end to end.
    let mut be = backend();
    let mut net = net;
    be.alloc_arena(net.plan.total).unwrap();
    net.init(&mut be, 9).unwrap();
    let l = loss(&net, &mut be);
    assert!(l.is_finite());
    net.backward(&mut be, net.batch, 0).unwrap();
}
