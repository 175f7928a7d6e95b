//! The largest batch that fits: a bisection over a size, for the batch-size fallback of a trial and for `batch-scan`.

/// The largest `b` in `[ok, bad)` for which `fits(b)`, given `fits(ok)` and `!fits(bad)`, for a
/// `fits` that holds up to some size and not beyond (a batch size against a slice's cap): a
/// bisection, `fits` called about log2(bad − ok) times.
pub fn largest_fitting<E>(
    mut ok: usize,
    mut bad: usize,
    fits: &mut dyn FnMut(usize) -> Result<bool, E>,
) -> Result<usize, E> {
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if fits(mid)? {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_finds_the_last_size_that_fits() {
        for limit in [5usize, 6, 7, 63, 64, 100] {
            let mut calls = 0;
            let got = largest_fitting(4, 128, &mut |b| {
                calls += 1;
                Ok::<bool, ()>(b <= limit)
            })
            .unwrap_or(0);
            assert_eq!(got, limit.min(127));
            assert!(calls <= 7, "{calls} probes for a range of 124");
        }
        assert_eq!(
            largest_fitting::<()>(4, 5, &mut |_| unreachable!()).unwrap_or(0),
            4
        );
    }
}
