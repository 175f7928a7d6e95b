//! A fused group's convolution as one lowering over all its trials: one im2col over the group's whole batch, GEMMs batched over the trials, the long weight-gradient sums split.
//!
//! The trials' activations lie trial after trial (`[trials][n][c][h][w]`), which is the layout
//! of one batch of `trials·n` samples. So im2col, col2im and the change to channel-major run once
//! over that batch, and the channel-major matrices hold every trial side by side: row `r` of the
//! group's column matrix is `[trials·n·h_out·w_out]`, trial `t`'s columns `t·n·h_out·w_out` on.
//! Each trial's GEMM reads its own block of columns (a matrix whose rows lie the group's row
//! length apart), and one strided-batched GEMM covers the trials: the members are the groups of a
//! grouped convolution, each with its own weights.
//!
//! The weight gradient `dW_t = dY'_t·col_tᵀ` sums over `n·h_out·w_out` terms into a small
//! matrix, which a batch of a few GEMMs leaves to a few thread blocks. It is split: part `j` of
//! trial `t` sums the columns of samples `j·n/S .. (j+1)·n/S`, every part of every trial is one
//! GEMM of one batch (part `t·S + j` starts `(t·S + j)·(n/S)·h_out·w_out` columns in, the same
//! stride throughout), and one kernel adds each trial's `S` parts in order. `S` depends on the
//! shape alone, so the sums add in one order on every GPU.
//!
//! [`Lowering`] is what the lowering needs launched; the CUDA backend launches it, and the tests
//! run it on the host against a direct convolution.

use super::blas::Lds;
use super::conv_shapes::{cnhw_len, col_len, workspace_len, BwdPtrs, FwdPtrs};
use crate::engine::{Conv2dShape, FusedConv, GemmBatch, GemmShape};
use crate::error::EngineError;

/// The fewest terms (columns) one part of a split weight-gradient sum adds.
const SPLIT_MIN_TERMS: usize = 4096;
/// The most parts a weight-gradient sum is split into.
const MAX_SPLITS: usize = 32;
/// The most partial-sum elements one trial's split may hold (4 MiB).
const MAX_PARTIALS: usize = 1 << 20;

