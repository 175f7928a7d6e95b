//! The plan: a job becomes rounds (N × split mode), each with its slices and its trials.

use serde::{Deserialize, Serialize};

use crate::error::JobError;
use crate::job::{CapPolicy, FaultSpec, Hyper, Job, SliceDef, SplitMode};
use crate::space::Method;

/// One logical part of the device that runs one trial at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SliceSpec {
    pub index: u32,
    /// The CUDA device the slice sits on, as numbered among the visible ones (0 on the CPU).
    #[serde(default)]
    pub device: u32,
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

/// Test builders: `SliceSpec::at(0, 1).capped(64 << 20).green(0, 48)`.
#[cfg(test)]
impl SliceSpec {
    /// Slice `index` on `device`, with no memory cap and no SM partition.
    pub(crate) const fn at(index: u32, device: u32) -> SliceSpec {
        SliceSpec {
            index,
            device,
            mem_cap_bytes: None,
            sm_count: None,
            partition: None,
        }
    }

    /// The same slice, capped at `bytes`.
    pub(crate) const fn capped(self, bytes: u64) -> SliceSpec {
        SliceSpec {
            mem_cap_bytes: Some(bytes),
            ..self
        }
    }

    /// The same slice, on SM partition `partition` of `sms` SMs (green mode).
    pub(crate) const fn green(self, partition: u32, sms: u32) -> SliceSpec {
        SliceSpec {
            sm_count: Some(sms),
            partition: Some(partition),
            ..self
        }
    }
}

pub use crate::units::{shares, MIB};

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
    /// How many groups of `sm_granularity` SMs the driver makes of the device (it can be fewer
    /// than `sm_count / sm_granularity`: groups stay within one processing cluster); `None`: that
    /// quotient.
    pub sm_groups: Option<u32>,
    /// The granularity the device's memory pools are capped in (bytes); `None` on the CPU.
    pub mem_granularity: Option<u64>,
}

impl DeviceBudget {
    /// The SM groups partitions are made of, and their size, as the driver reported them;
    /// `None` on the CPU or where the device has no green contexts.
    fn groups(&self) -> Option<(u32, u32)> {
        let total = self.sm_count?;
        let g = self.sm_granularity?.max(1);
        let fit = total / g;
        Some((self.sm_groups.map_or(fit, |n| n.min(fit)), g))
    }

    /// A cap as the device's pools enforce it: rounded down to whole pages of its memory
    /// granularity (at least one), so that the cap printed and recorded is the one in force.
    pub fn real_cap(&self, bytes: u64) -> u64 {
        match self.mem_granularity {
            Some(g) if g > 1 => (bytes / g).max(1) * g,
            _ => bytes,
        }
    }
}

/// One `T` per device a run's slices may sit on, by number: device 0's (the host's on the CPU
/// backend), and those of the further CUDA devices a job's slices name.
#[derive(Clone, Debug, PartialEq)]
pub struct PerDevice<T> {
    pub first: T,
    pub more: Vec<(u32, T)>,
}

impl<T> PerDevice<T> {
    /// Device 0 alone.
    pub fn one(first: T) -> PerDevice<T> {
        PerDevice {
            first,
            more: Vec::new(),
        }
    }

    /// Device 0 and the others, by number (a second device 0 among them is ignored).
    pub fn with(first: T, more: Vec<(u32, T)>) -> PerDevice<T> {
        PerDevice {
            first,
            more: more.into_iter().filter(|(d, _)| *d != 0).collect(),
        }
    }

    /// Device `number`'s, when it is open.
    pub fn get(&self, number: u32) -> Option<&T> {
        if number == 0 {
            return Some(&self.first);
        }
        self.more.iter().find(|(d, _)| *d == number).map(|(_, t)| t)
    }

    /// Every device's with its number, device 0 first.
    pub fn all(&self) -> impl Iterator<Item = (u32, &T)> {
        std::iter::once((0, &self.first)).chain(self.more.iter().map(|(d, t)| (*d, t)))
    }

