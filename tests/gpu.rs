//! The CUDA backend against the CPU reference: every op, the slice cap, green partitions, mirrored slices, and a short training.
//!
//! A harness of its own (libtest-mimic): where `cuda::available()` fails, every test is listed
//! as ignored and one line says how many GPU tests were skipped and why, so that `cargo test`
//! passes anywhere and the skip shows. `GPUMUX_REQUIRE_GPU=1` runs them anyway, so that each
//! fails naming the reason (the GPU check sets it: a machine whose driver cannot be loaded must
//! not pass by skipping). Tests that need cuDNN are skipped the same way where the GPU has no
//! cuDNN, unless `GPUMUX_REQUIRE_CUDNN=1`. Sizes are small: every test takes seconds and a few
//! MiB of GPU memory.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use gpumux::data::{synthetic, DataSpec, Dataset, Source};
use gpumux::engine::cpu::CpuBackend;
use gpumux::engine::cuda::{self, CudaEngine, DeviceData};
use gpumux::engine::{
    AdamParams, Backend, BiasGrad, BnParams, Conv2dShape, DropoutMask, FusedConv, FusedNorm,
    GemmBatch, GemmShape, PlaneShape, PoolShape, Region, SgdParams, Split, Update, COUNTER_LEN,
};
use gpumux::error::EngineError;
use gpumux::job::{ConvEngine, EngineOptions, Hyper, ModelKind, ModelSpec, Optimizer};
use gpumux::models::network::{LayerDef, Network, Node};
use gpumux::rng::HostRng;
use gpumux::train::fused::run_group;
use gpumux::train::mirrored::{train as train_mirrored, ParallelConfig};
use gpumux::train::{run_trial, TrialConfig};
use libtest_mimic::{Arguments, Trial};
use support::{dataset, samples};

/// The engine shared by every test of this file, or why there is none.
fn engine() -> Option<Arc<CudaEngine>> {
    static ENGINE: OnceLock<Result<Arc<CudaEngine>, String>> = OnceLock::new();
    let got = ENGINE.get_or_init(|| {
        cuda::available()?;
        // A GPU is there: failing to open it is a failure, not a skip.
        Ok(CudaEngine::open(0, &EngineOptions::default())
            .unwrap_or_else(|e| panic!("a GPU is available but the engine does not open: {e}")))
    });
    match got {
        Ok(e) => Some(Arc::clone(e)),
        Err(reason) => {
            if std::env::var("GPUMUX_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("GPUMUX_REQUIRE_GPU=1 but no GPU: {reason}");
            }
            println!("skipped: no GPU ({reason})");
            None
        }
    }
}

/// An engine whose convolutions run on `conv` (cuDNN or the GEMM lowering), or why there is none.
/// Without cuDNN installed the cuDNN one is skipped, unless `GPUMUX_REQUIRE_CUDNN=1` (the GPU
/// check sets it), which makes that a failure.
fn engine_with(conv: ConvEngine) -> Option<Arc<CudaEngine>> {
    type Cell = OnceLock<Result<Arc<CudaEngine>, String>>;
    static GEMM: Cell = OnceLock::new();
    static CUDNN: Cell = OnceLock::new();
    let (cell, name) = match conv {
        ConvEngine::Cudnn => (&CUDNN, "cudnn"),
        _ => (&GEMM, "gemm"),
    };
    engine()?;
    let got = cell.get_or_init(|| {
        let opts = EngineOptions {
            conv,
            ..EngineOptions::default()
        };
        match CudaEngine::open(0, &opts) {
            Ok(e) => Ok(e),
            Err(e @ EngineError::Unavailable { .. }) if conv == ConvEngine::Cudnn => {
                Err(e.to_string())
            }
            Err(e) => panic!("the {name} engine does not open: {e}"),
        }
    });
    match got {
        Ok(e) => Some(Arc::clone(e)),
        Err(reason) => {
            if std::env::var("GPUMUX_REQUIRE_CUDNN").is_ok_and(|v| v == "1") {
                panic!("GPUMUX_REQUIRE_CUDNN=1 but cuDNN cannot be used: {reason}");
            }
            println!("skipped the {name} variant: {reason}");
            None
        }
    }
}

/// The device's green-context granularity, or `None` (the test is skipped, saying so) where
/// green contexts are unsupported. With `GPUMUX_REQUIRE_GPU=1` on a device of compute capability
/// 9.0 or newer (H100, H200), which has them with any driver gpumux accepts for green mode, that
/// is a failure instead.
fn green_or_skip(e: &CudaEngine) -> Option<cuda::GreenCaps> {
    let info = e.info();
    if info.green.is_none() {
        let why = format!(
            "green contexts unsupported on {} (compute capability {}.{}, driver {})",
            info.name,
            info.compute_capability.0,
            info.compute_capability.1,
            e.driver_version()
        );
        if required("GPUMUX_REQUIRE_GPU") && info.compute_capability.0 >= 9 {
            panic!("GPUMUX_REQUIRE_GPU=1: {why}");
        }
        println!("skipped: {why}");
    }
    info.green
}

macro_rules! gpu_or_skip {
    () => {
        match engine() {
            Some(e) => e,
            None => return,
        }
    };
}

/// 20 training and 7 test samples of 1×4×4, 3 classes.
fn tiny_data() -> Arc<Dataset> {
    let mut rng = HostRng::new(11);
    let train = samples(20, 16, 3, || rng.uniform_f32(-1.0, 1.0));
    let test = samples(7, 16, 3, || rng.uniform_f32(-1.0, 1.0));
    Arc::new(dataset("tiny", [1, 4, 4], 3, train, test))
}

