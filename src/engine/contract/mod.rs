//! The backend contract: every shape, region and label check of the [`Backend`](super::Backend) ops, written once and called by both backends, so that they refuse the same inputs with the same errors.

use super::fused_hyper::HYPER_LEN;
use super::{
    Conv2dShape, FusedConv, FusedNorm, GemmBatch, GemmShape, PlaneShape, PoolShape, Region,
    COUNTER_LEN, STATS_LEN,
};
use crate::error::EngineError;

fn shape_error(op: &'static str, message: String) -> EngineError {
    EngineError::Shape { op, message }
}

/// `region`'s first `len` elements, or a shape error when it is shorter.
pub fn need(
    op: &'static str,
    what: &str,
    region: Region,
    len: usize,
) -> Result<Region, EngineError> {
    if region.len < len {
        return Err(shape_error(
            op,
            format!("{what} holds {} elements, needs {len}", region.len),
        ));
    }
    Ok(region.prefix(len))
}

/// An optional region checked as [`need`] does when given.
pub fn optional(
    op: &'static str,
    what: &str,
    region: Option<Region>,
    len: usize,
) -> Result<Option<Region>, EngineError> {
    region.map(|r| need(op, what, r, len)).transpose()
}

/// The step counter region: its first [`COUNTER_LEN`] elements.
pub fn counter(counter: Region) -> Result<Region, EngineError> {
    need("counter", "counter", counter, COUNTER_LEN)
}

/// Every region lies inside an arena of `arena` elements (0: none allocated yet), and written
/// regions overlap neither each other nor a read region.
pub fn regions(
    op: &'static str,
    arena: usize,
    reads: &[Region],
    writes: &[Region],
) -> Result<(), EngineError> {
    for r in reads.iter().chain(writes) {
        inside(*r, arena)?;
    }
    for (i, w) in writes.iter().enumerate() {
        let clash = reads.iter().chain(&writes[..i]).find(|o| o.overlaps(w));
        if let Some(o) = clash {
            return Err(shape_error(
                op,
                format!("written region {w:?} overlaps {o:?}"),
            ));
        }
    }
    Ok(())
}

/// `r` lies inside an arena of `arena` elements.
fn inside(r: Region, arena: usize) -> Result<(), EngineError> {
    if arena == 0 {
        return Err(EngineError::NoArena);
    }
    if r.offset.checked_add(r.len).is_none_or(|end| end > arena) {
        return Err(EngineError::OutOfArena {
            offset: r.offset,
            len: r.len,
            arena,
        });
    }
    Ok(())
}

/// A convolution whose window does not fit its padded input has no output size.
pub fn conv(op: &'static str, s: &Conv2dShape) -> Result<(), EngineError> {
    if s.fits() {
        return Ok(());
    }
    Err(shape_error(
        op,
        format!(
            "a {}×{} kernel with stride {} and padding {} does not fit a {}×{} input",
            s.k, s.k, s.stride, s.pad, s.h, s.w
        ),
    ))
}

/// A pooling window must fit its padded input and hold a real position.
pub fn pool(op: &'static str, s: &PoolShape) -> Result<(), EngineError> {
    if s.fits() {
        return Ok(());
    }
    Err(shape_error(
        op,
        format!(
            "a {}×{} window with stride {} and padding {} does not fit a {}×{} input",
            s.k, s.k, s.stride, s.pad, s.h, s.w
        ),
    ))
}

/// Labels must be whole numbers below `classes`: the ops index with them.
pub fn labels(labels: &[f32], classes: usize) -> Result<(), EngineError> {
    match labels
        .iter()
        .find(|&&l| !(l >= 0.0 && (l as usize) < classes && l.fract() == 0.0))
    {
        Some(bad) => Err(shape_error(
            "softmax_xent",
            format!("label {bad} is not a class below {classes}"),
        )),
        None => Ok(()),
    }
}

