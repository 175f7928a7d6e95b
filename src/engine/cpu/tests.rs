//! Tests of the CPU backend's ops on its arena.

use super::*;
use crate::data::{Dataset, Samples};
use crate::engine::{Update, STATS_LEN};

fn tiny() -> Arc<Dataset> {
    Arc::new(Dataset::in_memory(
        "tiny",
        [1, 1, 2],
        2,
        Samples::of(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], vec![0, 1, 0]),
        Samples::of(vec![9.0, 8.0], vec![1]),
    ))
}

#[test]
fn the_cap_is_checked_before_allocating() {
    let mut b = CpuBackend::new(tiny(), Some(1 << 20));
    let e = b.alloc_arena(1 << 20).unwrap_err();
    assert_eq!(e.to_string(), "needs 4.0 MiB, slice cap 1.0 MiB");
    assert!(b.alloc_arena(1000).is_ok());
    assert_eq!(b.allocated_bytes(), 4000);
}

#[test]
fn regions_are_checked() {
    let mut b = CpuBackend::new(tiny(), None);
    assert!(matches!(
        b.fill(Region::new(0, 1), 0.0),
        Err(EngineError::NoArena)
    ));
    b.alloc_arena(10).unwrap();
    assert!(matches!(
        b.fill(Region::new(5, 6), 0.0),
        Err(EngineError::OutOfArena { .. })
    ));
    let e = b
        .relu_fwd(Region::new(0, 4), Region::new(2, 4), 4)
        .unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
}

#[test]
fn gather_follows_the_epoch_order() {
    let mut b = CpuBackend::new(tiny(), None);
    b.alloc_arena(16).unwrap();
    b.set_train_order(&[2, 0, 1]).unwrap();
    b.gather(Split::Train, 0, 2, Region::new(0, 4), Region::new(4, 2))
        .unwrap();
    let mut out = [0.0; 6];
    b.read(Region::new(0, 6), &mut out).unwrap();
    assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 0.0, 0.0]);
    assert!(b.set_train_order(&[0, 1]).is_err());
    assert!(b
        .gather(Split::Test, 0, 2, Region::new(0, 4), Region::new(4, 2))
        .is_err());
}

/// 20 training samples of 1×2×3, 5 classes.
fn twenty() -> Arc<Dataset> {
    let mut rng = crate::rng::HostRng::new(3);
    let images = (0..20 * 6).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
    let labels = (0..20).map(|i| i % 5).collect();
    let test = Samples::of(vec![0.0; 6], vec![0]);
    Arc::new(Dataset::in_memory(
        "twenty",
        [1, 2, 3],
        5,
        Samples::of(images, labels),
        test,
    ))
}

/// The orders of `trials` trials as a fused group's `orders` region holds them.
fn order_bits(orders: &[Vec<u32>]) -> Vec<f32> {
    orders
        .iter()
        .flatten()
        .map(|&i| f32::from_bits(i))
        .collect()
}

