//! The checks of a loaded job: every key's value and how keys go together, each refusal naming its key and line.

use std::collections::BTreeMap;

use super::{
    limits, BatchRatios, Concurrency, Hyper, Job, ModelKind, BUILTIN_METRICS, MAX_DEVICES, MAX_MIB,
    MAX_N, MAX_NAME_LEN, MAX_RATIO, MAX_REPLICAS, MAX_SM, PARAMETERS,
};
use crate::error::JobError;
use crate::space::{Dist, Method};

impl Job {
    pub(super) fn check(&mut self) -> Result<(), JobError> {
        self.take_wandb_keys()?;
        if let Some(folder) = self.file.name.as_deref().and_then(folder_name) {
            crate::note!(
                "note: {}: name {:?} is a display name, as W&B's are: its folders are named {folder:?}",
                self.path.display(),
                self.name
            );
            self.name = folder;
        }
        let f = &self.file;
        if let Err(why) = check_name(&self.name) {
            // Shown escaped (control characters included) and cut short, on one line.
            let mut shown: String = self.name.chars().take(40).collect();
            if shown.len() < self.name.len() {
                shown.push_str("...");
            }
            if f.name.is_some() {
                return Err(self.invalid("name", format!("{why} (got {shown:?})")));
            }
            // The name comes from the file's name: say so.
            return Err(JobError::Invalid {
                path: self.path.clone(),
                key: "name".into(),
                line: None,
                message: format!(
                    "is not set, and the job file's name {shown:?} cannot stand for it: it {why}; set `name`"
                ),
            });
        }
        match (&f.model, &f.command) {
            (Some(_), Some(_)) => {
                return Err(self.invalid("command", "give either model or command, not both"))
            }
            (None, None) => {
                return Err(self.invalid("model", "is missing: give model (with data), or command"))
            }
            (Some(_), None) if f.data.is_none() => {
                return Err(self.invalid("data", "is missing: a built-in model needs data"))
            }
            (None, Some(c)) if c.trim().is_empty() => {
                return Err(self.invalid("command", "must not be empty"))
            }
            (None, Some(c)) => {
                if let Err(e) = shell_words::split(c) {
                    return Err(self.invalid("command", format!("cannot be split into words: {e}")));
                }
            }
            _ => {}
        }
        self.check_model()?;
        if let Some(d) = &f.data {
            if let Err((k, m)) = d.validate() {
                return Err(self.invalid(&format!("data.{k}"), m));
            }
        }
        if f.metric.name.trim().is_empty() {
            return Err(self.invalid("metric.name", "must not be empty"));
        }
        let own = crate::train::builtin_metric_name(&f.metric.name);
        if f.command.is_none() && !BUILTIN_METRICS.contains(&own) {
            return Err(self.invalid(
                "metric.name",
                format!(
                    "`{}` is not a metric of a built-in trial (expected one of {}, or a common name of one: {})",
                    f.metric.name,
                    BUILTIN_METRICS.join(", "),
                    crate::train::COMMON_METRIC_NAMES
                        .iter()
                        .map(|(common, _)| *common)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if let Some(cap) = f.run_cap {
            if cap == 0 || u64::from(cap) > limits::MAX_TRIALS {
                return Err(self.invalid(
                    "run_cap",
                    format!(
                        "must be from 1 to {}, not {cap}: each trial of a sweep is held in memory",
                        limits::MAX_TRIALS
                    ),
                ));
            }
        }
        if let Concurrency::Fixed(c) = f.concurrency {
            if c == 0 || c > MAX_N {
                return Err(self.invalid(
                    "concurrency",
                    format!("must be from 1 to {MAX_N}, or auto, not {c}"),
                ));
            }
        }
        let t = &f.train;
        if t.epochs == 0 || t.epochs > 100_000 {
            return Err(self.invalid(
                "train.epochs",
                format!("must be from 1 to 100000, not {}", t.epochs),
            ));
        }
        let defaults = Hyper {
            lr: t.lr,
            batch_size: t.batch_size,
            optimizer: t.optimizer,
            momentum: t.momentum,
            weight_decay: t.weight_decay,
            dropout: t.dropout,
        };
        if let Err((k, m)) = defaults.check() {
            return Err(self.invalid(&format!("train.{k}"), m));
        }
        self.check_space()?;
        let f = &self.file;
        if f.n.is_empty() {
            return Err(self.invalid("n", "must list at least one N"));
        }
        for &n in &f.n {
            if n == 0 || n > MAX_N {
                return Err(
                    self.invalid("n", format!("must hold values from 1 to {MAX_N}, not {n}"))
                );
            }
        }
        if let Some(d) = duplicate(&f.n) {
            return Err(self.invalid("n", format!("lists {d} twice")));
        }
        if f.splits.is_empty() {
            return Err(self.invalid("splits", "must list at least one split mode"));
        }
        if let Some(d) = duplicate(&f.splits) {
            return Err(self.invalid("splits", format!("lists {d} twice")));
        }
        // Every round of `fib` holds its trials: N of them under each split mode.
        let planned = f.n.iter().map(|&n| u64::from(n)).sum::<u64>() * f.splits.len() as u64;
        limits::check_trial_count(
            self,
            planned,
            "n",
            "with the split modes, make rounds of",
            "",
        )?;
        self.check_memory()?;
        self.check_slices()?;
        self.check_early_terminate()?;
        if self.file.engine.check_every == 0 {
            return Err(self.invalid("engine.check_every", "must be at least 1"));
        }
        if self.file.faults.len() > MAX_N as usize {
            return Err(self.invalid("faults", format!("must list at most {MAX_N} faults")));
        }
        let mut faulty = std::collections::HashSet::new();
        for (i, fault) in self.file.faults.iter().enumerate() {
            if fault.trial >= MAX_N {
                return Err(self.invalid(
                    &format!("faults.{i}.trial"),
                    format!("must be below {MAX_N}"),
                ));
            }
            if !faulty.insert(fault.trial) {
                return Err(self.invalid(
                    &format!("faults.{i}.trial"),
                    format!("names trial {} again: one fault per trial", fault.trial),
                ));
            }
        }
        Ok(())
    }

    /// Checks `early_terminate`: hyperband, with rungs a trial can reach.
    /// W&B's keys: `program` without `command` runs W&B's default command; `description`,
    /// `project` and `entity` are accepted and said to be unused.
    fn take_wandb_keys(&mut self) -> Result<(), JobError> {
        if let Some(program) = &self.file.program {
            if program.trim().is_empty() {
                return Err(self.invalid("program", "must not be empty"));
            }
            if self.file.command.is_none() {
                self.file.command = Some(super::WANDB_DEFAULT_COMMAND.into());
            }
        }
        Ok(())
    }

    /// The notes a loaded job file gets, once: the metric's goal when the file names none, and
    /// W&B's keys that gpumux does not use.
    pub(super) fn say_notes(&self) {
        if !self.file.metric.goal_given {
            crate::note!(
                "note: {}: metric.goal is not given: {} minimized, as W&B does (add `goal: maximize` for a metric where larger is better)",
                self.path.display(),
                self.file.metric.name
            );
        }
        let unused = [
            ("description", self.file.description.is_some()),
            ("project", self.file.project.is_some()),
            ("entity", self.file.entity.is_some()),
        ];
        for (key, given) in unused {
            if given {
                crate::note!(
                    "note: {}: `{key}` is W&B's; gpumux keeps its results in the output folder and does not use it",
                    self.path.display()
                );
            }
        }
    }

    fn check_early_terminate(&self) -> Result<(), JobError> {
        let Some(e) = &self.file.early_terminate else {
            return Ok(());
        };
        if e.kind != "hyperband" {
            return Err(self.invalid(
                "early_terminate.type",
                format!("must be hyperband, not `{}`", e.kind),
            ));
        }
        if e.min_iter == Some(0) {
            return Err(self.invalid("early_terminate.min_iter", "must be at least 1"));
        }
        if !(e.eta >= 2.0 && e.eta.is_finite()) {
            return Err(self.invalid(
                "early_terminate.eta",
                format!("must be at least 2, not {}", e.eta),
            ));
        }
        if e.s == Some(0) {
            return Err(self.invalid("early_terminate.s", "must be at least 1"));
        }
        if e.brackets == Some(0) {
            return Err(self.invalid(
                "early_terminate.brackets",
                "must be at least 1 (1: every trial judged at every rung)",
            ));
        }
        let max_iter = e.max_iter(self.file.train.epochs);
        let min_iter = e.min_iter.unwrap_or(1);
        if max_iter < min_iter {
            let key = if e.max_iter.is_some() {
                "early_terminate.max_iter"
            } else {
                "early_terminate.min_iter"
            };
            return Err(self.invalid(
                key,
                format!("max_iter ({max_iter}) must be at least min_iter ({min_iter})"),
            ));
        }
        Ok(())
    }

    fn check_model(&self) -> Result<(), JobError> {
        let Some(m) = &self.file.model else {
            return Ok(());
        };
        let only = |key: &str, present: bool, kind: ModelKind| {
            if present && m.kind != kind {
                Err(self.invalid(
                    &format!("model.{key}"),
                    format!("only applies to model kind {kind}"),
                ))
            } else {
                Ok(())
            }
        };
        only("hidden", m.hidden.is_some(), ModelKind::Mlp)?;
        only("channels", m.channels.is_some(), ModelKind::Cnn)?;
        only("kernel", m.kernel.is_some(), ModelKind::Cnn)?;
        only("padding", m.padding.is_some(), ModelKind::Cnn)?;
        only("fc", m.fc.is_some(), ModelKind::Cnn)?;
        only("width", m.width.is_some(), ModelKind::Resnet50)?;
        only("stem", m.stem.is_some(), ModelKind::Resnet50)?;
        if let Some(w) = m.width {
            if !(w.is_finite() && (1.0 / 64.0..=4.0).contains(&w)) {
                return Err(self.invalid(
                    "model.width",
                    format!("must be from 0.015625 (1/64) to 4, not {w}"),
                ));
            }
        }
        let width_ok = |w: &usize| (1..=1 << 16).contains(w);
        if let Some(h) = &m.hidden {
            if h.len() > 16 || !h.iter().all(width_ok) {
                return Err(self.invalid(
                    "model.hidden",
                    "must list at most 16 widths, each from 1 to 65536",
                ));
            }
        }
        if let Some(c) = &m.channels {
            if c.len() != 2 || !c.iter().all(width_ok) {
                return Err(self.invalid(
                    "model.channels",
                    "must list two channel counts, each from 1 to 65536",
                ));
            }
        }
        if let Some(k) = m.kernel {
            if k != 3 && k != 5 {
                return Err(self.invalid("model.kernel", format!("must be 3 or 5, not {k}")));
            }
        }
        if let Some(fc) = m.fc {
            if !width_ok(&fc) {
                return Err(self.invalid("model.fc", format!("must be from 1 to 65536, not {fc}")));
            }
        }
        Ok(())
    }

    fn check_space(&mut self) -> Result<(), JobError> {
        let mut dists = BTreeMap::new();
        let external = self.file.command.is_some();
        let flat = crate::space::ParamSpec::flatten(&self.file.parameters)
            .map_err(|e| self.invalid(&e.key, e.message))?;
        for (name, spec) in &flat {
            if !external && !PARAMETERS.contains(&name.as_str()) {
                return Err(self.invalid(
                    &format!("parameters.{name}"),
                    format!(
                        "is not a parameter (expected one of {})",
                        PARAMETERS.join(", ")
                    ),
                ));
            }
            let dist = spec
                .to_dist(name)
                .map_err(|e| self.invalid(&e.key, e.message))?;
            if self.file.method == crate::space::Method::Grid && !dist.is_discrete() {
                return Err(self.invalid(
                    &format!("parameters.{name}"),
                    "grid search needs `value` or `values`, not a range",
                ));
            }
            // An external command's parameters are its own, whatever their names.
            let checked = !external;
            for v in dist.extremes().into_iter().filter(|_| checked) {
                let mut point = BTreeMap::new();
                point.insert(name.clone(), v.clone());
                if let Err((k, m)) = Hyper::from_point(&self.file.train, &point) {
                    let key = if k.starts_with("parameters.") {
                        k
                    } else {
                        format!("parameters.{name}")
                    };
                    // A normal draw is refused when it is drawn, mid-sweep: refused here instead.
                    let m = if dist.is_normal() {
                        format!(
                            "{m}: a {} distribution draws as far as {} standard deviations from its mean, and `{name}` refuses that; use a range (`min`/`max`) or `values`{}",
                            spec.distribution.as_deref().unwrap_or("normal"),
                            crate::space::NORMAL_REACH,
                            if matches!(dist, Dist::Normal { .. }) {
                                ", or log_normal for a value that must be positive"
                            } else {
                                ""
                            }
                        )
                    } else {
                        m
                    };
                    return Err(self.invalid(&key, m));
                }
            }
            if let Dist::LogUniform { max, .. } = &dist {
                if *max < 1.0 && name == "lr" {
                    warn(&format!(
                        "{}: parameters.{name} uses log_uniform, whose min and max are natural-log exponents \
                         (W&B semantics); for bounds given as values use log_uniform_values",
                        self.path.display()
                    ));
                }
            }
            dists.insert(name.clone(), dist);
        }
        self.space.dists = dists;
        if self.space.method == Method::Grid && self.space.grid_size().is_none() {
            return Err(self.invalid(
                "parameters",
                format!(
                    "make a grid of more than 2^64 points ({} parameters): its size overflows",
                    self.space.dists.len()
                ),
            ));
        }
        if self.file.bayes.is_some() && self.space.method != Method::Bayes {
            return Err(self.invalid("bayes", "only applies with `method: bayes`"));
        }
        if self.space.method == Method::Bayes {
            if self.file.run_cap.is_none() {
                return Err(self.invalid(
                    "run_cap",
                    "is missing: a bayes sweep needs the number of trials to propose",
                ));
            }
            if self
                .space
                .dists
                .values()
                .all(|d| matches!(d, Dist::Constant(_)))
            {
                return Err(self.invalid(
                    "method",
                    "bayes needs at least one parameter with `values` or a range to search",
                ));
            }
        }
        Ok(())
    }

    fn check_memory(&self) -> Result<(), JobError> {
        let m = &self.file.memory;
        if m.fraction.is_some() && m.mib_per_slice.is_some() {
            return Err(self.invalid("memory", "give either fraction or mib_per_slice, not both"));
        }
        if let Some(f) = m.fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(self.invalid("memory.fraction", format!("must be in (0, 1], not {f}")));
            }
        }
        if let Some(mib) = m.mib_per_slice {
            if !(mib.is_finite() && mib > 0.0 && mib <= MAX_MIB) {
                return Err(self.invalid(
                    "memory.mib_per_slice",
                    format!("must be a positive number of MiB up to {MAX_MIB}, not {mib}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks `slices`, `ratios` and `parallel`.
    fn check_slices(&self) -> Result<(), JobError> {
        let f = &self.file;
        if f.slices.is_some() && f.ratios.is_some() {
            return Err(self.invalid("ratios", "give either slices or ratios, not both"));
        }
        let positive = |key: &str, w: &[f64]| -> Result<(), JobError> {
            if w.is_empty() || w.len() > MAX_N as usize {
                return Err(self.invalid(key, format!("must list from 1 to {MAX_N} numbers")));
            }
            match w
                .iter()
                .find(|x| !(x.is_finite() && **x > 0.0 && **x <= MAX_RATIO))
            {
                Some(x) => Err(self.invalid(
                    key,
                    format!("must hold positive numbers up to {MAX_RATIO}, not {x}"),
                )),
                None => Ok(()),
            }
        };
        if let Some(r) = &f.ratios {
            positive("ratios", r)?;
        }
        if let Some(s) = &f.slices {
            if s.is_empty() || s.len() > MAX_N as usize {
                return Err(self.invalid("slices", format!("must list from 1 to {MAX_N} slices")));
            }
            for (i, d) in s.iter().enumerate() {
                if d.sm == Some(0) {
                    return Err(self.invalid(&format!("slices.{i}.sm"), "must be at least 1"));
                }
                if let Some(sm) = d.sm.filter(|&sm| sm > MAX_SM) {
                    return Err(self.invalid(
                        &format!("slices.{i}.sm"),
                        format!("must be at most {MAX_SM} SMs, not {sm}"),
                    ));
                }
                if d.device.is_some_and(|o| o >= MAX_DEVICES) {
                    return Err(self.invalid(
                        &format!("slices.{i}.device"),
                        format!("must be a device number below {MAX_DEVICES}"),
                    ));
                }
                if let Some(m) = d.mem_mib {
                    if !(m.is_finite() && m > 0.0 && m <= MAX_MIB) {
                        return Err(self.invalid(
                            &format!("slices.{i}.mem_mib"),
                            format!("must be a positive number of MiB up to {MAX_MIB}, not {m}"),
                        ));
                    }
                }
            }
        }
        if let Some(p) = &f.parallel {
            if let Some(BatchRatios::Weights(w)) = &p.ratios {
                positive("parallel.ratios", w)?;
            }
            let k = self.replicas()?;
            if k == 0 || k > MAX_REPLICAS {
                return Err(self.invalid(
                    "parallel.slices",
                    format!("must be from 1 to {MAX_REPLICAS}, not {k}"),
                ));
            }
            if let Some(BatchRatios::Weights(w)) = &p.ratios {
                if w.len() != k as usize {
                    return Err(self.invalid(
                        "parallel.ratios",
                        format!("lists {} ratios for {k} slices", w.len()),
                    ));
                }
            }
            if let Some(plan) = self.slice_plan_len() {
                if plan != k as usize {
                    let key = if f.slices.is_some() {
                        "slices"
                    } else {
                        "ratios"
                    };
                    return Err(self.invalid(
                        key,
                        format!("plans {plan} slices, but parallel.slices is {k}"),
                    ));
                }
            }
            if (f.train.batch_size as usize) < k as usize {
                return Err(self.invalid(
                    "train.batch_size",
                    format!(
                        "{} is smaller than the {k} slices of parallel: each slice needs at least one row of the global batch",
                        f.train.batch_size
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Why `name` cannot name a job (it names the output folder, `out/<name>`), if it cannot: it
/// must be 1 to [`MAX_NAME_LEN`] letters, digits, `-`, `_` or `.`, and not `.` or `..`.
/// The folder name of a display name (W&B's sweep names hold spaces and signs): each run of
/// characters a folder name cannot hold made one `-`. `None` when `name` is fine as it is, and
/// when it holds a path separator, a control character or nothing else than dots, which are
/// refused as they are.
fn folder_name(name: &str) -> Option<String> {
    if check_name(name).is_ok()
        || name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\')
    {
        return None;
    }
    let mut out = String::new();
    for c in name.trim().chars() {
        if c.is_ascii_alphanumeric() || "-_.".contains(c) {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-').to_string();
    check_name(&out).is_ok().then_some(out)
}

pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(format!(
            "must be at most {MAX_NAME_LEN} characters, not {}",
            name.chars().count()
        ));
    }
    if name == "." || name == ".." {
        return Err("must not be `.` or `..`: the name is a folder under the output folder".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("must be letters, digits, '-', '_' or '.' (it names a folder)".into());
    }
    Ok(())
}

/// A warning printed once on stderr (the library has no logger of its own).
fn warn(message: &str) {
    crate::note!("warning: {message}");
}

fn duplicate<T: PartialEq + std::fmt::Display>(items: &[T]) -> Option<&T> {
    items
        .iter()
        .enumerate()
        .find(|(i, a)| items[..*i].contains(a))
        .map(|(_, a)| a)
}

#[cfg(test)]
mod tests {
    use crate::job::test_jobs::{parse, OK};

    #[test]
    fn errors_name_the_key_and_line() {
        let e = parse(&format!("{OK}n: [1, 0]\n")).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("`n`"), "{e}");
        let e = parse(&format!("{OK}memory:\n  fraction: 1.5\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("memory.fraction"), "{e}");
        let e = parse(&format!("{OK}train:\n  batch_size: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.batch_size") && e.contains("line 4"),
            "{e}"
        );
        let e = parse(&format!("{OK}colour: red\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field `colour`") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn parameters_are_checked_against_their_meaning() {
        let e = parse(&format!("{OK}parameters:\n  lr: {{values: [0.1, -1]}}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameters.lr") && e.contains("positive"), "{e}");
        let e = parse(&format!(
            "{OK}parameters:\n  optimizer: {{values: [sgd, rmsprop]}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("rmsprop"), "{e}");
        let e = parse(&format!("{OK}parameters:\n  colour: {{value: 1}}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parameters.colour") && e.contains("line 4"),
            "{e}"
        );
        let e = parse(&format!(
            "{OK}method: grid\nparameters:\n  lr: {{min: 0.1, max: 0.2}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("grid"), "{e}");
    }

    #[test]
    fn bayes_needs_a_run_cap_and_something_to_search() {
        let e = parse(&format!(
            "{OK}method: bayes\nparameters:\n  lr: {{min: 0.1, max: 0.2}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("run_cap") && e.contains("bayes"), "{e}");
        let e = parse(&format!(
            "{OK}method: bayes\nrun_cap: 8\nparameters:\n  lr: {{value: 0.1}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("method") && e.contains("line"), "{e}");
        parse(&format!(
            "{OK}method: bayes\nrun_cap: 8\nparameters:\n  lr: {{min: 0.1, max: 0.2}}\n"
        ))
        .unwrap();
    }
}