/// A training order must be a permutation of the `n` training samples' indices.
pub fn train_order(order: &[u32], n: usize) -> Result<(), EngineError> {
    if order.len() != n || order.iter().any(|&i| i as usize >= n) {
        return Err(shape_error(
            "set_train_order",
            format!("order must be a permutation of {n} samples"),
        ));
    }
    Ok(())
}

/// `gather`: rows `start..start + rows` of a split of `samples` samples into `x` (`rows ×
/// sample_len`) and `y` (`rows`).
pub fn gather(
    start: usize,
    rows: usize,
    samples: usize,
    sample_len: usize,
    x: Region,
    y: Region,
) -> Result<(Region, Region), EngineError> {
    if start + rows > samples {
        return Err(shape_error(
            "gather",
            format!("rows {start}..{} beyond {samples} samples", start + rows),
        ));
    }
    Ok((
        need("gather", "x", x, rows * sample_len)?,
        need("gather", "y", y, rows)?,
    ))
}

/// `gather_train`: an epoch has at least one step, every batch of it lies within the `n`
/// training samples (the batch index is the step counter's, read where the op runs), and `x`
/// (`batch × sample_len`) and `y` (`batch`) hold a batch.
pub fn gather_train(
    steps_per_epoch: usize,
    batch: usize,
    n: usize,
    sample_len: usize,
    x: Region,
    y: Region,
) -> Result<(Region, Region), EngineError> {
    epoch_batches("gather_train", steps_per_epoch, batch, n)?;
    Ok((
        need("gather_train", "x", x, batch * sample_len)?,
        need("gather_train", "y", y, batch)?,
    ))
}

/// An epoch of `steps_per_epoch` batches of `batch` has at least one step and lies within the
/// `n` training samples.
fn epoch_batches(
    op: &'static str,
    steps_per_epoch: usize,
    batch: usize,
    n: usize,
) -> Result<(), EngineError> {
    if steps_per_epoch == 0 {
        return Err(shape_error(op, "an epoch needs at least one step".into()));
    }
    if steps_per_epoch.checked_mul(batch).is_none_or(|s| s > n) {
        return Err(shape_error(
            op,
            format!("{steps_per_epoch} batches of {batch} are beyond {n} samples"),
        ));
    }
    Ok(())
}

/// The regions of `gather_train_fused`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatherFused {
    /// `trials × n` order elements.
    pub orders: Region,
    /// `trials × batch × sample_len`.
    pub x: Region,
    /// `trials × batch`.
    pub y: Region,
}

/// `gather_train_fused`: `gather_train`'s epoch for each of `trials` trials, `orders` holds one
/// order of the `n` training samples per trial, and `x` and `y` one batch per trial.
pub fn gather_train_fused(
    steps_per_epoch: usize,
    batch: usize,
    n: usize,
    sample_len: usize,
    trials: usize,
    [orders, x, y]: [Region; 3],
) -> Result<GatherFused, EngineError> {
    let op = "gather_train_fused";
    epoch_batches(op, steps_per_epoch, batch, n)?;
    let rows = fused_len(op, "the batches", trials, Some(batch))?;
    Ok(GatherFused {
        orders: need(
            op,
            "orders",
            orders,
            fused_len(op, "the orders", trials, Some(n))?,
        )?,
        x: need(
            op,
            "x",
            x,
            fused_len(op, "the batches", trials, batch.checked_mul(sample_len))?,
        )?,
        y: need(op, "y", y, rows)?,
    })
}

/// One element of trial `trial`'s order in a fused group's `orders` (a `u32` stored as the bits
/// of an `f32`): a training sample's index below `n`. The orders live in the arena, so the
/// backend checks each one it reads.
pub fn fused_order_index(trial: usize, bits: f32, n: usize) -> Result<usize, EngineError> {
    let i = bits.to_bits() as usize;
    if i >= n {
        return Err(shape_error(
            "gather_train_fused",
            format!("trial {trial}'s order holds sample {i}, beyond {n} training samples"),
        ));
    }
    Ok(i)
}

/// `write`: the destination holds the `len` values written.
pub fn write(dst: Region, len: usize) -> Result<Region, EngineError> {
    need("write", "destination", dst, len)
}

