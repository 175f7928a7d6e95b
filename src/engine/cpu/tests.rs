//! Tests of the CPU backend's ops on its arena.

use super::*;
use crate::data::{Dataset, Samples};

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
    let (counter, ord) = (Region::new(0, 1), Region::new(1, trials * 20));
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
    let (counter, ord) = (Region::new(0, 1), Region::new(1, 40));
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
