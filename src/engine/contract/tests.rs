//! Tests of the backend contract's checks.

use super::*;

fn message(e: EngineError) -> String {
    e.to_string()
}

#[test]
fn short_regions_are_shape_errors() {
    let e = need("gemm", "A", Region::new(0, 3), 4).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gemm: A holds 3 elements, needs 4"
    );
    assert_eq!(
        need("gemm", "A", Region::new(8, 10), 4).unwrap(),
        Region::new(8, 4)
    );
    assert_eq!(optional("conv2d_fwd", "b", None, 4).unwrap(), None);
}

#[test]
fn regions_lie_in_the_arena_and_writes_overlap_nothing() {
    assert!(matches!(
        regions("fill", 0, &[], &[Region::new(0, 1)]),
        Err(EngineError::NoArena)
    ));
    assert!(matches!(
        regions("fill", 10, &[], &[Region::new(5, 6)]),
        Err(EngineError::OutOfArena {
            offset: 5,
            len: 6,
            arena: 10
        })
    ));
    assert!(matches!(
        regions("fill", 10, &[], &[Region::new(usize::MAX, 2)]),
        Err(EngineError::OutOfArena { .. })
    ));
    let e = regions("relu_fwd", 10, &[Region::new(0, 4)], &[Region::new(2, 4)]).unwrap_err();
    assert!(message(e).contains("overlaps"));
    let e = regions("add", 10, &[], &[Region::new(0, 4), Region::new(3, 4)]).unwrap_err();
    assert!(message(e).contains("overlaps"));
    // Reads may overlap each other.
    regions(
        "add",
        10,
        &[Region::new(0, 4), Region::new(0, 4)],
        &[Region::new(4, 4)],
    )
    .unwrap();
}

#[test]
fn labels_are_whole_classes() {
    labels(&[0.0, 1.0, 2.0], 3).unwrap();
    for bad in [3.0, -1.0, 0.5, f32::NAN, f32::INFINITY] {
        let e = labels(&[0.0, bad], 3).unwrap_err();
        assert_eq!(
            message(e),
            format!("shape mismatch in softmax_xent: label {bad} is not a class below 3")
        );
    }
}

#[test]
fn windows_must_fit() {
    let c = Conv2dShape {
        n: 1,
        c_in: 1,
        h: 2,
        w: 2,
        c_out: 1,
        k: 3,
        pad: 0,
        stride: 1,
    };
    assert!(conv2d_fwd(
        &c,
        Region::new(0, 4),
        Region::new(4, 9),
        None,
        Region::new(13, 1)
    )
    .is_err());
    assert!(conv("conv2d_fwd", &Conv2dShape { pad: 1, ..c }).is_ok());
    let p = PoolShape::square(1, 1, 2, 2, 2);
    assert!(pool("maxpool_fwd", &p).is_ok());
    // Padding as wide as the window leaves a window of padding only.
    let e = pool("maxpool_fwd", &PoolShape { pad: 2, ..p }).unwrap_err();
    assert!(message(e).contains("does not fit"));
}

#[test]
fn orders_batches_and_rows_are_checked() {
    train_order(&[2, 0, 1], 3).unwrap();
    assert!(train_order(&[0, 1], 3).is_err());
    assert!(train_order(&[0, 1, 3], 3).is_err());
    let (x, y) = (Region::new(0, 10), Region::new(10, 5));
    assert!(gather_train(0, 1, 10, 2, x, y).is_err());
    assert!(gather_train(3, 4, 10, 2, x, y).is_err());
    assert!(gather_train(2, 5, 10, 3, x, y).is_err());
    assert_eq!(gather_train(2, 5, 10, 2, x, y).unwrap(), (x, y));
    assert!(gather_train(2, usize::MAX, 10, 2, x, y).is_err());
    let e = gather(2, 2, 3, 1, Region::new(0, 2), Region::new(2, 2)).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather: rows 2..4 beyond 3 samples"
    );
    let (x, y) = gather(0, 2, 3, 2, Region::new(0, 8), Region::new(8, 8)).unwrap();
    assert_eq!((x, y), (Region::new(0, 4), Region::new(8, 2)));
}

