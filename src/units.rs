//! Units of measure shared by every layer, and a total of units divided by weights.

/// Bytes in a mebibyte.
pub const MIB: f64 = (1u64 << 20) as f64;

/// Splits `total` units in proportion to `weights` by largest remainder (ties to the earlier
/// one); the shares add up to `total`. With `at_least_one`, a share that would be 0 takes one
/// unit from the largest share (when `total` has one unit for each).
pub fn shares(total: usize, weights: &[f64], at_least_one: bool) -> Vec<usize> {
    let k = weights.len();
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights
        .iter()
        .map(|w| {
            if sum > 0.0 {
                total as f64 * w / sum
            } else {
                total as f64 / k as f64
            }
        })
        .collect();
    let mut out: Vec<usize> = exact
        .iter()
        .map(|x| (x.floor() as usize).min(total))
        .collect();
    let given: usize = out.iter().sum();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().take(total.saturating_sub(given)) {
        out[i] += 1;
    }
    if at_least_one && total >= k {
        while let Some(zero) = out.iter().position(|&n| n == 0) {
            let (big, _) = out
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
                .unwrap_or((0, &0));
            out[big] -= 1;
            out[zero] += 1;
        }
    }
    out
}
