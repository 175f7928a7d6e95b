//! Every op of the CUDA backend against its CPU twin: regions, GEMM, bias and softmax, convolutions, batch norm, pooling, dropout, losses and optimisers (the ops a step folds together, gathers and graphs: `steps.rs`).

use super::*;

pub(crate) fn regions_are_checked_as_on_the_cpu() {
    let e = gpu_or_skip!();
    let data = tiny_data();
    let mut b = e
        .backend(e.upload(&data).expect("upload"), None, None)
        .expect("backend");
    assert!(matches!(
        b.fill(Region::new(0, 1), 0.0),
        Err(EngineError::NoArena)
    ));
    b.alloc_arena(10).expect("arena");
    assert!(matches!(
        b.fill(Region::new(5, 6), 0.0),
        Err(EngineError::OutOfArena { .. })
    ));
    let err = b
        .relu_fwd(Region::new(0, 4), Region::new(2, 4), 4)
        .unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
    assert!(b.set_train_order(&[0, 1]).is_err());
    assert!(b
        .gather(Split::Test, 5, 3, Region::new(0, 4), Region::new(4, 2))
        .is_err());
}

pub(crate) fn write_fill_read_and_the_counter_round_trip() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let a = p.random(1000, -5.0, 5.0);
    p.assert_exact(a, "write");
    let f = p.region(777);
    p.both(|b| b.fill(f, -2.5));
    p.assert_exact(f, "fill");
    let c = p.region(COUNTER_LEN);
    p.set(c, &[f32::from_bits(41)]);
    p.both(|b| b.advance(c));
    let (cpu, gpu) = p.outputs(c);
    assert_eq!((cpu[0].to_bits(), gpu[0].to_bits()), (42, 42));
}

/// Paced steps (the host at most one step ahead, the marks' events reused many times) compute
/// what unpaced ones do, in order.
pub(crate) fn paced_steps_keep_their_order() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let c = p.region(1);
    p.set(c, &[f32::from_bits(0)]);
    for lead in [1, 1, 2, 3] {
        for _ in 0..100 {
            p.both(|b| {
                b.advance(c)?;
                b.pace(lead)
            });
        }
    }
    let (cpu, gpu) = p.outputs(c);
    assert_eq!((cpu[0].to_bits(), gpu[0].to_bits()), (400, 400));
}

pub(crate) fn gemm_matches_the_cpu_in_every_transpose() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        for (alpha, beta) in [(1.0, 0.0), (0.7, 0.3)] {
            let g = GemmShape {
                trans_a,
                trans_b,
                m: 37,
                n: 23,
                k: 61,
                alpha,
                beta,
            };
            let a = p.random(g.a_len(), -1.0, 1.0);
            let b = p.random(g.b_len(), -1.0, 1.0);
            let c = p.random(g.c_len(), -1.0, 1.0);
            if beta == 0.0 {
                // With beta 0, C is overwritten: NaNs in it must not leak into the result.
                p.set(c, &vec![f32::NAN; g.c_len()]);
            }
            p.both(|be| be.gemm(g, a, b, c));
            p.assert_close(c, 1e-4, 1e-4, &format!("gemm {trans_a}/{trans_b} β={beta}"));
        }
    }
}

pub(crate) fn batched_gemm_matches_the_cpu_with_shared_operands() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = GemmShape {
            trans_a,
            trans_b,
            m: 19,
            n: 11,
            k: 29,
            alpha: 0.7,
            beta: 0.3,
        };
        let packed = GemmBatch {
            count: 5,
            stride_a: g.a_len(),
            stride_b: g.b_len(),
            stride_c: g.c_len(),
        };
        let padded = GemmBatch {
            stride_a: g.a_len() + 3,
            stride_c: g.c_len() + 5,
            ..packed
        };
        let shared_a = GemmBatch {
            stride_a: 0,
            ..packed
        };
        let shared_b = GemmBatch {
            stride_b: 0,
            ..padded
        };
        for (name, batch) in [
            ("packed", packed),
            ("padded", padded),
            ("shared A", shared_a),
            ("shared B", shared_b),
        ] {
            let a = p.random(batch.a_span(&g).unwrap(), -1.0, 1.0);
            let b = p.random(batch.b_span(&g).unwrap(), -1.0, 1.0);
            let c = p.random(batch.c_span(&g).unwrap(), -1.0, 1.0);
            p.both(|be| be.gemm_batched(g, batch, a, b, c));
            p.assert_close(
                c,
                1e-4,
                1e-4,
                &format!("gemm_batched {trans_a}/{trans_b} {name}"),
            );
        }
    }
}

