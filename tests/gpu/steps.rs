//! What a training step is made of on the GPU against the CPU: the ops it folds together, the gathers that follow the epoch order, and the graphs that replay it.

use super::*;

/// The folded ops of a training step (a dense layer with its bias and ReLU, the input gradient
/// through a ReLU with the bias gradient, the loss with the last bias gradient, a fused group's
/// evaluation gather and sums, the optimizer step with the counter's advance) against the CPU's,
/// for one trial and for 5; and an upload and a peek, which do not wait.
pub(crate) fn folded_ops_match_the_cpu() {
    use gpumux::engine::fused_hyper::*;
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    for trials in [1usize, 5] {
        let (rows, inputs, outputs) = (37, 50, 24);
        let fwd = GemmShape {
            trans_b: true,
            ..GemmShape::nn(rows, outputs, inputs)
        };
        let x = p.random(trials * rows * inputs, -1.0, 1.0);
        let w = p.random(trials * outputs * inputs, -0.5, 0.5);
        let stride = outputs + 3;
        let bias = p.random(trials * stride, -0.5, 0.5);
        let batch = GemmBatch {
            count: trials,
            stride_a: rows * inputs,
            stride_b: outputs * inputs,
            stride_c: rows * outputs,
        };
        for relu in [false, true] {
            let y = p.region(trials * rows * outputs);
            p.both(|b| b.dense_fwd(fwd, batch, x, w, y, bias, stride, relu));
            p.assert_close(y, 1e-5, 1e-4, &format!("dense_fwd relu {relu} x{trials}"));
        }
        // The input gradient of a layer of `inputs` outputs through the ReLU of `y`.
        let bwd = GemmShape::nn(rows, inputs, outputs);
        let dy = p.random(trials * rows * outputs, -1.0, 1.0);
        let y = p.random(trials * rows * inputs, -1.0, 1.0);
        let dx = p.region(trials * rows * inputs);
        let db = p.random(trials * (inputs + 2), -1.0, 1.0);
        let bb = GemmBatch {
            count: trials,
            stride_a: rows * outputs,
            stride_b: outputs * inputs,
            stride_c: rows * inputs,
        };
        let dbg = BiasGrad {
            db,
            stride: inputs + 2,
        };
        p.both(|b| b.dense_bwd_relu(bwd, bb, dy, w, dx, y, dbg));
        p.assert_close(dx, 1e-5, 1e-4, &format!("dense_bwd_relu dx x{trials}"));
        p.assert_close(db, 1e-4, 1e-4, &format!("dense_bwd_relu db x{trials}"));
        // The loss with the bias gradient of the logits' layer.
        let classes = 10;
        let logits = p.random(trials * rows * classes, -4.0, 4.0);
        let labels = p.region(trials * rows);
        let l: Vec<f32> = (0..trials * rows)
            .map(|_| p.rng.below(classes) as f32)
            .collect();
        p.set(labels, &l);
        let dlogits = p.region(trials * rows * classes);
        let stats = p.region(trials * 2);
        let dl = BiasGrad {
            db: p.random(trials * classes, -1.0, 1.0),
            stride: classes,
        };
        p.both(|b| b.softmax_xent_bias(logits, labels, dlogits, stats, rows, classes, trials, dl));
        p.assert_close(
            dlogits,
            1e-6,
            1e-5,
            &format!("softmax_xent_bias dlogits x{trials}"),
        );
        p.assert_close(
            dl.db,
            1e-5,
            1e-4,
            &format!("softmax_xent_bias db x{trials}"),
        );
        p.assert_close(
            stats,
            1e-4,
            1e-5,
            &format!("softmax_xent_bias stats x{trials}"),
        );
        // A fused evaluation batch: the same test samples into every trial, and its sums.
        let (len, batch_rows, rows_in) = (16, 6, 4);
        let ex = p.region(trials * batch_rows * len);
        let ey = p.region(trials * batch_rows);
        p.both(|b| b.gather_fused(Split::Test, 2, rows_in, batch_rows, ex, ey, trials));
        p.assert_exact(ex, "gather_fused x");
        p.assert_exact(ey, "gather_fused y");
        let el = p.random(trials * batch_rows * 5, -2.0, 2.0);
        let ey5: Vec<f32> = (0..trials * batch_rows).map(|i| (i % 5) as f32).collect();
        p.set(ey, &ey5);
        let es = p.region(trials * 2);
        p.both(|b| b.eval_xent_fused(el, ey, es, rows_in, batch_rows, 5, trials));
        p.assert_close(es, 1e-4, 1e-5, "eval_xent_fused");
    }
    // The optimizer steps with the advance: the same values, and the counter one further.
    let (trials, params) = (3, 2001);
    let n = trials * params;
    let mut table = vec![0.0f32; trials * HYPER_LEN];
    for (i, row) in table.chunks_mut(HYPER_LEN).enumerate() {
        row[HYPER_LR] = 1e-3 * (1.0 + i as f32);
        row[HYPER_MOMENTUM] = 0.9;
        row[HYPER_BETA1] = 0.9;
        row[HYPER_BETA2] = 0.999;
        row[HYPER_EPS] = 1e-8;
        row[HYPER_LIVE] = 1.0;
    }
    let hyper = p.region(table.len());
    p.set(hyper, &table);
    let (w, g) = (p.random(n, -1.0, 1.0), p.random(n, -1.0, 1.0));
    let (m, v) = (p.random(n, -0.1, 0.1), p.random(n, 0.0, 0.1));
    let adam = AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
    };
    let sgd = SgdParams {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-4,
    };
    let counter = p.region(COUNTER_LEN);
    p.set(counter, &[f32::from_bits(6), f32::from_bits(0)]);
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
            trials,
        },
        Update::AdamBatched {
            w,
            g,
            m,
            v,
            hyper,
            trials,
        },
    ];
    for (k, u) in updates.into_iter().enumerate() {
        p.both(|b| b.update(u, counter));
        p.assert_close(w, 1e-6, 1e-5, &format!("update w {u:?}"));
        p.assert_close(v, 1e-6, 1e-5, &format!("update v {u:?}"));
        let (c, gpu) = p.outputs(counter);
        let want = [7 + k as u32, 0];
        assert_eq!(c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        assert_eq!(gpu.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    }
    // Dropout over the group, each trial with its rate and seed from the table.
    let len = 777;
    let mut table = vec![0.0f32; trials * HYPER_LEN];
    for (i, row) in table.chunks_mut(HYPER_LEN).enumerate() {
        let [lo, hi] = seed_bits(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1));
        row[HYPER_DROPOUT] = 0.2 * i as f32;
        row[HYPER_SEED_LO] = lo;
        row[HYPER_SEED_HI] = hi;
        // Each trial at its own step: the counter less where it started.
        row[HYPER_STEP0] = f32::from_bits(3 * i as u32);
    }
    let dropout_table = p.region(table.len());
    p.set(dropout_table, &table);
    let src = p.random(trials * len, -1.0, 1.0);
    let dst = p.region(trials * len);
    p.both(|b| b.dropout_fused(src, dst, len, trials, dropout_table, counter, 2, 11));
    p.assert_exact(dst, "dropout_fused");
    // An upload lands in stream order; a peek gives the values it was issued at, later.
    let up = p.region(1000);
    let vals: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    p.gpu.upload(up, &vals).expect("upload");
    let mut seen = vec![0.0f32; 1000];
    let mut arrived = false;
    for _ in 0..1000 {
        if p.gpu.peek(up, &mut seen).expect("peek") {
            arrived = true;
            break;
        }
        p.gpu.synchronize().expect("synchronize");
    }
    assert!(arrived, "a peek never arrived");
    assert_eq!(seen, vals);
}

