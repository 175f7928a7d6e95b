//! The CUDA backend against the CPU reference, the harness of the tests in `ops.rs`, `steps.rs`, `slices.rs` and `training.rs`: every op, the slice cap, green partitions, mirrored slices, and a short training.
//!
//! A harness of its own (libtest-mimic): where `cuda::available()` fails, every test is listed
//! as ignored and one line says how many GPU tests were skipped and why, so that `cargo test`
//! passes anywhere and the skip shows. `GPUMUX_REQUIRE_GPU=1` runs them anyway, so that each
//! fails naming the reason (the GPU check sets it: a machine whose driver cannot be loaded must
//! not pass by skipping). Tests that need cuDNN are skipped the same way where the GPU has no
//! cuDNN, unless `GPUMUX_REQUIRE_CUDNN=1`. Sizes are small: every test takes seconds and a few
//! MiB of GPU memory.

#[path = "../support/mod.rs"]
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

mod ops;
mod slices;
mod steps;
mod training;
use ops::*;
use slices::*;
use steps::*;
use training::*;

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
        (
            "a_refilled_fused_trial_matches_its_run_alone",
            a_refilled_fused_trial_matches_its_run_alone,
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