pub(crate) fn bias_and_relu_match_the_cpu() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let (rows, cols) = (33, 70);
    let y = p.random(rows * cols, -1.0, 1.0);
    let bias = p.random(cols, -1.0, 1.0);
    p.both(|b| b.bias_add(y, bias, rows, cols));
    p.assert_exact(y, "bias_add");
    let db = p.region(cols);
    p.both(|b| b.bias_grad(y, db, rows, cols));
    p.assert_close(db, 1e-5, 1e-5, "bias_grad");
    let r = p.region(rows * cols);
    p.both(|b| b.relu_fwd(y, r, rows * cols));
    p.assert_exact(r, "relu_fwd");
    let dy = p.random(rows * cols, -1.0, 1.0);
    let dx = p.region(rows * cols);
    p.both(|b| b.relu_bwd(r, dy, dx, rows * cols));
    p.assert_exact(dx, "relu_bwd");
}

/// The fused bias ops over 5 trials with an odd bias stride (the gaps between the gradients
/// left as they are), and the fused softmax cross-entropy over 13 trials, against the CPU's.
pub(crate) fn fused_bias_and_softmax_match_the_cpu() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let (trials, rows, cols, stride) = (5, 33, 70, 77);
    let span = (trials - 1) * stride + cols;
    let y = p.random(trials * rows * cols, -1.0, 1.0);
    let bias = p.random(span, -1.0, 1.0);
    p.both(|b| b.bias_add_fused(y, bias, rows, cols, trials, stride));
    p.assert_exact(y, "bias_add_fused");
    let db = p.random(span, -1.0, 1.0);
    p.both(|b| b.bias_grad_fused(y, db, rows, cols, trials, stride));
    p.assert_close(db, 1e-5, 1e-5, "bias_grad_fused");
    let (trials, rows, classes) = (13, 37, 10);
    let logits = p.random(trials * rows * classes, -4.0, 4.0);
    let labels = p.region(trials * rows);
    let l: Vec<f32> = (0..trials * rows)
        .map(|_| p.rng.below(classes) as f32)
        .collect();
    p.set(labels, &l);
    let dlogits = p.region(trials * rows * classes);
    let stats = p.random(trials * 2, 0.0, 3.0);
    let (stats0, _) = p.outputs(stats);
    p.both(|b| b.softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials));
    p.assert_close(dlogits, 1e-6, 1e-5, "fused dlogits");
    let (c, g) = p.outputs(stats);
    for t in 0..trials {
        let (cl, gl) = (c[2 * t] - stats0[2 * t], g[2 * t] - stats0[2 * t]);
        assert!(
            (c[2 * t] - g[2 * t]).abs() <= 1e-5 * c[2 * t].abs(),
            "loss of trial {t}: {gl} vs {cl}"
        );
        assert_eq!(c[2 * t + 1], g[2 * t + 1], "correct count of trial {t}");
    }
}

/// Convolution shapes: valid and padded, strided, pointwise, and a strided 1×1 (a ResNet shortcut).
pub(crate) fn conv_shapes() -> Vec<Conv2dShape> {
    let base = Conv2dShape {
        n: 3,
        c_in: 2,
        h: 9,
        w: 7,
        c_out: 4,
        k: 3,
        pad: 0,
        stride: 1,
    };
    let mut v: Vec<Conv2dShape> = [
        (3, 0, 1),
        (3, 1, 1),
        (5, 0, 1),
        (5, 2, 1),
        (3, 1, 2),
        (7, 3, 2),
    ]
    .into_iter()
    .map(|(k, pad, stride)| Conv2dShape {
        k,
        pad,
        stride,
        ..base
    })
    .collect();
    for stride in [1, 2] {
        v.push(Conv2dShape {
            c_in: 6,
            c_out: 5,
            k: 1,
            stride,
            ..base
        });
    }
    v
}

