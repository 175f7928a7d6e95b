//! The bounds on what one run holds in memory: trials, parameter values and their bytes, checked when a job loads.

use super::Job;
use crate::error::JobError;

/// The most trials a sweep runs (`run_cap`, or the points of a grid); each one is held in
/// memory, with its parameter values, while the sweep runs.
pub const MAX_TRIALS: u64 = 50_000;
/// The most parameter values the trials of one run hold in memory in all (trials × values of
/// each): 50,000 trials of the 7 built-in values, or fewer trials with more parameters.
pub const MAX_VALUES: u64 = 350_000;
/// The most bytes of parameter values one trial holds (names and values, as in its `params`
/// cell): a row of the results files stays well under their longest line.
pub const MAX_TRIAL_BYTES: u64 = 64 * 1024;
/// The most bytes of parameter values the trials of one run hold in all (trials × bytes of each).
pub const MAX_RUN_BYTES: u64 = 32 << 20;

/// Checks that `trials` trials of `job` fit the bounds on what a run holds in memory
/// ([`MAX_TRIALS`], [`MAX_VALUES`]). The error names `key` and says `what` sets the count
/// (e.g. "asks for"), then `hint`.
pub fn check_trial_count(
    job: &Job,
    trials: u64,
    key: &str,
    what: &str,
    hint: &str,
) -> Result<(), JobError> {
    if trials > MAX_TRIALS {
        return Err(job.invalid(
            key,
            format!("{what} {trials} trials, more than a run holds (at most {MAX_TRIALS}){hint}"),
        ));
    }
    let each = job.values_per_trial() as u64;
    let values = trials.saturating_mul(each);
    if values > MAX_VALUES {
        return Err(job.invalid(
            key,
            format!(
                "{what} {trials} trials of {each} parameter values each ({values} values), more \
                 than a run holds (at most {MAX_VALUES} values: {} trials of {each} values){hint}",
                MAX_VALUES / each.max(1)
            ),
        ));
    }
    let bytes = job.space.bytes_per_point();
    if bytes > MAX_TRIAL_BYTES {
        return Err(job.invalid(
            "parameters",
            format!(
                "hold up to {bytes} bytes of names and values per trial, more than a trial \
                 holds (at most {MAX_TRIAL_BYTES}): shorten the longest values"
            ),
        ));
    }
    let held = trials.saturating_mul(bytes);
    if held > MAX_RUN_BYTES {
        return Err(job.invalid(
            key,
            format!(
                "{what} {trials} trials of up to {bytes} bytes of parameter values each ({held} \
                 bytes), more than a run holds (at most {MAX_RUN_BYTES} bytes: {} trials of \
                 {bytes} bytes){hint}",
                MAX_RUN_BYTES / bytes.max(1)
            ),
        ));
    }
    Ok(())
}