/// `read`: the source holds the `len` values read.
pub fn read(src: Region, len: usize) -> Result<Region, EngineError> {
    need("read", "source", src, len)
}

/// `gemm`: `A`, `B` and `C` as the shape sizes them.
pub fn gemm(g: &GemmShape, a: Region, b: Region, c: Region) -> Result<[Region; 3], EngineError> {
    Ok([
        need("gemm", "A", a, g.a_len())?,
        need("gemm", "B", b, g.b_len())?,
        need("gemm", "C", c, g.c_len())?,
    ])
}

/// `gemm_batched`: `A`, `B` and `C` hold every operand of the batch (each region spans its
/// operands, from the first's start to the last's end), and the outputs do not overlap.
pub fn gemm_batched(
    g: &GemmShape,
    batch: &GemmBatch,
    a: Region,
    b: Region,
    c: Region,
) -> Result<[Region; 3], EngineError> {
    let op = "gemm_batched";
    let span = |what: &str, span: Option<usize>| {
        span.ok_or_else(|| {
            shape_error(
                op,
                format!(
                    "{what} of {} GEMMs spans more elements than fit",
                    batch.count
                ),
            )
        })
    };
    let (sa, sb, sc) = (
        span("A", batch.a_span(g))?,
        span("B", batch.b_span(g))?,
        span("C", batch.c_span(g))?,
    );
    if batch.count > 1 && g.c_len() > 0 && batch.stride_c < g.c_len() {
        return Err(shape_error(
            op,
            format!(
                "C's stride {} is shorter than C's {} elements: the outputs would overlap",
                batch.stride_c,
                g.c_len()
            ),
        ));
    }
    Ok([
        need(op, "A", a, sa)?,
        need(op, "B", b, sb)?,
        need(op, "C", c, sc)?,
    ])
}

/// `bias_add`: `y` (`rows × cols`) and `bias` (`cols`).
pub fn bias_add(
    y: Region,
    bias: Region,
    rows: usize,
    cols: usize,
) -> Result<[Region; 2], EngineError> {
    Ok([
        need("bias_add", "y", y, rows * cols)?,
        need("bias_add", "bias", bias, cols)?,
    ])
}

/// `bias_grad`: `dy` (`rows × cols`) and `db` (`cols`).
pub fn bias_grad(
    dy: Region,
    db: Region,
    rows: usize,
    cols: usize,
) -> Result<[Region; 2], EngineError> {
    Ok([
        need("bias_grad", "dy", dy, rows * cols)?,
        need("bias_grad", "db", db, cols)?,
    ])
}

/// Elements spanned by `trials` copies of `per` elements one right after another, or a shape
/// error when that does not fit.
fn fused_len(
    op: &'static str,
    what: &str,
    trials: usize,
    per: Option<usize>,
) -> Result<usize, EngineError> {
    per.and_then(|p| p.checked_mul(trials)).ok_or_else(|| {
        shape_error(
            op,
            format!("{what} of {trials} trials spans more elements than fit"),
        )
    })
}

/// Elements spanned by `trials` copies of `len` elements, copy `i` starting `i·stride` elements
/// in: `(trials − 1)·stride + len` (0 for no trial). A shape error when that does not fit, or
/// when, with several trials, the stride is shorter than a copy.
fn strided_len(
    op: &'static str,
    what: &str,
    trials: usize,
    stride: usize,
    len: usize,
) -> Result<usize, EngineError> {
    if trials == 0 {
        return Ok(0);
    }
    if trials > 1 && stride < len {
        return Err(shape_error(
            op,
            format!("{what}'s stride {stride} is shorter than its {len} elements"),
        ));
    }
    (trials - 1)
        .checked_mul(stride)
        .and_then(|s| s.checked_add(len))
        .ok_or_else(|| {
            shape_error(
                op,
                format!("{what} of {trials} trials spans more elements than fit"),
            )
        })
}

