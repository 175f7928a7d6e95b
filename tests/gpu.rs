//! The CUDA backend against the CPU reference: every op, the slice cap, green partitions, and a short training.
//!
//! Each test needs a GPU. Where `cuda::available()` fails it prints `skipped: no GPU (reason)` and
//! passes, unless `GPUMUX_REQUIRE_GPU=1` is set, which turns the skip into a failure (for the
//! GPU check, so that a machine whose driver cannot be loaded does not pass by skipping).
//! Sizes are small: every test takes seconds and a few MiB of GPU memory.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use gpumux::data::{DataSpec, Dataset, Samples, Source};
use gpumux::engine::cpu::CpuBackend;
use gpumux::engine::cuda::{self, CudaEngine, DeviceData};
use gpumux::engine::rng::HostRng;
use gpumux::engine::{
    AdamParams, Backend, Conv2dShape, GemmShape, PoolShape, Region, SgdParams, Split,
};
use gpumux::error::EngineError;
use gpumux::job::{EngineOptions, Hyper, ModelKind, ModelSpec, Optimizer};
use gpumux::train::{run_trial, TrialConfig};

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
    let mut samples = |n: usize| Samples {
        images: (0..n * 16).map(|_| rng.uniform_f32(-1.0, 1.0)).collect(),
        labels: (0..n as u32).map(|i| i % 3).collect(),
    };
    Arc::new(Dataset {
        name: "tiny".into(),
        shape: [1, 4, 4],
        classes: 3,
        train: samples(20),
        test: samples(7),
    })
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

#[test]
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

#[test]
fn write_fill_read_and_the_counter_round_trip() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let a = p.random(1000, -5.0, 5.0);
    p.assert_exact(a, "write");
    let f = p.region(777);
    p.both(|b| b.fill(f, -2.5));
    p.assert_exact(f, "fill");
    let c = p.region(1);
    p.set(c, &[f32::from_bits(41)]);
    p.both(|b| b.advance(c));
    let (cpu, gpu) = p.outputs(c);
    assert_eq!((cpu[0].to_bits(), gpu[0].to_bits()), (42, 42));
}

#[test]
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

#[test]
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

#[test]
fn convolutions_match_the_cpu() {
    let e = gpu_or_skip!();
    for (k, pad) in [(3, 0), (3, 1), (5, 0), (5, 2)] {
        let mut p = Pair::new(&e);
        let s = Conv2dShape {
            n: 3,
            c_in: 2,
            h: 9,
            w: 7,
            c_out: 4,
            k,
            pad,
            stride: 1,
        };
        // Each backend gets the workspace it asks for; the GPU's is the larger.
        let ws_len = p
            .cpu
            .conv_workspace_len(&s)
            .max(p.gpu.conv_workspace_len(&s));
        let x = p.random(s.x_len(), -1.0, 1.0);
        let w = p.random(s.w_len(), -1.0, 1.0);
        let b = p.random(s.c_out, -1.0, 1.0);
        let y = p.region(s.y_len());
        let ws = p.region(ws_len);
        let what = format!("k{k} pad{pad}");
        p.both(|be| be.conv2d_fwd(&s, x, w, Some(b), y, ws));
        p.assert_close(y, 1e-4, 1e-4, &format!("conv fwd {what}"));
        let dy = p.random(s.y_len(), -1.0, 1.0);
        let (dx, dw, db) = (p.region(s.x_len()), p.region(s.w_len()), p.region(s.c_out));
        p.both(|be| be.conv2d_bwd(&s, x, w, dy, Some(dx), dw, Some(db), ws));
        p.assert_close(dx, 1e-4, 1e-4, &format!("conv dx {what}"));
        p.assert_close(dw, 1e-3, 1e-4, &format!("conv dw {what}"));
        p.assert_close(db, 1e-4, 1e-4, &format!("conv db {what}"));
        // Without dx (a first layer): dw and db alone, dx untouched.
        let (dw2, db2) = (p.region(s.w_len()), p.region(s.c_out));
        p.both(|be| be.conv2d_bwd(&s, x, w, dy, None, dw2, Some(db2), ws));
        p.assert_close(dw2, 1e-3, 1e-4, &format!("conv dw (no dx) {what}"));
        p.assert_close(db2, 1e-4, 1e-4, &format!("conv db (no dx) {what}"));
    }
}

