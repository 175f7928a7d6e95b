//! How a round's trials are queued: one by one, or (`split: fused`) in fused groups of compatible trials, or as single trials that fused groups take into their slots.

use super::RoundContext;
use crate::job::SplitMode;
use crate::plan::{fused_width, Round, TrialSpec};

/// What a slice worker takes off the queue of `round`: under `fused`, groups of compatible
/// trials (those of one [`crate::train::group_key`]) of at most
/// [`fused_width`] trials (of the round's N over its slices: N trials train at once); in every
/// other mode, each trial alone.
pub fn queued(round: &Round, ctx: &RoundContext) -> Vec<Vec<TrialSpec>> {
    let Some(work) = ctx.builtin().filter(|_| round.split == SplitMode::Fused) else {
        return round.trials.iter().map(|t| vec![t.clone()]).collect();
    };
    let cpu = ctx.devices.kind() == crate::engine::BackendKind::Cpu;
    let slices = round.slices.len();
    let width = fused_width(round.n as usize, slices, cpu);
    chunked(round.trials.clone(), width, slices, |t| {
        crate::train::group_key(&work.config(ctx, t))
    })
}

/// The width of the fused groups of `round` when they refill their freed slots from a queue of
/// single trials (`wanted`: its trials are proposed one by one, or pruned), as [`queued`]'s
/// groups would be; `None` when the round has no fused groups of built-in trials.
pub fn refill_width(round: &Round, ctx: &RoundContext, wanted: bool) -> Option<usize> {
    ctx.builtin()
        .filter(|_| wanted && round.split == SplitMode::Fused)?;
    let cpu = ctx.devices.kind() == crate::engine::BackendKind::Cpu;
    Some(fused_width(round.n as usize, round.slices.len(), cpu))
}

/// `items` bucketed by `key` (buckets in the order of their first item, items in their order
/// inside each), each bucket cut into the fewest groups of at most `width` (at least 1), of
/// sizes that differ by at most one, larger ones first. When every item shares one key, the
/// number of groups is also rounded up to a multiple of `slices` where there are items enough,
/// so that the slices' queues end together: 13 trials of width 4 on 2 slices train as 4, 3, 3
/// and 3 (7 and 6 on each slice), not 4, 4, 4 and 1 (8 and 5).
pub fn chunked<T, K: PartialEq>(
    items: Vec<T>,
    width: usize,
    slices: usize,
    key: impl Fn(&T) -> K,
) -> Vec<Vec<T>> {
    let mut buckets: Vec<(K, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match buckets.iter_mut().find(|(b, _)| *b == k) {
            Some((_, members)) => members.push(item),
            None => buckets.push((k, vec![item])),
        }
    }
    let (width, slices, one_key) = (width.max(1), slices.max(1), buckets.len() == 1);
    let mut groups = Vec::new();
    for (_, members) in buckets {
        let len = members.len();
        let mut count = len.div_ceil(width);
        if one_key {
            count = count.div_ceil(slices).saturating_mul(slices).min(len);
        }
        let (size, larger) = (len / count, len % count);
        let mut members = members.into_iter();
        for g in 0..count {
            groups.push(
                members
                    .by_ref()
                    .take(size + usize::from(g < larger))
                    .collect(),
            );
        }
    }
    groups
}