/// `bias_add_fused`: `y` holds `trials` blocks of `rows × cols` one after another, `bias` one
/// bias of `cols` every `bias_stride` elements.
pub fn bias_add_fused(
    y: Region,
    bias: Region,
    rows: usize,
    cols: usize,
    trials: usize,
    bias_stride: usize,
) -> Result<[Region; 2], EngineError> {
    let op = "bias_add_fused";
    let y_len = fused_len(op, "y", trials, rows.checked_mul(cols))?;
    let b_len = strided_len(op, "bias", trials, bias_stride, cols)?;
    Ok([need(op, "y", y, y_len)?, need(op, "bias", bias, b_len)?])
}

/// `bias_grad_fused`: `dy` holds `trials` blocks of `rows × cols` one after another, `db` one
/// gradient of `cols` every `db_stride` elements.
pub fn bias_grad_fused(
    dy: Region,
    db: Region,
    rows: usize,
    cols: usize,
    trials: usize,
    db_stride: usize,
) -> Result<[Region; 2], EngineError> {
    let op = "bias_grad_fused";
    let dy_len = fused_len(op, "dy", trials, rows.checked_mul(cols))?;
    let db_len = strided_len(op, "db", trials, db_stride, cols)?;
    Ok([need(op, "dy", dy, dy_len)?, need(op, "db", db, db_len)?])
}

/// An element-wise op over `len` elements of each named region, in order.
pub fn elementwise<const N: usize>(
    op: &'static str,
    named: [(&str, Region); N],
    len: usize,
) -> Result<[Region; N], EngineError> {
    let mut out = [Region::default(); N];
    for (o, (what, r)) in out.iter_mut().zip(named) {
        *o = need(op, what, r, len)?;
    }
    Ok(out)
}

/// A batched optimizer step over `trials` trials: `w` splits into `trials` equal parts of `P`
/// parameters, the `named` regions hold `w.len` elements each, and `hyper` holds one row of
/// [`HYPER_LEN`] per trial. Returns `P` and the checked regions, `hyper` last.
pub fn optim_batched<const N: usize>(
    op: &'static str,
    w: Region,
    named: [(&str, Region); N],
    hyper: Region,
    trials: usize,
) -> Result<(usize, [Region; N], Region), EngineError> {
    if (trials == 0 && w.len > 0) || (trials > 0 && !w.len.is_multiple_of(trials)) {
        return Err(shape_error(
            op,
            format!("w's {} elements do not split into {trials} trials", w.len),
        ));
    }
    let rows = trials
        .checked_mul(HYPER_LEN)
        .ok_or_else(|| shape_error(op, format!("a hyper table of {trials} trials does not fit")))?;
    let params = w.len.checked_div(trials).unwrap_or(0);
    Ok((
        params,
        elementwise(op, named, w.len)?,
        need(op, "hyper", hyper, rows)?,
    ))
}

/// The regions of `conv2d_fwd` (the workspace is the backend's to size).
#[derive(Debug)]
pub struct ConvFwd {
    pub x: Region,
    pub w: Region,
    pub b: Option<Region>,
    pub y: Region,
}

/// `conv2d_fwd`: the shape fits, and `x`, `w`, `b` and `y` are as large as it says.
pub fn conv2d_fwd(
    s: &Conv2dShape,
    x: Region,
    w: Region,
    b: Option<Region>,
    y: Region,
) -> Result<ConvFwd, EngineError> {
    let op = "conv2d_fwd";
    conv(op, s)?;
    Ok(ConvFwd {
        x: need(op, "x", x, s.x_len())?,
        w: need(op, "w", w, s.w_len())?,
        b: optional(op, "b", b, s.c_out)?,
        y: need(op, "y", y, s.y_len())?,
    })
}

/// The regions of `conv2d_bwd` (the workspace is the backend's to size).
#[derive(Debug)]
pub struct ConvBwd {
    pub x: Region,
    pub w: Region,
    pub dy: Region,
    pub dx: Option<Region>,
    pub dw: Region,
    pub db: Option<Region>,
}