/// Every convolution shape, with and without a bias, on the GEMM lowering and on cuDNN, against
/// the CPU. Tolerances: the GPU sums the same products in another order (cuBLAS or cuDNN, FP32),
/// so outputs, sums of up to 98 terms of order one, agree to 1e-4 absolute and relative; `dw`
/// sums over the whole batch (up to 300 terms), hence 1e-3 absolute.
pub(crate) fn convolutions_match_the_cpu(conv: ConvEngine) {
    gpu_or_skip!();
    if let Some(e) = engine_with(conv) {
        for s in conv_shapes() {
            for bias in [true, false] {
                let mut p = Pair::new(&e);
                // Each backend gets the workspace it asks for.
                let ws_len = p
                    .cpu
                    .conv_workspace_len(&s)
                    .max(p.gpu.conv_workspace_len(&s));
                let x = p.random(s.x_len(), -1.0, 1.0);
                let w = p.random(s.w_len(), -1.0, 1.0);
                let b = bias.then(|| p.random(s.c_out, -1.0, 1.0));
                let y = p.region(s.y_len());
                let ws = p.region(ws_len);
                let what = format!(
                    "{conv:?} k{} pad{} stride{} c{}→{} bias {bias}",
                    s.k, s.pad, s.stride, s.c_in, s.c_out
                );
                p.both(|be| be.conv2d_fwd(&s, x, w, b, y, ws));
                p.assert_close(y, 1e-4, 1e-4, &format!("conv fwd {what}"));
                let dy = p.random(s.y_len(), -1.0, 1.0);
                let (dx, dw) = (p.region(s.x_len()), p.region(s.w_len()));
                let db = bias.then(|| p.region(s.c_out));
                p.both(|be| be.conv2d_bwd(&s, x, w, dy, Some(dx), dw, db, ws));
                p.assert_close(dx, 1e-4, 1e-4, &format!("conv dx {what}"));
                p.assert_close(dw, 1e-3, 1e-4, &format!("conv dw {what}"));
                if let Some(db) = db {
                    p.assert_close(db, 1e-4, 1e-4, &format!("conv db {what}"));
                }
                // Without dx (a first layer): dw alone, and dx untouched.
                let (dw2, dx2) = (p.region(s.w_len()), p.random(s.x_len(), 5.0, 6.0));
                p.both(|be| be.conv2d_bwd(&s, x, w, dy, None, dw2, None, ws));
                p.assert_close(dw2, 1e-3, 1e-4, &format!("conv dw (no dx) {what}"));
                p.assert_exact(dx2, &format!("dx untouched {what}"));
            }
        }
    }
}