    /// The numbers of the open devices in words: `0` or `0, 1, 3`.
    pub fn numbers(&self) -> String {
        self.all()
            .map(|(d, _)| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What the slice plan knows of each device its slices may sit on.
pub type Budgets = PerDevice<DeviceBudget>;

/// The seed of trial `index` of a job.
pub fn trial_seed(job_seed: u64, index: u32) -> u64 {
    crate::rng::derive(job_seed, 0x7472_6961_6c00 + index as u64)
}

/// Trial `i` of a job, computed from its index alone (no other trial is built).
pub fn trial(job: &Job, i: u32) -> Result<TrialSpec, JobError> {
    trial_at(job, i, &job.space.point(job.file.seed, i as usize))
}

/// Trial `i` of a job given its point of the space (a point a sampler proposed).
pub fn trial_at(
    job: &Job,
    i: u32,
    point: &std::collections::BTreeMap<String, crate::space::ParamValue>,
) -> Result<TrialSpec, JobError> {
    Ok(TrialSpec {
        id: format!("t{i:03}"),
        index: i,
        hyper: job.hyper_at(i as usize, point)?,
        params: job.params_at(i as usize, point)?,
        seed: trial_seed(job.file.seed, i),
        fault: job.file.faults.iter().find(|f| f.trial == i).cloned(),
    })
}

/// The trials `0..n` of a job.
pub fn trials(job: &Job, n: u32) -> Result<Vec<TrialSpec>, JobError> {
    (0..n).map(|i| trial(job, i)).collect()
}

pub use crate::job::limits::{
    check_trial_count, MAX_RUN_BYTES, MAX_TRIALS, MAX_TRIAL_BYTES, MAX_VALUES,
};

/// How many trials a sweep of `job` runs: the grid's points (capped by `run_cap`), or `run_cap`
/// random draws (the points of a space of only `value`/`values` when `run_cap` is unset).
/// Counted with checked arithmetic and bounded by [`check_trial_count`]; an error names the key.
pub fn sweep_count(job: &Job) -> Result<u32, JobError> {
    let space = &job.space;
    let grid = || {
        space.grid_size().ok_or_else(|| {
            job.invalid(
                "parameters",
                format!(
                    "make a grid of more than 2^64 points ({} parameters): its size overflows",
                    space.dists.len()
                ),
            )
        })
    };
    let all_discrete = !space.dists.is_empty() && space.dists.values().all(|d| d.is_discrete());
    let (count, key, what, hint) = match job.file.run_cap.map(u64::from) {
        Some(cap) if space.method == Method::Grid => (grid()?.min(cap), "run_cap", "asks for", ""),
        Some(cap) => (cap, "run_cap", "asks for", ""),
        None if space.method == Method::Grid || all_discrete => (
            grid()?,
            "parameters",
            "make a grid of",
            "; set run_cap to run the first ones",
        ),
        None => {
            return Err(job.invalid(
                "run_cap",
                "is missing: a random sweep needs the number of trials to draw",
            ))
        }
    };
    check_trial_count(job, count, key, what, hint)?;
    u32::try_from(count).map_err(|_| job.invalid(key, "is too large"))
}

/// The slices of a round of `n` trials under `split`.
pub fn slices(
    job: &Job,
    n: u32,
    split: SplitMode,
    budgets: &Budgets,
) -> Result<Vec<SliceSpec>, JobError> {
    if let Some(plan) = unequal_slices(job, split, budgets)? {
        return Ok(plan);
    }
    let dev = &budgets.first;
    // A fused round runs its trials as groups on fewer slices: the budget is split over those.
    let n = if split == SplitMode::Fused {
        n.min(fused_slices(dev))
    } else {
        n
    };
    let cap = if split.capped() {
        Some(slice_cap(job, n, dev)?)
    } else {
        None
    };
    let parts = match (split, dev.groups()) {
        (SplitMode::Green, Some((groups, g))) => Some(partitions_of_groups(groups, g, n)),
        _ => None,
    };
    Ok((0..n)
        .map(|i| SliceSpec {
            index: i,
            device: 0,
            mem_cap_bytes: cap,
            sm_count: parts.as_ref().map(|p| p.sm_per_partition),
            partition: parts.as_ref().map(|p| i % p.count),
        })
        .collect())
}

/// How many slices a fused round uses at most: one per available core on the CPU (each trains
/// its groups on one thread), one on a GPU (its group is one batched model).
pub fn fused_slices(dev: &DeviceBudget) -> u32 {
    if dev.sm_count.is_some() {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |c| c.get() as u32)
    }
}

/// The most trials a fused group holds on the CPU. A group's step runs layer by layer over its
/// trials, so every trial's weights, gradients and optimizer state pass through the caches at
/// each layer: at 4 MLP trials (about 6 MiB) they stay in a 32 MiB L3, and the group trains
/// faster than its trials one after another; at 17 it was 1.2× slower (bench/fused.sh).
pub const CPU_FUSED_WIDTH: usize = 4;

/// The most trials a fused group of a round of `n` trials on `slices` slices holds: ⌈n/slices⌉,
/// at least 1, and at most [`CPU_FUSED_WIDTH`] on the CPU (more groups then queue on each slice).
pub fn fused_width(n: usize, slices: usize, cpu: bool) -> usize {
    let width = n.div_ceil(slices.max(1)).max(1);
    if cpu {
        width.min(CPU_FUSED_WIDTH)
    } else {
        width
    }
}

/// The cap of each slice under the job's memory policy; a cap above the device's memory is an error.
pub fn slice_cap(job: &Job, n: u32, dev: &DeviceBudget) -> Result<u64, JobError> {
    match job.file.memory.policy() {
        CapPolicy::Fraction(f) => Ok(dev.real_cap((dev.memory_bytes as f64 * f / n as f64) as u64)),
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
            Ok(dev.real_cap(bytes as u64))
        }
    }
}

/// The slices of a job's unequal slice plan (`slices:` or `ratios:`), or `None` when it has
/// none. The plan is fixed whatever the round's N: its trials queue on these slices.
///
/// Each device is planned on its own, for the slices that sit on it (`slices[i].device`,
/// default 0). Caps (capped split modes): `slices[i].mem_mib`, or the device's memory budget
/// (`memory.fraction` of it, or `mib_per_slice` × its slices) split in proportion to `ratios`.
/// SMs (green mode on a GPU): `slices[i].sm` rounded up to the device's granularity, or its SM
/// groups split in proportion to `ratios` (largest remainder, at least one group each). Each
/// slice has a partition of its own, numbered as the slice.
pub fn unequal_slices(
    job: &Job,
    split: SplitMode,
    budgets: &Budgets,
) -> Result<Option<Vec<SliceSpec>>, JobError> {
    let f = &job.file;
    let (weights, key) = match (&f.slices, &f.ratios) {
        (Some(s), _) => (vec![1.0; s.len()], "slices"),
        (None, Some(r)) => (r.clone(), "ratios"),
        (None, None) => return Ok(None),
    };
    let k = weights.len();
    let explicit = f.slices.as_deref();
    let device_of = |i: usize| explicit.and_then(|s| s[i].device).unwrap_or(0);
    let devices = job.devices();
    let mut plan: Vec<SliceSpec> = (0..k)
        .map(|i| SliceSpec {
            index: i as u32,
            device: device_of(i),
            mem_cap_bytes: None,
            sm_count: None,
            partition: None,
        })
        .collect();
    for &d in &devices {
        let members: Vec<usize> = (0..k).filter(|&i| device_of(i) == d).collect();
        let first = members.first().copied().unwrap_or(0);
        let Some(dev) = budgets.get(d) else {
            return Err(job.invalid(
                &format!("slices.{first}.device"),
                format!(
                    "device {d} is not among those open here ({})",
                    budgets.numbers()
                ),
            ));
        };
        // Messages name the device only when the plan has several.
        let on = if devices.len() > 1 {
            format!(" on device {d}")
        } else {
            String::new()
        };
        let w: Vec<f64> = members.iter().map(|&i| weights[i]).collect();
        if split.capped() {
            let budget = match f.memory.policy() {
                CapPolicy::Fraction(fr) => dev.memory_bytes as f64 * fr,
                CapPolicy::MibPerSlice(mib) => mib * MIB * members.len() as f64,
            };
            let sum: f64 = w.iter().sum();
            let mut total = 0u64;
            for (&i, wi) in members.iter().zip(&w) {
                let given = explicit.and_then(|s| s[i].mem_mib).map(|m| m * MIB);
                let cap = dev.real_cap(given.unwrap_or(budget * wi / sum) as u64);
                total = total.saturating_add(cap);
                plan[i].mem_cap_bytes = Some(cap);
            }
            if total > dev.memory_bytes {
                return Err(job.invalid(
                    key,
                    format!(
                        "the caps of the slices{on} add up to {:.0} MiB, above the device's memory ({:.0} MiB)",
                        total as f64 / MIB,
                        dev.memory_bytes as f64 / MIB
                    ),
                ));
            }
        }
        if let (SplitMode::Green, Some((groups, g))) = (split, dev.groups()) {
            let defs: Option<Vec<&SliceDef>> =
                explicit.map(|s| members.iter().map(|&i| &s[i]).collect());
            let sms = unequal_sms(job, key, &on, (groups, g), &w, defs.as_deref())?;
            for (&i, sm) in members.iter().zip(sms) {
                plan[i].sm_count = Some(sm);
                plan[i].partition = Some(i as u32);
            }
        }
    }
    Ok(Some(plan))
}

/// SMs per slice of an unequal plan for the slices of one device, whose SMs make `groups`
/// groups of `g`; `defs` are those slices' definitions when the plan lists them.
fn unequal_sms(
    job: &Job,
    key: &str,
    on: &str,
    (groups, g): (u32, u32),
    weights: &[f64],
    defs: Option<&[&SliceDef]>,
) -> Result<Vec<u32>, JobError> {
    let total = groups * g;
    let groups = groups as usize;
    let k = weights.len();
    if k > groups {
        return Err(job.invalid(
            key,
            format!(
                "{k} slices{on} need {k} SM partitions; the device has room for {groups} of {g} SMs"
            ),
        ));
    }
    let sms: Vec<u32> = match defs {
        None => shares(groups, weights, true)
            .into_iter()
            .map(|n| n as u32 * g)
            .collect(),
        Some(defs) => {
            let rounded: Vec<Option<u32>> = defs
                .iter()
                .map(|d| d.sm.map(|s| s.div_ceil(g) * g))
                .collect();
            let given: u32 = rounded.iter().flatten().sum();
            let open = rounded.iter().filter(|s| s.is_none()).count() as u32;
            let left = total.saturating_sub(given);
            let each = left.checked_div(open).map_or(0, |x| x / g * g);
            if open > 0 && each == 0 {
                return Err(job.invalid(
                    "slices",
                    format!("{left} SMs are left for the {open} slices{on} without `sm`: fewer than {g} each"),
                ));
            }
            rounded.iter().map(|s| s.unwrap_or(each)).collect()
        }
    };
    let sum: u32 = sms.iter().sum();
    if sum > total {
        return Err(job.invalid(
            key,
            format!(
                "partitions of {} SMs{on} (rounded up to multiples of {g}) need {sum} SMs; the device has {total}",
                sms.iter().map(u32::to_string).collect::<Vec<_>>().join(" + ")
            ),
        ));
    }
    Ok(sms)
}

/// How the SMs are cut for green contexts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partitions {
    pub count: u32,
    pub sm_per_partition: u32,
}