/// `conv2d_bwd`: the shape fits, and every region is as large as it says.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bwd(
    s: &Conv2dShape,
    x: Region,
    w: Region,
    dy: Region,
    dx: Option<Region>,
    dw: Region,
    db: Option<Region>,
) -> Result<ConvBwd, EngineError> {
    let op = "conv2d_bwd";
    conv(op, s)?;
    let x = need(op, "x", x, s.x_len())?;
    let w = need(op, "w", w, s.w_len())?;
    let dy = need(op, "dy", dy, s.y_len())?;
    let dw = need(op, "dw", dw, s.w_len())?;
    let db = optional(op, "db", db, s.c_out)?;
    let dx = optional(op, "dx", dx, s.x_len())?;
    Ok(ConvBwd {
        x,
        w,
        dy,
        dx,
        dw,
        db,
    })
}

/// `conv2d_fwd_fused`: the shape fits, and `x`, `w`, `b` and `y` span every trial's copy (`x`
/// and `y` one after another, `w` and `b` every `w_stride` elements).
pub fn conv2d_fwd_fused(
    s: &Conv2dShape,
    x: Region,
    w: Region,
    b: Option<Region>,
    y: Region,
    f: FusedConv,
) -> Result<ConvFwd, EngineError> {
    let op = "conv2d_fwd_fused";
    conv(op, s)?;
    let n = f.trials;
    let b_len = strided_len(op, "b", n, f.w_stride, s.c_out)?;
    Ok(ConvFwd {
        x: need(op, "x", x, fused_len(op, "x", n, Some(s.x_len()))?)?,
        w: need(op, "w", w, strided_len(op, "w", n, f.w_stride, s.w_len())?)?,
        b: optional(op, "b", b, b_len)?,
        y: need(op, "y", y, fused_len(op, "y", n, Some(s.y_len()))?)?,
    })
}

/// `conv2d_bwd_fused`: as [`conv2d_fwd_fused`], `dy` and `dx` laid out as `y` and `x`, `dw` and
/// `db` as `w` and `b`.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bwd_fused(
    s: &Conv2dShape,
    x: Region,
    w: Region,
    dy: Region,
    dx: Option<Region>,
    dw: Region,
    db: Option<Region>,
    f: FusedConv,
) -> Result<ConvBwd, EngineError> {
    let op = "conv2d_bwd_fused";
    conv(op, s)?;
    let n = f.trials;
    let x_len = fused_len(op, "x", n, Some(s.x_len()))?;
    let y_len = fused_len(op, "dy", n, Some(s.y_len()))?;
    let w_len = strided_len(op, "w", n, f.w_stride, s.w_len())?;
    let b_len = strided_len(op, "db", n, f.w_stride, s.c_out)?;
    Ok(ConvBwd {
        x: need(op, "x", x, x_len)?,
        w: need(op, "w", w, w_len)?,
        dy: need(op, "dy", dy, y_len)?,
        dx: optional(op, "dx", dx, x_len)?,
        dw: need(op, "dw", dw, w_len)?,
        db: optional(op, "db", db, b_len)?,
    })
}

/// The workspace of a fused convolution whose trials need `len` elements each, one every
/// `ws_stride` elements: a shape error when, with several trials, the stride is shorter.
pub fn fused_ws(
    op: &'static str,
    ws: Region,
    f: FusedConv,
    len: usize,
) -> Result<Region, EngineError> {
    let span = strided_len(op, "workspace", f.trials, f.ws_stride, len)?;
    need(op, "workspace", ws, span)
}