/// The fused convolutions over 3 trials, every shape and one whose weight gradient is split, with
/// and without a bias, against the CPU (same tolerances as [`convolutions_match_the_cpu`]): each
/// trial's weights then bias in a parameter block of an odd stride, the gaps between the blocks
/// left as they are. On the GEMM engine the group runs as one lowering; on cuDNN trial by trial.
pub(crate) fn fused_convolutions_match_the_cpu(conv: ConvEngine) {
    gpu_or_skip!();
    let Some(e) = engine_with(conv) else {
        return;
    };
    let trials = 3;
    // 4 samples of 64×64 outputs: a weight gradient long enough for the GEMM lowering to split.
    let long = Conv2dShape {
        n: 4,
        c_in: 1,
        h: 64,
        w: 64,
        c_out: 2,
        k: 3,
        pad: 1,
        stride: 1,
    };
    for s in conv_shapes().into_iter().chain([long]) {
        for bias in [true, false] {
            let mut p = Pair::new(&e);
            let ws_stride = p
                .cpu
                .fused_conv_workspace_len(&s)
                .max(p.gpu.fused_conv_workspace_len(&s));
            let f = FusedConv {
                trials,
                w_stride: s.w_len() + s.c_out + 5,
                ws_stride,
            };
            let block = (trials - 1) * f.w_stride + s.w_len() + s.c_out;
            let params = p.random(block, -1.0, 1.0);
            let w = Region::new(params.offset, block);
            let b = bias.then(|| Region::new(params.offset + s.w_len(), block - s.w_len()));
            let x = p.random(trials * s.x_len(), -1.0, 1.0);
            let y = p.region(trials * s.y_len());
            let ws = p.region(trials * ws_stride);
            let what = format!(
                "{conv:?} k{} pad{} stride{} c{}→{} bias {bias}",
                s.k, s.pad, s.stride, s.c_in, s.c_out
            );
            p.both(|be| be.conv2d_fwd_fused(&s, x, w, b, y, ws, f));
            p.assert_close(y, 1e-4, 1e-4, &format!("fused conv fwd {what}"));
            let dy = p.random(trials * s.y_len(), -1.0, 1.0);
            let dx = p.region(trials * s.x_len());
            let grads = p.random(block, 5.0, 6.0);
            let dw = Region::new(grads.offset, block);
            let db = bias.then(|| Region::new(grads.offset + s.w_len(), block - s.w_len()));
            p.both(|be| be.conv2d_bwd_fused(&s, x, w, dy, Some(dx), dw, db, ws, f));
            p.assert_close(dx, 1e-4, 1e-4, &format!("fused conv dx {what}"));
            p.assert_close(dw, 1e-3, 1e-4, &format!("fused conv dw, db {what}"));
            // Without dx: dw alone, and dx untouched.
            let (dw2, dx2) = (
                p.random(block, 5.0, 6.0),
                p.random(trials * s.x_len(), 5.0, 6.0),
            );
            p.both(|be| be.conv2d_bwd_fused(&s, x, w, dy, None, dw2, None, ws, f));
            p.assert_close(dw2, 1e-3, 1e-4, &format!("fused conv dw (no dx) {what}"));
            p.assert_exact(dx2, &format!("fused dx untouched {what}"));
        }
    }
}

/// cuDNN runs every shape in exactly the workspace it asked the plan for, and says which cuDNN.
pub(crate) fn cudnn_runs_in_the_workspace_it_planned() {
    gpu_or_skip!();
    let Some(e) = engine_with(ConvEngine::Cudnn) else {
        return;
    };
    println!("convolutions on {}", e.conv_engine());
    assert!(
        e.conv_engine().starts_with("cudnn 9."),
        "{}",
        e.conv_engine()
    );
    let gemm = engine_with(ConvEngine::Gemm).expect("gemm engine");
    assert_eq!(gemm.conv_engine(), "gemm");
    let mut p = Pair::new(&e);
    for s in conv_shapes() {
        let need = p.gpu.conv_workspace_len(&s);
        assert_eq!(need, p.gpu.conv_workspace_len(&s), "the choice is stable");
        let x = p.random(s.x_len(), -1.0, 1.0);
        let w = p.random(s.w_len(), -1.0, 1.0);
        let (y, dy, dx, dw) = (
            p.region(s.y_len()),
            p.random(s.y_len(), -1.0, 1.0),
            p.region(s.x_len()),
            p.region(s.w_len()),
        );
        let ws = p.region(need);
        let gpu = p.gpu.as_mut();
        gpu.conv2d_fwd(&s, x, w, None, y, ws)
            .unwrap_or_else(|err| panic!("{s:?} fwd in its planned {need} elements: {err}"));
        gpu.conv2d_bwd(&s, x, w, dy, Some(dx), dw, None, ws)
            .unwrap_or_else(|err| panic!("{s:?} bwd in its planned {need} elements: {err}"));
    }
}

