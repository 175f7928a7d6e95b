//! The plan: a job becomes rounds (N × split mode), each with its slices and its trials.

use serde::{Deserialize, Serialize};

use crate::error::JobError;
use crate::job::{CapPolicy, FaultSpec, Hyper, Job, SplitMode};

/// One logical part of the device that runs one trial at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SliceSpec {
    pub index: u32,
    /// The memory cap; `None` when the split mode has none.
    pub mem_cap_bytes: Option<u64>,
    /// SMs of the slice's partition (green mode); `None` elsewhere.
    pub sm_count: Option<u32>,
    /// The SM partition the slice runs on (green mode); slices share one when N exceeds the partitions.
    pub partition: Option<u32>,
}

impl SliceSpec {
    pub fn cap_mib(&self) -> Option<f64> {
        self.mem_cap_bytes.map(|b| b as f64 / MIB)
    }
}

pub const MIB: f64 = (1u64 << 20) as f64;

/// One training run with one set of hyperparameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialSpec {
    /// Stable id: `t` + index; the same id means the same hyperparameters and seed in every round.
    pub id: String,
    pub index: u32,
    pub hyper: Hyper,
    /// Every value the trial is given, by name (what an external command's template refers to).
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, crate::space::ParamValue>,
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSpec>,
}

/// N trials launched together under one split mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub index: u32,
    pub n: u32,
    pub split: SplitMode,
    pub slices: Vec<SliceSpec>,
    pub trials: Vec<TrialSpec>,
}

/// What the slice plan needs to know about the device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceBudget {
    pub memory_bytes: u64,
    /// SMs and the partition granularity (green mode); `None` on the CPU.
    pub sm_count: Option<u32>,
    pub sm_granularity: Option<u32>,
}

/// The seed of trial `index` of a job.
pub fn trial_seed(job_seed: u64, index: u32) -> u64 {
    crate::engine::rng::derive(job_seed, 0x7472_6961_6c00 + index as u64)
}

/// The trials `0..n` of a job.
pub fn trials(job: &Job, n: u32) -> Result<Vec<TrialSpec>, JobError> {
    (0..n)
        .map(|i| {
            Ok(TrialSpec {
                id: format!("t{i:03}"),
                index: i,
                hyper: job.hyper(i as usize)?,
                params: job.params(i as usize)?,
                seed: trial_seed(job.file.seed, i),
                fault: job.file.faults.iter().find(|f| f.trial == i).cloned(),
            })
        })
        .collect()
}

/// The slices of a round of `n` trials under `split`.
pub fn slices(
    job: &Job,
    n: u32,
    split: SplitMode,
    dev: &DeviceBudget,
) -> Result<Vec<SliceSpec>, JobError> {
    let cap = if split.capped() {
        Some(slice_cap(job, n, dev)?)
    } else {
        None
    };
    let parts = match (split, dev.sm_count) {
        (SplitMode::Green, Some(sms)) => {
            Some(green_partitions(sms, dev.sm_granularity.unwrap_or(8), n))
        }
        _ => None,
    };
    Ok((0..n)
        .map(|i| SliceSpec {
            index: i,
            mem_cap_bytes: cap,
            sm_count: parts.as_ref().map(|p| p.sm_per_partition),
            partition: parts.as_ref().map(|p| i % p.count),
        })
        .collect())
}

/// The cap of each slice under the job's memory policy; a cap above the device's memory is an error.
pub fn slice_cap(job: &Job, n: u32, dev: &DeviceBudget) -> Result<u64, JobError> {
    match job.file.memory.policy() {
        CapPolicy::Fraction(f) => Ok((dev.memory_bytes as f64 * f / n as f64) as u64),
        CapPolicy::MibPerSlice(mib) => {
            let bytes = mib * MIB;
            let total = dev.memory_bytes as f64;
            if bytes > total {
                return Err(job.invalid(
                    "memory.mib_per_slice",
                    format!(
                        "{mib} MiB is above the device's memory ({:.0} MiB)",
                        total / MIB
                    ),
                ));
            }
            if bytes * n as f64 > total {
                return Err(job.invalid(
                    "memory.mib_per_slice",
                    format!(
                        "{n} slices of {mib} MiB need {:.0} MiB, above the device's {:.0} MiB",
                        mib * n as f64,
                        total / MIB
                    ),
                ));
            }
            Ok(bytes as u64)
        }
    }
}

/// How the SMs are cut for green contexts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partitions {
    pub count: u32,
    pub sm_per_partition: u32,
}

/// Equal partitions of `sms` in multiples of `granularity`, as many as `n` (at least one group each).
pub fn green_partitions(sms: u32, granularity: u32, n: u32) -> Partitions {
    let g = granularity.max(1);
    let groups = (sms / g).max(1);
    let count = n.clamp(1, groups);
    Partitions {
        count,
        sm_per_partition: (groups / count) * g,
    }
}

/// Every round of a job, N by N, each N under every split mode in turn.
pub fn rounds(job: &Job, dev: &DeviceBudget, splits: &[SplitMode]) -> Result<Vec<Round>, JobError> {
    let mut out = Vec::new();
    for &n in &job.file.n {
        let trials = trials(job, n)?;
        for &split in splits {
            out.push(Round {
                index: out.len() as u32,
                n,
                split,
                slices: slices(job, n, split, dev)?,
                trials: trials.clone(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn job(extra: &str) -> Job {
        Job::parse(
            &format!("model: {{kind: mlp}}\ndata: {{source: synthetic}}\n{extra}"),
            Path::new("j.yaml"),
        )
        .unwrap()
    }

    const DEV: DeviceBudget = DeviceBudget {
        memory_bytes: 1 << 30,
        sm_count: None,
        sm_granularity: None,
    };

    #[test]
    fn rounds_cover_every_n_and_split_with_stable_trials() {
        let j = job("n: [1, 3]\nsplits: [shared, logical]\n");
        let r = rounds(&j, &DEV, &j.file.splits).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r[2].n, 3);
        assert_eq!(r[2].trials.len(), 3);
        assert_eq!(r[0].trials[0], r[3].trials[0]);
        assert!(r[0].slices[0].mem_cap_bytes.is_none());
        assert_eq!(
            r[3].slices[0].mem_cap_bytes,
            Some(((1u64 << 30) as f64 * 0.9 / 3.0) as u64)
        );
    }

    #[test]
    fn a_cap_above_the_device_is_an_error() {
        let j = job("memory:\n  mib_per_slice: 4096\n");
        let e = slice_cap(&j, 1, &DEV).unwrap_err().to_string();
        assert!(
            e.contains("above the device") && e.contains("line 4"),
            "{e}"
        );
        let j = job("memory:\n  mib_per_slice: 512\n");
        assert!(slice_cap(&j, 2, &DEV).is_ok());
        assert!(slice_cap(&j, 3, &DEV).is_err());
    }

    #[test]
    fn green_partitions_share_when_n_is_large() {
        assert_eq!(
            green_partitions(132, 8, 1),
            Partitions {
                count: 1,
                sm_per_partition: 128
            }
        );
        assert_eq!(
            green_partitions(132, 8, 4),
            Partitions {
                count: 4,
                sm_per_partition: 32
            }
        );
        let p = green_partitions(132, 8, 34);
        assert_eq!(
            p,
            Partitions {
                count: 16,
                sm_per_partition: 8
            }
        );
    }
}