/// A fused batch norm's regions (see [`FusedNorm`]): each of `planes` spans every trial's copy,
/// each of `params` (`γ`, `β` and their gradients) `(trials − 1)·param_stride + c` elements, and
/// `running` (when given) and `saved` their strides' spans of `2c`.
pub fn fused_norm(
    op: &'static str,
    s: &PlaneShape,
    f: FusedNorm,
    planes: &[(&str, Region)],
    params: &[(&str, Region)],
    running: Option<Region>,
    saved: Region,
) -> Result<(), EngineError> {
    let plane_len = f
        .trials
        .checked_mul(s.len())
        .ok_or_else(|| shape_error(op, format!("{} trials overflow the planes", f.trials)))?;
    for &(name, r) in planes {
        need(op, name, r, plane_len)?;
    }
    let per = strided_len(op, "each parameter", f.trials, f.param_stride, s.c)?;
    for &(name, r) in params {
        need(op, name, r, per)?;
    }
    if let Some(r) = running {
        let len = strided_len(op, "running", f.trials, f.running_stride, 2 * s.c)?;
        need(op, "running", r, len)?;
    }
    let len = strided_len(op, "saved", f.trials, f.saved_stride, 2 * s.c)?;
    need(op, "saved", saved, len)?;
    Ok(())
}

/// `batchnorm_fwd`: `[x, gamma, beta, running, saved, y]`.
pub fn batchnorm_fwd(
    s: &PlaneShape,
    x: Region,
    gamma: Region,
    beta: Region,
    running: Region,
    saved: Region,
    y: Region,
) -> Result<[Region; 6], EngineError> {
    let op = "batchnorm_fwd";
    Ok([
        need(op, "x", x, s.len())?,
        need(op, "gamma", gamma, s.c)?,
        need(op, "beta", beta, s.c)?,
        need(op, "running statistics", running, 2 * s.c)?,
        need(op, "saved statistics", saved, 2 * s.c)?,
        need(op, "y", y, s.len())?,
    ])
}

/// `batchnorm_bwd`: `[x, gamma, saved, dy, dx, dgamma, dbeta]`.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_bwd(
    s: &PlaneShape,
    x: Region,
    gamma: Region,
    saved: Region,
    dy: Region,
    dx: Region,
    dgamma: Region,
    dbeta: Region,
) -> Result<[Region; 7], EngineError> {
    let op = "batchnorm_bwd";
    Ok([
        need(op, "x", x, s.len())?,
        need(op, "gamma", gamma, s.c)?,
        need(op, "saved statistics", saved, 2 * s.c)?,
        need(op, "dy", dy, s.len())?,
        need(op, "dx", dx, s.len())?,
        need(op, "dgamma", dgamma, s.c)?,
        need(op, "dbeta", dbeta, s.c)?,
    ])
}

/// `avgpool_fwd`: `x` (the planes) and `y` (one value a plane).
pub fn avgpool_fwd(s: &PlaneShape, x: Region, y: Region) -> Result<[Region; 2], EngineError> {
    let op = "avgpool_fwd";
    Ok([need(op, "x", x, s.len())?, need(op, "y", y, s.n * s.c)?])
}

/// `avgpool_bwd`: `dy` (one value a plane) and `dx` (the planes).
pub fn avgpool_bwd(s: &PlaneShape, dy: Region, dx: Region) -> Result<[Region; 2], EngineError> {
    let op = "avgpool_bwd";
    Ok([need(op, "dy", dy, s.n * s.c)?, need(op, "dx", dx, s.len())?])
}

/// `maxpool_fwd`: the window fits, `x` and `y`.
pub fn maxpool_fwd(s: &PoolShape, x: Region, y: Region) -> Result<[Region; 2], EngineError> {
    let op = "maxpool_fwd";
    pool(op, s)?;
    Ok([need(op, "x", x, s.x_len())?, need(op, "y", y, s.y_len())?])
}

/// `maxpool_bwd`: the window fits, `[x, y, dy, dx]`.
pub fn maxpool_bwd(
    s: &PoolShape,
    x: Region,
    y: Region,
    dy: Region,
    dx: Region,
) -> Result<[Region; 4], EngineError> {
    let op = "maxpool_bwd";
    pool(op, s)?;
    Ok([
        need(op, "x", x, s.x_len())?,
        need(op, "y", y, s.y_len())?,
        need(op, "dy", dy, s.y_len())?,
        need(op, "dx", dx, s.x_len())?,
    ])
}

