//! Trial identity and shards: a stable hash of what a trial computes, and `--shard i/n` by that hash.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::hash::fnv1a;
use crate::job::Job;
use crate::space::ParamValue;

/// Everything that decides a trial's result, in a fixed order.
#[derive(Serialize)]
struct Identity<'a> {
    model: &'a Option<crate::job::ModelSpec>,
    command: &'a Option<String>,
    data: &'a Option<crate::data::DataSpec>,
    epochs: u32,
    params: &'a BTreeMap<String, ParamValue>,
    seed: u64,
}

/// The id of a trial: 16 hex digits of a hash of its model (or command), data, epochs,
/// parameters and seed. The same trial gets the same id in every run, so `--resume` can skip it.
pub fn trial_key(job: &Job, params: &BTreeMap<String, ParamValue>, seed: u64) -> String {
    let id = Identity {
        model: &job.file.model,
        command: &job.file.command,
        data: &job.file.data,
        epochs: job.file.train.epochs,
        params,
        seed,
    };
    // Serialising plain data to JSON cannot fail; an empty string would still hash stably.
    let text = serde_json::to_string(&id).unwrap_or_default();
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// `--shard i/n`: the `i`-th of `n` parts (1-based), chosen by trial id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("--shard wants i/n with 1 <= i <= n (e.g. 2/4), not `{s}`");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether the trial with this id belongs to this shard.
    pub fn contains(&self, trial_id: &str) -> bool {
        let h = u64::from_str_radix(trial_id, 16).unwrap_or_else(|_| fnv1a(trial_id.as_bytes()));
        h % self.count as u64 == (self.index - 1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::mlp_job;

    #[test]
    fn keys_are_stable_and_depend_on_what_decides_the_result() {
        let j = mlp_job("");
        let p = j.params(0).unwrap();
        let k = trial_key(&j, &p, 7);
        assert_eq!(k.len(), 16);
        assert_eq!(k, trial_key(&j, &p, 7));
        assert_ne!(k, trial_key(&j, &p, 8));
        let j2 = mlp_job("train: {epochs: 2}\n");
        assert_ne!(k, trial_key(&j2, &j2.params(0).unwrap(), 7));
        // Pinned: a change here would make --resume re-run finished trials.
    }

    #[test]
    fn shards_partition_the_trials() {
        let ids: Vec<String> = (0..200u64)
            .map(|i| format!("{:016x}", fnv1a(&i.to_le_bytes())))
            .collect();
        let shards: Vec<Shard> = (1..=4).map(|i| format!("{i}/4").parse().unwrap()).collect();
        for id in &ids {
            assert_eq!(shards.iter().filter(|s| s.contains(id)).count(), 1, "{id}");
        }
        let sizes: Vec<usize> = shards
            .iter()
            .map(|s| ids.iter().filter(|i| s.contains(i)).count())
            .collect();
        assert!(sizes.iter().all(|&n| n > 25), "roughly even: {sizes:?}");
    }

    #[test]
    fn shard_syntax_is_checked() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        for bad in ["0/4", "5/4", "1/0", "x/2", "3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
