//! The AVX-512 GEMM: `C = alpha·op(A)·op(B) + beta·C` with the operands read where they lie.
//!
//! A general GEMM copies ("packs") both operands into the micro-kernel's order before every
//! call. The models' products are small (a batch of 64 rows, a convolution's one sample), so
//! each packed element is used only a few times and the copies cost as much as a third of the
//! arithmetic. Here the micro-kernel reads `A` where it lies, through a row and a column offset
//! (strides, or tables for an operand gathered from another array such as im2col's column
//! matrix from the image), and reads `B` row by row. A transposed `B` is handled by computing
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ` instead, where `op(B)ᵀ` is then read in place and `op(A)ᵀ` is either `A`
//! itself (a transposed `A`) or the smaller of the two operands copied in transposed order
//! (16 × 16 tiles, in registers); `Cᵀ` is summed row-major into a scratch matrix and written
//! into `C` transposed, once. Only a product with a transposed `B` and a plain `A` copies an
//! operand.
//!
//! The micro-kernel computes a block of 16 to 64 columns of `C` (1 to 4 vectors, chosen for `n`)
//! by 6 to 16 rows (at most 24 accumulators): per step of the inner dimension it loads one row of `B` across the block and
//! multiplies it by the broadcast values of a column of `A`. The inner dimension is cut into
//! blocks so that a slab of `B` ([`SLAB`] floats) stays in the L1 cache while the kernel walks
//! down `A`. Partial blocks at the edges of `C` are computed with masked loads and stores, which
//! read and write nothing outside the operands. Each element of `C` is the FMA chain of its
//! products in the order of the inner dimension, block by block, so a shape always gives the
//! same bits.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ptr::null;

use crate::engine::shapes::GemmShape;

/// Floats of `B` per slab (a block of the inner dimension by the kernel's columns): 32 KiB, so
/// the slab stays in the L1 cache while the kernel walks down `A`.
const SLAB: usize = 8192;
/// Scratch a thread keeps between products, at most (floats; 4 MiB): a larger one, such as a
/// large convolution's, is freed after its product, so that no thread holds it idle.
const KEEP: usize = 1 << 20;

/// Makes `v` at least `len` long; what it holds is overwritten before it is read.
fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// Frees `v` if it is larger than [`KEEP`].
fn release(v: &mut Vec<f32>) {
    if v.capacity() > KEEP {
        *v = Vec::new();
    }
}

thread_local! {
    /// Room for a transposed operand, kept between calls.
    static COPY: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Room for the sums of a product stored transposed.
    static SUMS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where the rows or the columns of `A` start: `i·stride`, or a table's `i`-th entry (an
/// operand gathered from another array, such as im2col's column matrix from the image).
#[derive(Clone, Copy)]
enum Index {
    Stride(usize),
    Table(*const usize),
}

impl Index {
    /// The offset of row (or column) `i`.
    ///
    /// # Safety
    /// A table holds more than `i` entries.
    #[inline(always)]
    unsafe fn at(self, i: usize) -> usize {
        match self {
            Index::Stride(s) => i * s,
            // SAFETY: as the caller promised.
            Index::Table(t) => unsafe { *t.add(i) },
        }
    }
}

/// One product for [`blocks`]: `C = alpha·A·B + beta·C` with `A` `m × k`, element (i, p) at
/// `a[rows.at(i) + cols.at(p)]`; `B` `k × n`, element (p, j) at `b[p·ldb + j]`; and `C` `m × n`,
/// element (i, j) at `c[i·ldc + j]`, or at `c[j·ldc + i]` when `trans_c`.
struct Product {
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    rows: Index,
    cols: Index,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    trans_c: bool,
    alpha: f32,
    beta: f32,
}

/// `C = beta·C`, a product over an empty inner dimension (with `beta == 0`, `C` is overwritten).
fn scale(c: &mut [f32], beta: f32) {
    for v in c.iter_mut() {
        *v = if beta == 0.0 { 0.0 } else { beta * *v };
    }
}

/// Row-major `C = alpha·op(A)·op(B) + beta·C`, as `super::gemm`.
///
/// # Safety
/// The host supports AVX-512F, and the slices hold exactly `m·k`, `k·n` and `m·n` elements.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn gemm(g: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    debug_assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        return scale(c, g.beta);
    }
    let mut p = Product {
        m,
        n,
        k,
        a: a.as_ptr(),
        rows: Index::Stride(if g.trans_a { 1 } else { k }),
        cols: Index::Stride(if g.trans_a { m } else { 1 }),
        b: b.as_ptr(),
        ldb: n,
        c: c.as_mut_ptr(),
        ldc: n,
        trans_c: false,
        alpha: g.alpha,
        beta: g.beta,
    };
    if !g.trans_b {
        // SAFETY: the views above address exactly the caller's slices.
        return unsafe { blocks(&p) };
    }
    // op(B) is stored n × k. Cᵀ = op(B)ᵀ·op(A)ᵀ reads it in place as its A, row-major.
    let swapped = |p: &mut Product, at: *const f32| {
        *p = Product {
            m: n,
            n: m,
            a: b.as_ptr(),
            rows: Index::Stride(k),
            cols: Index::Stride(1),
            b: at,
            ldb: m,
            trans_c: true,
            ..*p
        };
    };
    if g.trans_a {
        // op(A)ᵀ is A as stored, k × m.
        swapped(&mut p, a.as_ptr());
        // SAFETY: as above, with the roles of the operands exchanged.
        return unsafe { blocks(&p) };
    }
    COPY.with(|copy| {
        let mut copy = copy.borrow_mut();
        if m <= n {
            // Copy A (m × k) as op(A)ᵀ, k × m.
            grow(&mut copy, k * m);
            // SAFETY: A holds m × k elements and the copy k × m.
            unsafe { transpose(a, m, k, &mut copy) };
            swapped(&mut p, copy.as_ptr());
        } else {
            // Copy op(B) (stored n × k) row-major, k × n.
            grow(&mut copy, k * n);
            // SAFETY: B holds n × k elements and the copy k × n.
            unsafe { transpose(b, n, k, &mut copy) };
            p.b = copy.as_ptr();
        }
        // SAFETY: the views address the caller's slices and the copy, alive until here.
        unsafe { blocks(&p) };
        release(&mut copy);
    })
}

/// `C = alpha·A·Gᵀ + beta·C`, as `super::gemm_gathered`: `A` row-major `m × k`, and `G` the
/// `n × k` matrix `G[j, p] = x[rows[j] + cols[p]]`, read where it lies in `x`. Computed as
/// `Cᵀ = G·Aᵀ` with `A` copied transposed.
///
/// # Safety
/// The host supports AVX-512F; `a` holds `m·k` elements, `c` `m·n`, `rows` `n` and `cols` `k`
/// entries, and every `rows[j] + cols[p]` is below `x.len()`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn gemm_gathered(
    m: usize,
    a: &[f32],
    x: &[f32],
    rows: &[usize],
    cols: &[usize],
    alpha: f32,
    beta: f32,
    c: &mut [f32],
) {
    let (n, k) = (rows.len(), cols.len());
    debug_assert!(a.len() == m * k && c.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        return scale(c, beta);
    }
    COPY.with(|copy| {
        let mut copy = copy.borrow_mut();
        grow(&mut copy, k * m);
        // SAFETY: A holds m × k elements and the copy k × m.
        unsafe { transpose(a, m, k, &mut copy) };
        let p = Product {
            m: n,
            n: m,
            k,
            a: x.as_ptr(),
            rows: Index::Table(rows.as_ptr()),
            cols: Index::Table(cols.as_ptr()),
            b: copy.as_ptr(),
            ldb: m,
            c: c.as_mut_ptr(),
            ldc: n,
            trans_c: true,
            alpha,
            beta,
        };
        // SAFETY: the tables address x within its length (the caller's promise), and the copy
        // and C hold the rest.
        unsafe { blocks(&p) };
        release(&mut copy);
    })
}

/// The blocking of a [`Product`], with the kernel's width chosen for `n`: 16, 32, 48 or 64
/// columns (1 to 4 vectors), the widest that wastes the fewest lanes at the edge of `C`, and as
/// many rows as keep 24 or fewer accumulators.
///
/// A product stored transposed is first summed row-major into a scratch matrix, then written
/// into `C` once, in 16 × 16 tiles transposed in registers: storing the kernel's blocks
/// transposed element by element, once per block of the inner dimension, cost as much as a
/// third of the arithmetic.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn blocks(p: &Product) {
    if !p.trans_c {
        // SAFETY: passed on from the caller.
        return unsafe { blocks_row_major(p) };
    }
    SUMS.with(|sums| {
        let mut sums = sums.borrow_mut();
        grow(&mut sums, p.m * p.n);
        let q = Product {
            c: sums.as_mut_ptr(),
            ldc: p.n,
            trans_c: false,
            alpha: 1.0,
            beta: 0.0,
            ..*p
        };
        // SAFETY: as the caller promised for A and B; `sums` holds m × n.
        unsafe { blocks_row_major(&q) };
        // SAFETY: C holds the caller's n × m block at c, ldc apart.
        unsafe { store_transposed(&sums, p.m, p.n, p.c, p.ldc, p.alpha, p.beta) };
        release(&mut sums);
    })
}

/// `C[j, i] = alpha·S[i, j] + beta·C[j, i]` for the row-major `m × n` matrix `S`, where
/// `C[j, i]` is at `c[j·ldc + i]`; with `beta == 0`, C is not read.
///
/// # Safety
/// `c` addresses `n` rows of at least `m` elements, `ldc` apart.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn store_transposed(
    s: &[f32],
    m: usize,
    n: usize,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: f32,
) {
    let (full_i, full_j) = (m / 16 * 16, n / 16 * 16);
    let (av, bv) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    let mut tile = [0f32; 256];
    for i0 in (0..full_i).step_by(16) {
        for j0 in (0..full_j).step_by(16) {
            // SAFETY: rows i0..i0+16, columns j0..j0+16 of S; the tile holds 16 × 16.
            unsafe { tile16(s.as_ptr().add(i0 * n + j0), n, tile.as_mut_ptr(), 16) };
            for r in 0..16 {
                // SAFETY: row j0 + r < n of C, elements i0..i0+16 < m.
                unsafe {
                    let cp = c.add((j0 + r) * ldc + i0);
                    let mut out = _mm512_mul_ps(av, _mm512_loadu_ps(tile.as_ptr().add(16 * r)));
                    if beta != 0.0 {
                        out = _mm512_fmadd_ps(_mm512_loadu_ps(cp), bv, out);
                    }
                    _mm512_storeu_ps(cp, out);
                }
            }
        }
    }
    // The edges, element by element.
    for i in 0..m {
        let from = if i < full_i { full_j } else { 0 };
        for j in from..n {
            // SAFETY: row j < n of C, element i < m.
            unsafe {
                let cp = c.add(j * ldc + i);
                let o = alpha * s[i * n + j];
                *cp = if beta != 0.0 {
                    (*cp).mul_add(beta, o)
                } else {
                    o
                };
            }
        }
    }
}

/// [`blocks`] for a product stored row-major.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn blocks_row_major(p: &Product) {
    // SAFETY (each arm): passed on from the caller.
    match vectors_for(p.n) {
        4 => unsafe { blocks_of::<6, 4>(p) },
        3 => unsafe { blocks_of::<8, 3>(p) },
        2 => unsafe { blocks_of::<12, 2>(p) },
        _ => unsafe { blocks_of::<16, 1>(p) },
    }
}

/// The number of 16-lane vectors across the kernel's block for `n` columns: the most lanes in
/// use at the edge, then the widest.
fn vectors_for(n: usize) -> usize {
    (1..=4)
        .map(|v: usize| (n.div_ceil(16 * v) * 16 * v - n, usize::MAX - v, v))
        .min()
        .map_or(1, |(_, _, v)| v)
}

/// Blocks of the inner dimension, then slabs of `MR`-row by `16·NV`-column blocks: each slab of
/// `B` is read by every row panel of `A` in turn.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn blocks_of<const MR: usize, const NV: usize>(p: &Product) {
    let nr = 16 * NV;
    // Every vector of a block has a lane in use (`vectors_for` wastes fewer than 16 lanes).
    debug_assert!(p.n.div_ceil(nr) * nr - p.n < 16);
    let kc_max = SLAB / nr;
    let mut p0 = 0;
    while p0 < p.k {
        let kc = kc_max.min(p.k - p0);
        // The first block scales the old C by beta; the later ones add to it.
        let beta = if p0 == 0 { p.beta } else { 1.0 };
        let mut j0 = 0;
        while j0 < p.n {
            let cols = nr.min(p.n - j0);
            let mut i0 = 0;
            while i0 < p.m {
                let rows = MR.min(p.m - i0);
                let c_at = i0 * p.ldc + j0;
                // Rows past `rows` repeat the last one, so every read stays inside A; they are
                // not stored.
                let mut off = [0usize; MR];
                for (i, o) in off.iter_mut().enumerate() {
                    // SAFETY: row i0 + min(i, rows - 1) < m.
                    *o = unsafe { p.rows.at(i0 + i.min(rows - 1)) };
                }
                // SAFETY: the kernel touches rows i0..i0+rows and columns j0..j0+cols of C, and
                // reads A's rows i0..i0+rows and B's columns j0..j0+cols at steps p0..p0+kc.
                unsafe {
                    // The strided walk starts at block p0's column; the gathered one at its
                    // table entry.
                    let (a, a_cols) = match p.cols {
                        Index::Stride(s) => (p.a.add(p0 * s), p.cols),
                        Index::Table(tab) => (p.a, Index::Table(tab.add(p0))),
                    };
                    let t = Tile {
                        a,
                        off: &off,
                        b: p.b.add(p0 * p.ldb + j0),
                        ldb: p.ldb,
                        rows,
                        cols,
                        c: p.c.add(c_at),
                        ldc: p.ldc,
                    };
                    match a_cols {
                        Index::Stride(_) => kernel::<MR, NV, false>(kc, &t, a_cols, p.alpha, beta),
                        Index::Table(_) => kernel::<MR, NV, true>(kc, &t, a_cols, p.alpha, beta),
                    }
                }
                i0 += MR;
            }
            j0 += nr;
        }
        p0 += kc;
    }
}

/// Where one kernel call reads and writes: row `i < rows` of `A` starts at `a + off[i]`, `B[p, j]`
/// is at `b[p·ldb + j]` for `j < cols`, and `C[i, j]` at `c[i·ldc + j]`.
struct Tile<'a, const MR: usize> {
    a: *const f32,
    off: &'a [usize; MR],
    b: *const f32,
    ldb: usize,
    rows: usize,
    cols: usize,
    c: *mut f32,
    ldc: usize,
}

/// `C[..rows, ..cols] = alpha·Σ_p A[i, p]·B[p, j] + beta·C` over `kc` steps of the [`Tile`],
/// with step `p` of `A`'s rows at `a_cols.at(p)` past the tile's `a` (a table when `GATHER`).
/// With `beta == 0`, C is not read.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn kernel<const MR: usize, const NV: usize, const GATHER: bool>(
    kc: usize,
    t: &Tile<MR>,
    a_cols: Index,
    alpha: f32,
    beta: f32,
) {
    let (rows, cols, ldc) = (t.rows, t.cols, t.ldc);
    let mut mask = [0u16; NV];
    for (v, mk) in mask.iter_mut().enumerate() {
        let lanes = cols.saturating_sub(16 * v).min(16);
        *mk = ((1u32 << lanes) - 1) as u16;
    }
    let off = *t.off;
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    // The strided walk moves a pointer along A; the gathered one reads each step's offset.
    let (stride, table) = match a_cols {
        Index::Stride(s) => (s, null()),
        Index::Table(tab) => (0, tab),
    };
    let mut ap = t.a;
    let mut bp = t.b;
    for step in 0..kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for v in 0..NV {
            // SAFETY: masked-off lanes are not read; the others are columns of B below `cols`.
            bv[v] = unsafe { _mm512_maskz_loadu_ps(mask[v], bp.add(16 * v)) };
        }
        let at = if GATHER {
            // SAFETY: the table holds an entry for each of the kc steps.
            t.a.wrapping_add(unsafe { *table.add(step) })
        } else {
            ap
        };
        for i in 0..MR {
            // SAFETY: off[i] plus this step's offset addresses an element of A.
            let av = _mm512_set1_ps(unsafe { *at.add(off[i]) });
            for v in 0..NV {
                acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
        // Past the last step these point one step beyond, and are not read.
        ap = ap.wrapping_add(stride);
        bp = bp.wrapping_add(t.ldb);
    }
    let c = t.c;
    let (alpha, beta_v) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    for (i, acc) in acc.iter().enumerate().take(rows) {
        for v in 0..NV {
            // SAFETY: row i < rows and the unmasked lanes are columns below `cols`.
            unsafe {
                let cp = c.add(i * ldc + 16 * v);
                let mut out = _mm512_mul_ps(alpha, acc[v]);
                if beta != 0.0 {
                    out = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[v], cp), beta_v, out);
                }
                _mm512_mask_storeu_ps(cp, mask[v], out);
            }
        }
    }
}

/// `dst[p·rows + j] = src[j·k + p]`: the `rows × k` matrix `src` transposed, in 16 × 16 tiles
/// transposed in registers, and the edges element by element.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn transpose(src: &[f32], rows: usize, k: usize, dst: &mut [f32]) {
    assert!(src.len() >= rows * k && dst.len() >= rows * k);
    let (full_j, full_p) = (rows / 16 * 16, k / 16 * 16);
    for j0 in (0..full_j).step_by(16) {
        for p0 in (0..full_p).step_by(16) {
            // SAFETY: rows j0..j0+16 and columns p0..p0+16 are inside src, and rows p0..p0+16,
            // columns j0..j0+16 inside dst (checked above).
            unsafe {
                tile16(
                    src.as_ptr().add(j0 * k + p0),
                    k,
                    dst.as_mut_ptr().add(p0 * rows + j0),
                    rows,
                )
            };
        }
    }
    for j in 0..rows {
        let from = if j < full_j { full_p } else { 0 };
        for p in from..k {
            dst[p * rows + j] = src[j * k + p];
        }
    }
}

/// Transposes the 16 × 16 tile at `src` (rows `lds` apart) into `dst` (rows `ldd` apart):
/// interleave pairs of rows, then pairs of pairs, then exchange 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile16(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    // SAFETY: the caller gives 16 rows of 16 floats at each side.
    let r: [__m512; 16] = std::array::from_fn(|a| unsafe { _mm512_loadu_ps(src.add(a * lds)) });
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], lane L: column 4L + c of rows 4g..4g+4.
    let mut u = [_mm512_setzero_ps(); 16];
    let (lo, hi) = (
        |x: __m512, y: __m512| {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
        },
        |x: __m512, y: __m512| {
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
        },
    );
    for g in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = lo(t0, t2);
        u[4 * g + 1] = hi(t0, t2);
        u[4 * g + 2] = lo(t1, t3);
        u[4 * g + 3] = hi(t1, t3);
    }
    for c in 0..4 {
        let (v0, v1, v2, v3) = (u[c], u[4 + c], u[8 + c], u[12 + c]);
        let w0 = _mm512_shuffle_f32x4::<0x44>(v0, v1);
        let w1 = _mm512_shuffle_f32x4::<0xEE>(v0, v1);
        let w2 = _mm512_shuffle_f32x4::<0x44>(v2, v3);
        let w3 = _mm512_shuffle_f32x4::<0xEE>(v2, v3);
        // SAFETY: rows c, 4 + c, 8 + c and 12 + c of dst's tile.
        unsafe {
            _mm512_storeu_ps(dst.add(c * ldd), _mm512_shuffle_f32x4::<0x88>(w0, w2));
            _mm512_storeu_ps(dst.add((4 + c) * ldd), _mm512_shuffle_f32x4::<0xDD>(w0, w2));
            _mm512_storeu_ps(dst.add((8 + c) * ldd), _mm512_shuffle_f32x4::<0x88>(w1, w3));
            _mm512_storeu_ps(
                dst.add((12 + c) * ldd),
                _mm512_shuffle_f32x4::<0xDD>(w1, w3),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_matches_element_by_element_for_tiles_and_edges() {
        if crate::engine::cpu::simd::level() != crate::engine::cpu::simd::Level::Avx512 {
            return;
        }
        for (rows, k) in [
            (16, 16),
            (32, 48),
            (17, 33),
            (5, 40),
            (40, 5),
            (1, 1),
            (64, 784),
        ] {
            let src: Vec<f32> = (0..rows * k).map(|x| x as f32).collect();
            let mut dst = vec![f32::NAN; rows * k];
            // SAFETY: the host has AVX-512 (checked above); the slices hold rows × k.
            unsafe { transpose(&src, rows, k, &mut dst) };
            for j in 0..rows {
                for p in 0..k {
                    assert_eq!(
                        dst[p * rows + j],
                        src[j * k + p],
                        "{rows}x{k} at ({j}, {p})"
                    );
                }
            }
        }
    }
}