/// `softmax_xent`: `[logits, labels, dlogits, stats]`.
pub fn softmax_xent(
    logits: Region,
    labels: Region,
    dlogits: Region,
    stats: Region,
    rows: usize,
    classes: usize,
) -> Result<[Region; 4], EngineError> {
    let op = "softmax_xent";
    Ok([
        need(op, "logits", logits, rows * classes)?,
        need(op, "labels", labels, rows)?,
        need(op, "dlogits", dlogits, rows * classes)?,
        need(op, "stats", stats, STATS_LEN)?,
    ])
}

/// `softmax_xent_fused`: `[logits, labels, dlogits, stats]`, each holding `trials` copies of
/// what `softmax_xent` needs one after another.
#[allow(clippy::too_many_arguments)]
pub fn softmax_xent_fused(
    logits: Region,
    labels: Region,
    dlogits: Region,
    stats: Region,
    rows: usize,
    classes: usize,
    trials: usize,
) -> Result<[Region; 4], EngineError> {
    let op = "softmax_xent_fused";
    let per_logits = rows.checked_mul(classes);
    let logits_len = fused_len(op, "logits", trials, per_logits)?;
    let labels_len = fused_len(op, "labels", trials, Some(rows))?;
    let stats_len = fused_len(op, "stats", trials, Some(STATS_LEN))?;
    Ok([
        need(op, "logits", logits, logits_len)?,
        need(op, "labels", labels, labels_len)?,
        need(op, "dlogits", dlogits, logits_len)?,
        need(op, "stats", stats, stats_len)?,
    ])
}

/// `eval_xent`: `[logits, labels, stats]`.
pub fn eval_xent(
    logits: Region,
    labels: Region,
    stats: Region,
    rows: usize,
    classes: usize,
) -> Result<[Region; 3], EngineError> {
    let op = "eval_xent";
    Ok([
        need(op, "logits", logits, rows * classes)?,
        need(op, "labels", labels, rows)?,
        need(op, "stats", stats, STATS_LEN)?,
    ])
}

/// `dense_fwd`: the GEMMs' operands as [`gemm_batched`] checks them, their outputs one right
/// after another (`stride_c` is C's length, so one bias-and-ReLU pass covers them), and the bias
/// as [`bias_add_fused`] checks it. Returns `[x, w, y, bias]`.
pub fn dense_fwd(
    g: &GemmShape,
    batch: &GemmBatch,
    x: Region,
    w: Region,
    y: Region,
    bias: Region,
    bias_stride: usize,
) -> Result<[Region; 4], EngineError> {
    let op = "dense_fwd";
    let [x, w, y] = gemm_batched(g, batch, x, w, y)?;
    outputs_in_a_row(op, g, batch)?;
    let [y, bias] =
        bias_add_fused(y, bias, g.m, g.n, batch.count, bias_stride).map_err(|e| rename(e, op))?;
    Ok([x, w, y, bias])
}

/// `dense_bwd_relu`: the GEMMs' operands as [`gemm_batched`] checks them, their outputs one
/// right after another, `y` as long as the outputs, and the bias gradient as
/// [`bias_grad_fused`] checks it. Returns `[dy, w, dx, y, db]`.
pub fn dense_bwd_relu(
    g: &GemmShape,
    batch: &GemmBatch,
    dy: Region,
    w: Region,
    dx: Region,
    y: Region,
    db: super::BiasGrad,
) -> Result<[Region; 5], EngineError> {
    let op = "dense_bwd_relu";
    let [dy, w, dx] = gemm_batched(g, batch, dy, w, dx)?;
    outputs_in_a_row(op, g, batch)?;
    let y = need(op, "y", y, dx.len)?;
    let [dx, db] =
        bias_grad_fused(dx, db.db, g.m, g.n, batch.count, db.stride).map_err(|e| rename(e, op))?;
    Ok([dy, w, dx, y, db])
}

/// The bias gradient of `softmax_xent_bias`: one of `classes` for each of `trials` trials,
/// `db.stride` apart.
pub fn xent_bias_grad(
    classes: usize,
    trials: usize,
    db: super::BiasGrad,
) -> Result<Region, EngineError> {
    let op = "softmax_xent_bias";
    need(
        op,
        "db",
        db.db,
        strided_len(op, "db", trials, db.stride, classes)?,
    )
}