/// Batch norm in training (per-channel statistics in double on both sides, in another order),
/// in inference (bit for bit) and backward, with one block a channel and, for a shape of few
/// channels and many values, several blocks a channel. Tolerance: the double sums round to the same float
/// but for the last bit, so outputs of order one agree to 1e-5 absolute and relative (dx, a
/// difference of sums, to 1e-4 relative).
pub(crate) fn batch_norm_matches_the_cpu() {
    let e = gpu_or_skip!();
    for s in [
        PlaneShape { n: 3, c: 5, hw: 37 },
        PlaneShape {
            n: 4,
            c: 3,
            hw: 700,
        },
        PlaneShape {
            n: 16,
            c: 70,
            hw: 1,
        },
        // Few channels of many values: each channel's sums split over several blocks.
        PlaneShape {
            n: 2,
            c: 2,
            hw: 12288,
        },
    ] {
        let mut p = Pair::new(&e);
        let what = format!("{s:?}");
        let x = p.random(s.len(), -2.0, 3.0);
        let gamma = p.random(s.c, 0.5, 1.5);
        let beta = p.random(s.c, -0.5, 0.5);
        let running = p.random(2 * s.c, 0.5, 1.5);
        let saved = p.region(2 * s.c);
        let y = p.region(s.len());
        let train = BnParams::default();
        p.both(|b| b.batchnorm_fwd(&s, x, gamma, beta, running, saved, y, train));
        p.assert_close(saved, 1e-6, 1e-5, &format!("bn saved {what}"));
        p.assert_close(running, 1e-6, 1e-5, &format!("bn running {what}"));
        p.assert_close(y, 1e-5, 1e-5, &format!("bn y {what}"));
        let dy = p.random(s.len(), -1.0, 1.0);
        let (dx, dg, db) = (p.region(s.len()), p.region(s.c), p.region(s.c));
        // The same saved statistics on both sides, so the gradients are compared alone.
        let (stats, _) = p.outputs(saved);
        p.set(saved, &stats);
        p.both(|b| b.batchnorm_bwd(&s, x, gamma, saved, dy, dx, dg, db));
        p.assert_close(db, 1e-5, 1e-5, &format!("bn dbeta {what}"));
        p.assert_close(dg, 1e-5, 1e-5, &format!("bn dgamma {what}"));
        p.assert_close(dx, 1e-5, 1e-4, &format!("bn dx {what}"));
        // Inference from the same running statistics: bit for bit, and nothing else written.
        let (r, _) = p.outputs(running);
        p.set(running, &r);
        p.set(saved, &vec![7.0; 2 * s.c]);
        let infer = BnParams {
            train: false,
            ..train
        };
        p.both(|b| b.batchnorm_fwd(&s, x, gamma, beta, running, saved, y, infer));
        p.assert_exact(y, &format!("bn inference y {what}"));
        p.assert_exact(running, &format!("bn inference running {what}"));
        p.assert_exact(saved, &format!("bn inference saved {what}"));
    }
}