/// Parts of trial `s`'s weight-gradient sum: the largest divisor of the batch `n` (each part
/// whole samples) with parts of at least [`SPLIT_MIN_TERMS`] terms, at most [`MAX_SPLITS`] parts
/// and [`MAX_PARTIALS`] partial sums; 1 for a sum too short to split.
pub(crate) fn dw_splits(s: &Conv2dShape) -> usize {
    let terms = s.n * s.h_out() * s.w_out();
    let most = (terms / SPLIT_MIN_TERMS)
        .min(MAX_SPLITS)
        .min(MAX_PARTIALS / s.w_len().max(1));
    (1..=most.max(1))
        .rev()
        .find(|d| s.n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Elements of the partial sums of one trial's split weight gradient (none when unsplit).
fn partials_len(s: &Conv2dShape) -> usize {
    match dw_splits(s) {
        1 => 0,
        parts => parts * s.w_len(),
    }
}

/// Elements of workspace the group lowering needs per trial: the trial's share of the column
/// matrix and of the channel-major output, and its partial sums.
pub(crate) fn group_workspace_len(s: &Conv2dShape) -> usize {
    workspace_len(s) + partials_len(s)
}

/// Whether the group lowering runs `f`'s trials of `s`: more than one trial, a workspace stride
/// that holds a trial's share, and a group whose sizes fit the kernels' 32-bit sizes and cuBLAS's
/// `int`s.
pub(crate) fn fits(s: &Conv2dShape, f: FusedConv) -> bool {
    let Some(batch) = f.trials.checked_mul(s.n) else {
        return false;
    };
    let g = s.with_n(batch);
    let u32_max = u32::MAX as usize;
    let group_ws = col_len(&g).checked_add(cnhw_len(&g));
    f.trials > 1
        && s.fits()
        && f.ws_stride >= group_workspace_len(s)
        && g.x_len() <= u32_max
        && g.y_len() <= u32_max
        && group_ws.is_some_and(|l| l <= u32_max)
        && batch * g.h_out() * g.w_out() <= i32::MAX as usize
}

/// What the group lowering has launched, on device addresses (bytes).
pub(crate) trait Lowering {
    /// im2col of the NCHW batch `x` of shape `s` into `col`, `[c_in·k·k][n·h_out·w_out]`.
    fn im2col(&mut self, s: &Conv2dShape, x: u64, col: u64) -> Result<(), EngineError>;
    /// col2im: `dx` (shape `s`, NCHW) from the column matrix `col`, overwritten.
    fn col2im(&mut self, s: &Conv2dShape, col: u64, dx: u64) -> Result<(), EngineError>;
    /// `dst[ch][b·hw + j] = src[b][ch][j]` over `n` samples of `c` channels.
    fn to_cnhw(
        &mut self,
        n: usize,
        c: usize,
        hw: usize,
        src: u64,
        dst: u64,
    ) -> Result<(), EngineError>;
    /// `dst[t·n + b][ch][j] = src[ch][(t·n + b)·hw + j] + bias[t·bias_stride + ch]` for trial
    /// `t < trials` (no bias when `bias` is `None`).
    #[allow(clippy::too_many_arguments)]
    fn to_nchw(
        &mut self,
        trials: usize,
        n: usize,
        c: usize,
        hw: usize,
        src: u64,
        bias: Option<u64>,
        bias_stride: usize,
        dst: u64,
    ) -> Result<(), EngineError>;
    /// Each trial's bias gradient: `db[t·db_stride + ch]` is the sum of channel `ch` of trial
    /// `t`'s `dy` (NCHW, trial after trial), as the single convolution sums it.
    #[allow(clippy::too_many_arguments)]
    fn channel_sums(
        &mut self,
        trials: usize,
        n: usize,
        c: usize,
        hw: usize,
        dy: u64,
        db: u64,
        db_stride: usize,
    ) -> Result<(), EngineError>;
    /// A strided batch of row-major GEMMs whose operands' rows lie `ld` apart.
    fn gemm(
        &mut self,
        g: &GemmShape,
        ld: Lds,
        batch: GemmBatch,
        a: u64,
        b: u64,
        c: u64,
    ) -> Result<(), EngineError>;
    /// `dst[t·dst_stride + e] = Σ_{j < splits} part[(t·splits + j)·len + e]`, `j` in order.
    #[allow(clippy::too_many_arguments)]
    fn split_sum(
        &mut self,
        trials: usize,
        splits: usize,
        len: usize,
        part: u64,
        dst: u64,
        dst_stride: usize,
    ) -> Result<(), EngineError>;
}

/// `p` moved `elems` f32 elements on.
fn on(p: u64, elems: usize) -> u64 {
    p + (elems as u64) * 4
}

/// The sizes of a group's lowering, and where its buffers lie in the workspace at `ws`.
struct Group {
    /// The group's batch as one convolution: `trials·n` samples.
    batch: Conv2dShape,
    trials: usize,
    /// Output pixels of one trial: `n·h_out·w_out`, its columns in the group's matrices.
    nhw: usize,
    /// Output pixels of the group: the rows' length of its channel-major matrices.
    row: usize,
    /// Rows of the column matrix: `c_in·k·k`.
    kk: usize,
    /// `[kk][row]`.
    col: u64,
    /// The channel-major output (or its gradient), `[c_out][row]`.
    yt: u64,
    /// The weight gradient's partial sums, `[trials·splits][c_out·kk]`.
    part: u64,
}

impl Group {
    fn new(s: &Conv2dShape, f: FusedConv, ws: u64) -> Group {
        let batch = s.with_n(f.trials * s.n);
        let nhw = s.n * s.h_out() * s.w_out();
        let col = ws;
        let yt = on(col, col_len(&batch));
        Group {
            batch,
            trials: f.trials,
            nhw,
            row: f.trials * nhw,
            kk: s.c_in * s.k * s.k,
            col,
            yt,
            part: on(yt, cnhw_len(&batch)),
        }
    }

    /// One GEMM per trial: `A`, `B` and `C` `stride_a`, `stride_b` and `stride_c` apart.
    fn per_trial(&self, stride_a: usize, stride_b: usize, stride_c: usize) -> GemmBatch {
        GemmBatch {
            count: self.trials,
            stride_a,
            stride_b,
            stride_c,
        }
    }
}

/// `y = conv(x, w) + b` for every trial of `f` (operands as [`FwdPtrs::trial`] lays them out):
/// im2col over the group, `Y'_t = W_t·col_t` for every trial in one batch, then back to NCHW
/// with each trial's bias. Three launches whatever the group's width.
pub(crate) fn forward(
    l: &mut dyn Lowering,
    s: &Conv2dShape,
    p: &FwdPtrs,
    f: FusedConv,
) -> Result<(), EngineError> {
    let g = Group::new(s, f, p.ws);
    l.im2col(&g.batch, p.x, g.col)?;
    let gemm = GemmShape::nn(s.c_out, g.nhw, g.kk);
    let ld = Lds {
        a: g.kk,
        b: g.row,
        c: g.row,
    };
    let batch = g.per_trial(f.w_stride, g.nhw, g.nhw);
    l.gemm(&gemm, ld, batch, p.w, g.col, g.yt)?;
    let hw = s.h_out() * s.w_out();
    l.to_nchw(f.trials, s.n, s.c_out, hw, g.yt, p.b, f.w_stride, p.y)
}

/// The gradients of every trial of `f` (laid out as in [`forward`]): `dY'` channel-major over
/// the group, each trial's bias gradient, im2col over the group, `dW_t` as a split sum (or one
/// GEMM per trial when unsplit), and `dcol_t = W_tᵀ·dY'_t` folded back by col2im. At most seven
/// launches whatever the group's width.
pub(crate) fn backward(
    l: &mut dyn Lowering,
    s: &Conv2dShape,
    p: &BwdPtrs,
    f: FusedConv,
) -> Result<(), EngineError> {
    let g = Group::new(s, f, p.ws);
    let hw = s.h_out() * s.w_out();
    l.to_cnhw(g.batch.n, s.c_out, hw, p.dy, g.yt)?;
    if let Some(db) = p.db {
        l.channel_sums(f.trials, s.n, s.c_out, hw, p.dy, db, f.w_stride)?;
    }
    l.im2col(&g.batch, p.x, g.col)?;
    let splits = dw_splits(s);
    let terms = g.nhw / splits;
    let gw = GemmShape {
        trans_b: true,
        ..GemmShape::nn(s.c_out, g.kk, terms)
    };
    let ld = Lds {
        a: g.row,
        b: g.row,
        c: g.kk,
    };
    if splits == 1 {
        let batch = g.per_trial(g.nhw, g.nhw, f.w_stride);
        l.gemm(&gw, ld, batch, g.yt, g.col, p.dw)?;
    } else {
        // Part q = t·S + j starts q·terms columns in: trial t's block, then its j-th part.
        let batch = GemmBatch {
            count: f.trials * splits,
            stride_a: terms,
            stride_b: terms,
            stride_c: s.w_len(),
        };
        l.gemm(&gw, ld, batch, g.yt, g.col, g.part)?;
        l.split_sum(f.trials, splits, s.w_len(), g.part, p.dw, f.w_stride)?;
    }
    let Some(dx) = p.dx else { return Ok(()) };
    let gx = GemmShape {
        trans_a: true,
        ..GemmShape::nn(g.kk, g.nhw, s.c_out)
    };
    let ld = Lds {
        a: g.kk,
        b: g.row,
        c: g.row,
    };
    let batch = g.per_trial(f.w_stride, g.nhw, g.nhw);
    // dcol overwrites the column matrix, which dW has read before it in stream order.
    l.gemm(&gx, ld, batch, p.w, g.yt, g.col)?;
    l.col2im(&g.batch, g.col, dx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::random;
    use crate::rng::HostRng;

    /// Every entry of the column matrix of `s` (`[c_in·k·k][n·h_out·w_out]`), in order: its
    /// offset, and the offset in the NCHW input it takes (`None` in the padding).
    fn taps(s: &Conv2dShape) -> impl Iterator<Item = (usize, Option<usize>)> + '_ {
        let (ho, wo) = (s.h_out(), s.w_out());
        let cols = s.n * ho * wo;
        (0..s.c_in * s.k * s.k).flat_map(move |r| {
            let (ci, ky, kx) = (r / (s.k * s.k), r / s.k % s.k, r % s.k);
            (0..cols).map(move |j| {
                let (b, oy, ox) = (j / (ho * wo), j / wo % ho, j % wo);
                let iy = (oy * s.stride + ky).checked_sub(s.pad).filter(|&y| y < s.h);
                let ix = (ox * s.stride + kx).checked_sub(s.pad).filter(|&x| x < s.w);
                let at = iy
                    .zip(ix)
                    .map(|(iy, ix)| ((b * s.c_in + ci) * s.h + iy) * s.w + ix);
                (r * cols + j, at)
            })
        })
    }

    /// The lowering run on the host, on one memory of f32s addressed in bytes, counting launches.
    struct Host {
        mem: Vec<f32>,
        launches: usize,
    }

    impl Host {
        fn i(addr: u64) -> usize {
            assert_eq!(addr % 4, 0, "an f32 address");
            (addr / 4) as usize
        }
    }

    impl Lowering for Host {
        fn im2col(&mut self, s: &Conv2dShape, x: u64, col: u64) -> Result<(), EngineError> {
            self.launches += 1;
            let (x, col) = (Self::i(x), Self::i(col));
            for (c, xi) in taps(s) {
                self.mem[col + c] = xi.map_or(0.0, |xi| self.mem[x + xi]);
            }
            Ok(())
        }

        fn col2im(&mut self, s: &Conv2dShape, col: u64, dx: u64) -> Result<(), EngineError> {
            self.launches += 1;
            let (col, dx) = (Self::i(col), Self::i(dx));
            self.mem[dx..dx + s.x_len()].fill(0.0);
            for (c, xi) in taps(s) {
                if let Some(xi) = xi {
                    self.mem[dx + xi] += self.mem[col + c];
                }
            }
            Ok(())
        }

        fn to_cnhw(
            &mut self,
            n: usize,
            c: usize,
            hw: usize,
            src: u64,
            dst: u64,
        ) -> Result<(), EngineError> {
            self.launches += 1;
            let (src, dst) = (Self::i(src), Self::i(dst));
            for b in 0..n {
                for ch in 0..c {
                    for j in 0..hw {
                        self.mem[dst + ch * n * hw + b * hw + j] =
                            self.mem[src + (b * c + ch) * hw + j];
                    }
                }
            }
            Ok(())
        }

        fn to_nchw(
            &mut self,
            trials: usize,
            n: usize,
            c: usize,
            hw: usize,
            src: u64,
            bias: Option<u64>,
            bias_stride: usize,
            dst: u64,
        ) -> Result<(), EngineError> {
            self.launches += 1;
            let (src, dst) = (Self::i(src), Self::i(dst));
            let samples = trials * n;
            for t in 0..trials {
                for b in 0..n {
                    for ch in 0..c {
                        let add = bias.map_or(0.0, |p| self.mem[Self::i(p) + t * bias_stride + ch]);
                        for j in 0..hw {
                            let sample = t * n + b;
                            self.mem[dst + (sample * c + ch) * hw + j] =
                                self.mem[src + ch * samples * hw + sample * hw + j] + add;
                        }
                    }
                }
            }
            Ok(())
        }

        fn channel_sums(
            &mut self,
            trials: usize,
            n: usize,
            c: usize,
            hw: usize,
            dy: u64,
            db: u64,
            db_stride: usize,
        ) -> Result<(), EngineError> {
            self.launches += 1;
            let (dy, db) = (Self::i(dy), Self::i(db));
            for t in 0..trials {
                for ch in 0..c {
                    let mut sum = 0f32;
                    for b in 0..n {
                        let plane = dy + ((t * n + b) * c + ch) * hw;
                        sum += self.mem[plane..plane + hw].iter().sum::<f32>();
                    }
                    self.mem[db + t * db_stride + ch] = sum;
                }
            }
            Ok(())
        }

        fn gemm(
            &mut self,
            g: &GemmShape,
            ld: Lds,
            batch: GemmBatch,
            a: u64,
            b: u64,
            c: u64,
        ) -> Result<(), EngineError> {
            self.launches += 1;
            // Rows at least as long as the matrices' (cuBLAS refuses shorter ones).
            let dense = Lds::dense(g);
            assert!(
                ld.a >= dense.a && ld.b >= dense.b && ld.c >= dense.c,
                "{ld:?}"
            );
            let (a, b, c) = (Self::i(a), Self::i(b), Self::i(c));
            for q in 0..batch.count {
                let (a, b, c) = (
                    a + q * batch.stride_a,
                    b + q * batch.stride_b,
                    c + q * batch.stride_c,
                );
                for i in 0..g.m {
                    for j in 0..g.n {
                        let mut sum = 0f32;
                        for p in 0..g.k {
                            let av = if g.trans_a {
                                self.mem[a + p * ld.a + i]
                            } else {
                                self.mem[a + i * ld.a + p]
                            };
                            let bv = if g.trans_b {
                                self.mem[b + j * ld.b + p]
                            } else {
                                self.mem[b + p * ld.b + j]
                            };
                            sum += av * bv;
                        }
                        let at = c + i * ld.c + j;
                        self.mem[at] = g.alpha * sum + g.beta * self.mem[at];
                    }
                }
            }
            Ok(())
        }

        fn split_sum(
            &mut self,
            trials: usize,
            splits: usize,
            len: usize,
            part: u64,
            dst: u64,
            dst_stride: usize,
        ) -> Result<(), EngineError> {
            self.launches += 1;
            let (part, dst) = (Self::i(part), Self::i(dst));
            for t in 0..trials {
                for e in 0..len {
                    let sum = (0..splits)
                        .map(|j| self.mem[part + (t * splits + j) * len + e])
                        .fold(0f32, |acc, v| acc + v);
                    self.mem[dst + t * dst_stride + e] = sum;
                }
            }
            Ok(())
        }
    }

    /// The direct convolution of one trial, in f64: `y`, and from `dy` the gradients `dx`, `dw`
    /// and `db`.
    struct Direct {
        y: Vec<f64>,
        dx: Vec<f64>,
        dw: Vec<f64>,
        db: Vec<f64>,
    }

    fn direct(s: &Conv2dShape, x: &[f32], w: &[f32], b: Option<&[f32]>, dy: &[f32]) -> Direct {
        let (ho, wo) = (s.h_out(), s.w_out());
        let mut d = Direct {
            y: vec![0.0; s.y_len()],
            dx: vec![0.0; s.x_len()],
            dw: vec![0.0; s.w_len()],
            db: vec![0.0; s.c_out],
        };
        for n in 0..s.n {
            for co in 0..s.c_out {
                for oy in 0..ho {
                    for ox in 0..wo {
                        let yi = ((n * s.c_out + co) * ho + oy) * wo + ox;
                        let mut sum = b.map_or(0.0, |b| b[co] as f64);
                        let g = dy[yi] as f64;
                        d.db[co] += g;
                        for ci in 0..s.c_in {
                            for ky in 0..s.k {
                                for kx in 0..s.k {
                                    let iy = (oy * s.stride + ky) as isize - s.pad as isize;
                                    let ix = (ox * s.stride + kx) as isize - s.pad as isize;
                                    if iy < 0 || ix < 0 || iy as usize >= s.h || ix as usize >= s.w
                                    {
                                        continue;
                                    }
                                    let xi =
                                        ((n * s.c_in + ci) * s.h + iy as usize) * s.w + ix as usize;
                                    let wi = ((co * s.c_in + ci) * s.k + ky) * s.k + kx;
                                    sum += w[wi] as f64 * x[xi] as f64;
                                    d.dw[wi] += g * x[xi] as f64;
                                    d.dx[xi] += g * w[wi] as f64;
                                }
                            }
                        }
                        d.y[yi] = sum;
                    }
                }
            }
        }
        d
    }

    fn close(got: &[f32], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let tol = 1e-4 * (1.0 + w.abs());
            assert!((*g as f64 - w).abs() <= tol, "{what}[{i}]: {g} against {w}");
        }
    }

    fn shape(
        n: usize,
        c_in: usize,
        hw: usize,
        c_out: usize,
        k: usize,
        pad: usize,
        stride: usize,
    ) -> Conv2dShape {
        Conv2dShape {
            n,
            c_in,
            h: hw,
            w: hw,
            c_out,
            k,
            pad,
            stride,
        }
    }

    /// Runs the group lowering of `trials` trials of `s` on the host and checks every trial's
    /// output and gradients against its direct convolution; returns the launches of the forward
    /// and the backward pass.
    fn check(s: &Conv2dShape, trials: usize, bias: bool, with_dx: bool) -> (usize, usize) {
        let mut rng = HostRng::new(7 + trials as u64);
        // Each trial's weights then bias in a parameter block of an odd stride.
        let w_stride = s.w_len() + s.c_out + 3;
        let ws_stride = group_workspace_len(s) + 5;
        let f = FusedConv {
            trials,
            w_stride,
            ws_stride,
        };
        assert!(fits(s, f), "{s:?} × {trials}");
        // Memory: x, params, y, dy, dx, grads, ws.
        let lens = [
            trials * s.x_len(),
            trials * w_stride,
            trials * s.y_len(),
            trials * s.y_len(),
            trials * s.x_len(),
            trials * w_stride,
            trials * ws_stride,
        ];
        let mut starts = Vec::new();
        let mut total = 0;
        for l in lens {
            starts.push(total);
            total += l;
        }
        let mem = random(&mut rng, total, -1.0, 1.0);
        // The gradients' blocks hold garbage that the pass must overwrite where it writes.
        let grads_before = mem[starts[5]..starts[5] + lens[5]].to_vec();
        let dx_before = mem[starts[4]..starts[4] + lens[4]].to_vec();
        let addr = |k: usize| (starts[k] * 4) as u64;
        let fwd = FwdPtrs {
            x: addr(0),
            w: addr(1),
            b: bias.then(|| addr(1) + (s.w_len() * 4) as u64),
            y: addr(2),
            ws: addr(6),
            ws_bytes: ws_stride * 4,
        };
        let bwd = BwdPtrs {
            x: addr(0),
            w: addr(1),
            dy: addr(3),
            dx: with_dx.then(|| addr(4)),
            dw: addr(5),
            db: bias.then(|| addr(5) + (s.w_len() * 4) as u64),
            ws: addr(6),
            ws_bytes: ws_stride * 4,
        };
        let mut host = Host { mem, launches: 0 };
        forward(&mut host, s, &fwd, f).unwrap();
        let fwd_launches = host.launches;
        backward(&mut host, s, &bwd, f).unwrap();
        let bwd_launches = host.launches - fwd_launches;
        let m = &host.mem;
        for t in 0..trials {
            let slice = |k: usize, at: usize, len: usize| &m[starts[k] + at..starts[k] + at + len];
            let x = slice(0, t * s.x_len(), s.x_len());
            let w = slice(1, t * w_stride, s.w_len());
            let b = bias.then(|| slice(1, t * w_stride + s.w_len(), s.c_out));
            let dy = slice(3, t * s.y_len(), s.y_len());
            let d = direct(s, x, w, b, dy);
            let what = format!("{s:?} trial {t} of {trials}, bias {bias}");
            close(
                slice(2, t * s.y_len(), s.y_len()),
                &d.y,
                &format!("y {what}"),
            );
            close(
                slice(5, t * w_stride, s.w_len()),
                &d.dw,
                &format!("dw {what}"),
            );
            let db_at = t * w_stride + s.w_len();
            if bias {
                close(slice(5, db_at, s.c_out), &d.db, &format!("db {what}"));
            } else {
                assert_eq!(
                    slice(5, db_at, s.c_out),
                    &grads_before[db_at..db_at + s.c_out],
                    "db untouched {what}"
                );
            }
            let dx = slice(4, t * s.x_len(), s.x_len());
            if with_dx {
                close(dx, &d.dx, &format!("dx {what}"));
            } else {
                assert_eq!(dx, &dx_before[t * s.x_len()..(t + 1) * s.x_len()]);
            }
        }
        // The gaps between the trials' parameter blocks are left as they were.
        for t in 0..trials {
            let gap = t * w_stride + s.w_len() + s.c_out..(t + 1) * w_stride;
            assert_eq!(
                &m[starts[5] + gap.start..starts[5] + gap.end],
                &grads_before[gap],
                "gap after trial {t}"
            );
        }
        (fwd_launches, bwd_launches)
    }

    #[test]
    fn the_group_lowering_computes_each_trials_convolution() {
        for s in [
            shape(2, 3, 7, 4, 3, 1, 1),
            shape(3, 2, 9, 3, 3, 0, 2),
            shape(2, 4, 5, 6, 1, 0, 1),
            shape(2, 3, 8, 5, 1, 0, 2),
            shape(1, 1, 6, 2, 5, 2, 1),
        ] {
            assert_eq!(dw_splits(&s), 1, "{s:?}");
            for trials in [2, 3] {
                for (bias, dx) in [(true, true), (false, true), (true, false)] {
                    check(&s, trials, bias, dx);
                }
            }
        }
    }

    #[test]
    fn a_long_weight_gradient_is_split_and_still_each_trials_own() {
        // 4 samples of 64×64 outputs: 16,384 terms in 4 parts of one sample each.
        let s = shape(4, 1, 64, 2, 3, 1, 1);
        assert_eq!(dw_splits(&s), 4);
        assert_eq!(group_workspace_len(&s), workspace_len(&s) + 4 * s.w_len());
        for (bias, dx) in [(true, true), (false, false)] {
            check(&s, 3, bias, dx);
        }
    }

    #[test]
    fn the_launches_do_not_grow_with_the_group() {
        let s = shape(2, 3, 7, 4, 3, 1, 1);
        let two = check(&s, 2, true, true);
        assert_eq!(check(&s, 5, true, true), two);
        assert_eq!(two, (3, 6));
        let long = shape(4, 1, 64, 2, 3, 1, 1);
        let split = check(&long, 2, true, true);
        assert_eq!(split, (3, 7));
        assert_eq!(check(&long, 4, true, true), split);
    }

    #[test]
    fn splits_are_whole_samples_within_their_bounds() {
        // MNIST's CNN at batch 128: 26×26 and 24×24 outputs.
        let conv1 = shape(128, 1, 28, 32, 3, 0, 1);
        let conv2 = shape(128, 32, 26, 64, 3, 0, 1);
        for s in [conv1, conv2] {
            let k = dw_splits(&s);
            assert_eq!(k, 16, "{s:?}");
            assert_eq!(s.n % k, 0);
            assert!(s.n * s.h_out() * s.w_out() / k >= SPLIT_MIN_TERMS);
            assert!(k * s.w_len() <= MAX_PARTIALS);
        }
        // A large weight matrix has tiles enough: unsplit.
        assert_eq!(dw_splits(&shape(32, 512, 7, 512, 3, 1, 1)), 1);
        // A prime batch splits into whole samples only: unsplit.
        assert_eq!(dw_splits(&shape(127, 1, 28, 32, 3, 0, 1)), 1);
        // Short sums are not split.
        assert_eq!(dw_splits(&shape(2, 3, 7, 4, 3, 1, 1)), 1);
    }

    #[test]
    fn the_group_runs_only_where_it_fits() {
        let s = shape(2, 3, 7, 4, 3, 1, 1);
        let f = |trials, ws_stride| FusedConv {
            trials,
            w_stride: s.w_len() + s.c_out,
            ws_stride,
        };
        let need = group_workspace_len(&s);
        assert!(fits(&s, f(2, need)));
        assert!(!fits(&s, f(1, need)), "one trial runs as itself");
        assert!(!fits(&s, f(2, need - 1)), "a workspace too short");
        // A group whose matrices pass the kernels' 32-bit sizes.
        let big = shape(256, 64, 64, 64, 3, 1, 1);
        let per = group_workspace_len(&big);
        assert!(fits(
            &big,
            FusedConv {
                trials: 2,
                w_stride: 1,
                ws_stride: per
            }
        ));
        assert!(!fits(
            &big,
            FusedConv {
                trials: 64,
                w_stride: 1,
                ws_stride: per
            }
        ));
    }
}