#[test]
fn fused_gathers_hold_every_trial() {
    // 3 trials of 10 samples of 2, batches of 4 over 2 steps.
    let (o, x, y) = (Region::new(0, 40), Region::new(40, 30), Region::new(70, 20));
    let got = gather_train_fused(2, 4, 10, 2, 3, [o, x, y]).unwrap();
    assert_eq!(
        got,
        GatherFused {
            orders: Region::new(0, 30),
            x: Region::new(40, 24),
            y: Region::new(70, 12),
        }
    );
    let e = gather_train_fused(2, 4, 10, 2, 3, [Region::new(0, 29), x, y]).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: orders holds 29 elements, needs 30"
    );
    let e = gather_train_fused(2, 4, 10, 2, 3, [o, Region::new(40, 23), y]).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: x holds 23 elements, needs 24"
    );
    let e = gather_train_fused(2, 4, 10, 2, 3, [o, x, Region::new(70, 11)]).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: y holds 11 elements, needs 12"
    );
    let e = gather_train_fused(3, 4, 10, 2, 3, [o, x, y]).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: 3 batches of 4 are beyond 10 samples"
    );
    let e = gather_train_fused(0, 4, 10, 2, 3, [o, x, y]).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: an epoch needs at least one step"
    );
    let e = gather_train_fused(1, 4, 10, 2, usize::MAX, [o, x, y]).unwrap_err();
    assert!(message(e).contains("spans more elements than fit"));
    let e = gather_train_fused(1, 4, 10, usize::MAX, 3, [o, x, y]).unwrap_err();
    assert!(message(e).contains("spans more elements than fit"));
    let empty = Region::new(0, 0);
    assert!(gather_train_fused(1, 4, 10, 2, 0, [empty, empty, empty]).is_ok());
    assert_eq!(fused_order_index(1, f32::from_bits(9), 10).unwrap(), 9);
    let e = fused_order_index(2, f32::from_bits(10), 10).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gather_train_fused: trial 2's order holds sample 10, beyond 10 \
         training samples"
    );
}

#[test]
fn batched_gemm_regions_span_every_operand() {
    let g = GemmShape::nn(2, 3, 4);
    let batch = GemmBatch {
        count: 3,
        stride_a: 10,
        stride_b: 0,
        stride_c: 6,
    };
    // A: 2·10 + 8, B: shared, 12; C: 2·6 + 6.
    let [a, b, c] = gemm_batched(
        &g,
        &batch,
        Region::new(0, 30),
        Region::new(30, 12),
        Region::new(42, 20),
    )
    .unwrap();
    assert_eq!((a.len, b.len, c.len), (28, 12, 18));
    let e = gemm_batched(
        &g,
        &batch,
        Region::new(0, 27),
        Region::new(30, 12),
        Region::new(42, 20),
    )
    .unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gemm_batched: A holds 27 elements, needs 28"
    );
    let e = gemm_batched(
        &g,
        &GemmBatch {
            stride_c: 5,
            ..batch
        },
        Region::new(0, 30),
        Region::new(30, 12),
        Region::new(42, 20),
    )
    .unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in gemm_batched: C's stride 5 is shorter than C's 6 elements: \
         the outputs would overlap"
    );
    // One GEMM may have any C stride; none needs no room at all.
    let one = GemmBatch { count: 1, ..batch };
    assert!(gemm_batched(&g, &one, a, b, Region::new(42, 6)).is_ok());
    let none = GemmBatch { count: 0, ..batch };
    let empty = Region::new(0, 0);
    assert!(gemm_batched(&g, &none, empty, empty, empty).is_ok());
    let huge = GemmBatch {
        count: usize::MAX,
        ..batch
    };
    assert!(gemm_batched(&g, &huge, a, b, c).is_err());
}

#[test]
fn batched_optimizer_regions_split_into_trials() {
    use super::super::fused_hyper::HYPER_LEN;
    let (w, g, h) = (Region::new(0, 12), Region::new(12, 12), Region::new(24, 40));
    let (params, [g2], h2) = optim_batched("op", w, [("g", g)], h, 3).unwrap();
    assert_eq!((params, g2, h2.len), (4, g, 3 * HYPER_LEN));
    let e = optim_batched("op", w, [("g", g)], h, 5).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in op: w's 12 elements do not split into 5 trials"
    );
    let e = optim_batched("op", w, [("g", g)], Region::new(24, 20), 3).unwrap_err();
    assert_eq!(
        message(e),
        format!(
            "shape mismatch in op: hyper holds 20 elements, needs {}",
            3 * HYPER_LEN
        )
    );
    let e = optim_batched("op", w, [("g", Region::new(12, 11))], h, 3).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in op: g holds 11 elements, needs 12"
    );
    let empty = Region::new(0, 0);
    assert!(optim_batched("op", empty, [("g", empty)], empty, 0).is_ok());
    assert!(optim_batched("op", w, [("g", g)], h, 0).is_err());
}