/// The same arena on the CPU and on the GPU, with the same contents.
struct Pair {
    cpu: CpuBackend,
    gpu: Box<dyn Backend>,
    next: usize,
    rng: HostRng,
}

const ARENA: usize = 1 << 18;

impl Pair {
    fn new(engine: &CudaEngine) -> Pair {
        let data = tiny_data();
        let dev = engine.upload(&data).expect("upload");
        Pair::on(engine, data, dev, None)
    }

    fn on(
        engine: &CudaEngine,
        data: Arc<Dataset>,
        dev: Arc<DeviceData>,
        partition: Option<Arc<cuda::GreenPartition>>,
    ) -> Pair {
        let mut cpu = CpuBackend::new(data, None);
        let mut gpu = engine.backend(dev, None, partition).expect("backend");
        cpu.alloc_arena(ARENA).expect("cpu arena");
        gpu.alloc_arena(ARENA).expect("gpu arena");
        Pair {
            cpu,
            gpu,
            next: 0,
            rng: HostRng::new(5),
        }
    }

    /// A fresh region of `len` elements (zero on both sides).
    fn region(&mut self, len: usize) -> Region {
        let r = Region::new(self.next, len);
        self.next = (self.next + len).div_ceil(64) * 64;
        assert!(self.next <= ARENA, "test arena too small");
        r
    }

    fn set(&mut self, r: Region, v: &[f32]) {
        self.cpu.write(r, v).expect("cpu write");
        self.gpu.write(r, v).expect("gpu write");
    }

    /// A region holding the same uniform values in `[lo, hi)` on both sides.
    fn random(&mut self, len: usize, lo: f32, hi: f32) -> Region {
        let r = self.region(len);
        let v: Vec<f32> = (0..len).map(|_| self.rng.uniform_f32(lo, hi)).collect();
        self.set(r, &v);
        r
    }

    fn both(&mut self, f: impl Fn(&mut dyn Backend) -> Result<(), EngineError>) {
        f(&mut self.cpu).expect("cpu op");
        f(self.gpu.as_mut()).expect("gpu op");
    }

    fn outputs(&mut self, r: Region) -> (Vec<f32>, Vec<f32>) {
        let mut c = vec![0.0; r.len];
        let mut g = vec![0.0; r.len];
        self.cpu.read(r, &mut c).expect("cpu read");
        self.gpu.read(r, &mut g).expect("gpu read");
        (c, g)
    }

    /// `|gpu − cpu| ≤ atol + rtol·|cpu|` everywhere.
    fn assert_close(&mut self, r: Region, atol: f32, rtol: f32, what: &str) {
        let (c, g) = self.outputs(r);
        for (i, (c, g)) in c.iter().zip(&g).enumerate() {
            let ok = (g - c).abs() <= atol + rtol * c.abs();
            assert!(
                ok,
                "{what}[{i}]: gpu {g} vs cpu {c} (atol {atol}, rtol {rtol})"
            );
        }
    }

    /// Bit for bit.
    fn assert_exact(&mut self, r: Region, what: &str) {
        let (c, g) = self.outputs(r);
        for (i, (c, g)) in c.iter().zip(&g).enumerate() {
            assert_eq!(c.to_bits(), g.to_bits(), "{what}[{i}]: gpu {g} vs cpu {c}");
        }
    }
}