/// What a dry run says of how trials with these group keys gather under `fused`, `n` at a time
/// on `slices` slices (of the CPU when `cpu`), as "fused: 12 trials in 3 groups of up to 4 on 2 slices".
pub fn describe(keys: Vec<String>, n: usize, slices: usize, cpu: bool) -> String {
    let width = fused_width(n, slices, cpu);
    let n = keys.len();
    let groups = chunked(keys, width, slices, |k| k.clone());
    let (width, groups) = (groups.iter().map(Vec::len).max().unwrap_or(0), groups.len());
    let s = |k: usize| if k == 1 { "" } else { "s" };
    format!(
        "fused: {n} trial{} in {groups} group{} of up to {width} on {slices} slice{}",
        s(n),
        s(groups),
        s(slices)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_their_order_never_mix_keys_nor_exceed_the_width() {
        let items: Vec<(u32, char)> = ['a', 'b', 'a', 'a', 'b', 'c', 'a', 'a', 'b', 'a']
            .into_iter()
            .enumerate()
            .map(|(i, k)| (i as u32, k))
            .collect();
        let groups = chunked(items.clone(), 3, 2, |t| t.1);
        let ids: Vec<Vec<u32>> = groups
            .iter()
            .map(|g| g.iter().map(|t| t.0).collect())
            .collect();
        assert_eq!(
            ids,
            vec![vec![0, 2, 3], vec![6, 7, 9], vec![1, 4, 8], vec![5]]
        );
        for g in &groups {
            assert!(!g.is_empty() && g.len() <= 3);
            assert!(g.iter().all(|t| t.1 == g[0].1));
            assert!(g.windows(2).all(|w| w[0].0 < w[1].0));
        }
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), items.len());
        // Width 0 counts as 1; one key and a wide width make one group.
        assert_eq!(chunked(vec![1, 2], 0, 1, |_| ()).len(), 2);
        assert_eq!(chunked(vec![1, 2, 3], 8, 1, |_| ()), vec![vec![1, 2, 3]]);
        assert!(chunked(Vec::<u8>::new(), 2, 2, |_| ()).is_empty());
    }

    #[test]
    fn one_key_s_groups_are_even_and_fill_every_slice_alike() {
        let sizes = |n: usize, width: usize, slices: usize| {
            chunked((0..n).collect(), width, slices, |_| ())
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>()
        };
        // The fib rounds on a 2-core CPU (width 4).
        assert_eq!(sizes(13, 4, 2), [4, 3, 3, 3]);
        assert_eq!(sizes(21, 4, 2), [4, 4, 4, 3, 3, 3]);
        assert_eq!(sizes(34, 4, 2), [4, 4, 4, 4, 3, 3, 3, 3, 3, 3]);
        assert_eq!(sizes(5, 3, 2), [3, 2]);
        assert_eq!(sizes(8, 4, 2), [4, 4]);
        // Fewer items than slices: one each.
        assert_eq!(sizes(3, 2, 4), [1, 1, 1]);
        // One slice (a GPU): one group of the whole width.
        assert_eq!(sizes(34, 34, 1), [34]);
        // Several keys: each its fewest even groups, with no rounding to the slices.
        let keyed = chunked((0..10).collect::<Vec<u32>>(), 4, 2, |i| i % 2);
        let keyed: Vec<usize> = keyed.iter().map(Vec::len).collect();
        assert_eq!(keyed, [3, 2, 3, 2]);
    }

    #[test]
    fn a_dry_run_says_how_the_trials_group() {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            describe(keys(&["a"; 12]), 12, 3, false),
            "fused: 12 trials in 3 groups of up to 4 on 3 slices"
        );
        assert_eq!(
            describe(keys(&["a", "b", "a", "b"]), 4, 2, false),
            "fused: 4 trials in 2 groups of up to 2 on 2 slices"
        );
        assert_eq!(
            describe(keys(&["a"]), 1, 1, false),
            "fused: 1 trial in 1 group of up to 1 on 1 slice"
        );
        // 8 at a time on 2 slices: groups of up to 4, as 4 groups of 3 so both slices end
        // together.
        assert_eq!(
            describe(keys(&["a"; 12]), 8, 2, false),
            "fused: 12 trials in 4 groups of up to 3 on 2 slices"
        );
        // On the CPU, at most CPU_FUSED_WIDTH a group.
        assert_eq!(
            describe(keys(&["a"; 34]), 34, 2, true),
            "fused: 34 trials in 10 groups of up to 4 on 2 slices"
        );
    }
}
