//! The convolution ops of the backend contract: their operands checked against the contract and the arena, then run by `conv.rs` (one trial) or a fused group's lowering.

use super::backend::{at, CudaBackend};
use super::conv_shapes::{BwdPtrs, FwdPtrs};
use crate::engine::contract;
use crate::engine::{Conv2dShape, FusedConv, Region};
use crate::error::EngineError;

impl CudaBackend {
    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv2d_fwd_checked(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
    ) -> Result<(), EngineError> {
        let op = "conv2d_fwd";
        let contract::ConvFwd { x, w, b, y } = contract::conv2d_fwd(s, x, w, b, y)?;
        let ws = self.conv_ws(op, s, ws)?;
        let reads: Vec<Region> = [x, w].into_iter().chain(b).collect();
        let base = self.regions(op, &reads, &[y, ws])?;
        let p = FwdPtrs {
            x: at(base, x),
            w: at(base, w),
            b: b.map(|b| at(base, b)),
            y: at(base, y),
            ws: at(base, ws),
            ws_bytes: ws.len * 4,
        };
        let e = self.ctx.enter()?;
        self.conv_fwd(&e, s, &p)
    }

    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv2d_bwd_checked(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        dy: Region,
        dx: Option<Region>,
        dw: Region,
        db: Option<Region>,
        ws: Region,
    ) -> Result<(), EngineError> {
        let op = "conv2d_bwd";
        let contract::ConvBwd {
            x,
            w,
            dy,
            dx,
            dw,
            db,
        } = contract::conv2d_bwd(s, x, w, dy, dx, dw, db)?;
        let ws = self.conv_ws(op, s, ws)?;
        let writes: Vec<Region> = dx.into_iter().chain([dw]).chain(db).chain([ws]).collect();
        let base = self.regions(op, &[x, w, dy], &writes)?;
        let p = BwdPtrs {
            x: at(base, x),
            w: at(base, w),
            dy: at(base, dy),
            dx: dx.map(|dx| at(base, dx)),
            dw: at(base, dw),
            db: db.map(|db| at(base, db)),
            ws: at(base, ws),
            ws_bytes: ws.len * 4,
        };
        let e = self.ctx.enter()?;
        self.conv_bwd(&e, s, &p)
    }

    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv2d_fwd_fused_checked(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        b: Option<Region>,
        y: Region,
        ws: Region,
        f: FusedConv,
    ) -> Result<(), EngineError> {
        let op = "conv2d_fwd_fused";
        let r = contract::conv2d_fwd_fused(s, x, w, b, y, f)?;
        let ws_len = self.fused_ws_len(s, ws, f);
        let ws = contract::fused_ws(op, ws, f, ws_len)?;
        let (x_len, y_len) = (s.x_len(), s.y_len());
        let mut base = 0;
        for i in 0..f.trials {
            let reads: Vec<Region> = [
                FusedConv::at(r.x, i, x_len, x_len),
                FusedConv::at(r.w, i, f.w_stride, s.w_len()),
            ]
            .into_iter()
            .chain(r.b.map(|b| FusedConv::at(b, i, f.w_stride, s.c_out)))
            .collect();
            let writes = [
                FusedConv::at(r.y, i, y_len, y_len),
                FusedConv::at(ws, i, f.ws_stride, ws_len),
            ];
            base = self.regions(op, &reads, &writes)?;
        }
        if f.trials == 0 {
            return Ok(());
        }
        // The trials run at once: no trial's output may overlap another's input or output.
        let all = |r: Region, len: usize| Region::new(r.offset, len * f.trials);
        let ws_all = self.fused_ws_written(s, ws, ws_len, f);
        self.regions(op, &[all(r.x, x_len)], &[all(r.y, y_len), ws_all])?;
        let p = FwdPtrs {
            x: at(base, r.x),
            w: at(base, r.w),
            b: r.b.map(|b| at(base, b)),
            y: at(base, r.y),
            ws: at(base, ws),
            ws_bytes: ws_len * 4,
        };
        let e = self.ctx.enter()?;
        self.conv_fwd_fused(&e, s, &p, f)
    }

    // The operands of the contract op, as the trait takes them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv2d_bwd_fused_checked(
        &mut self,
        s: &Conv2dShape,
        x: Region,
        w: Region,
        dy: Region,
        dx: Option<Region>,
        dw: Region,
        db: Option<Region>,
        ws: Region,
        f: FusedConv,
    ) -> Result<(), EngineError> {
        let op = "conv2d_bwd_fused";
        let r = contract::conv2d_bwd_fused(s, x, w, dy, dx, dw, db, f)?;
        let ws_len = self.fused_ws_len(s, ws, f);
        let ws = contract::fused_ws(op, ws, f, ws_len)?;
        let (x_len, y_len, w_len) = (s.x_len(), s.y_len(), s.w_len());
        let mut base = 0;
        for i in 0..f.trials {
            let reads = [
                FusedConv::at(r.x, i, x_len, x_len),
                FusedConv::at(r.w, i, f.w_stride, w_len),
                FusedConv::at(r.dy, i, y_len, y_len),
            ];
            let writes: Vec<Region> =
                r.dx.map(|dx| FusedConv::at(dx, i, x_len, x_len))
                    .into_iter()
                    .chain([FusedConv::at(r.dw, i, f.w_stride, w_len)])
                    .chain(r.db.map(|db| FusedConv::at(db, i, f.w_stride, s.c_out)))
                    .chain([FusedConv::at(ws, i, f.ws_stride, ws_len)])
                    .collect();
            base = self.regions(op, &reads, &writes)?;
        }
        if f.trials == 0 {
            return Ok(());
        }
        // The trials run at once: no trial's output may overlap another's input or output.
        let all = |r: Region, len: usize| Region::new(r.offset, len * f.trials);
        let ws_all = self.fused_ws_written(s, ws, ws_len, f);
        let writes: Vec<Region> =
            r.dx.map(|dx| all(dx, x_len))
                .into_iter()
                .chain([ws_all])
                .collect();
        self.regions(op, &[all(r.x, x_len), all(r.dy, y_len)], &writes)?;
        let p = BwdPtrs {
            x: at(base, r.x),
            w: at(base, r.w),
            dy: at(base, r.dy),
            dx: r.dx.map(|dx| at(base, dx)),
            dw: at(base, r.dw),
            db: r.db.map(|db| at(base, db)),
            ws: at(base, ws),
            ws_bytes: ws_len * 4,
        };
        let e = self.ctx.enter()?;
        self.conv_bwd_fused(&e, s, &p, f)
    }
}
