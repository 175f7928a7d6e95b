//! How a round's trials are queued: one by one, or (`split: fused`) in fused groups of compatible trials.

use super::RoundContext;
use crate::job::SplitMode;
use crate::plan::{fused_width, Round, TrialSpec};

/// What a slice worker takes off the queue of `round`: under `fused`, groups of compatible
/// trials (those of one [`crate::train::fused::group_key`]) of at most
/// [`fused_width`] trials (of the round's N over its slices: N trials train at once); in every
/// other mode, each trial alone.
pub fn queued(round: &Round, ctx: &RoundContext) -> Vec<Vec<TrialSpec>> {
    if round.split != SplitMode::Fused {
        return round.trials.iter().map(|t| vec![t.clone()]).collect();
    }
    let cpu = ctx.devices.kind() == crate::engine::BackendKind::Cpu;
    let width = fused_width(round.n as usize, round.slices.len(), cpu);
    chunked(round.trials.clone(), width, |t| {
        crate::train::fused::group_key(&ctx.config(t))
    })
}

/// `items` bucketed by `key` (buckets in the order of their first item, items in their order
/// inside each), each bucket cut into groups of at most `width` (at least 1).
pub fn chunked<T, K: PartialEq>(items: Vec<T>, width: usize, key: impl Fn(&T) -> K) -> Vec<Vec<T>> {
    let mut buckets: Vec<(K, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match buckets.iter_mut().find(|(b, _)| *b == k) {
            Some((_, members)) => members.push(item),
            None => buckets.push((k, vec![item])),
        }
    }
    let width = width.max(1);
    let mut groups = Vec::new();
    for (_, members) in buckets {
        let mut members = members.into_iter().peekable();
        while members.peek().is_some() {
            groups.push(members.by_ref().take(width).collect());
        }
    }
    groups
}

/// What a dry run says of how trials with these group keys gather under `fused`, `n` at a time
/// on `slices` slices (of the CPU when `cpu`), as "fused: 12 trials in 3 groups of up to 4 on 2 slices".
pub fn describe(keys: Vec<String>, n: usize, slices: usize, cpu: bool) -> String {
    let width = fused_width(n, slices, cpu);
    let n = keys.len();
    let groups = chunked(keys, width, |k| k.clone()).len();
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
        let groups = chunked(items.clone(), 3, |t| t.1);
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
        assert_eq!(chunked(vec![1, 2], 0, |_| ()).len(), 2);
        assert_eq!(chunked(vec![1, 2, 3], 8, |_| ()), vec![vec![1, 2, 3]]);
        assert!(chunked(Vec::<u8>::new(), 2, |_| ()).is_empty());
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
        // 8 at a time on 2 slices: groups of up to 4.
        assert_eq!(
            describe(keys(&["a"; 12]), 8, 2, false),
            "fused: 12 trials in 3 groups of up to 4 on 2 slices"
        );
        // On the CPU, at most CPU_FUSED_WIDTH a group.
        assert_eq!(
            describe(keys(&["a"; 34]), 34, 2, true),
            "fused: 34 trials in 9 groups of up to 4 on 2 slices"
        );
    }
}