pub(crate) fn gathers_follow_the_epoch_order_and_the_counter() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let len = 16;
    let order = HostRng::new(8).permutation(20);
    p.both(|b| b.set_train_order(&order));
    let (x, y) = (p.region(5 * len), p.region(5));
    p.both(|b| b.gather(Split::Train, 3, 5, x, y));
    p.assert_exact(x, "gather train x");
    p.assert_exact(y, "gather train y");
    p.both(|b| b.gather(Split::Test, 2, 4, x, y));
    p.assert_exact(x, "gather test x");
    p.assert_exact(y, "gather test y");
    let counter = p.region(COUNTER_LEN);
    for count in [0u32, 7, 8] {
        p.set(counter, &[f32::from_bits(count)]);
        p.both(|b| b.gather_train(counter, 3, 5, x, y));
        p.assert_exact(x, &format!("gather_train x at {count}"));
        p.assert_exact(y, &format!("gather_train y at {count}"));
    }
    assert_eq!(p.gpu.split_len(Split::Train), 20);
    assert_eq!(p.gpu.split_len(Split::Test), 7);
}

pub(crate) fn fused_gathers_follow_each_trials_order() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let (trials, len, batch) = (3, 16, 5);
    let mut orders: Vec<f32> = (0..trials)
        .flat_map(|t| HostRng::new(30 + t as u64).permutation(20))
        .map(f32::from_bits)
        .collect();
    let ord = p.region(orders.len());
    p.set(ord, &orders);
    let (x, y) = (p.region(trials * batch * len), p.region(trials * batch));
    let counter = p.region(COUNTER_LEN);
    for count in [0u32, 7, 8] {
        p.set(counter, &[f32::from_bits(count)]);
        p.both(|b| b.gather_train_fused(counter, ord, 3, batch, x, y, trials));
        p.assert_exact(x, &format!("gather_train_fused x at {count}"));
        p.assert_exact(y, &format!("gather_train_fused y at {count}"));
    }
    // Captured, the op reads the counter where it runs: the second replay gathers at 5.
    p.set(counter, &[f32::from_bits(4)]);
    let gpu = p.gpu.as_mut();
    gpu.begin_capture().expect("begin");
    gpu.gather_train_fused(counter, ord, 3, batch, x, y, trials)
        .expect("gather captured");
    gpu.advance(counter).expect("advance captured");
    gpu.end_capture().expect("end");
    for _ in 0..2 {
        gpu.replay().expect("replay");
    }
    p.cpu
        .write(counter, &[f32::from_bits(5)])
        .expect("cpu counter");
    p.cpu
        .gather_train_fused(counter, ord, 3, batch, x, y, trials)
        .expect("cpu gather");
    p.assert_exact(x, "replayed gather_train_fused x");
    p.assert_exact(y, "replayed gather_train_fused y");
    // An index beyond the split: the CPU refuses it, the GPU writes zeros for its row.
    let (bad_trial, bad_row) = (1, 2);
    orders[bad_trial * 20 + 2 * batch + bad_row] = f32::from_bits(1000);
    p.set(ord, &orders);
    p.set(counter, &[f32::from_bits(2)]);
    assert!(p
        .cpu
        .gather_train_fused(counter, ord, 3, batch, x, y, trials)
        .is_err());
    p.gpu
        .gather_train_fused(counter, ord, 3, batch, x, y, trials)
        .expect("gpu gather of a bad index");
    let (mut xs, mut ys) = (vec![1.0; x.len], vec![1.0; y.len]);
    p.gpu.read(x, &mut xs).expect("read x");
    p.gpu.read(y, &mut ys).expect("read y");
    let row = bad_trial * batch + bad_row;
    assert!(xs[row * len..(row + 1) * len].iter().all(|&v| v == 0.0));
    assert_eq!(ys[row], 0.0);
}

pub(crate) fn graphs_replay_what_was_captured() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    assert!(p.gpu.supports_graphs());
    let counter = p.region(COUNTER_LEN);
    p.set(counter, &[f32::from_bits(0)]);
    let x = p.random(100, -1.0, 1.0);
    let y = p.region(100);
    let gpu = p.gpu.as_mut();
    assert!(gpu.replay().is_err(), "nothing captured yet");
    gpu.begin_capture().expect("begin");
    gpu.relu_fwd(x, y, 100).expect("relu captured");
    gpu.advance(counter).expect("advance captured");
    assert!(
        gpu.read(counter, &mut [0.0]).is_err(),
        "no reads while capturing"
    );
    gpu.end_capture().expect("end");
    let mut c = [0.0f32];
    gpu.read(counter, &mut c).expect("read");
    assert_eq!(c[0].to_bits(), 0, "capturing runs nothing");
    for _ in 0..3 {
        gpu.replay().expect("replay");
    }
    gpu.read(counter, &mut c).expect("read");
    assert_eq!(c[0].to_bits(), 3, "each replay advances the counter once");
    p.cpu.relu_fwd(x, y, 100).expect("cpu relu");
    p.assert_exact(y, "replayed relu");
}