fn regions_are_checked_as_on_the_cpu() {
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

fn write_fill_read_and_the_counter_round_trip() {
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
fn paced_steps_keep_their_order() {
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

fn gemm_matches_the_cpu_in_every_transpose() {
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

fn batched_gemm_matches_the_cpu_with_shared_operands() {
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

fn bias_and_relu_match_the_cpu() {
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
fn fused_bias_and_softmax_match_the_cpu() {
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
fn conv_shapes() -> Vec<Conv2dShape> {
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
fn convolutions_match_the_cpu(conv: ConvEngine) {
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
fn fused_convolutions_match_the_cpu(conv: ConvEngine) {
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
fn cudnn_runs_in_the_workspace_it_planned() {
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
fn batch_norm_matches_the_cpu() {
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
fn fused_batch_norm_is_each_trials_own() {
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
fn average_pooling_adds_and_copies_are_bit_identical() {
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
fn max_pooling_matches_the_cpu_ties_included() {
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

fn dropout_masks_are_bit_identical() {
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

fn softmax_cross_entropy_matches_the_cpu() {
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

fn optimisers_match_the_cpu() {
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
fn batched_optimisers_match_the_cpu() {
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

/// The folded ops of a training step (a dense layer with its bias and ReLU, the input gradient
/// through a ReLU with the bias gradient, the loss with the last bias gradient, a fused group's
/// evaluation gather and sums, the optimizer step with the counter's advance) against the CPU's,
/// for one trial and for 5; and an upload and a peek, which do not wait.
fn folded_ops_match_the_cpu() {
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

fn gathers_follow_the_epoch_order_and_the_counter() {
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

fn fused_gathers_follow_each_trials_order() {
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

fn graphs_replay_what_was_captured() {
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

fn a_trial_over_its_cap_fails_and_one_at_its_cap_fits() {
    let e = gpu_or_skip!();
    let dev = e.upload(&tiny_data()).expect("upload");
    let elems = 3 << 20; // 12 MiB of arena
    let mut free = e.backend(Arc::clone(&dev), None, None).expect("backend");
    free.alloc_arena(elems).expect("uncapped arena");
    let need = free.allocated_bytes() as u64;
    // The cuBLAS workspace is part of the one allocation: 32 MiB from Hopper on, else 4 MiB.
    let blas: u64 = if e.info().compute_capability.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    };
    assert!(need >= (elems * 4) as u64 + blas, "{need} bytes");
    drop(free);
    let mut over = e
        .backend(Arc::clone(&dev), Some(need - 1), None)
        .expect("backend");
    match over.alloc_arena(elems) {
        Err(EngineError::CapExceeded { need_mib, cap_mib }) => {
            assert!(need_mib > cap_mib, "{need_mib} vs {cap_mib}");
        }
        other => panic!("expected CapExceeded, got {other:?}"),
    }
    assert_eq!(over.allocated_bytes(), 0);
    let mut tight = e
        .backend(Arc::clone(&dev), Some(need), None)
        .expect("backend");
    tight
        .alloc_arena(elems)
        .expect("an arena exactly at the cap fits");
    // Replacing the arena frees the old one first, so it fits again.
    tight
        .alloc_arena(elems)
        .expect("a second arena replaces the first");
    let r = Region::new(elems - 10, 10);
    tight.fill(r, 1.5).expect("fill");
    let mut out = [0.0; 10];
    tight.read(r, &mut out).expect("read");
    assert_eq!(out, [1.5; 10]);
}

fn green_partitions_run_on_disjoint_sms() {
    let e = gpu_or_skip!();
    let Some(caps) = green_or_skip(&e) else {
        return;
    };
    let parts = e
        .green_partitions(2, caps.min_sms)
        .expect("two partitions of the minimum size");
    assert_eq!(parts.len(), 2);
    let mut sets = Vec::new();
    for part in &parts {
        assert!(part.sm_count >= caps.min_sms, "{} SMs", part.sm_count);
        let ids = e.sm_probe(Some(part), 64 * part.sm_count).expect("probe");
        let set: BTreeSet<u32> = ids.into_iter().collect();
        assert!(
            set.len() <= part.sm_count as usize,
            "partition {} ran on {} SMs, has {}",
            part.index,
            set.len(),
            part.sm_count
        );
        sets.push(set);
    }
    assert!(
        sets[0].is_disjoint(&sets[1]),
        "partitions share SMs: {:?} and {:?}",
        sets[0],
        sets[1]
    );
    let whole: BTreeSet<u32> = e
        .sm_probe(None, 64 * e.info().sm_count)
        .expect("probe")
        .into_iter()
        .collect();
    println!(
        "SMs used: partition 0 {}, partition 1 {}, primary context {}",
        sets[0].len(),
        sets[1].len(),
        whole.len()
    );
}

fn trials_sharing_a_green_partition_compute_correctly() {
    let e = gpu_or_skip!();
    let Some(caps) = green_or_skip(&e) else {
        return;
    };
    let parts = e.green_partitions(1, caps.min_sms).expect("partition");
    let data = tiny_data();
    let dev = e.upload(&data).expect("upload");
    std::thread::scope(|s| {
        for t in 0..2 {
            let (e, data, dev) = (&e, Arc::clone(&data), Arc::clone(&dev));
            let part = Arc::clone(&parts[0]);
            s.spawn(move || {
                let mut p = Pair::on(e, data, dev, Some(part));
                let g = GemmShape {
                    trans_b: true,
                    ..GemmShape::nn(64, 32, 48)
                };
                let (a, b) = (
                    p.random(g.a_len(), -1.0, 1.0),
                    p.random(g.b_len(), -1.0, 1.0),
                );
                let (c, r) = (p.region(g.c_len()), p.region(g.c_len()));
                let counter = p.region(COUNTER_LEN);
                p.set(counter, &[f32::from_bits(0)]);
                let gpu = p.gpu.as_mut();
                // As a trial does: the first step eagerly, with the process's captures held
                // off while its kernels load (cuBLAS's too, lazily, in this new green context).
                {
                    let _hold = gpu.hold_captures();
                    gpu.gemm(g, a, b, c).expect("eager gemm");
                    gpu.relu_fwd(c, r, g.c_len()).expect("eager relu");
                }
                gpu.begin_capture().expect("begin");
                gpu.gemm(g, a, b, c).expect("gemm");
                gpu.relu_fwd(c, r, g.c_len()).expect("relu");
                gpu.advance(counter).expect("advance");
                gpu.end_capture().expect("end");
                for _ in 0..50 {
                    gpu.replay().expect("replay");
                }
                p.cpu.gemm(g, a, b, c).expect("cpu gemm");
                p.cpu.relu_fwd(c, r, g.c_len()).expect("cpu relu");
                p.assert_close(r, 1e-4, 1e-4, &format!("thread {t}: gemm+relu"));
                let mut n = [0.0f32];
                p.gpu.read(counter, &mut n).expect("read");
                assert_eq!(n[0].to_bits(), 50, "thread {t}: replays");
            });
        }
    });
}

fn trial(model: ModelSpec, optimizer: Optimizer, graphs: bool, data: &Dataset) -> TrialConfig {
    TrialConfig {
        model,
        hyper: Hyper {
            lr: 1e-3,
            batch_size: 64,
            optimizer,
            momentum: 0.0,
            weight_decay: 0.0,
            dropout: 0.2,
        },
        epochs: 2,
        seed: 3,
        input: data.shape,
        classes: data.classes,
        fault: None,
        max_steps: None,
        warm_up: false,
        cancel: Default::default(),
        prune: None,
        engine: EngineOptions {
            graphs,
            ..EngineOptions::default()
        },
    }
}

/// Test accuracy of one trial on the CPU and on the GPU with graphs on and off.
fn accuracies(e: &CudaEngine, model: ModelSpec, data: Dataset) -> (f64, f64, f64) {
    let data = Arc::new(data);
    let dev = e.upload(&data).expect("upload");
    let cfg = trial(model.clone(), Optimizer::Adam, true, &data);
    let mut cpu = CpuBackend::new(Arc::clone(&data), None);
    let on_cpu = run_trial(&mut cpu, &cfg, &mut |_| {}).expect("cpu trial");
    let gpu_acc = |graphs: bool| {
        let cfg = trial(model.clone(), Optimizer::Adam, graphs, &data);
        let mut be = e.backend(Arc::clone(&dev), None, None).expect("backend");
        run_trial(be.as_mut(), &cfg, &mut |_| {})
            .expect("gpu trial")
            .test_acc
    };
    (on_cpu.test_acc, gpu_acc(true), gpu_acc(false))
}

fn mlp_training_reaches_the_cpu_accuracy_with_and_without_graphs() {
    let e = gpu_or_skip!();
    let data = DataSpec::of(Source::Mnist10k)
        .load(None, 0)
        .expect("mnist-10k");
    let (cpu, graphs, plain) = accuracies(&e, ModelSpec::of(ModelKind::Mlp), data);
    println!("MLP test accuracy: cpu {cpu:.4}, gpu with graphs {graphs:.4}, without {plain:.4}");
    assert!(cpu > 0.9, "the CPU reference learns: {cpu}");
    for (what, acc) in [("with graphs", graphs), ("without graphs", plain)] {
        assert!(
            (acc - cpu).abs() <= 0.005,
            "GPU {what}: {acc:.4} vs CPU {cpu:.4}"
        );
    }
}

/// A slice that stays warm: a finished trial's backend goes back to the engine and the next trial
/// of the same shapes takes it, and that trial holds no capture of the process off (its kernels
/// are loaded), waits on the host for nothing inside its epochs and takes 8 launches a step.
fn a_warm_slice_takes_no_hold_after_its_warm_up() {
    let e = gpu_or_skip!();
    let data = Arc::new(
        DataSpec::of(Source::Mnist10k)
            .load(None, 0)
            .expect("mnist-10k"),
    );
    let dev = e.upload(&data).expect("upload");
    let mut cfg = trial(ModelSpec::of(ModelKind::Mlp), Optimizer::Adam, true, &data);
    cfg.hyper.dropout = 0.0;
    cfg.epochs = 1;
    let idle = e.idle_backends();
    let mut be = e.backend(Arc::clone(&dev), None, None).expect("backend");
    let first = run_trial(be.as_mut(), &cfg, &mut |_| {}).expect("first trial");
    be.recycle();
    assert_eq!(e.idle_backends(), idle + 1, "the backend is kept warm");
    let holds = cuda::holds_taken();
    let mut be = e
        .backend(Arc::clone(&dev), None, None)
        .expect("warm backend");
    assert_eq!(e.idle_backends(), idle, "the warm backend is taken");
    cfg.seed += 1;
    let second = run_trial(be.as_mut(), &cfg, &mut |_| {}).expect("second trial");
    assert_eq!(cuda::holds_taken(), holds, "a warm trial held captures off");
    for r in [&first, &second] {
        assert_eq!(r.launches_per_step, Some(8));
        assert_eq!(r.host_syncs, Some(0));
    }
    println!(
        "first trial {:.4} s, second on the warm slice {:.4} s",
        first.wall_s, second.wall_s
    );
}

/// A fused group of three MLP trials on the GPU (graphs on) against each trial alone on the GPU,
/// after one epoch: the stated tolerance of `split: fused` on CUDA is a final training loss within
/// 1e-4 relative and a test accuracy within 2 samples (the batched GEMMs may choose other
/// algorithms than the single ones).
fn fused_mlp_trials_match_their_runs_alone() {
    let e = gpu_or_skip!();
    let spec = DataSpec {
        train_limit: Some(4096),
        test_limit: Some(1000),
        ..DataSpec::of(Source::Mnist10k)
    };
    let data = Arc::new(spec.load(None, 0).expect("mnist-10k"));
    let dev = e.upload(&data).expect("upload");
    let cfgs: Vec<TrialConfig> = (0..3)
        .map(|i| {
            let mut c = trial(ModelSpec::of(ModelKind::Mlp), Optimizer::Adam, true, &data);
            c.epochs = 1;
            c.seed = 10 + i as u64;
            c.hyper.lr = [1e-3, 3e-3, 5e-4][i];
            c.hyper.dropout = [0.2, 0.1, 0.3][i];
            c
        })
        .collect();
    let mut be = e.backend(Arc::clone(&dev), None, None).expect("backend");
    let ends = run_group(be.as_mut(), &cfgs, &mut |_, _| {});
    let n_test = data.test.len() as f64;
    for (i, (cfg, end)) in cfgs.iter().zip(&ends).enumerate() {
        let fused = end
            .as_ref()
            .unwrap_or_else(|e| panic!("fused trial {i}: {e}"));
        let mut be = e.backend(Arc::clone(&dev), None, None).expect("backend");
        let alone = run_trial(be.as_mut(), cfg, &mut |_| {}).expect("trial alone");
        let rel = (fused.final_loss - alone.final_loss).abs() / alone.final_loss.abs();
        println!(
            "trial {i}: loss fused {:.6} alone {:.6} (rel {rel:.2e}), acc fused {:.4} alone {:.4}",
            fused.final_loss, alone.final_loss, fused.test_acc, alone.test_acc
        );
        assert!(rel <= 1e-4, "trial {i}: relative loss difference {rel:.2e}");
        let samples = (fused.test_acc - alone.test_acc).abs() * n_test;
        assert!(
            samples <= 2.0 + 1e-6,
            "trial {i}: accuracies {samples} samples apart"
        );
    }
}

fn cnn_training_runs_with_graphs() {
    let e = gpu_or_skip!();
    let spec = DataSpec {
        train_limit: Some(2048),
        test_limit: Some(500),
        ..DataSpec::of(Source::Mnist10k)
    };
    let data = spec.load(None, 0).expect("mnist-10k");
    let model = ModelSpec {
        channels: Some(vec![8, 16]),
        fc: Some(32),
        ..ModelSpec::of(ModelKind::Cnn)
    };
    let (cpu, graphs, plain) = accuracies(&e, model, data);
    println!("CNN test accuracy: cpu {cpu:.4}, gpu with graphs {graphs:.4}, without {plain:.4}");
    assert!(graphs > 0.8, "the GPU CNN learns: {graphs}");
    // Small test split and floating-point orders that differ: a looser bar than the MLP's.
    assert!((graphs - cpu).abs() <= 0.03, "{graphs} vs {cpu}");
    assert!((graphs - plain).abs() <= 0.01, "{graphs} vs {plain}");
}

/// A reduced ResNet by hand: a stem convolution (no bias) → BN → ReLU, a residual block whose
/// main path is a strided 3×3 convolution → BN and whose shortcut is a strided 1×1 convolution →
/// BN, added and passed through a ReLU, then ResNet's overlapping padded max-pool, a pointwise
/// convolution with a bias, global average pooling and a dense layer, on 3×8×8 inputs.
fn reduced_resnet() -> Vec<Node> {
    let conv = |c_in, h, c_out, k, pad, stride, bias| LayerDef::Conv {
        shape: Conv2dShape {
            n: 1,
            c_in,
            h,
            w: h,
            c_out,
            k,
            pad,
            stride,
        },
        bias,
    };
    let bn = |c, hw| LayerDef::BatchNorm(PlaneShape { n: 1, c, hw });
    let node = |def, src| Node { def, src };
    vec![
        node(conv(3, 8, 8, 3, 1, 1, false), 0),
        node(bn(8, 64), 1),
        node(LayerDef::Relu, 2),
        node(conv(8, 8, 8, 3, 1, 2, false), 3),
        node(bn(8, 16), 4),
        node(conv(8, 8, 8, 1, 0, 2, false), 3),
        node(bn(8, 16), 6),
        node(LayerDef::Add { other: 5 }, 7),
        node(LayerDef::Relu, 8),
        node(
            LayerDef::MaxPool(PoolShape {
                n: 1,
                c: 8,
                h: 4,
                w: 4,
                k: 3,
                stride: 2,
                pad: 1,
            }),
            9,
        ),
        node(conv(8, 2, 16, 1, 0, 1, true), 10),
        node(
            LayerDef::GlobalAvgPool(PlaneShape { n: 1, c: 16, hw: 4 }),
            11,
        ),
        node(
            LayerDef::Dense {
                inputs: 16,
                outputs: 4,
            },
            12,
        ),
    ]
}

/// Training the reduced ResNet for a few SGD steps on the CPU and on the GPU (GEMM lowering and
/// cuDNN, FP32; the GPU replays a captured step after an eager first one) ends with the same
/// parameters, running statistics and loss. Tolerance: each op agrees to about 1e-6 relative;
/// five steps at lr 0.05 carry that to well under 1e-3, while a wrong gradient anywhere moves
/// parameters by more than 1e-2.
fn reduced_resnet_training_matches_the_cpu(conv: ConvEngine) {
    gpu_or_skip!();
    let mut rng = HostRng::new(21);
    let (batch, steps_per_epoch, classes) = (4, 2, 4);
    let n_train = batch * steps_per_epoch;
    let train = samples(n_train, 3 * 64, classes, || rng.uniform_f32(-1.0, 1.0));
    let test = samples(4, 3 * 64, classes, || rng.uniform_f32(-1.0, 1.0));
    let data = Arc::new(dataset("resnet-parity", [3, 8, 8], classes, train, test));
    let order = HostRng::new(22).permutation(n_train);
    let h = Hyper {
        lr: 0.05,
        batch_size: batch as u32,
        optimizer: Optimizer::Sgd,
        momentum: 0.9,
        weight_decay: 1e-4,
        dropout: 0.0,
    };
    let steps = 5;
    if let Some(e) = engine_with(conv) {
        let dev = e.upload(&data).expect("upload");
        let mut cpu = CpuBackend::new(Arc::clone(&data), None);
        let mut gpu = e.backend(dev, None, None).expect("backend");
        let ws = |s: &Conv2dShape| cpu.conv_workspace_len(s).max(gpu.conv_workspace_len(s));
        let mut net = Network::graph(
            &reduced_resnet(),
            data.shape,
            classes,
            batch,
            Optimizer::Sgd,
            &ws,
        )
        .expect("the reduced ResNet plans");
        for be in [&mut cpu as &mut dyn Backend, gpu.as_mut()] {
            be.alloc_arena(net.plan.total).expect("arena");
            net.init(be, 7).expect("init");
            be.set_train_order(&order).expect("order");
            be.fill(net.stats, 0.0).expect("stats");
        }
        for _ in 0..steps {
            net.train_step(&mut cpu, steps_per_epoch, 3, &h)
                .expect("cpu step");
        }
        net.train_step(gpu.as_mut(), steps_per_epoch, 3, &h)
            .expect("eager gpu step");
        gpu.begin_capture().expect("begin");
        let body = net.train_step(gpu.as_mut(), steps_per_epoch, 3, &h);
        let end = gpu.end_capture();
        body.expect("captured step");
        end.expect("end");
        for _ in 1..steps {
            gpu.replay().expect("replay");
        }
        let read = |be: &mut dyn Backend, r: Region| {
            let mut v = vec![0.0; r.len];
            be.read(r, &mut v).expect("read");
            v
        };
        let (pc, pg) = (read(&mut cpu, net.params), read(gpu.as_mut(), net.params));
        let (sc, sg) = (read(&mut cpu, net.stats), read(gpu.as_mut(), net.stats));
        let (mut worst, mut moved) = (0f32, 0f32);
        for (i, (c, g)) in pc.iter().zip(&pg).enumerate() {
            assert!(
                (g - c).abs() <= 1e-3 + 1e-3 * c.abs(),
                "{conv:?}: parameter {i}: gpu {g} vs cpu {c}"
            );
            worst = worst.max((g - c).abs());
        }
        // The parameters did train: they moved away from their initial values.
        net.init(&mut cpu, 7).expect("re-init");
        for (c, p0) in pg.iter().zip(read(&mut cpu, net.params)) {
            moved = moved.max((c - p0).abs());
        }
        assert!(
            moved > 1e-2,
            "{conv:?}: the parameters barely moved ({moved})"
        );
        println!(
            "reduced ResNet on {}: worst parameter difference {worst:.2e} after {steps} steps \
             (largest move {moved:.3}); loss sum cpu {} gpu {}",
            e.conv_engine(),
            sc[0],
            sg[0]
        );
        assert!(
            (sc[0] - sg[0]).abs() <= 1e-3 * sc[0].abs(),
            "{conv:?}: loss"
        );
    }
}

/// On a GPU: mirrored training on 2 and 4 CUDA slices gives the weights of one CUDA slice, which
/// is itself close to the CPU's.
fn mirrored_training_matches_one_slice() {
    let engine = gpu_or_skip!();
    let (train_s, test_s) = synthetic::generate([1, 12, 12], 10, 600, 50, 3).expect("data");
    let data = Arc::new(dataset("synthetic", [1, 12, 12], 10, train_s, test_s));
    let dev = engine.upload(&data).expect("upload");
    for kind in [ModelKind::Mlp, ModelKind::Cnn] {
        for optimizer in [Optimizer::Sgd, Optimizer::Adam] {
            let mut model = ModelSpec::of(kind);
            if kind == ModelKind::Cnn {
                model.channels = Some(vec![4, 8]);
                model.fc = Some(16);
            }
            let cfg = |shards: Vec<usize>| ParallelConfig {
                trial: TrialConfig {
                    model: model.clone(),
                    hyper: Hyper {
                        lr: 0.002,
                        batch_size: 50,
                        optimizer,
                        momentum: 0.9,
                        weight_decay: 0.0,
                        dropout: 0.0,
                    },
                    epochs: 1,
                    seed: 5,
                    input: [1, 12, 12],
                    classes: 10,
                    fault: None,
                    engine: EngineOptions::default(),
                    max_steps: Some(10),
                    warm_up: false,
                    cancel: Default::default(),
                    prune: None,
                },
                shards,
            };
            let cpu: Vec<(u32, Box<dyn Backend>)> =
                vec![(0, Box::new(CpuBackend::new(Arc::clone(&data), None)))];
            let on_cpu = train_mirrored(cpu, &cfg(vec![50]), &mut |_| {})
                .expect("cpu")
                .params;
            // The reference is one GPU slice: mirrored replicas must give its weights (the
            // same kernels, sums split by shard). One GPU slice and the CPU sum in other orders
            // (cuBLAS, cuDNN's algorithms), which Adam carries further: a looser bar.
            let one: Vec<(u32, Box<dyn Backend>)> = vec![(
                0,
                engine
                    .backend(Arc::clone(&dev), None, None)
                    .expect("backend"),
            )];
            let reference = train_mirrored(one, &cfg(vec![50]), &mut |_| {})
                .expect("one gpu slice")
                .params;
            let to_cpu = rel_diff(&reference, &on_cpu);
            println!("{kind} {optimizer} one GPU slice against the CPU: ‖Δ‖/‖w‖ {to_cpu:.2e}");
            assert!(to_cpu < 1e-4, "{kind} {optimizer}: {to_cpu:.2e}");
            // Two replicas on unequal green partitions (where the device has them), then plain
            // streams in the primary context.
            let green = engine.info().green.map(|caps| {
                let unit = caps.unit();
                engine
                    .green_partitions_sized(&[2 * unit, unit])
                    .expect("unequal green partitions")
            });
            let mut runs = vec![(vec![30, 20], false), (vec![23, 14, 9, 4], false)];
            if green.is_some() {
                runs.push((vec![30, 20], true));
            }
            for (shards, on_green) in runs {
                let gpus: Vec<(u32, Box<dyn Backend>)> = (0..shards.len() as u32)
                    .map(|i| {
                        let part = green
                            .as_ref()
                            .filter(|_| on_green)
                            .map(|p| Arc::clone(&p[i as usize]));
                        let be = engine
                            .backend(Arc::clone(&dev), None, part)
                            .expect("backend");
                        (i, be)
                    })
                    .collect();
                let out = train_mirrored(gpus, &cfg(shards.clone()), &mut |_| {}).expect("gpu");
                assert_eq!(out.replica_spread, 0.0);
                let rel = rel_diff(&out.params, &reference);
                println!("{kind} {optimizer} {shards:?} green {on_green}: ‖Δ‖/‖w‖ {rel:.2e}");
                // cuDNN picks its algorithms by shape, so a shard of 23 rows may sum in another
                // order than the batch of 50: then a replica is as far from one slice as the CPU
                // is (1.5e-5 for the CNN under Adam on an H200), and takes the CPU's bar.
                let bar = if kind == ModelKind::Cnn && engine.conv_engine().starts_with("cudnn") {
                    1e-4
                } else {
                    1e-5
                };
                assert!(rel < bar, "{kind} {optimizer} {shards:?}: {rel:.2e}");
            }
        }
    }
}

/// ‖a − b‖ / ‖b‖ over two parameter vectors.
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let (mut d2, mut b2) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d2 += ((x - y) as f64).powi(2);
        b2 += (*y as f64).powi(2);
    }
    (d2 / b2).sqrt()
}

/// On a GPU with green contexts: partitions of unequal size run on disjoint SMs, each on at least
/// the SMs asked for.
fn unequal_green_partitions_are_disjoint() {
    let engine = gpu_or_skip!();
    let Some(caps) = green_or_skip(&engine) else {
        return;
    };
    // The groups the driver makes on this GPU (fewer than SMs / unit where processing clusters
    // leave SMs over): as large as fits, 5:3 like the job's ratios, in whole groups.
    let g = caps.unit();
    let total = engine.info().sm_count;
    let groups = caps.groups.unwrap_or(total / g).min(total / g);
    assert!(
        groups >= 2,
        "{groups} groups of {g} SMs: too few for two partitions"
    );
    let a_groups = (groups * 5 / 8).clamp(1, groups - 1);
    let b_groups = (groups * 3 / 8).clamp(1, groups - a_groups);
    let (a, b) = (a_groups * g, b_groups * g);
    let parts = engine.green_partitions_sized(&[a, b]).expect("partitions");
    assert_eq!(parts.len(), 2);
    assert!(
        parts[0].sm_count >= a && parts[1].sm_count >= b,
        "{} {}",
        parts[0].sm_count,
        parts[1].sm_count
    );
    let mut seen = Vec::new();
    for p in &parts {
        let sms: std::collections::BTreeSet<u32> = engine
            .sm_probe(Some(p), 4 * total)
            .expect("probe")
            .into_iter()
            .collect();
        assert!(
            sms.len() as u32 <= p.sm_count,
            "partition {} ran on {} SMs",
            p.index,
            sms.len()
        );
        seen.push(sms);
    }
    assert!(
        seen[0].is_disjoint(&seen[1]),
        "{:?} and {:?} overlap",
        seen[0],
        seen[1]
    );
    println!(
        "green partitions of {a} and {b} SMs: got {} and {}",
        parts[0].sm_count, parts[1].sm_count
    );
    // Partitions that do not fit together are an error, not a crash.
    assert!(engine.green_partitions_sized(&[total, g]).is_err());
}

/// What a test needs besides a GPU.
#[derive(Clone, Copy, PartialEq)]
enum Needs {
    Gpu,
    Cudnn,
}

/// A test's body.
type Body = Box<dyn FnOnce() + Send>;
/// A test run once per convolution path, with its name.
type PerConv = (&'static str, fn(ConvEngine));

/// Every test of this file: its name, what it needs, and its body.
fn tests() -> Vec<(String, Needs, Body)> {
    let plain: Vec<(&str, fn())> = vec![
        (
            "regions_are_checked_as_on_the_cpu",
            regions_are_checked_as_on_the_cpu,
        ),
        (
            "write_fill_read_and_the_counter_round_trip",
            write_fill_read_and_the_counter_round_trip,
        ),
        ("paced_steps_keep_their_order", paced_steps_keep_their_order),
        (
            "gemm_matches_the_cpu_in_every_transpose",
            gemm_matches_the_cpu_in_every_transpose,
        ),
        ("folded_ops_match_the_cpu", folded_ops_match_the_cpu),
        (
            "a_warm_slice_takes_no_hold_after_its_warm_up",
            a_warm_slice_takes_no_hold_after_its_warm_up,
        ),
        (
            "batched_gemm_matches_the_cpu_with_shared_operands",
            batched_gemm_matches_the_cpu_with_shared_operands,
        ),
        ("bias_and_relu_match_the_cpu", bias_and_relu_match_the_cpu),
        (
            "fused_bias_and_softmax_match_the_cpu",
            fused_bias_and_softmax_match_the_cpu,
        ),
        ("batch_norm_matches_the_cpu", batch_norm_matches_the_cpu),
        (
            "fused_batch_norm_is_each_trials_own",
            fused_batch_norm_is_each_trials_own,
        ),
        (
            "average_pooling_adds_and_copies_are_bit_identical",
            average_pooling_adds_and_copies_are_bit_identical,
        ),
        (
            "max_pooling_matches_the_cpu_ties_included",
            max_pooling_matches_the_cpu_ties_included,
        ),
        (
            "dropout_masks_are_bit_identical",
            dropout_masks_are_bit_identical,
        ),
        (
            "softmax_cross_entropy_matches_the_cpu",
            softmax_cross_entropy_matches_the_cpu,
        ),
        ("optimisers_match_the_cpu", optimisers_match_the_cpu),
        (
            "batched_optimisers_match_the_cpu",
            batched_optimisers_match_the_cpu,
        ),
        (
            "gathers_follow_the_epoch_order_and_the_counter",
            gathers_follow_the_epoch_order_and_the_counter,
        ),
        (
            "fused_gathers_follow_each_trials_order",
            fused_gathers_follow_each_trials_order,
        ),
        (
            "graphs_replay_what_was_captured",
            graphs_replay_what_was_captured,
        ),
        (
            "a_trial_over_its_cap_fails_and_one_at_its_cap_fits",
            a_trial_over_its_cap_fails_and_one_at_its_cap_fits,
        ),
        (
            "green_partitions_run_on_disjoint_sms",
            green_partitions_run_on_disjoint_sms,
        ),
        (
            "trials_sharing_a_green_partition_compute_correctly",
            trials_sharing_a_green_partition_compute_correctly,
        ),
        (
            "unequal_green_partitions_are_disjoint",
            unequal_green_partitions_are_disjoint,
        ),
        (
            "mirrored_training_matches_one_slice",
            mirrored_training_matches_one_slice,
        ),
        (
            "mlp_training_reaches_the_cpu_accuracy_with_and_without_graphs",
            mlp_training_reaches_the_cpu_accuracy_with_and_without_graphs,
        ),
        (
            "cnn_training_runs_with_graphs",
            cnn_training_runs_with_graphs,
        ),
        (
            "fused_mlp_trials_match_their_runs_alone",
            fused_mlp_trials_match_their_runs_alone,
        ),
    ];
    let mut all: Vec<(String, Needs, Body)> = plain
        .into_iter()
        .map(|(name, f)| (name.to_string(), Needs::Gpu, Box::new(f) as Body))
        .collect();
    let per_conv: [PerConv; 3] = [
        ("convolutions_match_the_cpu", convolutions_match_the_cpu),
        (
            "fused_convolutions_match_the_cpu",
            fused_convolutions_match_the_cpu,
        ),
        (
            "reduced_resnet_training_matches_the_cpu",
            reduced_resnet_training_matches_the_cpu,
        ),
    ];
    for (name, f) in per_conv {
        for (conv, word, needs) in [
            (ConvEngine::Gemm, "gemm", Needs::Gpu),
            (ConvEngine::Cudnn, "cudnn", Needs::Cudnn),
        ] {
            all.push((format!("{name}::{word}"), needs, Box::new(move || f(conv))));
        }
    }
    all.push((
        "cudnn_runs_in_the_workspace_it_planned".into(),
        Needs::Cudnn,
        Box::new(cudnn_runs_in_the_workspace_it_planned),
    ));
    all
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn main() -> std::process::ExitCode {
    // As the binary does, before any thread starts.
    cuda::choose_module_loading();
    let args = Arguments::from_args();
    let tests = tests();
    let gpu = cuda::available();
    // cuDNN is asked about only where there is a GPU (it opens an engine).
    let cudnn = match &gpu {
        Ok(()) => cudnn_missing(),
        Err(_) => None,
    };
    let skip = |needs: Needs| match needs {
        Needs::Gpu => gpu.is_err() && !required("GPUMUX_REQUIRE_GPU"),
        Needs::Cudnn => {
            (gpu.is_err() && !required("GPUMUX_REQUIRE_GPU"))
                || (cudnn.is_some() && !required("GPUMUX_REQUIRE_CUDNN"))
        }
    };
    let skipped = tests.iter().filter(|(_, needs, _)| skip(*needs)).count();
    match (&gpu, &cudnn) {
        (Err(why), _) if skipped > 0 => println!(
            "GPU tests: {skipped} of {} skipped (listed as ignored): no GPU ({why})",
            tests.len()
        ),
        (Err(why), _) => println!(
            "GPU tests: no GPU ({why}), and GPUMUX_REQUIRE_GPU=1: every test fails with the reason"
        ),
        (Ok(()), Some(why)) if skipped > 0 => println!(
            "GPU tests: {skipped} of {} skipped (listed as ignored): {why}",
            tests.len()
        ),
        _ => {}
    }
    let trials = tests
        .into_iter()
        .map(|(name, needs, body)| {
            Trial::test(name, move || {
                body();
                Ok(())
            })
            .with_ignored_flag(skip(needs))
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Why the cuDNN engine cannot open here, or `None` when it can.
fn cudnn_missing() -> Option<String> {
    let opts = EngineOptions {
        conv: ConvEngine::Cudnn,
        ..EngineOptions::default()
    };
    match CudaEngine::open(0, &opts) {
        Ok(_) => None,
        Err(e) => Some(format!("cuDNN cannot be used ({e})")),
    }
}