/// Batch norm over a fused group of 3 trials in one call (odd strides between the trials'
/// parameters and statistics): against the CPU with [`batch_norm_matches_the_cpu`]'s
/// tolerances, and on the GPU bit for bit what each trial computes alone.
pub(crate) fn fused_batch_norm_is_each_trials_own() {
    let e = gpu_or_skip!();
    let trials = 3;
    for s in [
        PlaneShape { n: 3, c: 5, hw: 37 },
        PlaneShape {
            n: 16,
            c: 70,
            hw: 1,
        },
        // Few channels of many values: each channel's sums split over several blocks.
        PlaneShape {
            n: 2,
            c: 2,
            hw: 12288,
        },
    ] {
        let mut p = Pair::new(&e);
        let what = format!("{s:?} × {trials}");
        let f = FusedNorm {
            trials,
            param_stride: s.c + 3,
            running_stride: 2 * s.c + 5,
            saved_stride: 2 * s.c + 1,
        };
        let span = |stride: usize, len: usize| (trials - 1) * stride + len;
        let x = p.random(trials * s.len(), -2.0, 3.0);
        let gamma = p.random(span(f.param_stride, s.c), 0.5, 1.5);
        let beta = p.random(span(f.param_stride, s.c), -0.5, 0.5);
        let running = p.random(span(f.running_stride, 2 * s.c), 0.5, 1.5);
        let (running0, _) = p.outputs(running);
        let saved = p.region(span(f.saved_stride, 2 * s.c));
        let y = p.region(trials * s.len());
        let train = BnParams::default();
        p.both(|b| b.batchnorm_fwd_fused(&s, x, gamma, beta, running, saved, y, train, f));
        p.assert_close(saved, 1e-6, 1e-5, &format!("fused bn saved {what}"));
        p.assert_close(running, 1e-6, 1e-5, &format!("fused bn running {what}"));
        p.assert_close(y, 1e-5, 1e-5, &format!("fused bn y {what}"));
        let read = |gpu: &mut dyn Backend, r: Region| {
            let mut v = vec![0f32; r.len];
            gpu.read(r, &mut v).expect("gpu read");
            v
        };
        let group_fwd = [y, saved, running].map(|r| read(p.gpu.as_mut(), r));
        let dy = p.random(trials * s.len(), -1.0, 1.0);
        let dx = p.region(trials * s.len());
        let (dg, db) = (
            p.random(span(f.param_stride, s.c), 9.0, 9.5),
            p.random(span(f.param_stride, s.c), 9.0, 9.5),
        );
        // The same saved statistics on both sides, so the gradients are compared alone.
        let (stats, _) = p.outputs(saved);
        p.set(saved, &stats);
        p.both(|b| b.batchnorm_bwd_fused(&s, x, gamma, saved, dy, dx, dg, db, f));
        p.assert_close(db, 1e-5, 1e-5, &format!("fused bn dbeta {what}"));
        p.assert_close(dg, 1e-5, 1e-5, &format!("fused bn dgamma {what}"));
        p.assert_close(dx, 1e-5, 1e-4, &format!("fused bn dx {what}"));
        let group_bwd = [dx, dg, db].map(|r| read(p.gpu.as_mut(), r));
        // Each trial alone on the GPU, from the same running and saved statistics: the same bits.
        let gpu = p.gpu.as_mut();
        gpu.write(running, &running0).expect("gpu write");
        for i in 0..trials {
            gpu.batchnorm_fwd(
                &s,
                f.plane(x, &s, i),
                f.param(gamma, &s, i),
                f.param(beta, &s, i),
                f.running(running, &s, i),
                f.saved(saved, &s, i),
                f.plane(y, &s, i),
                train,
            )
            .expect("alone fwd");
        }
        let alone_fwd = [y, saved, running].map(|r| read(gpu, r));
        gpu.write(saved, &stats).expect("gpu write");
        for i in 0..trials {
            gpu.batchnorm_bwd(
                &s,
                f.plane(x, &s, i),
                f.param(gamma, &s, i),
                f.saved(saved, &s, i),
                f.plane(dy, &s, i),
                f.plane(dx, &s, i),
                f.param(dg, &s, i),
                f.param(db, &s, i),
            )
            .expect("alone bwd");
        }
        let alone_bwd = [dx, dg, db].map(|r| read(gpu, r));
        let pairs = group_fwd
            .iter()
            .chain(&group_bwd)
            .zip(alone_fwd.iter().chain(&alone_bwd));
        for (k, (g, a)) in pairs.enumerate() {
            let same = g.iter().zip(a).all(|(g, a)| g.to_bits() == a.to_bits());
            assert!(
                same,
                "{what}: output {k} of the group differs from the trials alone"
            );
        }
    }
}

/// Global average pooling, the residual adds and the copy: bit for bit.
pub(crate) fn average_pooling_adds_and_copies_are_bit_identical() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let s = PlaneShape { n: 5, c: 7, hw: 49 };
    let x = p.random(s.len(), -1.0, 1.0);
    let y = p.region(s.n * s.c);
    p.both(|b| b.avgpool_fwd(&s, x, y));
    p.assert_exact(y, "avgpool_fwd");
    let dx = p.random(s.len(), 3.0, 4.0);
    p.both(|b| b.avgpool_bwd(&s, y, dx));
    p.assert_exact(dx, "avgpool_bwd");
    let len = 3001;
    let (a, b) = (p.random(len, -1.0, 1.0), p.random(len, -1.0, 1.0));
    let sum = p.region(len);
    p.both(|be| be.add(a, b, sum, len));
    p.assert_exact(sum, "add");
    p.both(|be| be.add_assign(sum, a, len));
    p.assert_exact(sum, "add_assign");
    let c = p.random(len, 5.0, 6.0);
    p.both(|be| be.copy(sum, c, len - 1));
    p.assert_exact(c, "copy (the last element untouched)");
}