#[test]
fn fused_bias_regions_span_every_trial() {
    // 3 trials of 4 × 5, biases every 7 elements: y 60, bias 2·7 + 5 = 19.
    let (y, b) = (Region::new(0, 70), Region::new(70, 30));
    let [y2, b2] = bias_add_fused(y, b, 4, 5, 3, 7).unwrap();
    assert_eq!((y2, b2), (Region::new(0, 60), Region::new(70, 19)));
    let [dy2, db2] = bias_grad_fused(y, b, 4, 5, 3, 5).unwrap();
    assert_eq!((dy2, db2), (Region::new(0, 60), Region::new(70, 15)));
    let e = bias_add_fused(Region::new(0, 59), b, 4, 5, 3, 7).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in bias_add_fused: y holds 59 elements, needs 60"
    );
    let e = bias_add_fused(y, Region::new(70, 18), 4, 5, 3, 7).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in bias_add_fused: bias holds 18 elements, needs 19"
    );
    let e = bias_grad_fused(y, b, 4, 5, 3, 4).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in bias_grad_fused: db's stride 4 is shorter than its 5 elements"
    );
    let e = bias_add_fused(y, b, 4, 5, 3, 4).unwrap_err();
    assert!(message(e).contains("bias's stride 4 is shorter"));
    let e = bias_grad_fused(Region::new(0, 59), b, 4, 5, 3, 5).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in bias_grad_fused: dy holds 59 elements, needs 60"
    );
    // One trial may have any stride; none needs no room.
    let [_, b1] = bias_add_fused(y, b, 4, 5, 1, 0).unwrap();
    assert_eq!(b1, Region::new(70, 5));
    let empty = Region::new(0, 0);
    assert!(bias_grad_fused(empty, empty, 4, 5, 0, 0).is_ok());
    for (rows, trials, stride) in [(usize::MAX, 3, 7), (4, usize::MAX, 7), (4, 3, usize::MAX)] {
        let e = bias_add_fused(y, b, rows, 5, trials, stride).unwrap_err();
        assert!(message(e).contains("spans more elements than fit"));
        let e = bias_grad_fused(y, b, rows, 5, trials, stride).unwrap_err();
        assert!(message(e).contains("spans more elements than fit"));
    }
}

#[test]
fn fused_conv_regions_span_every_trial() {
    // 1→2 channels, 3×3 valid on 4×4, batch 2: x 32, y 16, w 18, b 2.
    let s = Conv2dShape {
        n: 2,
        c_in: 1,
        h: 4,
        w: 4,
        c_out: 2,
        k: 3,
        pad: 0,
        stride: 1,
    };
    let f = FusedConv {
        trials: 3,
        w_stride: 25,
        ws_stride: 20,
    };
    let (x, w, b, y) = (
        Region::new(0, 100),
        Region::new(100, 80),
        Region::new(118, 70),
        Region::new(200, 60),
    );
    let r = conv2d_fwd_fused(&s, x, w, Some(b), y, f).unwrap();
    assert_eq!(r.x, Region::new(0, 96));
    assert_eq!(r.w, Region::new(100, 68));
    assert_eq!(r.b, Some(Region::new(118, 52)));
    assert_eq!(r.y, Region::new(200, 48));
    let e = conv2d_fwd_fused(&s, Region::new(0, 95), w, None, y, f).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in conv2d_fwd_fused: x holds 95 elements, needs 96"
    );
    let e = conv2d_fwd_fused(&s, x, Region::new(100, 67), None, y, f).unwrap_err();
    assert!(message(e).contains("w holds 67 elements, needs 68"));
    let short = FusedConv { w_stride: 17, ..f };
    let e = conv2d_fwd_fused(&s, x, w, None, y, short).unwrap_err();
    assert!(message(e).contains("w's stride 17 is shorter than its 18 elements"));
    let r = conv2d_bwd_fused(&s, x, w, y, Some(x), w, Some(b), f).unwrap();
    assert_eq!(
        (r.dy, r.dx),
        (Region::new(200, 48), Some(Region::new(0, 96)))
    );
    assert_eq!(
        (r.dw, r.db),
        (Region::new(100, 68), Some(Region::new(118, 52)))
    );
    let e = conv2d_bwd_fused(&s, x, w, Region::new(200, 47), None, w, None, f).unwrap_err();
    assert!(message(e).contains("dy holds 47 elements, needs 48"));
    let e = conv2d_bwd_fused(&s, x, w, y, None, w, Some(Region::new(118, 51)), f);
    assert!(message(e.unwrap_err()).contains("db holds 51 elements, needs 52"));
    // The workspace: 2·20 + 15 for trials of 15 elements; a stride under a trial's need.
    let ws = fused_ws("op", Region::new(0, 60), f, 15).unwrap();
    assert_eq!(ws, Region::new(0, 55));
    let e = fused_ws("op", Region::new(0, 60), f, 21).unwrap_err();
    assert!(message(e).contains("workspace's stride 20 is shorter than its 21 elements"));
    assert!(fused_ws("op", Region::new(0, 54), f, 15).is_err());
    // Spans that overflow are shape errors.
    let huge = FusedConv {
        trials: usize::MAX,
        ..f
    };
    let e = conv2d_fwd_fused(&s, x, w, None, y, huge).unwrap_err();
    assert!(message(e).contains("spans more elements than fit"));
    let e = fused_ws(
        "op",
        x,
        FusedConv {
            ws_stride: usize::MAX,
            ..f
        },
        1,
    )
    .unwrap_err();
    assert!(message(e).contains("spans more elements than fit"));
}

