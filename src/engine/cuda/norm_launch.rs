//! Batch norm on the device: the launches of its reductions (one block a channel, or a channel split over several blocks), for one trial or a fused group.

use cudarc::driver::sys;

use super::backend::{at, CudaBackend};
use super::launch::{Arg, MAX_BLOCKS};
use super::status::to_u32;
use crate::engine::contract;
use crate::engine::{BnParams, FusedNorm, PlaneShape, Region};
use crate::error::EngineError;

/// Threads per block of the batch-norm reductions: the most a block may have, for the most loads
/// in flight.
pub(super) const NORM_BLOCK: u32 = 1024;
/// The fewest values of a channel one block of a batch-norm reduction takes when a channel is
/// split over several blocks, and the most blocks a channel is split over.
pub(super) const NORM_MIN_CHUNK: usize = 16 << 10;
pub(super) const NORM_MAX_CHUNKS: usize = 32;
/// Blocks a batch-norm reduction aims for over all its channels.
pub(super) const NORM_TARGET_BLOCKS: usize = 256;

impl CudaBackend {
    /// The arena's checks of every trial's regions (`check(i)` for trial `i`); the arena's
    /// address.
    pub(super) fn each_trial(
        &self,
        f: FusedNorm,
        check: impl Fn(usize) -> Result<sys::CUdeviceptr, EngineError>,
    ) -> Result<sys::CUdeviceptr, EngineError> {
        let mut base = 0;
        for i in 0..f.trials {
            base = check(i)?;
        }
        Ok(base)
    }

