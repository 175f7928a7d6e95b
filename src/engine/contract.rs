//! The backend contract: every shape, region and label check of the [`Backend`](super::Backend) ops, written once and called by both backends, so that they refuse the same inputs with the same errors.

use super::fused::HYPER_LEN;
use super::{
    Conv2dShape, FusedConv, GemmBatch, GemmShape, PlaneShape, PoolShape, Region, COUNTER_LEN,
    STATS_LEN,
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
    if r.offset.checked_add(r.len).map_or(true, |end| end > arena) {
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
    if steps_per_epoch.checked_mul(batch).map_or(true, |s| s > n) {
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
    let too_big = |what: &str| {
        shape_error(
            op,
            format!("{what} of {trials} trials spans more elements than fit"),
        )
    };
    let rows = trials
        .checked_mul(batch)
        .ok_or_else(|| too_big("the batches"))?;
    Ok(GatherFused {
        orders: need(
            op,
            "orders",
            orders,
            trials.checked_mul(n).ok_or_else(|| too_big("the orders"))?,
        )?,
        x: need(
            op,
            "x",
            x,
            rows.checked_mul(sample_len)
                .ok_or_else(|| too_big("the batches"))?,
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
    if (trials == 0 && w.len > 0) || (trials > 0 && w.len % trials != 0) {
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

#[cfg(test)]
mod tests {
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
        use super::super::fused::HYPER_LEN;
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
        for (rows, classes, trials) in [(usize::MAX, 4, 3), (2, usize::MAX, 3), (2, 4, usize::MAX)]
        {
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
}
