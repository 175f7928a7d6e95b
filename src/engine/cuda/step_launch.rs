//! The launches the trait's ops share beyond batch norm: a convolution's workspace, the optimizer steps (one trial or a fused group) and dropout.

use super::backend::{at, CudaBackend};
use super::conv_group::group_workspace_len;
use super::conv_shapes::workspace_len;
use super::launch::Arg;
use super::status::to_u32;
use crate::engine::contract::{self, need};
use crate::engine::{Conv2dShape, DropoutMask, FusedConv, Region, Update};
use crate::error::EngineError;

impl CudaBackend {
    /// The workspace region of a convolution: cuDNN takes the whole region it is given (its
    /// algorithms are chosen to fit it; see `cudnn.rs`), the GEMM lowering needs its fixed size.
    pub(super) fn conv_ws(
        &self,
        op: &'static str,
        s: &Conv2dShape,
        ws: Region,
    ) -> Result<Region, EngineError> {
        if self.dnn_for(s).is_some() {
            Ok(ws)
        } else {
            need(op, "workspace", ws, workspace_len(s))
        }
    }

    /// The workspace each trial of a fused convolution takes: the GEMM lowering's fixed size, or
    /// for cuDNN (which takes what it is given) the whole stride, or with one trial the whole
    /// region.
    /// The workspace a fused convolution writes, all trials together: the group lowering's
    /// `trials·len` from the start, else every trial's copy of `len` (and the gaps between).
    pub(super) fn fused_ws_written(
        &self,
        s: &Conv2dShape,
        ws: Region,
        len: usize,
        f: FusedConv,
    ) -> Region {
        if self.groups_conv(s, f) {
            Region::new(ws.offset, len * f.trials)
        } else {
            ws
        }
    }

    pub(super) fn fused_ws_len(&self, s: &Conv2dShape, ws: Region, f: FusedConv) -> usize {
        if self.groups_conv(s, f) {
            return group_workspace_len(s);
        }
        match (self.dnn_for(s).is_some(), f.trials) {
            (false, _) => workspace_len(s),
            (true, 1) => ws.len,
            (true, _) => f.ws_stride,
        }
    }

    /// One optimizer step ([`Update`]) as one launch; Adam reads its `t` from `counter`. With
    /// `advance`, the kernel's last block then advances `counter` (`kernels/optim.cu`'s
    /// `advance_when_done`), so that [`Backend::update`] is one launch too.
    pub(super) fn optimizer(
        &mut self,
        u: Update,
        counter: Option<Region>,
        advance: bool,
    ) -> Result<(), EngineError> {
        /// A kernel argument: a region of the arena (its address once the arena's base is
        /// known), or a plain value.
        enum Part {
            At(Region),
            Value(Arg),
        }
        use Part::{At, Value};
        let counter = counter.map(contract::counter).transpose()?;
        let need_counter = || {
            counter.ok_or_else(|| {
                EngineError::Device("an optimizer step needs the step counter".into())
            })
        };
        // The advance is the kernel's last argument: the counter it writes, or none.
        let advance = if advance { Some(need_counter()?) } else { None };
        let per_trial = |op, w: Region, trials: usize| {
            to_u32(op, "params", w.len.checked_div(trials).unwrap_or(0)).map(Arg::U32)
        };
        let (op, w, reads, writes, parts) = match u {
            Update::Sgd { w, g, v, p } => {
                let op = "sgd_step";
                let [g, v] = contract::elementwise(op, [("g", g), ("v", v)], w.len)?;
                let params = [p.lr, p.momentum, p.weight_decay].map(|x| Value(Arg::F32(x)));
                let mut parts = vec![
                    At(w),
                    At(g),
                    At(v),
                    Value(Arg::U32(to_u32(op, "len", w.len)?)),
                ];
                parts.extend(params);
                (op, w, vec![g], vec![w, v], parts)
            }
            Update::Adam { w, g, m, v, p } => {
                let op = "adam_step";
                let [g, m, v] = contract::elementwise(op, [("g", g), ("m", m), ("v", v)], w.len)?;
                let c = need_counter()?;
                let params =
                    [p.lr, p.beta1, p.beta2, p.eps, p.weight_decay].map(|x| Value(Arg::F32(x)));
                let mut parts = vec![
                    At(w),
                    At(g),
                    At(m),
                    At(v),
                    Value(Arg::U32(to_u32(op, "len", w.len)?)),
                ];
                parts.extend(params);
                parts.push(At(c));
                (op, w, vec![g, c], vec![w, m, v], parts)
            }
            Update::SgdBatched {
                w,
                g,
                v,
                hyper,
                trials,
            } => {
                let op = "sgd_step_batched";
                let (_, [g, v], hyper) =
                    contract::optim_batched(op, w, [("g", g), ("v", v)], hyper, trials)?;
                let parts = vec![
                    At(w),
                    At(g),
                    At(v),
                    Value(Arg::U32(to_u32(op, "len", w.len)?)),
                    Value(per_trial(op, w, trials)?),
                    At(hyper),
                ];
                (op, w, vec![g, hyper], vec![w, v], parts)
            }
            Update::AdamBatched {
                w,
                g,
                m,
                v,
                hyper,
                trials,
            } => {
                let op = "adam_step_batched";
                let (_, [g, m, v], hyper) =
                    contract::optim_batched(op, w, [("g", g), ("m", m), ("v", v)], hyper, trials)?;
                let c = need_counter()?;
                let parts = vec![
                    At(w),
                    At(g),
                    At(m),
                    At(v),
                    Value(Arg::U32(to_u32(op, "len", w.len)?)),
                    Value(per_trial(op, w, trials)?),
                    At(hyper),
                    At(c),
                ];
                (op, w, vec![g, hyper, c], vec![w, m, v], parts)
            }
        };
        // The counter is written by the advance (and read by Adam): checked as written then.
        let reads: Vec<Region> = reads.into_iter().filter(|r| Some(*r) != advance).collect();
        let writes: Vec<Region> = writes.into_iter().chain(advance).collect();
        let base = self.regions(op, &reads, &writes)?;
        let mut args: Vec<Arg> = parts
            .into_iter()
            .map(|part| match part {
                At(r) => Arg::Ptr(at(base, r)),
                Value(a) => a,
            })
            .collect();
        args.push(Arg::Ptr(advance.map_or(0, |c| at(base, c))));
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, w.len, &args)
    }

    /// `dropout_fwd(x → y)` or `dropout_bwd(dy → dx)`: the same kernel signature.
    pub(super) fn dropout(
        &mut self,
        op: &'static str,
        len: usize,
        d: DropoutMask,
        src: Region,
        dst: Region,
    ) -> Result<(), EngineError> {
        let counter = contract::counter(d.counter)?;
        let (src_name, dst_name) = if op == "dropout_fwd" {
            ("x", "y")
        } else {
            ("dy", "dx")
        };
        let [src, dst] = contract::elementwise(op, [(src_name, src), (dst_name, dst)], len)?;
        // The counter is read by the kernel, so it is checked as a read region too.
        let base = self.regions(op, &[src, counter], &[dst])?;
        let args = [
            Arg::Ptr(at(base, src)),
            Arg::Ptr(at(base, dst)),
            Arg::U32(to_u32(op, "len", len)?),
            Arg::F32(d.p),
            Arg::U64(d.seed),
            Arg::Ptr(at(base, counter)),
            Arg::U32(d.layer),
            Arg::U64(d.first),
        ];
        let e = self.ctx.enter()?;
        self.elementwise(&e, op, len, &args)
    }
}
