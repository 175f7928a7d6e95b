//! Writing `runs.csv`, `trials.csv` and `progress.csv` one flushed row at a time, and reading them back.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ProgressRow, RunRow, TrialRow};
use crate::error::ReportError;

/// The file with one row per round.
pub const RUNS_CSV: &str = "runs.csv";
/// The file with one row per trial.
pub const TRIALS_CSV: &str = "trials.csv";
/// The file with one row per trial and epoch.
pub const PROGRESS_CSV: &str = "progress.csv";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn csv_err(path: &Path) -> impl FnOnce(::csv::Error) -> ReportError + '_ {
    move |source| ReportError::Csv {
        path: path.to_path_buf(),
        source,
    }
}

/// The header record of a row type: its field names, in order.
fn header_of<T: Serialize + Default>() -> Result<::csv::StringRecord, ReportError> {
    let invalid = |e: &dyn std::fmt::Display| ReportError::Invalid(format!("row header: {e}"));
    let mut writer = ::csv::Writer::from_writer(Vec::new());
    writer.serialize(T::default()).map_err(|e| invalid(&e))?;
    let bytes = writer.into_inner().map_err(|e| invalid(&e))?;
    let mut reader = ::csv::Reader::from_reader(bytes.as_slice());
    let header = reader.headers().map_err(|e| invalid(&e))?;
    Ok(header.clone())
}

/// One CSV file open for writing; every row is flushed as soon as it is written.
struct Sink {
    path: PathBuf,
    writer: ::csv::Writer<File>,
}

impl Sink {
    fn open<T: Serialize + Default>(path: PathBuf, append: bool) -> Result<Self, ReportError> {
        let header = header_of::<T>()?;
        let existing = append && non_empty(&path)?;
        if existing {
            check_header(&path, &header)?;
        }
        let mut file = open_file(&path, append)?;
        if existing {
            end_with_newline(&path, &mut file)?;
        }
        let writer = ::csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(file);
        let mut sink = Sink { path, writer };
        if !existing {
            sink.writer
                .write_record(&header)
                .map_err(csv_err(&sink.path))?;
            sink.flush()?;
        }
        Ok(sink)
    }

    fn write<T: Serialize>(&mut self, row: &T) -> Result<(), ReportError> {
        self.writer.serialize(row).map_err(csv_err(&self.path))?;
        self.flush()
    }

    /// Hands the row to the OS and to the disk (fsync), so a crash right after loses nothing.
    fn flush(&mut self) -> Result<(), ReportError> {
        self.writer.flush().map_err(io_err(&self.path))?;
        self.writer
            .get_ref()
            .sync_data()
            .map_err(io_err(&self.path))
    }
}