#[test]
fn fused_convolutions_are_each_trials_own_bit_for_bit() {
    // 3 trials of 2 samples, 2→3 channels, 3×3 padded on 5×4, with a bias; each trial's
    // parameter block holds its weights then its bias, with room between the blocks.
    let s = Conv2dShape {
        n: 2,
        c_in: 2,
        h: 5,
        w: 4,
        c_out: 3,
        k: 3,
        pad: 1,
        stride: 2,
    };
    let trials = 3;
    let f = FusedConv {
        trials,
        w_stride: s.w_len() + s.c_out + 3,
        ws_stride: s.ws_len() + 2,
    };
    let (xl, yl) = (s.x_len() * trials, s.y_len() * trials);
    let pl = f.w_stride * trials;
    let x = Region::new(0, xl);
    let y = Region::new(xl, yl);
    let w = Region::new(xl + yl, pl);
    let b = Region::new(w.offset + s.w_len(), pl - s.w_len());
    let dw = Region::new(w.end(), pl);
    let db = Region::new(dw.offset + s.w_len(), pl - s.w_len());
    let dx = Region::new(dw.end(), xl);
    let ws = Region::new(dx.end(), f.ws_stride * trials);
    let total = ws.end();
    let mut rng = crate::rng::HostRng::new(7);
    let init: Vec<f32> = (0..total).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
    let fresh = || {
        let mut be = CpuBackend::new(tiny(), None);
        be.alloc_arena(total).unwrap();
        be.write(Region::new(0, total), &init).unwrap();
        be
    };
    let all = |be: &mut CpuBackend| {
        let mut out = vec![0.0f32; total];
        be.read(Region::new(0, total), &mut out).unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    let mut fused = fresh();
    fused.conv2d_fwd_fused(&s, x, w, Some(b), y, ws, f).unwrap();
    fused
        .conv2d_bwd_fused(&s, x, w, y, Some(dx), dw, Some(db), ws, f)
        .unwrap();
    let mut alone = fresh();
    let (x_len, y_len) = (s.x_len(), s.y_len());
    for i in 0..trials {
        let at = |r: Region, stride, len| FusedConv::at(r, i, stride, len);
        let ws_i = at(ws, f.ws_stride, s.ws_len());
        let (x_i, y_i) = (at(x, x_len, x_len), at(y, y_len, y_len));
        let (w_i, b_i) = (at(w, f.w_stride, s.w_len()), at(b, f.w_stride, s.c_out));
        alone
            .conv2d_fwd(&s, x_i, w_i, Some(b_i), y_i, ws_i)
            .unwrap();
    }
    for i in 0..trials {
        let at = |r: Region, stride, len| FusedConv::at(r, i, stride, len);
        let ws_i = at(ws, f.ws_stride, s.ws_len());
        let (x_i, y_i) = (at(x, x_len, x_len), at(y, y_len, y_len));
        let (w_i, dw_i) = (at(w, f.w_stride, s.w_len()), at(dw, f.w_stride, s.w_len()));
        let (db_i, dx_i) = (at(db, f.w_stride, s.c_out), at(dx, x_len, x_len));
        alone
            .conv2d_bwd(&s, x_i, w_i, y_i, Some(dx_i), dw_i, Some(db_i), ws_i)
            .unwrap();
    }
    assert_eq!(all(&mut fused), all(&mut alone));
    // A workspace stride under one convolution's need is a shape error.
    let short = FusedConv {
        ws_stride: s.ws_len() - 1,
        ..f
    };
    let e = fused
        .conv2d_fwd_fused(&s, x, w, None, y, ws, short)
        .unwrap_err();
    assert!(e.to_string().contains("workspace's stride"), "{e}");
}

#[test]
fn a_fused_gather_is_each_trials_own_gather() {
    let (trials, steps, batch, len) = (3, 3, 6, 6);
    let orders: Vec<Vec<u32>> = (0..trials)
        .map(|t| crate::rng::HostRng::new(40 + t as u64).permutation(20))
        .collect();
    assert_ne!(orders[0], orders[1]);
    let (counter, ord) = (
        Region::new(0, COUNTER_LEN),
        Region::new(COUNTER_LEN, trials * 20),
    );
    let x = Region::new(64, trials * batch * len);
    let y = Region::new(192, trials * batch);
    // Past one epoch: batch 7 % 3 = 1 of each order.
    let count = [f32::from_bits(7)];
    let mut fused = CpuBackend::new(twenty(), None);
    fused.alloc_arena(256).unwrap();
    fused.write(counter, &count).unwrap();
    fused.write(ord, &order_bits(&orders)).unwrap();
    fused
        .gather_train_fused(counter, ord, steps, batch, x, y, trials)
        .unwrap();
    let (mut xs, mut ys) = (vec![0.0; x.len], vec![0.0; y.len]);
    fused.read(x, &mut xs).unwrap();
    fused.read(y, &mut ys).unwrap();
    for (t, order) in orders.iter().enumerate() {
        let mut one = CpuBackend::new(twenty(), None);
        one.alloc_arena(64).unwrap();
        one.write(counter, &count).unwrap();
        one.set_train_order(order).unwrap();
        let (x1, y1) = (Region::new(8, batch * len), Region::new(48, batch));
        one.gather_train(counter, steps, batch, x1, y1).unwrap();
        let (mut want_x, mut want_y) = (vec![0.0f32; x1.len], vec![0.0f32; y1.len]);
        one.read(x1, &mut want_x).unwrap();
        one.read(y1, &mut want_y).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let got_x = &xs[t * batch * len..(t + 1) * batch * len];
        assert_eq!(bits(got_x), bits(&want_x), "trial {t}'s x");
        assert_eq!(
            bits(&ys[t * batch..(t + 1) * batch]),
            bits(&want_y),
            "trial {t}'s y"
        );
    }
}

#[test]
fn a_fused_gather_refuses_an_index_beyond_the_split() {
    let mut b = CpuBackend::new(twenty(), None);
    b.alloc_arena(256).unwrap();
    let mut orders = vec![(0..20).collect::<Vec<u32>>(); 2];
    orders[1][5] = 20;
    let (counter, ord) = (Region::new(0, COUNTER_LEN), Region::new(COUNTER_LEN, 40));
    let (x, y) = (Region::new(64, 2 * 4 * 6), Region::new(128, 8));
    b.write(counter, &[f32::from_bits(1)]).unwrap();
    b.write(ord, &order_bits(&orders)).unwrap();
    b.fill(x, 7.0).unwrap();
    let e = b
        .gather_train_fused(counter, ord, 2, 4, x, y, 2)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "shape mismatch in gather_train_fused: trial 1's order holds sample 20, beyond 20 \
         training samples"
    );
    let mut xs = vec![0.0; x.len];
    b.read(x, &mut xs).unwrap();
    assert!(xs.iter().all(|&v| v == 7.0), "nothing is written");
    // Batch 0 does not reach the bad index.
    b.write(counter, &[f32::from_bits(2)]).unwrap();
    b.gather_train_fused(counter, ord, 2, 4, x, y, 2).unwrap();
    // Nor do the orders overlap what is written.
    let e = b
        .gather_train_fused(counter, ord, 2, 4, Region::new(30, 48), y, 2)
        .unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
}

