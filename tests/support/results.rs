//! The results CSVs read back as rows keyed by their header, and rows counted while a run writes them.

use std::collections::HashMap;
use std::path::Path;

/// One CSV record keyed by its header.
pub type Row = HashMap<String, String>;

/// Reads a CSV file into records keyed by header.
pub fn read_csv(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let headers = r.headers().expect("headers").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("record");
            headers
                .iter()
                .map(String::from)
                .zip(rec.iter().map(String::from))
                .collect()
        })
        .collect()
}

/// The rows of `out/trials.csv`.
pub fn trials_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("trials.csv"))
}

/// The rows of `out/progress.csv`.
pub fn progress_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("progress.csv"))
}

/// The rows of `out/runs.csv`.
pub fn runs_csv(out: &Path) -> Vec<Row> {
    read_csv(&out.join("runs.csv"))
}

/// Each trial's id and state, in the order of `out/trials.csv`.
pub fn states(out: &Path) -> Vec<(String, String)> {
    trials_csv(out)
        .into_iter()
        .map(|r| (r["trial_id"].clone(), r["state"].clone()))
        .collect()
}

/// Whole lines of a file after its header (a cut last line counts as nothing); 0 for a file
/// not there yet.
pub fn rows_in(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count().saturating_sub(1))
        .unwrap_or(0)
}

/// The distinct `trial_id`s among the whole lines of a progress CSV (a cut last line counts as
/// nothing); 0 for a file not there yet.
pub fn trials_with_progress(path: &Path) -> usize {
    let Ok(bytes) = std::fs::read(path) else {
        return 0;
    };
    let whole = bytes.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
    let mut r = csv::Reader::from_reader(&bytes[..whole]);
    let Some(col) = r
        .headers()
        .ok()
        .and_then(|h| h.iter().position(|f| f == "trial_id"))
    else {
        return 0;
    };
    let ids: std::collections::HashSet<String> = r
        .records()
        .filter_map(|rec| rec.ok().and_then(|rec| rec.get(col).map(String::from)))
        .collect();
    ids.len()
}