    /// Batch norm's forward pass over `f`'s trials (one trial: [`FusedNorm::one`]), regions
    /// `[x, gamma, beta, running, saved, y]` spanning every trial's.
    pub(super) fn norm_fwd(
        &mut self,
        op: &'static str,
        s: &PlaneShape,
        all: [Region; 6],
        p: BnParams,
        f: FusedNorm,
    ) -> Result<(), EngineError> {
        let [x, gamma, beta, running, saved, y] = all;
        let (ps, rs, ss) = (f.param_stride, f.running_stride, f.saved_stride);
        let trials = Arg::U32(to_u32(op, "trials", f.trials)?);
        let (ps_arg, rs_arg, ss_arg) = (
            Arg::U64(ps as u64),
            Arg::U64(rs as u64),
            Arg::U64(ss as u64),
        );
        let dims = plane_dims(op, s)?;
        let group = s.with_n(s.n * f.trials);
        let e = self.ctx.enter()?;
        if !p.train {
            let base = self.each_trial(f, |i| {
                let [x, gamma, beta, running, _, y] = f.fwd_trial(s, all, i);
                self.regions(op, &[x, gamma, beta, running], &[y])
            })?;
            let mut args = vec![
                Arg::Ptr(at(base, x)),
                Arg::Ptr(at(base, gamma)),
                Arg::Ptr(at(base, beta)),
                Arg::Ptr(at(base, running)),
                Arg::Ptr(at(base, y)),
            ];
            args.extend(dims);
            args.extend([Arg::F32(p.eps), trials, ps_arg, rs_arg]);
            return self.elementwise(&e, "batchnorm_fwd_infer", group.len(), &args);
        }
        let base = self.each_trial(f, |i| {
            let [x, gamma, beta, running, saved, y] = f.fwd_trial(s, all, i);
            self.regions(op, &[x, gamma, beta], &[running, saved, y])
        })?;
        let channels = s.c * f.trials;
        let chunks = self.norm_chunks(s, 1);
        if chunks > 1 {
            let [partials, means, tickets] = self.scratch_ptrs()?;
            for pass in 0..2u32 {
                let mut a = vec![
                    Arg::Ptr(at(base, x)),
                    Arg::Ptr(at(base, running)),
                    Arg::Ptr(at(base, saved)),
                    Arg::Ptr(partials),
                    Arg::Ptr(means),
                    Arg::Ptr(tickets),
                ];
                a.extend(plane_dims(op, s)?);
                a.extend([Arg::F32(p.momentum), Arg::F32(p.eps), Arg::U32(pass)]);
                a.extend([trials, ps_arg, rs_arg, ss_arg]);
                let grid = (chunks, to_u32(op, "channels", channels)?);
                self.kernel2(&e, "batchnorm_fwd_partial", grid, NORM_BLOCK, &a)?;
            }
            let mut a = vec![
                Arg::Ptr(at(base, x)),
                Arg::Ptr(at(base, gamma)),
                Arg::Ptr(at(base, beta)),
                Arg::Ptr(at(base, saved)),
                Arg::Ptr(at(base, y)),
            ];
            a.extend(plane_dims(op, s)?);
            a.extend([trials, ps_arg, ss_arg]);
            return self.elementwise(&e, "batchnorm_normalize", group.len(), &a);
        }
        let mut args = vec![
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, gamma)),
            Arg::Ptr(at(base, beta)),
            Arg::Ptr(at(base, running)),
            Arg::Ptr(at(base, saved)),
            Arg::Ptr(at(base, y)),
        ];
        args.extend(dims);
        args.extend([Arg::F32(p.momentum), Arg::F32(p.eps)]);
        args.extend([trials, ps_arg, rs_arg, ss_arg]);
        // One block per channel of every trial (blocks loop over channels beyond the grid).
        let grid = channels.clamp(1, MAX_BLOCKS as usize) as u32;
        self.kernel(&e, "batchnorm_fwd_train", (grid, NORM_BLOCK), &args)
    }

    /// Batch norm's backward pass over `f`'s trials, regions
    /// `[x, gamma, saved, dy, dx, dgamma, dbeta]` spanning every trial's.
    pub(super) fn norm_bwd(
        &mut self,
        op: &'static str,
        s: &PlaneShape,
        all: [Region; 7],
        f: FusedNorm,
    ) -> Result<(), EngineError> {
        let [x, gamma, saved, dy, dx, dgamma, dbeta] = all;
        let (ps, ss) = (f.param_stride, f.saved_stride);
        let base = self.each_trial(f, |i| {
            let [x, gamma, saved, dy, dx, dgamma, dbeta] = f.bwd_trial(s, all, i);
            self.regions(op, &[x, gamma, saved, dy], &[dx, dgamma, dbeta])
        })?;
        let tail = [
            Arg::U32(to_u32(op, "trials", f.trials)?),
            Arg::U64(ps as u64),
            Arg::U64(ss as u64),
        ];
        let group = s.with_n(s.n * f.trials);
        let channels = s.c * f.trials;
        let e = self.ctx.enter()?;
        let chunks = self.norm_chunks(s, 2);
        if chunks > 1 {
            let [partials, _, tickets] = self.scratch_ptrs()?;
            let mut a = vec![
                Arg::Ptr(at(base, x)),
                Arg::Ptr(at(base, saved)),
                Arg::Ptr(at(base, dy)),
                Arg::Ptr(at(base, dgamma)),
                Arg::Ptr(at(base, dbeta)),
                Arg::Ptr(partials),
                Arg::Ptr(tickets),
            ];
            a.extend(plane_dims(op, s)?);
            a.extend(tail);
            let grid = (chunks, to_u32(op, "channels", channels)?);
            self.kernel2(&e, "batchnorm_bwd_partial", grid, NORM_BLOCK, &a)?;
            let mut a = vec![
                Arg::Ptr(at(base, x)),
                Arg::Ptr(at(base, gamma)),
                Arg::Ptr(at(base, saved)),
                Arg::Ptr(at(base, dy)),
                Arg::Ptr(at(base, dgamma)),
                Arg::Ptr(at(base, dbeta)),
                Arg::Ptr(at(base, dx)),
            ];
            a.extend(plane_dims(op, s)?);
            a.extend(tail);
            return self.elementwise(&e, "batchnorm_bwd_dx", group.len(), &a);
        }
        let mut args = vec![
            Arg::Ptr(at(base, x)),
            Arg::Ptr(at(base, gamma)),
            Arg::Ptr(at(base, saved)),
            Arg::Ptr(at(base, dy)),
            Arg::Ptr(at(base, dx)),
            Arg::Ptr(at(base, dgamma)),
            Arg::Ptr(at(base, dbeta)),
        ];
        args.extend(plane_dims(op, s)?);
        args.extend(tail);
        let grid = channels.clamp(1, MAX_BLOCKS as usize) as u32;
        self.kernel(&e, "batchnorm_bwd", (grid, NORM_BLOCK), &args)
    }
}

/// The size arguments of the per-channel kernels: `n, c, hw` (all elements within 32 bits).
fn plane_dims(op: &'static str, s: &PlaneShape) -> Result<[Arg; 3], EngineError> {
    to_u32(op, "elements", s.len())?;
    Ok([
        Arg::U32(to_u32(op, "n", s.n)?),
        Arg::U32(to_u32(op, "c", s.c)?),
        Arg::U32(to_u32(op, "hw", s.hw)?),
    ])
}