/// Max pooling bit for bit: square windows, and ResNet's overlapping padded 3×3 stride-2 one,
/// with ties (the first maximum takes the gradient; overlapping windows add in row-major order).
pub(crate) fn max_pooling_matches_the_cpu_ties_included() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    for (k, stride, pad) in [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0), (3, 3, 0)] {
        let s = PoolShape {
            n: 2,
            c: 3,
            h: 9,
            w: 7,
            k,
            stride,
            pad,
        };
        let what = format!("k{k} stride{stride} pad{pad}");
        // Values on a coarse grid, so windows hold ties.
        let x = p.region(s.x_len());
        let v: Vec<f32> = (0..s.x_len())
            .map(|_| (p.rng.uniform_f32(-2.0, 2.0) * 2.0).round() / 2.0)
            .collect();
        p.set(x, &v);
        let y = p.region(s.y_len());
        p.both(|b| b.maxpool_fwd(&s, x, y));
        p.assert_exact(y, &format!("maxpool_fwd {what}"));
        let dy = p.random(s.y_len(), -1.0, 1.0);
        let dx = p.random(s.x_len(), -1.0, 1.0);
        p.both(|b| b.maxpool_bwd(&s, x, y, dy, dx));
        p.assert_exact(dx, &format!("maxpool_bwd {what}"));
    }
}

pub(crate) fn dropout_masks_are_bit_identical() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let len = 5000;
    let counter = p.region(COUNTER_LEN);
    p.set(counter, &[f32::from_bits(5)]);
    // Nonzero inputs, so a zero output means a dropped element.
    let x = p.random(len, 0.5, 1.5);
    for (prob, layer, first) in [(0.3f32, 2u32, 0u64), (0.0, 1, 0), (0.3, 2, 123_457)] {
        let m = DropoutMask {
            p: prob,
            seed: 99,
            counter,
            layer,
            first,
        };
        let y = p.region(len);
        p.both(|b| b.dropout_fwd(x, y, len, m));
        let (c, g) = p.outputs(y);
        let mask = |v: &[f32]| v.iter().map(|&v| v == 0.0).collect::<Vec<_>>();
        assert_eq!(mask(&c), mask(&g), "dropout mask p={prob} from {first}");
        p.assert_close(y, 0.0, 1e-6, &format!("dropout_fwd p={prob}"));
        let dx = p.region(len);
        p.both(|b| b.dropout_bwd(x, dx, len, m));
        p.assert_close(dx, 0.0, 1e-6, &format!("dropout_bwd p={prob}"));
        let (c, g) = p.outputs(dx);
        assert_eq!(mask(&c), mask(&g), "dropout_bwd mask p={prob}");
    }
}

pub(crate) fn softmax_cross_entropy_matches_the_cpu() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let (rows, classes) = (37, 10);
    let logits = p.random(rows * classes, -4.0, 4.0);
    let labels = p.region(rows);
    let l: Vec<f32> = (0..rows).map(|_| p.rng.below(classes) as f32).collect();
    p.set(labels, &l);
    let dlogits = p.region(rows * classes);
    let stats = p.region(2);
    p.set(stats, &[1.0, 2.0]);
    p.both(|b| b.softmax_xent(logits, labels, dlogits, stats, rows, classes));
    p.assert_close(dlogits, 1e-6, 1e-5, "dlogits");
    let (c, g) = p.outputs(stats);
    assert!(
        (c[0] - g[0]).abs() <= 1e-5 * c[0].abs(),
        "loss {g} vs {c}",
        c = c[0],
        g = g[0]
    );
    assert_eq!(c[1], g[1], "correct count");
    p.both(|b| b.eval_xent(logits, labels, stats, rows, classes));
    let (c, g) = p.outputs(stats);
    assert!(
        (c[0] - g[0]).abs() <= 1e-5 * c[0].abs(),
        "eval loss {g} vs {c}",
        c = c[0],
        g = g[0]
    );
    assert_eq!(c[1], g[1], "eval correct count");
}