fn non_empty(path: &Path) -> Result<bool, ReportError> {
    match fs::metadata(path) {
        Ok(meta) => Ok(meta.len() > 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn open_file(path: &Path, append: bool) -> Result<File, ReportError> {
    let mut options = OpenOptions::new();
    if append {
        options.read(true).append(true).create(true);
    } else {
        options.write(true).create(true).truncate(true);
    }
    options.open(path).map_err(io_err(path))
}

/// Appending to a file written with other columns would corrupt it: refuse instead.
fn check_header(path: &Path, expected: &::csv::StringRecord) -> Result<(), ReportError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = ::csv::Reader::from_reader(BufReader::new(file));
    let found = reader.headers().map_err(csv_err(path))?;
    if found == expected {
        return Ok(());
    }
    Err(ReportError::Invalid(format!(
        "{}: cannot append: its columns are `{}`, expected `{}`",
        path.display(),
        found.iter().collect::<Vec<_>>().join(","),
        expected.iter().collect::<Vec<_>>().join(","),
    )))
}

/// A row cut short by an interruption (a kill in the middle of a write) is dropped, so the
/// file reads cleanly and the next row starts on a line of its own.
fn end_with_newline(path: &Path, file: &mut File) -> Result<(), ReportError> {
    let len = file.seek(SeekFrom::End(0)).map_err(io_err(path))?;
    let mut tail = Vec::new();
    let from = len.saturating_sub(1 << 16);
    file.seek(SeekFrom::Start(from)).map_err(io_err(path))?;
    file.read_to_end(&mut tail).map_err(io_err(path))?;
    if tail.last() == Some(&b'\n') {
        return Ok(());
    }
    let keep = match tail.iter().rposition(|&b| b == b'\n') {
        Some(i) => from + i as u64 + 1,
        None if from == 0 => 0,
        None => {
            return Err(ReportError::Invalid(format!(
                "{}: its last line is over 64 KiB",
                path.display()
            )))
        }
    };
    file.set_len(keep).map_err(io_err(path))?;
    file.sync_data().map_err(io_err(path))
}

/// Writes the three report files of one output directory.
pub struct ReportWriter {
    dir: PathBuf,
    runs: Sink,
    trials: Sink,
    progress: Sink,
}

impl ReportWriter {
    /// Creates `dir` if needed and opens its report files. With `append`, existing files keep
    /// their rows and header (their columns must match); without it, they are rewritten.
    /// Each file has its header as soon as this returns.
    pub fn open(dir: &Path, append: bool) -> Result<Self, ReportError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        Ok(ReportWriter {
            dir: dir.to_path_buf(),
            runs: Sink::open::<RunRow>(dir.join(RUNS_CSV), append)?,
            trials: Sink::open::<TrialRow>(dir.join(TRIALS_CSV), append)?,
            progress: Sink::open::<ProgressRow>(dir.join(PROGRESS_CSV), append)?,
        })
    }

    /// Opens `dir` with fresh report files.
    pub fn create(dir: &Path) -> Result<Self, ReportError> {
        Self::open(dir, false)
    }

    /// Opens `dir`, adding rows to the report files already there.
    pub fn append(dir: &Path) -> Result<Self, ReportError> {
        Self::open(dir, true)
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one round's row to `runs.csv`; it is with the OS when this returns.
    pub fn run(&mut self, row: &RunRow) -> Result<(), ReportError> {
        self.runs.write(row)
    }

    /// Writes one trial's row to `trials.csv`; it is with the OS when this returns.
    pub fn trial(&mut self, row: &TrialRow) -> Result<(), ReportError> {
        self.trials.write(row)
    }

    /// Writes one epoch's row to `progress.csv`; it is with the OS when this returns.
    pub fn progress(&mut self, row: &ProgressRow) -> Result<(), ReportError> {
        self.progress.write(row)
    }
}

/// Reads every row of a report file; errors name the file and, for a bad row, its line.
pub fn read_rows<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, ReportError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = ::csv::Reader::from_reader(BufReader::new(file));
    reader
        .deserialize()
        .map(|row| row.map_err(csv_err(path)))
        .collect()
}

/// Reads `runs.csv` in `dir`.
pub fn read_runs(dir: &Path) -> Result<Vec<RunRow>, ReportError> {
    read_rows(&dir.join(RUNS_CSV))
}

/// Reads `trials.csv` in `dir`.
pub fn read_trials(dir: &Path) -> Result<Vec<TrialRow>, ReportError> {
    read_rows(&dir.join(TRIALS_CSV))
}

/// Reads `progress.csv` in `dir`.
pub fn read_progress(dir: &Path) -> Result<Vec<ProgressRow>, ReportError> {
    read_rows(&dir.join(PROGRESS_CSV))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn run_row(split: &str, n: u32, tpt: f64) -> RunRow {
        RunRow {
            model: "mlp".into(),
            dataset: "mnist-10k".into(),
            split: split.into(),
            n,
            slices: n,
            sm_per_slice: None,
            slices_per_partition: None,
            mem_cap_mib: None,
            makespan_s: tpt * f64::from(n),
            time_per_training_s: tpt,
            samples_per_s: 1000.0 / tpt,
            gpu_util_mean: None,
            gpu_mem_peak_mib: None,
            power_w_mean: None,
            sm_clock_mhz_mean: None,
            proc_mem_peak_mib: None,
            device: "cpu: 2 cores".into(),
            backend: "cpu".into(),
            epochs: 2,
            ok: n,
            failed: 0,
            slice_plan: String::new(),
        }
    }

    pub(crate) fn trial_row(
        id: &str,
        split: &str,
        acc: Option<f64>,
        loss: Option<f64>,
    ) -> TrialRow {
        TrialRow {
            trial_id: id.into(),
            round: 0,
            split: split.into(),
            n: 1,
            slice: 0,
            model: "mlp".into(),
            params_lr: 0.01,
            params_batch_size: 64,
            params_optimizer: "sgd".into(),
            params_momentum: 0.9,
            params_weight_decay: 1e-4,
            params_dropout: 0.1,
            seed: 7,
            state: if acc.is_some() { "COMPLETE" } else { "FAIL" }.into(),
            test_acc: acc,
            final_loss: loss,
            epochs: 2,
            wall_s: 1.5,
            samples_per_s: Some(123.25),
            peak_mem_mib: None,
            mem_cap_mib: Some(512.0),
            error: String::new(),
            metric: acc,
            params: "{}".into(),
        }
    }

    fn progress_row(epoch: u32) -> ProgressRow {
        ProgressRow {
            round: 1,
            trial_id: "t0".into(),
            split: "green".into(),
            n: 3,
            epoch,
            train_loss: 0.1 + f64::from(epoch),
            train_acc: 0.5,
            test_loss: 0.7,
            test_acc: 0.1 / 3.0,
            wall_s: 2.0,
        }
    }

    #[test]
    fn rows_round_trip_with_empty_and_full_options() {
        let dir = tempfile::tempdir().unwrap();
        let mut full = run_row("green", 5, 1.0 / 3.0);
        full.sm_per_slice = Some(26.4);
        full.slices_per_partition = Some(1.5);
        full.mem_cap_mib = Some(15_872.0);
        full.gpu_util_mean = Some(97.125);
        full.gpu_mem_peak_mib = Some(40_000.5);
        full.power_w_mean = Some(612.0);
        full.sm_clock_mhz_mean = Some(1_755.5);
        full.slice_plan = "80sm/30000MiB;48sm/20000MiB".into();
        let runs = vec![run_row("shared", 1, 12.5), full];
        let mut failed = trial_row("t1", "mps", None, None);
        failed.error = "needs 9.0 MiB, slice cap 8.0 MiB, \"quoted\"\nsecond line".into();
        let trials = vec![
            trial_row("t0", "mps", Some(0.1 + 0.2), Some(1e-300)),
            failed,
        ];
        let progress = vec![progress_row(0), progress_row(1)];
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        runs.iter().for_each(|r| writer.run(r).unwrap());
        trials.iter().for_each(|r| writer.trial(r).unwrap());
        progress.iter().for_each(|r| writer.progress(r).unwrap());
        drop(writer);
        assert_eq!(read_runs(dir.path()).unwrap(), runs);
        assert_eq!(read_trials(dir.path()).unwrap(), trials);
        assert_eq!(read_progress(dir.path()).unwrap(), progress);
        let text = fs::read_to_string(dir.path().join(RUNS_CSV)).unwrap();
        let first = text.lines().nth(1).unwrap();
        assert!(first.contains(",,,"), "None is an empty cell: {first}");
    }

    #[test]
    fn sm_clock_column_follows_power_in_the_header() {
        let header = header_of::<RunRow>().unwrap();
        let names: Vec<&str> = header.iter().collect();
        let power = names.iter().position(|n| *n == "power_w_mean").unwrap();
        assert_eq!(names[power + 1], "sm_clock_mhz_mean");
        assert_eq!(names[power + 2], "proc_mem_peak_mib");
        assert_eq!(names.len(), 22);
        assert_eq!(names[21], "slice_plan");
    }

    #[test]
    fn runs_written_before_the_sm_clock_column_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let old = "model,dataset,split,n,slices,sm_per_slice,slices_per_partition,mem_cap_mib,\
                   makespan_s,time_per_training_s,samples_per_s,gpu_util_mean,gpu_mem_peak_mib,\
                   power_w_mean,device,backend,epochs,ok,failed\n\
                   mlp,mnist-10k,shared,2,2,,,,25,12.5,80,97.5,1024,300,cpu: 2 cores,cpu,2,2,0\n";
        fs::write(dir.path().join(RUNS_CSV), old).unwrap();
        let mut want = run_row("shared", 2, 12.5);
        want.gpu_util_mean = Some(97.5);
        want.gpu_mem_peak_mib = Some(1024.0);
        want.power_w_mean = Some(300.0);
        assert_eq!(read_runs(dir.path()).unwrap(), vec![want]);
        // Appending new rows to such a file would misalign its columns: refused.
        let err = ReportWriter::append(dir.path()).err().unwrap().to_string();
        assert!(err.contains("cannot append"), "{err}");
    }

    #[test]
    fn a_row_is_on_disk_when_the_call_returns() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        let row = trial_row("t9", "process", Some(0.5), Some(0.25));
        writer.trial(&row).unwrap();
        assert_eq!(read_trials(dir.path()).unwrap(), vec![row]);
        writer.run(&run_row("process", 2, 3.0)).unwrap();
        assert_eq!(read_runs(dir.path()).unwrap().len(), 1);
        drop(writer);
    }

    #[test]
    fn headers_are_written_before_any_row() {
        let dir = tempfile::tempdir().unwrap();
        let _writer = ReportWriter::create(dir.path().join("new/sub").as_path()).unwrap();
        let text = fs::read_to_string(dir.path().join("new/sub").join(PROGRESS_CSV)).unwrap();
        assert!(text.starts_with("round,trial_id,split,n,epoch,"), "{text}");
        assert!(read_progress(&dir.path().join("new/sub"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn append_keeps_one_header_and_all_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.run(&run_row("shared", 1, 4.0)).unwrap();
        drop(writer);
        let mut writer = ReportWriter::append(dir.path()).unwrap();
        writer.run(&run_row("shared", 2, 3.0)).unwrap();
        drop(writer);
        let text = fs::read_to_string(dir.path().join(RUNS_CSV)).unwrap();
        assert_eq!(text.matches("model,dataset,split").count(), 1, "{text}");
        let ns: Vec<u32> = read_runs(dir.path()).unwrap().iter().map(|r| r.n).collect();
        assert_eq!(ns, vec![1, 2]);
    }

    #[test]
    fn create_without_append_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.run(&run_row("shared", 1, 4.0)).unwrap();
        drop(writer);
        drop(ReportWriter::create(dir.path()).unwrap());
        assert!(read_runs(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn append_after_a_cut_row_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(ReportWriter::create(dir.path()).unwrap());
        let path = dir.path().join(TRIALS_CSV);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"t0,0,shared").unwrap();
        drop(file);
        let mut writer = ReportWriter::append(dir.path()).unwrap();
        writer
            .trial(&trial_row("t1", "shared", Some(0.5), None))
            .unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("t0,0,shared"), "the cut row is gone: {text}");
        assert_eq!(text.lines().count(), 2, "header and the new row: {text}");
        assert_eq!(
            read_trials(dir.path()).unwrap().len(),
            1,
            "the file reads cleanly"
        );
    }

    #[test]
    fn append_refuses_other_columns() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(RUNS_CSV), "a,b\n1,2\n").unwrap();
        let err = ReportWriter::append(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains(RUNS_CSV) && err.contains("cannot append"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_runs(dir.path()).unwrap_err();
        assert!(matches!(err, ReportError::Io { .. }));
        assert!(err
            .to_string()
            .contains(&*dir.path().join(RUNS_CSV).to_string_lossy()));
    }

    #[test]
    fn a_malformed_row_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = ReportWriter::create(dir.path()).unwrap();
        writer.progress(&progress_row(0)).unwrap();
        drop(writer);
        let path = dir.path().join(PROGRESS_CSV);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"1,t0,green,3,not-a-number,0.1,0.5,0.7,0.2,2.0\n")
            .unwrap();
        drop(file);
        let err = read_progress(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ReportError::Csv { .. }));
        assert!(
            text.contains(PROGRESS_CSV) && text.contains("line: 3"),
            "{text}"
        );
    }
}
