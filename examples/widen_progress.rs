//! Appends one progress row whose key `progress.csv`'s header lacks, with the project's own writer: the widening rewrite of the file alone, as `bench/results-memory.sh` times it.
//!
//! `cargo run --release --example widen_progress -- DIR [KEY]`

use std::path::PathBuf;
use std::process::ExitCode;

use gpumux::report::{ProgressRow, ReportWriter};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        eprintln!("usage: widen_progress DIR [KEY]");
        return ExitCode::from(2);
    };
    let key = args.get(1).cloned().unwrap_or_else(|| "grad_norm".into());
    let mut row = ProgressRow {
        trial_id: "widened".into(),
        split: "logical".into(),
        epoch: 1,
        ..ProgressRow::default()
    };
    row.extra.insert(key, 0.5);
    let written = ReportWriter::append(&dir).and_then(|mut w| w.progress(&row));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