pub(crate) fn optimisers_match_the_cpu() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let n = 3000;
    for momentum in [0.0, 0.9] {
        let (w, g, v) = (
            p.random(n, -1.0, 1.0),
            p.random(n, -1.0, 1.0),
            p.random(n, -0.1, 0.1),
        );
        let sp = SgdParams {
            lr: 0.05,
            momentum,
            weight_decay: 1e-4,
        };
        p.both(|b| b.sgd_step(w, g, v, sp));
        p.assert_close(w, 1e-6, 1e-5, &format!("sgd w μ={momentum}"));
        p.assert_close(v, 1e-6, 1e-5, &format!("sgd v μ={momentum}"));
    }
    let (w, g) = (p.random(n, -1.0, 1.0), p.random(n, -1.0, 1.0));
    let (m, v) = (p.random(n, -0.1, 0.1), p.random(n, 0.0, 0.1));
    let counter = p.region(COUNTER_LEN);
    p.set(counter, &[f32::from_bits(4)]);
    let ap = AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
    };
    p.both(|b| b.adam_step(w, g, m, v, ap, counter));
    p.assert_close(w, 1e-6, 1e-5, "adam w");
    p.assert_close(m, 1e-6, 1e-5, "adam m");
    p.assert_close(v, 1e-6, 1e-5, "adam v");
}

/// The batched SGD and Adam steps over 13 trials with mixed hyperparameters (momentum and weight
/// decay 0 for some, differing betas, two trials dead) against the CPU's.
pub(crate) fn batched_optimisers_match_the_cpu() {
    use gpumux::engine::fused_hyper::*;
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let (trials, params) = (13, 1001);
    let n = trials * params;
    let mut table = vec![0.0f32; trials * HYPER_LEN];
    for (i, row) in table.chunks_mut(HYPER_LEN).enumerate() {
        let f = i as f32;
        row[HYPER_LR] = 1e-3 * (1.0 + f);
        row[HYPER_WD] = if i % 3 == 0 { 0.0 } else { 1e-4 * f };
        row[HYPER_MOMENTUM] = if i % 2 == 0 { 0.0 } else { 0.9 };
        row[HYPER_BETA1] = 0.9 - 0.01 * f;
        row[HYPER_BETA2] = if i % 2 == 0 { 0.999 } else { 0.99 };
        row[HYPER_EPS] = if i % 4 == 0 { 1e-8 } else { 1e-6 };
        row[HYPER_LIVE] = if i == 4 || i == 12 { 0.0 } else { 1.0 };
        // Trials that took their slot at different steps of the group (at most the counter).
        row[HYPER_STEP0] = f32::from_bits(2 * (i as u32 % 3));
    }
    let hyper = p.region(table.len());
    p.set(hyper, &table);
    let (w, g, v) = (
        p.random(n, -1.0, 1.0),
        p.random(n, -1.0, 1.0),
        p.random(n, -0.1, 0.1),
    );
    p.both(|b| b.sgd_step_batched(w, g, v, hyper, trials));
    p.assert_close(w, 1e-6, 1e-5, "batched sgd w");
    p.assert_close(v, 1e-6, 1e-5, "batched sgd v");
    let (w, g) = (p.random(n, -1.0, 1.0), p.random(n, -1.0, 1.0));
    let (m, v) = (p.random(n, -0.1, 0.1), p.random(n, 0.0, 0.1));
    let counter = p.region(COUNTER_LEN);
    p.set(counter, &[f32::from_bits(4)]);
    p.both(|b| b.adam_step_batched(w, g, m, v, hyper, trials, counter));
    p.assert_close(w, 1e-6, 1e-5, "batched adam w");
    p.assert_close(m, 1e-6, 1e-5, "batched adam m");
    p.assert_close(v, 1e-6, 1e-5, "batched adam v");
}