/// Deterministic values in [-1, 1) with some exact zeros and negatives, for the folded ops.
fn wavy(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32;
            let v = v / (1u32 << 24) as f32 * 2.0 - 1.0;
            if i % 7 == 3 {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// Two CPU backends with the same arena of `len` values.
fn pair(len: usize, seed: u32) -> (CpuBackend, CpuBackend) {
    let vals = wavy(len, seed);
    let mut a = CpuBackend::new(twenty(), None);
    let mut b = CpuBackend::new(twenty(), None);
    for be in [&mut a, &mut b] {
        be.alloc_arena(len).unwrap();
        be.write(Region::new(0, len), &vals).unwrap();
    }
    (a, b)
}

fn arena(b: &mut CpuBackend) -> Vec<f32> {
    let mut out = vec![0.0; b.arena.len()];
    b.read(Region::new(0, out.len()), &mut out).unwrap();
    out
}

#[test]
fn a_dense_layer_in_one_op_is_its_gemm_bias_and_relu_bit_for_bit() {
    let (rows, inputs, outputs, trials) = (5, 7, 4, 3);
    let g = GemmShape {
        trans_b: true,
        ..GemmShape::nn(rows, outputs, inputs)
    };
    let x = Region::new(0, trials * rows * inputs);
    let w = Region::new(200, trials * outputs * inputs);
    let bias = Region::new(300, trials * 16);
    let y = Region::new(400, trials * rows * outputs);
    let batch = GemmBatch {
        count: trials,
        stride_a: rows * inputs,
        stride_b: outputs * inputs,
        stride_c: rows * outputs,
    };
    for relu in [false, true] {
        let (mut one, mut parts) = pair(600, 11);
        one.dense_fwd(g, batch, x, w, y, bias, 16, relu).unwrap();
        parts.gemm_batched(g, batch, x, w, y).unwrap();
        parts
            .bias_add_fused(y, bias, rows, outputs, trials, 16)
            .unwrap();
        if relu {
            let tmp = Region::new(520, y.len);
            parts.relu_fwd(y, tmp, y.len).unwrap();
            parts.copy(tmp, y, y.len).unwrap();
        }
        let (a, b) = (arena(&mut one), arena(&mut parts));
        assert_eq!(a[y.offset..y.end()], b[y.offset..y.end()], "relu {relu}");
        if relu {
            assert!(a[y.offset..y.end()].iter().all(|&v| v >= 0.0));
        }
    }
    // Outputs that do not lie one right after another are refused.
    let (mut one, _) = pair(512, 11);
    let apart = GemmBatch {
        stride_c: rows * outputs + 1,
        ..batch
    };
    let y_apart = Region::new(400, 100);
    let e = one
        .dense_fwd(g, apart, x, w, y_apart, bias, 16, true)
        .unwrap_err();
    assert!(e.to_string().contains("one right after another"), "{e}");
}

#[test]
fn a_dense_input_gradient_through_a_relu_is_its_gemm_relu_and_bias_gradient_bit_for_bit() {
    let (rows, inputs, outputs, trials) = (6, 5, 3, 2);
    let g = GemmShape::nn(rows, inputs, outputs);
    let dy = Region::new(0, trials * rows * outputs);
    let w = Region::new(64, trials * outputs * inputs);
    let y = Region::new(128, trials * rows * inputs);
    let dx = Region::new(192, trials * rows * inputs);
    let db = Region::new(256, trials * 9);
    let batch = GemmBatch {
        count: trials,
        stride_a: rows * outputs,
        stride_b: outputs * inputs,
        stride_c: rows * inputs,
    };
    let (mut one, mut parts) = pair(320, 5);
    one.dense_bwd_relu(g, batch, dy, w, dx, y, BiasGrad { db, stride: 9 })
        .unwrap();
    // The same ops apart, the GEMM's output first in scratch past the shared values.
    let mut big = CpuBackend::new(twenty(), None);
    big.alloc_arena(512).unwrap();
    let vals = arena(&mut parts);
    big.write(Region::new(0, 320), &vals).unwrap();
    let raw = Region::new(320, dx.len);
    big.gemm_batched(g, batch, dy, w, raw).unwrap();
    big.relu_bwd(y, raw, dx, dx.len).unwrap();
    big.bias_grad_fused(dx, db, rows, inputs, trials, 9)
        .unwrap();
    let (a, b) = (arena(&mut one), arena(&mut big));
    assert_eq!(a[..320], b[..320]);
    // Something was masked, and something was not.
    let masked = a[dx.offset..dx.end()].iter().filter(|&&v| v == 0.0).count();
    assert!(masked > 0 && masked < dx.len, "{masked} of {}", dx.len);
}

#[test]
fn the_loss_with_its_bias_gradient_is_the_loss_then_the_bias_gradient() {
    let (rows, classes, trials) = (4, 3, 2);
    let logits = Region::new(0, trials * rows * classes);
    let labels = Region::new(32, trials * rows);
    let dlogits = Region::new(48, trials * rows * classes);
    let stats = Region::new(80, trials * STATS_LEN);
    let db = Region::new(96, trials * 5);
    let (mut one, mut parts) = pair(128, 3);
    let labels_vals: Vec<f32> = (0..labels.len).map(|i| (i % classes) as f32).collect();
    for b in [&mut one, &mut parts] {
        b.write(labels, &labels_vals).unwrap();
        b.fill(stats, 0.0).unwrap();
    }
    one.softmax_xent_bias(
        logits,
        labels,
        dlogits,
        stats,
        rows,
        classes,
        trials,
        BiasGrad { db, stride: 5 },
    )
    .unwrap();
    parts
        .softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials)
        .unwrap();
    parts
        .bias_grad_fused(dlogits, db, rows, classes, trials, 5)
        .unwrap();
    assert_eq!(arena(&mut one), arena(&mut parts));
}

#[test]
fn fused_evaluation_ops_are_each_trials_own() {
    let (rows, batch, classes, trials) = (3, 4, 5, 3);
    let len = 6;
    let x = Region::new(0, trials * batch * len);
    let y = Region::new(80, trials * batch);
    let stats = Region::new(96, trials * STATS_LEN);
    let (mut one, mut parts) = pair(160, 9);
    one.gather_fused(Split::Train, 1, rows, batch, x, y, trials)
        .unwrap();
    for t in 0..trials {
        let xt = Region::new(t * batch * len, rows * len);
        let yt = Region::new(80 + t * batch, rows);
        parts.gather(Split::Train, 1, rows, xt, yt).unwrap();
    }
    assert_eq!(arena(&mut one), arena(&mut parts));
    // The inputs as logits of 5 classes over a batch of 4 (6 > 5 elements a row is fine:
    // only 5 are read per row at a stride of 5).
    for b in [&mut one, &mut parts] {
        b.fill(stats, 0.0).unwrap();
    }
    let logits = Region::new(0, trials * batch * classes);
    one.eval_xent_fused(logits, y, stats, rows, batch, classes, trials)
        .unwrap();
    for t in 0..trials {
        let l = Region::new(t * batch * classes, rows * classes);
        let yt = Region::new(80 + t * batch, rows);
        let st = Region::new(96 + t * STATS_LEN, STATS_LEN);
        parts.eval_xent(l, yt, st, rows, classes).unwrap();
    }
    assert_eq!(arena(&mut one), arena(&mut parts));
    let e = one
        .gather_fused(Split::Train, 0, batch + 1, batch, x, y, trials)
        .unwrap_err();
    assert!(e.to_string().contains("do not fit a batch"), "{e}");
}

#[test]
fn an_update_is_the_optimizer_step_then_the_advance() {
    let n = 24;
    let (w, g, m, v) = (
        Region::new(0, n),
        Region::new(32, n),
        Region::new(64, n),
        Region::new(96, n),
    );
    let counter = Region::new(128, COUNTER_LEN);
    let hyper = Region::new(136, 2 * crate::engine::fused_hyper::HYPER_LEN);
    let adam = AdamParams {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let sgd = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    let mut table = vec![0.05f32; hyper.len];
    for row in table.chunks_mut(crate::engine::fused_hyper::HYPER_LEN) {
        row[crate::engine::fused_hyper::HYPER_LIVE] = 1.0;
        row[crate::engine::fused_hyper::HYPER_BETA1] = 0.9;
        row[crate::engine::fused_hyper::HYPER_BETA2] = 0.999;
        row[crate::engine::fused_hyper::HYPER_EPS] = 1e-8;
    }
    let updates = [
        Update::Sgd { w, g, v, p: sgd },
        Update::Adam {
            w,
            g,
            m,
            v,
            p: adam,
        },
        Update::SgdBatched {
            w,
            g,
            v,
            hyper,
            trials: 2,
        },
        Update::AdamBatched {
            w,
            g,
            m,
            v,
            hyper,
            trials: 2,
        },
    ];
    for u in updates {
        let (mut one, mut parts) = pair(160, 21);
        for b in [&mut one, &mut parts] {
            b.write(counter, &[f32::from_bits(4), f32::from_bits(0)])
                .unwrap();
            b.write(hyper, &table).unwrap();
        }
        one.update(u, counter).unwrap();
        match u {
            Update::Sgd { w, g, v, p } => parts.sgd_step(w, g, v, p).unwrap(),
            Update::Adam { w, g, m, v, p } => parts.adam_step(w, g, m, v, p, counter).unwrap(),
            Update::SgdBatched {
                w,
                g,
                v,
                hyper,
                trials,
            } => parts.sgd_step_batched(w, g, v, hyper, trials).unwrap(),
            Update::AdamBatched {
                w,
                g,
                m,
                v,
                hyper,
                trials,
            } => parts
                .adam_step_batched(w, g, m, v, hyper, trials, counter)
                .unwrap(),
        }
        parts.advance(counter).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let (a, b) = (arena(&mut one), arena(&mut parts));
        assert_eq!(bits(a.clone()), bits(b), "{u:?}");
        assert_eq!(a[counter.offset].to_bits(), 5, "{u:?}");
        assert_eq!(a[counter.offset + 1].to_bits(), 0, "{u:?}");
    }
}

/// Each trial's mask is its own: its rate, its seed, and its own step (the group's counter
/// less the step it started at).
#[test]
fn fused_dropout_is_each_trials_own_mask() {
    use crate::engine::fused_hyper::{
        seed_bits, HYPER_DROPOUT, HYPER_LEN, HYPER_SEED_HI, HYPER_SEED_LO, HYPER_STEP0,
    };
    let (len, trials) = (50, 3);
    let src = Region::new(0, len * trials);
    let dst = Region::new(160, len * trials);
    let hyper = Region::new(320, trials * HYPER_LEN);
    let counter = Region::new(360, COUNTER_LEN);
    let rates = [0.0f32, 0.25, 0.5];
    let seeds = [7u64, u64::MAX - 3, 1 << 40];
    let step0 = [0u32, 4, 9];
    let mut table = vec![0f32; hyper.len];
    for (t, row) in table.chunks_mut(HYPER_LEN).enumerate() {
        let [lo, hi] = seed_bits(seeds[t]);
        row[HYPER_DROPOUT] = rates[t];
        row[HYPER_SEED_LO] = lo;
        row[HYPER_SEED_HI] = hi;
        row[HYPER_STEP0] = f32::from_bits(step0[t]);
    }
    let (mut one, mut parts) = pair(400, 17);
    for b in [&mut one, &mut parts] {
        b.write(hyper, &table).unwrap();
        b.write(counter, &[f32::from_bits(9), f32::from_bits(0)])
            .unwrap();
    }
    one.dropout_fused(src, dst, len, trials, hyper, counter, 3, 5)
        .unwrap();
    for t in 0..trials {
        // Alone, the trial's counter holds its own step.
        let own = Region::new(364 + 2 * t, COUNTER_LEN);
        parts
            .write(own, &[f32::from_bits(9 - step0[t]), f32::from_bits(0)])
            .unwrap();
        let mask = DropoutMask {
            p: rates[t],
            seed: seeds[t],
            counter: own,
            layer: 3,
            first: 5,
        };
        let (s, d) = (Region::new(t * len, len), Region::new(160 + t * len, len));
        parts.dropout_fwd(s, d, len, mask).unwrap();
    }
    let (a, b) = (arena(&mut one), arena(&mut parts));
    let outputs = |v: &[f32]| {
        v[160..160 + len * trials]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(outputs(&a), outputs(&b));
    // The trial with a rate of 0.5 dropped some of its elements, the one with 0 none.
    let dropped = |t: usize| {
        a[160 + t * len..160 + (t + 1) * len]
            .iter()
            .filter(|&&v| v == 0.0)
            .count()
    };
    assert!(dropped(2) > dropped(0), "{} vs {}", dropped(2), dropped(0));
}