/// `dropout_fused`: `src` and `dst` hold `trials` copies of `len` elements, `hyper` a row per
/// trial, and the counter its elements. Returns `[src, dst, hyper, counter]`.
pub fn dropout_fused(
    src: Region,
    dst: Region,
    len: usize,
    trials: usize,
    hyper: Region,
    counter_region: Region,
) -> Result<[Region; 4], EngineError> {
    let op = "dropout_fused";
    let all = fused_len(op, "src", trials, Some(len))?;
    let rows = fused_len(op, "hyper", trials, Some(HYPER_LEN))?;
    Ok([
        need(op, "src", src, all)?,
        need(op, "dst", dst, all)?,
        need(op, "hyper", hyper, rows)?,
        counter(counter_region)?,
    ])
}

/// One trial's part of `gather_fused`'s operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherPart {
    pub x: Region,
    pub y: Region,
}

/// `gather_fused`: `rows ≤ batch`, and `x` and `y` hold `trials` batches of `batch` rows
/// (`sample_len` elements each) and labels one after another. Returns each trial's rows.
pub fn gather_fused(
    rows: usize,
    batch: usize,
    sample_len: usize,
    trials: usize,
    x: Region,
    y: Region,
) -> Result<Vec<GatherPart>, EngineError> {
    let op = "gather_fused";
    if rows > batch {
        return Err(shape_error(
            op,
            format!("{rows} rows do not fit a batch of {batch}"),
        ));
    }
    let per_x = batch.checked_mul(sample_len);
    let x = need(op, "x", x, fused_len(op, "x", trials, per_x)?)?;
    let y = need(op, "y", y, fused_len(op, "y", trials, Some(batch))?)?;
    let per_x = per_x.unwrap_or(0);
    Ok((0..trials)
        .map(|i| GatherPart {
            x: Region::new(x.offset + i * per_x, rows * sample_len),
            y: Region::new(y.offset + i * batch, rows),
        })
        .collect())
}

/// `eval_xent_fused`: `rows ≤ batch`, and `logits`, `labels` and `stats` hold `trials` copies of
/// `batch × classes`, `batch` and [`STATS_LEN`] elements one after another. Returns
/// `[logits, labels, stats]`.
pub fn eval_xent_fused(
    logits: Region,
    labels: Region,
    stats: Region,
    rows: usize,
    batch: usize,
    classes: usize,
    trials: usize,
) -> Result<[Region; 3], EngineError> {
    let op = "eval_xent_fused";
    if rows > batch {
        return Err(shape_error(
            op,
            format!("{rows} rows do not fit a batch of {batch}"),
        ));
    }
    let per_logits = batch.checked_mul(classes);
    Ok([
        need(
            op,
            "logits",
            logits,
            fused_len(op, "logits", trials, per_logits)?,
        )?,
        need(
            op,
            "labels",
            labels,
            fused_len(op, "labels", trials, Some(batch))?,
        )?,
        need(
            op,
            "stats",
            stats,
            fused_len(op, "stats", trials, Some(STATS_LEN))?,
        )?,
    ])
}

/// With several GEMMs, their outputs lie one right after another.
fn outputs_in_a_row(op: &'static str, g: &GemmShape, batch: &GemmBatch) -> Result<(), EngineError> {
    if batch.count > 1 && batch.stride_c != g.c_len() {
        return Err(shape_error(
            op,
            format!(
                "C's stride {} is not C's {} elements: the outputs must lie one right after another",
                batch.stride_c,
                g.c_len()
            ),
        ));
    }
    Ok(())
}

/// The same error, named for the op that made the check.
fn rename(e: EngineError, op: &'static str) -> EngineError {
    match e {
        EngineError::Shape { message, .. } => EngineError::Shape { op, message },
        other => other,
    }
}

#[cfg(test)]
mod tests;
