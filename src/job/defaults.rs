//! A job file's defaults, as a value: what a job file that says nothing holds, for jobs made from flags.

use super::schema::{default_n, default_seed, default_splits, default_sweep_split};
use super::JobFile;

impl Default for JobFile {
    /// The job file `{}`: every field at the default a job file gets when it leaves it out.
    fn default() -> Self {
        JobFile {
            name: None,
            model: None,
            data: None,
            command: None,
            program: None,
            description: None,
            project: None,
            entity: None,
            metric: Default::default(),
            run_cap: None,
            concurrency: Default::default(),
            split: default_sweep_split(),
            train: Default::default(),
            seed: default_seed(),
            method: Default::default(),
            parameters: Default::default(),
            n: default_n(),
            splits: default_splits(),
            memory: Default::default(),
            backend: Default::default(),
            engine: Default::default(),
            faults: Vec::new(),
            slices: None,
            ratios: None,
            parallel: None,
            early_terminate: None,
            bayes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_empty_job_file() {
        let empty: JobFile = serde_yaml::from_str("{}").unwrap();
        assert_eq!(JobFile::default(), empty);
    }
}