/// Equal partitions of `groups` groups of `g` SMs, as many as `n` (at least one group each).
pub fn partitions_of_groups(groups: u32, g: u32, n: u32) -> Partitions {
    let g = g.max(1);
    let groups = groups.max(1);
    let count = n.clamp(1, groups);
    Partitions {
        count,
        sm_per_partition: (groups / count) * g,
    }
}

/// Every round of a job, N by N, each N under every split mode in turn.
pub fn rounds(job: &Job, budgets: &Budgets, splits: &[SplitMode]) -> Result<Vec<Round>, JobError> {
    let mut out = Vec::new();
    for &n in &job.file.n {
        let trials = trials(job, n)?;
        for &split in splits {
            out.push(Round {
                index: out.len() as u32,
                n,
                split,
                slices: slices(job, n, split, budgets)?,
                trials: trials.clone(),
            });
        }
    }
    Ok(out)
}

/// A job for tests: an MLP on synthetic data, then the lines of `extra`.
#[cfg(test)]
pub(crate) fn mlp_job(extra: &str) -> Job {
    Job::parse(
        &format!("model: {{kind: mlp}}\ndata: {{source: synthetic}}\n{extra}"),
        std::path::Path::new("j.yaml"),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn one(b: &DeviceBudget) -> Budgets {
        Budgets::one(b.clone())
    }

    const DEV: DeviceBudget = DeviceBudget {
        memory_bytes: 1 << 30,
        sm_count: None,
        sm_granularity: None,
        sm_groups: None,
        mem_granularity: None,
    };

    #[test]
    fn rounds_cover_every_n_and_split_with_stable_trials() {
        let j = mlp_job("n: [1, 3]\nsplits: [shared, logical]\n");
        let r = rounds(&j, &one(&DEV), &j.file.splits).unwrap();
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
        let j = mlp_job("memory:\n  mib_per_slice: 4096\n");
        let e = slice_cap(&j, 1, &DEV).unwrap_err().to_string();
        assert!(
            e.contains("above the device") && e.contains("line 4"),
            "{e}"
        );
        let j = mlp_job("memory:\n  mib_per_slice: 512\n");
        assert!(slice_cap(&j, 2, &DEV).is_ok());
        assert!(slice_cap(&j, 3, &DEV).is_err());
    }

    #[test]
    fn green_partitions_share_when_n_is_large() {
        assert_eq!(
            partitions_of_groups(132 / 8, 8, 1),
            Partitions {
                count: 1,
                sm_per_partition: 128
            }
        );
        assert_eq!(
            partitions_of_groups(132 / 8, 8, 4),
            Partitions {
                count: 4,
                sm_per_partition: 32
            }
        );
        let p = partitions_of_groups(132 / 8, 8, 34);
        assert_eq!(
            p,
            Partitions {
                count: 16,
                sm_per_partition: 8
            }
        );
    }

    #[test]
    fn shares_follow_the_weights_and_add_up() {
        assert_eq!(shares(1000, &[3.0, 2.0], false), vec![600, 400]);
        assert_eq!(shares(64, &[3.0, 2.0], false), vec![38, 26]);
        assert_eq!(shares(10, &[1.0; 4], false), vec![3, 3, 2, 2]);
        assert_eq!(
            shares(64, &[5.0, 3.0, 2.0, 1.0], false),
            vec![29, 17, 12, 6]
        );
        assert_eq!(shares(8, &[100.0, 1.0], false), vec![8, 0]);
        assert_eq!(shares(8, &[100.0, 1.0], true), vec![7, 1]);
        for (total, w) in [
            (7usize, vec![0.3, 0.3, 0.4]),
            (1, vec![1.0, 1.0]),
            (0, vec![2.0]),
        ] {
            assert_eq!(shares(total, &w, false).iter().sum::<usize>(), total);
        }
    }

    #[test]
    fn ratios_size_caps_and_green_partitions_unequally() {
        let gpu = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: None,
            mem_granularity: None,
        };
        let j = mlp_job("ratios: [5, 3]\nmemory: {fraction: 0.8}\n");
        let s = slices(&j, 7, SplitMode::Green, &one(&gpu)).unwrap();
        assert_eq!(s.len(), 2, "the plan has its own slice count whatever N is");
        // 16 groups of 8 SMs split 5:3 → 10 and 6 groups.
        assert_eq!((s[0].sm_count, s[1].sm_count), (Some(80), Some(48)));
        assert_eq!((s[0].partition, s[1].partition), (Some(0), Some(1)));
        let budget = (80u64 << 30) as f64 * 0.8;
        assert_eq!(s[0].mem_cap_bytes, Some((budget * 5.0 / 8.0) as u64));
        assert_eq!(s[1].mem_cap_bytes, Some((budget * 3.0 / 8.0) as u64));
        // On the CPU there are no SMs; caps apply in capped modes only.
        let cpu = slices(&j, 2, SplitMode::Logical, &one(&DEV)).unwrap();
        assert!(cpu
            .iter()
            .all(|s| s.sm_count.is_none() && s.partition.is_none()));
        let shared = slices(&j, 2, SplitMode::Shared, &one(&DEV)).unwrap();
        assert!(shared.iter().all(|s| s.mem_cap_bytes.is_none()));
    }

    #[test]
    fn partitions_follow_the_groups_the_driver_makes() {
        // A device whose processing clusters leave SMs over: 14 groups of 8, not 132 / 8 = 16.
        let gpu = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: Some(14),
            mem_granularity: None,
        };
        let j = mlp_job("");
        let s = slices(&j, 34, SplitMode::Green, &one(&gpu)).unwrap();
        let parts: BTreeSet<_> = s.iter().map(|s| s.partition).collect();
        assert_eq!(parts.len(), 14, "one partition per group the driver makes");
        assert!(s.iter().all(|s| s.sm_count == Some(8)));
        let two = slices(&j, 2, SplitMode::Green, &one(&gpu)).unwrap();
        assert_eq!((two[0].sm_count, two[1].sm_count), (Some(56), Some(56)));
        // 14 groups split 5:3 by largest remainder: 8.75 → 9 and 5.25 → 5 groups.
        let r = mlp_job("ratios: [5, 3]\n");
        let s = slices(&r, 2, SplitMode::Green, &one(&gpu)).unwrap();
        assert_eq!((s[0].sm_count, s[1].sm_count), (Some(72), Some(40)));
        // A driver answer above what the SMs allow is not trusted.
        let odd = DeviceBudget {
            sm_groups: Some(40),
            ..gpu
        };
        assert_eq!(odd.groups(), Some((16, 8)));
    }

    #[test]
    fn caps_are_whole_pages_of_the_device_memory() {
        let gpu = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: None,
            mem_granularity: Some(2 << 20),
        };
        // 0.9 of 80 GiB over 7 slices is not a whole number of 2 MiB pages: rounded down.
        let j = mlp_job("memory: {fraction: 0.9}\n");
        let s = slices(&j, 7, SplitMode::Logical, &one(&gpu)).unwrap();
        let exact = ((80u64 << 30) as f64 * 0.9 / 7.0) as u64;
        let cap = s[0].mem_cap_bytes.unwrap();
        assert_eq!(cap % (2 << 20), 0);
        assert!(cap <= exact && exact - cap < 2 << 20, "{cap} vs {exact}");
        // An odd number of MiB per slice: the cap in force is one page less.
        let j = mlp_job("memory: {mib_per_slice: 1001}\n");
        let s = slices(&j, 2, SplitMode::Logical, &one(&gpu)).unwrap();
        assert_eq!(s[0].mem_cap_bytes, Some(1000 << 20));
        // Never below one page, and unequal caps are rounded too.
        assert_eq!(gpu.real_cap(1), 2 << 20);
        let j = mlp_job("ratios: [5, 3]\nmemory: {mib_per_slice: 1001}\n");
        let s = slices(&j, 2, SplitMode::Logical, &one(&gpu)).unwrap();
        assert!(s.iter().all(|s| s.mem_cap_bytes.unwrap() % (2 << 20) == 0));
        // The CPU has no pages: caps stay as computed.
        assert_eq!(DEV.real_cap(12345), 12345);
        // Without green contexts there are no SM groups to plan.
        let plain = DeviceBudget {
            sm_granularity: None,
            ..gpu
        };
        assert_eq!(plain.groups(), None);
    }

    #[test]
    fn explicit_slices_round_their_sms_and_must_fit() {
        let gpu = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: None,
            mem_granularity: None,
        };
        let j = mlp_job("slices:\n  - {sm: 64, mem_mib: 30000}\n  - {sm: 37, mem_mib: 20000}\n  - {mem_mib: 1000}\n");
        let s = slices(&j, 3, SplitMode::Green, &one(&gpu)).unwrap();
        assert_eq!(
            s.iter().map(|s| s.sm_count).collect::<Vec<_>>(),
            vec![Some(64), Some(40), Some(24)]
        );
        assert_eq!(s[1].mem_cap_bytes, Some(20000 << 20));
        let j = mlp_job("slices:\n  - {sm: 100}\n  - {sm: 40}\n");
        let e = slices(&j, 2, SplitMode::Green, &one(&gpu))
            .unwrap_err()
            .to_string();
        assert!(e.contains("need 144 SMs") && e.contains("line 3"), "{e}");
        let j = mlp_job("slices:\n  - {mem_mib: 900}\n  - {mem_mib: 200}\n");
        let e = slices(&j, 2, SplitMode::Logical, &one(&DEV))
            .unwrap_err()
            .to_string();
        assert!(e.contains("above the device"), "{e}");
    }

    #[test]
    fn slices_on_two_devices_share_each_device_alone() {
        let h100 = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: None,
            mem_granularity: None,
        };
        let a100 = DeviceBudget {
            memory_bytes: 40 << 30,
            sm_count: Some(108),
            sm_granularity: Some(4),
            sm_groups: None,
            mem_granularity: None,
        };
        let both = Budgets {
            first: h100.clone(),
            more: vec![(1, a100.clone())],
        };
        let j = mlp_job("slices:\n  - {device: 1}\n  - {sm: 64}\n  - {device: 1, sm: 30}\nmemory: {fraction: 0.5}\n");
        assert_eq!(j.devices(), vec![0, 1]);
        let s = slices(&j, 5, SplitMode::Green, &both).unwrap();
        assert_eq!(
            s.iter().map(|s| s.device).collect::<Vec<_>>(),
            vec![1, 0, 1]
        );
        // Device 1: 30 SMs rounded up to 32 of its 108, the other slice takes the 76 left.
        assert_eq!(
            s.iter().map(|s| s.sm_count).collect::<Vec<_>>(),
            vec![Some(76), Some(64), Some(32)]
        );
        // Each slice is its own partition, numbered as the slice.
        assert_eq!(
            s.iter().map(|s| s.partition).collect::<Vec<_>>(),
            vec![Some(0), Some(1), Some(2)]
        );
        // Half of each device's memory, shared by the slices on it.
        assert_eq!(s[0].mem_cap_bytes, Some((20u64 << 30) / 2));
        assert_eq!(s[1].mem_cap_bytes, Some(40u64 << 30));
        assert_eq!(s[2].mem_cap_bytes, s[0].mem_cap_bytes);
        // Without device 1's budget the plan names the slice that asks for it.
        let e = slices(&j, 5, SplitMode::Logical, &one(&h100))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("slices.0.device")
                && e.contains("device 1 is not among those open here (0)"),
            "{e}"
        );
        // Caps are checked against the memory of the slice's own device.
        let j = mlp_job("slices:\n  - {mem_mib: 50000}\n  - {device: 1, mem_mib: 50000}\n");
        let e = slices(&j, 2, SplitMode::Logical, &both)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("slices on device 1 add up to 50000 MiB") && e.contains("40960 MiB"),
            "{e}"
        );
        // An equal plan stays on device 0.
        let eq = slices(&mlp_job(""), 3, SplitMode::Logical, &both).unwrap();
        assert!(eq.iter().all(|s| s.device == 0));
    }

    #[test]
    fn a_fused_group_holds_at_most_the_trials_over_the_slices() {
        assert_eq!(fused_width(12, 3, false), 4);
        assert_eq!(fused_width(13, 3, false), 5);
        assert_eq!(fused_width(3, 2, false), 2);
        assert_eq!(fused_width(1, 16, false), 1);
        assert_eq!(fused_width(0, 2, false), 1);
        assert_eq!(fused_width(5, 0, false), 5);
        assert_eq!(fused_width(34, 2, true), CPU_FUSED_WIDTH);
        assert_eq!(fused_width(3, 2, true), 2);
    }

    #[test]
    fn a_fused_round_splits_the_budget_over_its_slices() {
        let gpu = DeviceBudget {
            memory_bytes: 80 << 30,
            sm_count: Some(132),
            sm_granularity: Some(8),
            sm_groups: None,
            mem_granularity: None,
        };
        let j = mlp_job("memory: {fraction: 0.8}\n");
        // One slice on a GPU, holding the whole budget.
        let s = slices(&j, 8, SplitMode::Fused, &one(&gpu)).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(
            s[0].mem_cap_bytes,
            Some(((80u64 << 30) as f64 * 0.8) as u64)
        );
        assert!(s[0].partition.is_none() && s[0].sm_count.is_none());
        // One per core on the CPU, never more than the trials.
        let cores = fused_slices(&DEV);
        let s = slices(&j, 1000, SplitMode::Fused, &one(&DEV)).unwrap();
        assert_eq!(s.len() as u32, cores);
        assert!(s.iter().all(|s| s.mem_cap_bytes.is_some()));
        assert_eq!(
            slices(&j, 1, SplitMode::Fused, &one(&DEV)).unwrap().len(),
            1
        );
    }
}