impl CudaBackend {
    /// Whether a fused group's batch norm over `s` runs as one launch per kernel: where each
    /// trial's channel takes one block, or where the reductions' scratch holds every trial's
    /// partial sums (`pairs` doubles each). Either way each trial's sums add in the order they add
    /// alone (the blocks a channel depend on one trial's shape), so a trial computes in a group
    /// what it computes alone, bit for bit; else the group's trials run one after another.
    pub(super) fn norm_groups(&self, s: &PlaneShape, f: FusedNorm, pairs: usize) -> bool {
        use super::mem_pool::{REDUCE_CHANNELS, REDUCE_PARTIALS};
        let k = self.norm_chunks(s, pairs) as usize;
        let channels = s.c.saturating_mul(f.trials);
        k == 1
            || (channels <= REDUCE_CHANNELS
                && channels.saturating_mul(k * pairs) <= 2 * REDUCE_PARTIALS
                && channels <= u16::MAX as usize)
    }

    /// Blocks each channel of a batch-norm reduction over `s` is split over: enough for about
    /// [`NORM_TARGET_BLOCKS`] blocks over all channels (two an SM on the largest GPUs), each
    /// taking about [`NORM_MIN_CHUNK`] values or more (at least half that), at most
    /// [`NORM_MAX_CHUNKS`], and within the reductions' scratch (`pairs` doubles a partial); 1
    /// (one block a channel, the single-kernel path) when a layer has channels enough. It depends
    /// on the shape alone, not on the device, so the sums' order (and their last bits) is the
    /// same on every GPU.
    pub(super) fn norm_chunks(&self, s: &PlaneShape, pairs: usize) -> u32 {
        use super::mem_pool::{REDUCE_CHANNELS, REDUCE_PARTIALS};
        let (c, m) = (s.c, s.n * s.hw);
        if c == 0 || m == 0 {
            return 1;
        }
        let fill = NORM_TARGET_BLOCKS.div_ceil(c);
        let by_size = m.div_ceil(NORM_MIN_CHUNK);
        let k = fill.min(by_size).clamp(1, NORM_MAX_CHUNKS);
        if k == 1 || c > REDUCE_CHANNELS || c * k * pairs > 2 * REDUCE_PARTIALS {
            return 1;
        }
        k as u32
    }
}

/// The fused ops of the backend contract, checked trial by trial, then run as one launch where
/// the group's sums add as each trial's alone do.
impl CudaBackend {
    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn batchnorm_fwd_fused_checked(
        &mut self,
        s: &PlaneShape,
        x: Region,
        gamma: Region,
        beta: Region,
        running: Region,
        saved: Region,
        y: Region,
        p: BnParams,
        f: FusedNorm,
    ) -> Result<(), EngineError> {
        let op = "batchnorm_fwd_fused";
        let planes = [("x", x), ("y", y)];
        let params = [("gamma", gamma), ("beta", beta)];
        contract::fused_norm(op, s, f, &planes, &params, Some(running), saved)?;
        if f.trials == 0 {
            return Ok(());
        }
        let all = [x, gamma, beta, running, saved, y];
        // Every trial's operands pass the single op's checks (and the arena's, in norm_fwd).
        for i in 0..f.trials {
            let [x, gamma, beta, running, saved, y] = f.fwd_trial(s, all, i);
            contract::batchnorm_fwd(s, x, gamma, beta, running, saved, y)?;
        }
        // Inference takes no partial sums: one launch over the group whatever the shape.
        if p.train && !self.norm_groups(s, f, 1) {
            for i in 0..f.trials {
                self.norm_fwd(op, s, f.fwd_trial(s, all, i), p, FusedNorm::one())?;
            }
            return Ok(());
        }
        self.norm_fwd(op, s, all, p, f)
    }

    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn batchnorm_bwd_fused_checked(
        &mut self,
        s: &PlaneShape,
        x: Region,
        gamma: Region,
        saved: Region,
        dy: Region,
        dx: Region,
        dgamma: Region,
        dbeta: Region,
        f: FusedNorm,
    ) -> Result<(), EngineError> {
        let op = "batchnorm_bwd_fused";
        let planes = [("x", x), ("dy", dy), ("dx", dx)];
        let params = [("gamma", gamma), ("dgamma", dgamma), ("dbeta", dbeta)];
        contract::fused_norm(op, s, f, &planes, &params, None, saved)?;
        if f.trials == 0 {
            return Ok(());
        }
        let all = [x, gamma, saved, dy, dx, dgamma, dbeta];
        for i in 0..f.trials {
            let [x, gamma, saved, dy, dx, dgamma, dbeta] = f.bwd_trial(s, all, i);
            contract::batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta)?;
        }
        if !self.norm_groups(s, f, 2) {
            for i in 0..f.trials {
                self.norm_bwd(op, s, f.bwd_trial(s, all, i), FusedNorm::one())?;
            }
            return Ok(());
        }
        self.norm_bwd(op, s, all, f)
    }
}