#[test]
fn max_pooling_matches_the_cpu_ties_included() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let s = PoolShape {
        n: 2,
        c: 3,
        h: 9,
        w: 7,
        k: 2,
        stride: 2,
        pad: 0,
    };
    // Values on a coarse grid, so windows hold ties: the first maximum takes the gradient.
    let x = p.region(s.x_len());
    let v: Vec<f32> = (0..s.x_len())
        .map(|_| (p.rng.uniform_f32(-2.0, 2.0) * 2.0).round() / 2.0)
        .collect();
    p.set(x, &v);
    let y = p.region(s.y_len());
    p.both(|b| b.maxpool_fwd(&s, x, y));
    p.assert_exact(y, "maxpool_fwd");
    let dy = p.random(s.y_len(), -1.0, 1.0);
    let dx = p.random(s.x_len(), -1.0, 1.0);
    p.both(|b| b.maxpool_bwd(&s, x, y, dy, dx));
    p.assert_exact(dx, "maxpool_bwd");
}

#[test]
fn dropout_masks_are_bit_identical() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    let len = 5000;
    let counter = p.region(1);
    p.set(counter, &[f32::from_bits(5)]);
    // Nonzero inputs, so a zero output means a dropped element.
    let x = p.random(len, 0.5, 1.5);
    for (prob, layer) in [(0.3f32, 2u32), (0.0, 1)] {
        let y = p.region(len);
        p.both(|b| b.dropout_fwd(x, y, len, prob, 99, counter, layer));
        let (c, g) = p.outputs(y);
        let mask = |v: &[f32]| v.iter().map(|&v| v == 0.0).collect::<Vec<_>>();
        assert_eq!(mask(&c), mask(&g), "dropout mask p={prob}");
        p.assert_close(y, 0.0, 1e-6, &format!("dropout_fwd p={prob}"));
        let dx = p.region(len);
        p.both(|b| b.dropout_bwd(x, dx, len, prob, 99, counter, layer));
        p.assert_close(dx, 0.0, 1e-6, &format!("dropout_bwd p={prob}"));
        let (c, g) = p.outputs(dx);
        assert_eq!(mask(&c), mask(&g), "dropout_bwd mask p={prob}");
    }
}

#[test]
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

#[test]
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
    let counter = p.region(1);
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

#[test]
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
    let counter = p.region(1);
    for count in [0u32, 7, 8] {
        p.set(counter, &[f32::from_bits(count)]);
        p.both(|b| b.gather_train(counter, 3, 5, x, y));
        p.assert_exact(x, &format!("gather_train x at {count}"));
        p.assert_exact(y, &format!("gather_train y at {count}"));
    }
    assert_eq!(p.gpu.split_len(Split::Train), 20);
    assert_eq!(p.gpu.split_len(Split::Test), 7);
}

#[test]
fn graphs_replay_what_was_captured() {
    let e = gpu_or_skip!();
    let mut p = Pair::new(&e);
    assert!(p.gpu.supports_graphs());
    let counter = p.region(1);
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

#[test]
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

#[test]
fn green_partitions_run_on_disjoint_sms() {
    let e = gpu_or_skip!();
    let Some(caps) = e.info().green else {
        println!("skipped: green contexts unsupported on {}", e.info().name);
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

#[test]
fn trials_sharing_a_green_partition_compute_correctly() {
    let e = gpu_or_skip!();
    let Some(caps) = e.info().green else {
        println!("skipped: green contexts unsupported on {}", e.info().name);
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
                let counter = p.region(1);
                p.set(counter, &[f32::from_bits(0)]);
                let gpu = p.gpu.as_mut();
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
        cancel: Default::default(),
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

#[test]
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

#[test]
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