#[test]
fn fused_softmax_regions_hold_every_trial() {
    // 3 trials of 2 rows × 4 classes: logits 24, labels 6, stats 6.
    let (l, y, d, s) = (
        Region::new(0, 30),
        Region::new(30, 10),
        Region::new(40, 30),
        Region::new(70, 10),
    );
    let got = softmax_xent_fused(l, y, d, s, 2, 4, 3).unwrap();
    assert_eq!(
        got,
        [
            Region::new(0, 24),
            Region::new(30, 6),
            Region::new(40, 24),
            Region::new(70, 6)
        ]
    );
    let short = [
        (
            Region::new(0, 23),
            y,
            d,
            s,
            "logits holds 23 elements, needs 24",
        ),
        (
            l,
            Region::new(30, 5),
            d,
            s,
            "labels holds 5 elements, needs 6",
        ),
        (
            l,
            y,
            Region::new(40, 23),
            s,
            "dlogits holds 23 elements, needs 24",
        ),
        (
            l,
            y,
            d,
            Region::new(70, 5),
            "stats holds 5 elements, needs 6",
        ),
    ];
    for (l, y, d, s, want) in short {
        let e = softmax_xent_fused(l, y, d, s, 2, 4, 3).unwrap_err();
        assert_eq!(
            message(e),
            format!("shape mismatch in softmax_xent_fused: {want}")
        );
    }
    for (rows, classes, trials) in [(usize::MAX, 4, 3), (2, usize::MAX, 3), (2, 4, usize::MAX)] {
        let e = softmax_xent_fused(l, y, d, s, rows, classes, trials).unwrap_err();
        assert!(message(e).contains("spans more elements than fit"));
    }
    let empty = Region::new(0, 0);
    assert!(softmax_xent_fused(empty, empty, empty, empty, 2, 4, 0).is_ok());
}

#[test]
fn per_op_sizes() {
    let g = GemmShape::nn(2, 3, 4);
    let [a, b, c] = gemm(
        &g,
        Region::new(0, 8),
        Region::new(8, 12),
        Region::new(20, 9),
    )
    .unwrap();
    assert_eq!((a.len, b.len, c.len), (8, 12, 6));
    assert!(gemm(
        &g,
        Region::new(0, 7),
        Region::new(8, 12),
        Region::new(20, 6)
    )
    .is_err());
    let s = PlaneShape { n: 2, c: 3, hw: 4 };
    let e = avgpool_fwd(&s, Region::new(0, 24), Region::new(24, 5)).unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in avgpool_fwd: y holds 5 elements, needs 6"
    );
    let e = softmax_xent(
        Region::new(0, 6),
        Region::new(6, 2),
        Region::new(8, 6),
        Region::new(14, 1),
        2,
        3,
    )
    .unwrap_err();
    assert_eq!(
        message(e),
        "shape mismatch in softmax_xent: stats holds 1 elements, needs 2"
    );
    let [x, y] = elementwise(
        "relu_fwd",
        [("x", Region::new(0, 9)), ("y", Region::new(9, 4))],
        4,
    )
    .unwrap();
    assert_eq!((x, y), (Region::new(0, 4), Region::new(9, 4)));
}
