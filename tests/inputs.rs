//! Inputs are bounded and validated: huge spaces, size overflows, data-file bombs, deep or
//! aliased YAML, out-of-range numbers and durations, names that leave the output folder,
//! duplicate keys, labels outside the classes, and files that are not regular files. Each one
//! is exit code 2 with one line naming the problem, or a bounded run; never a panic, a hang or
//! unbounded memory.
//!
//! Runs that must stay bounded run the real binary with its address space limited, so a
//! regression fails by running out of memory instead of growing the machine's.

mod support;
use support::*;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// The address space a bounded run may use (the bar for these cases is 500 MB resident).
const LIMIT_BYTES: u64 = 1 << 30;

/// Runs gpumux in `cwd` with its address space limited to [`LIMIT_BYTES`], stdin closed.
fn bounded(cwd: &Path, args: &[&str]) -> Output {
    run(cwd, args).address_space(LIMIT_BYTES).output()
}

/// The one `error:` line of a run that must fail with exit code 2, checked to hold every piece
/// of `needles`.
fn refused(o: &Output, needles: &[&str]) -> String {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "a panic: {err}");
    assert_eq!(o.status.code(), Some(2), "exit code: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {:?}", lines[0]);
    }
    lines[0].to_string()
}

/// `job` with an MLP of one epoch on 64 synthetic 1×4×4 samples of 3 classes.
fn tiny(job: JobYaml) -> JobYaml {
    job.model(mlp(&[]))
        .data("{source: synthetic, shape: [1, 4, 4], classes: 3, train_samples: 64, test_samples: 16}")
        .train(epochs(1, 8))
}

/// [`tiny`] sweeping `lr` over a range, at most `run_cap` trials.
fn tiny_sweep(run_cap: u64) -> JobYaml {
    tiny(JobYaml::new())
        .run_cap(run_cap)
        .param("lr", "{min: 0.001, max: 0.1}")
}

/// `job` with an MLP of one epoch in batches of 4 on the data `data`.
fn small_mlp(data: String) -> JobYaml {
    JobYaml::new()
        .model(mlp(&[8]))
        .data(data)
        .train(epochs(1, 4))
}

fn sweep_dry(dir: &Path, job: &Path) -> Output {
    let out = dir.join("out");
    bounded(dir, &["sweep", s(job), "--dry-run", "--out", s(&out)])
}

// Case 1: huge spaces are refused or generated lazily, and a dry run prints a bounded amount.

#[test]
fn a_run_cap_past_the_maximum_is_refused_naming_the_key_and_line() {
    let dir = sandbox();
    for cap in ["1000000000", "50001"] {
        let j = dir.job("cap.yaml", tiny_sweep(cap.parse().expect("a number")));
        refused(
            &sweep_dry(dir.path(), &j),
            &["`run_cap`", "line 4", "50000"],
        );
    }
}

#[test]
fn a_dry_run_of_a_large_space_lists_a_bounded_number_of_trials() {
    let dir = sandbox();
    let j = dir.job("big.yaml", tiny_sweep(50000));
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    let listed = s.lines().filter(|l| l.contains("\"lr\"")).count();
    assert!(listed > 0 && listed <= 100, "{listed} trials listed");
    assert!(
        s.contains("50000 trials in the space") && s.contains("49950 more"),
        "{s}"
    );
}

#[test]
fn a_huge_grid_needs_a_run_cap_and_then_runs_its_first_points() {
    let dir = sandbox();
    let params: String = (0..40)
        .map(|i| format!("  p{i}: {{values: [0, 1]}}\n"))
        .collect();
    let text = format!("command: \"true {{p0}}\"\nmethod: grid\nparameters:\n{params}");
    let j = dir.job("grid.yaml", &text);
    refused(
        &sweep_dry(dir.path(), &j),
        &["`parameters`", "1099511627776", "run_cap"],
    );
    let j = dir.job("grid.yaml", format!("{text}run_cap: 3\n"));
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed = stdout(&o).lines().filter(|l| l.contains("\"p0\"")).count();
    assert_eq!(listed, 3, "{}", stdout(&o));
}

#[test]
fn train_builds_only_the_trial_it_is_asked_for() {
    let dir = sandbox();
    let j = dir.job("t.yaml", tiny_sweep(10));
    let o = bounded(
        dir.path(),
        &["train", s(&j), "--trial", "99999999", "--backend", "cpu"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("trial t99999999"), "{}", stdout(&o));
}

// Case 2: sizes are multiplied with checked arithmetic.

#[test]
fn a_grid_of_2_to_the_64_points_is_refused_not_run_as_zero_trials() {
    let dir = sandbox();
    let params: String = (0..64)
        .map(|i| format!("  p{i}: {{values: [a, b]}}\n"))
        .collect();
    let text = format!("command: \"true {{p0}}\"\nmethod: grid\nparameters:\n{params}");
    let j = dir.job("g64.yaml", &text);
    refused(
        &sweep_dry(dir.path(), &j),
        &["`parameters`", "line 3", "overflows"],
    );
    // A random sweep over the same values draws run_cap points: no grid is counted.
    let text = text.replace("method: grid", "method: random\nrun_cap: 2");
    let j = dir.job("r64.yaml", &text);
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn products_of_sizes_from_the_job_are_bounded() {
    let dir = sandbox();
    let cases: [(&str, &[&str]); 8] = [
        ("memory: {mib_per_slice: 1e300}\n", &["memory.mib_per_slice"]),
        ("slices:\n  - {mem_mib: 1e300}\n  - {mem_mib: 1e300}\n", &["slices.0.mem_mib"]),
        ("ratios: [1e308, 1e308]\n", &["`ratios`"]),
        ("train: {batch_size: 4000000000}\n", &["train.batch_size"]),
        (
            "run_cap: 5\nparameters:\n  batch_size: {min: -9e18, max: 9e18}\n",
            &["parameters.batch_size"],
        ),
        (
            "data: {source: synthetic, train_samples: 100000000}\n",
            &["data.train_samples"],
        ),
        (
            "n: [1024, 1023, 1022, 1021, 1020, 1019, 1018, 1017, 1016, 1015, 1014, 1013, 1012, 1011, 1010, 1009, 1008, 1007, 1006, 1005, 1004, 1003, 1002, 1001, 1000, 999, 998, 997, 996, 995, 994, 993, 992, 991, 990]\n",
            &["`n`", "50000"],
        ),
        (
            "faults:\n  - {trial: 1, kind: nan}\n  - {trial: 1, kind: panic}\n",
            &["faults.1.trial"],
        ),
    ];
    for (extra, needles) in cases {
        let base = if extra.starts_with("data:") {
            "model: {kind: mlp}\n"
        } else {
            "model: {kind: mlp}\ndata: {source: synthetic}\n"
        };
        let j = dir.job("p.yaml", format!("{base}{extra}"));
        let o = bounded(dir.path(), &["fib", s(&j), "--backend", "cpu"]);
        refused(&o, needles);
    }
}

#[test]
fn a_memory_plan_past_its_bound_is_refused_before_any_allocation() {
    let dir = sandbox();
    let j = dir.job(
        "wide.yaml",
        JobYaml::new()
            .model("{kind: cnn, channels: [65536, 65536]}")
            .data("{source: synthetic, shape: [1, 512, 512], train_samples: 64, test_samples: 16}")
            .train("{batch_size: 32, epochs: 1}")
            .backend("cpu"),
    );
    refused(
        &bounded(dir.path(), &["train", s(&j)]),
        &["batch of 32", "memory plan"],
    );
}

// Case 3: data files are bounded by their headers.

/// A training of [`small_mlp`] on the IDX folder `folder`, with `extra` keys of the data.
fn idx_job(dir: &Path, folder: &Path, extra: &str) -> PathBuf {
    small_mlp(format!(
        "{{source: idx, path: {}{extra}}}",
        folder.display()
    ))
    .backend("cpu")
    .write(dir, "idx.yaml")
}

fn train(dir: &Path, job: &Path) -> Output {
    bounded(dir, &["train", s(job)])
}

#[test]
fn a_gzip_bomb_is_read_no_further_than_its_header_declares() {
    let dir = sandbox();
    let folder = idx_folder(dir.path(), 50);
    std::fs::remove_file(folder.join("labels-idx1-ubyte")).expect("rm");
    // The header declares 50 labels; 2 GiB of zeros follow, as 2048 gzip members of 1 MiB each.
    let mut labels = idx(&[50], &[0; 50]);
    labels.resize(1 << 20, 0);
    let mut bomb = gzip(&labels);
    let member = gzip(&vec![0u8; 1 << 20]);
    for _ in 0..2048 {
        bomb.extend_from_slice(&member);
    }
    std::fs::write(folder.join("labels-idx1-ubyte.gz"), &bomb).expect("bomb");
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &train(dir.path(), &j),
        &["labels-idx1-ubyte.gz", "trailing bytes", "declares 50"],
    );
}

#[test]
fn a_header_declaring_more_than_the_file_holds_is_an_error_not_an_allocation() {
    let dir = sandbox();
    let folder = idx_folder(dir.path(), 50);
    // 2^31 - 1 images of 1×1 declared: within the limit, far beyond the file.
    std::fs::write(
        folder.join("images-idx3-ubyte"),
        idx(&[u32::MAX >> 1, 1, 1], &[0; 16]),
    )
    .expect("images");
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &train(dir.path(), &j),
        &["images-idx3-ubyte", "truncated", "found 16"],
    );
    // Beyond the limit: refused from the header alone, raw or gzip.
    let huge = idx(&[60_000, 60_000, 60_000], &[]);
    std::fs::write(folder.join("images-idx3-ubyte"), gzip(&huge)).expect("images");
    refused(
        &train(dir.path(), &j),
        &["images-idx3-ubyte", "more than an IDX file may hold"],
    );
}

#[test]
fn a_cifar_batch_is_checked_by_its_size_before_it_is_read() {
    let dir = sandbox();
    let folder = dir.path().join("cifar");
    std::fs::create_dir(&folder).expect("folder");
    let record = |label: u8| {
        let mut r = vec![label];
        r.resize(3073, 7);
        r
    };
    for name in [
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
        "test_batch.bin",
    ] {
        let bytes: Vec<u8> = (0..4).flat_map(|i| record(i as u8)).collect();
        std::fs::write(folder.join(name), bytes).expect("batch");
    }
    // A sparse batch of 3 GiB: refused from its size, never read.
    let big = std::fs::File::create(folder.join("data_batch_3.bin")).expect("big");
    big.set_len(3073 * 1_100_000).expect("sparse");
    let j = dir.job(
        "c.yaml",
        small_mlp(format!("{{source: cifar10, path: {}}}", folder.display())).backend("cpu"),
    );
    refused(
        &train(dir.path(), &j),
        &[
            "data_batch_3.bin",
            "more than a CIFAR-10 batch file may hold",
        ],
    );
}

// Case 4: job files are bounded before the YAML parser sees them.

fn fib_check(dir: &Path, name: &str, text: &str) -> Output {
    let j = write_job(dir, name, text);
    bounded(dir, &["fib", s(&j), "--backend", "cpu"])
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let dir = sandbox();
    for (open, close) in [("[", "]"), ("{a: ", "}")] {
        let text = format!(
            "model: {{kind: mlp}}\ndata: {{source: synthetic}}\nn: {}1{}\n",
            open.repeat(2000),
            close.repeat(2000)
        );
        refused(
            &fib_check(dir.path(), "deep.yaml", &text),
            &["line 3", "more than 32"],
        );
    }
    let block: String = (0..100)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i + 1)))
        .collect();
    let text = format!("model: {{kind: mlp}}\ndata: {{source: synthetic}}\nparameters:\n{block}");
    refused(
        &fib_check(dir.path(), "block.yaml", &text),
        &["more than 32"],
    );
}

#[test]
fn a_job_file_over_1_mib_is_refused() {
    let dir = sandbox();
    let text = format!(
        "model: {{kind: mlp}}\ndata: {{source: synthetic}}\n# {}\n",
        "x".repeat(2 << 20)
    );
    refused(&fib_check(dir.path(), "big.yaml", &text), &["1 MiB"]);
}

#[test]
fn alias_bombs_are_refused() {
    let dir = sandbox();
    // The billion laughs: ten levels of ten aliases each.
    let mut text = String::from(
        "model: {kind: mlp}\ndata: {source: synthetic}\nlol0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("lol{i}: &a{i} [{refs}]\n"));
    }
    refused(&fib_check(dir.path(), "lol.yaml", &text), &["aliases"]);
    // One long list under an anchor, referred to many times where values are kept.
    let text = format!(
        "command: \"true {{p}}\"\nrun_cap: 2\nparameters:\n  q: {{values: &a [{}]}}\n  p: {{values: [{}]}}\n",
        vec!["1"; 20_000].join(","),
        vec!["*a"; 5_000].join(",")
    );
    let j = dir.job("wide.yaml", &text);
    refused(&sweep_dry(dir.path(), &j), &["aliases"]);
}

#[test]
fn long_parameter_values_are_bounded_per_trial_and_per_run() {
    let dir = sandbox();
    // One value repeated through an alias: each trial would hold 1.2 MB, a row longer than
    // the results files' longest line, which no reader could take back.
    let long = "y".repeat(400_000);
    let text = format!(
        "command: \"true\"\nmethod: grid\nconcurrency: 1\nparameters:\n  a: {{value: &s \"{long}\"}}\n  b: {{value: *s}}\n  c: {{value: *s}}\n"
    );
    let j = dir.job("alias.yaml", &text);
    refused(
        &sweep_dry(dir.path(), &j),
        &["`parameters`", "per trial", "65536"],
    );
    // Two 20 kB words drawn 40,000 times: 800 MB held by the run, from a 40 kB job.
    let word = "z".repeat(20_000);
    let text = format!(
        "command: \"true {{s}}\"\nmethod: random\nrun_cap: 40000\nconcurrency: 4\nparameters:\n  s: {{values: [\"{word}a\", \"{word}b\"]}}\n"
    );
    let j = dir.job("words.yaml", &text);
    refused(
        &sweep_dry(dir.path(), &j),
        &["`run_cap`", "40000 trials", "bytes"],
    );
    // The same words, for as many trials as the bound allows, still run.
    let text = text.replace("run_cap: 40000", "run_cap: 1000");
    let j = dir.job("fewer.yaml", &text);
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

// Case 5: durations and floats from flags and job keys are checked when parsed.

#[test]
fn out_of_range_durations_and_numbers_in_flags_exit_2() {
    let root = root();
    let dir = sandbox();
    let out = dir.path().join("out");
    let out = s(&out);
    for grace in ["1e30", "-1", "NaN", "inf", "1e400", "seconds"] {
        let flag = format!("--grace={grace}");
        let o = bounded(
            &root,
            &[
                "sweep",
                "jobs/sweep-random.yaml",
                "--dry-run",
                "--out",
                out,
                &flag,
            ],
        );
        refused(&o, &["--grace"]);
    }
    for seconds in ["1e30", "0", "-5", "NaN"] {
        let flag = format!("--seconds={seconds}");
        let o = bounded(&root, &["batch-scan", "jobs/mnist-fib.yaml", &flag]);
        refused(&o, &["--seconds"]);
    }
    let flags: [(&str, &str, &str); 7] = [
        ("--lr", "NaN", "train.lr"),
        ("--lr", "inf", "train.lr"),
        ("--momentum", "1e300", "train.momentum"),
        ("--dropout", "NaN", "train.dropout"),
        ("--weight-decay", "-inf", "train.weight_decay"),
        ("--width", "NaN", "model.width"),
        ("--batch-size", "4000000000", "train.batch_size"),
    ];
    for (flag, value, key) in flags {
        let arg = format!("{flag}={value}");
        let model = if flag == "--width" { "resnet50" } else { "mlp" };
        let o = bounded(
            &root,
            &["train", "--model", model, "--data", "synthetic", &arg],
        );
        refused(&o, &[key]);
    }
}

#[test]
fn out_of_range_numbers_in_job_keys_exit_2() {
    let dir = sandbox();
    let cases: [(&str, &str); 8] = [
        ("memory: {fraction: .nan}\n", "memory.fraction"),
        ("train: {lr: .inf}\n", "train.lr"),
        ("train: {momentum: .nan}\n", "train.momentum"),
        (
            "run_cap: 3\nparameters:\n  lr: {min: -1e300, max: 1e300, distribution: log_uniform}\n",
            "parameters.lr",
        ),
        (
            "run_cap: 3\nparameters:\n  lr: {mu: 0, sigma: .inf}\n",
            "parameters.lr.sigma",
        ),
        (
            "run_cap: 3\nparameters:\n  dropout: {values: [0.1, .nan]}\n",
            "parameters.dropout",
        ),
        (
            "data: {source: mnist-10k, test_fraction: .nan}\n",
            "data.test_fraction",
        ),
        ("model: {kind: resnet50, width: 1e300}\n", "model.width"),
    ];
    for (extra, key) in cases {
        let mut text = String::new();
        if !extra.starts_with("model:") {
            text.push_str("model: {kind: mlp}\n");
        }
        if !extra.starts_with("data:") {
            text.push_str("data: {source: synthetic}\n");
        }
        text.push_str(extra);
        refused(&fib_check(dir.path(), "num.yaml", &text), &[key]);
    }
}

#[test]
fn a_concurrency_that_is_not_a_whole_number_or_auto_is_refused_naming_the_key_and_line() {
    let dir = sandbox();
    for (value, shown) in [
        ("-3", "-3"),
        ("2.5", "2.5"),
        ("abc", "`abc`"),
        ("[1]", "a list"),
    ] {
        let job = tiny_sweep(4).concurrency(value);
        let line = job
            .text()
            .lines()
            .position(|l| l.starts_with("concurrency:"))
            .expect("the job has a concurrency line")
            + 1;
        let j = dir.job("conc.yaml", job);
        refused(
            &sweep_dry(dir.path(), &j),
            &[
                &format!("line {line}: `concurrency`"),
                &format!("must be a whole number from 1 to 1024, or auto, not {shown}"),
            ],
        );
    }
}

// Case 6: a name never leads outside the output folder.

#[test]
fn names_that_would_leave_the_output_folder_are_refused() {
    let dir = sandbox();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("work");
    let long = "n".repeat(300);
    for name in [
        "..",
        ".",
        "\"\"",
        "a/b",
        "'..\\\\x'",
        "\"a\\0b\"",
        "\"a\\tb\"",
        "\"a\\nb\"",
        long.as_str(),
    ] {
        let j = dir.job(
            "named.yaml",
            tiny(JobYaml::new().name(name)).n("[1]").splits("[shared]"),
        );
        let o = bounded(&work, &["fib", s(&j)]);
        let line = refused(&o, &["`name`", "line 1"]);
        assert!(!line.contains('\t') && !line.contains('\0'), "{line:?}");
    }
    // A file whose name cannot stand for the job's name.
    let j = dir.job("..yaml", tiny(JobYaml::new()).n("[1]").splits("[shared]"));
    refused(&bounded(&work, &["fib", s(&j)]), &["`name`", "set `name`"]);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        !dir.path().join("out").exists() && !work.join("out").exists(),
        "nothing written: {left:?}"
    );
}

// Case 7: a key given twice is an error, wherever it is.

#[test]
fn duplicate_keys_are_refused_anywhere() {
    let dir = sandbox();
    let cases: [(&str, &str, &str); 4] = [
        (
            "model: {kind: mlp}\ndata: {source: synthetic}\nparameters:\n  lr: {value: 0.1}\n  lr: {value: 0.2}\n",
            "parameters.lr",
            "line 5",
        ),
        (
            "model: {kind: mlp}\ndata: {source: synthetic}\nseed: 1\nseed: 2\n",
            "`seed`",
            "line 4",
        ),
        (
            "model: {kind: mlp}\ndata: {source: synthetic}\nmemory:\n  fraction: 0.5\n  fraction: 0.6\n",
            "memory.fraction",
            "line 5",
        ),
        (
            "model: {kind: mlp}\ndata: {source: synthetic}\nparameters:\n  lr: {values: [0.1], values: [0.2]}\n",
            "parameters.lr.values",
            "line 4",
        ),
    ];
    for (text, key, line) in cases {
        refused(
            &fib_check(dir.path(), "dup.yaml", text),
            &[key, line, "twice"],
        );
    }
}

// Case 8: labels outside the classes are refused at load, whatever the backend.

#[test]
fn a_label_outside_the_classes_is_refused_at_load() {
    let dir = sandbox();
    let folder = idx_folder(dir.path(), 50);
    let mut labels: Vec<u8> = (0..50).map(|i| (i % 10) as u8).collect();
    labels[17] = 255;
    std::fs::write(folder.join("labels-idx1-ubyte"), idx(&[50], &labels)).expect("labels");
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &train(dir.path(), &j),
        &["labels-idx1-ubyte", "sample 17", "label 255"],
    );
    // Saying how many classes there are: a label beyond them is still refused.
    let j = idx_job(dir.path(), &folder, ", classes: 10");
    refused(
        &train(dir.path(), &j),
        &["labels-idx1-ubyte", "sample 17", "label 255", "10"],
    );
    // Saying there are 256 classes makes the label valid.
    let j = idx_job(dir.path(), &folder, ", classes: 256");
    let o = train(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A 10-class source that names its classes refuses the label the same way.
    std::fs::create_dir(dir.path().join("fm")).expect("fm");
    for (prefix, n) in [("train-", 50usize), ("t10k-", 10)] {
        let mut l: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        l[3] = 255;
        std::fs::write(
            dir.path().join(format!("fm/{prefix}images-idx3-ubyte")),
            idx(&[n as u32, 4, 4], &vec![1; n * 16]),
        )
        .expect("images");
        std::fs::write(
            dir.path().join(format!("fm/{prefix}labels-idx1-ubyte")),
            idx(&[n as u32], &l),
        )
        .expect("labels");
    }
    let j = dir.job(
        "fm.yaml",
        small_mlp(format!(
            "{{source: fashion-mnist, path: {}}}",
            dir.join("fm").display()
        )),
    );
    refused(
        &train(dir.path(), &j),
        &["train-labels-idx1-ubyte", "sample 3", "label 255"],
    );
}

// Case 9: a directory, a FIFO or a byte-order mark is named for what it is.

#[test]
fn a_directory_given_as_a_data_file_is_named_as_one() {
    let dir = sandbox();
    let folder = idx_folder(dir.path(), 50);
    std::fs::remove_file(folder.join("images-idx3-ubyte")).expect("rm");
    std::fs::create_dir(folder.join("images-idx3-ubyte")).expect("dir");
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &train(dir.path(), &j),
        &["images-idx3-ubyte", "is a directory"],
    );
    // A data path that is a file, not a folder.
    let j = idx_job(dir.path(), &folder.join("labels-idx1-ubyte"), "");
    refused(&train(dir.path(), &j), &["not a folder"]);
    // A job file that is a directory.
    refused(
        &bounded(dir.path(), &["fib", s(&folder)]),
        &["is a directory"],
    );
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Runs a command that must not wait on a FIFO; a run that does is killed after a minute, and
/// the test fails.
#[cfg(unix)]
fn never_waits(dir: &Path, args: &[&str]) -> Output {
    run(dir, args).timeout(Duration::from_secs(60)).output()
}

#[cfg(unix)]
#[test]
fn a_fifo_given_as_a_file_is_refused_without_waiting() {
    let dir = sandbox();
    let folder = idx_folder(dir.path(), 50);
    std::fs::remove_file(folder.join("labels-idx1-ubyte")).expect("rm");
    mkfifo(&folder.join("labels-idx1-ubyte"));
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &never_waits(dir.path(), &["train", s(&j)]),
        &["labels-idx1-ubyte", "FIFO"],
    );
    let fifo_job = dir.path().join("job.yaml");
    mkfifo(&fifo_job);
    refused(
        &never_waits(dir.path(), &["fib", s(&fifo_job)]),
        &["job.yaml", "FIFO"],
    );
}

#[test]
fn a_byte_order_mark_is_accepted_in_a_job_and_named_in_a_data_file() {
    let dir = sandbox();
    let j = dir.join("bom.yaml");
    std::fs::write(
        &j,
        [
            b"\xef\xbb\xbf".as_slice(),
            tiny(JobYaml::new()).run_cap(2).text().as_bytes(),
        ]
        .concat(),
    )
    .expect("job");
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // UTF-16 is not read as YAML: it says how to save the file.
    let utf16: Vec<u8> = [0xff, 0xfe]
        .into_iter()
        .chain(
            tiny(JobYaml::new())
                .text()
                .encode_utf16()
                .flat_map(|u| u.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .collect();
    std::fs::write(&j, utf16).expect("job");
    refused(&sweep_dry(dir.path(), &j), &["UTF-16", "UTF-8"]);
    // An IDX file that is text with a byte-order mark.
    let folder = idx_folder(dir.path(), 50);
    std::fs::write(folder.join("labels-idx1-ubyte"), b"\xef\xbb\xbf1,2,3\n").expect("labels");
    let j = idx_job(dir.path(), &folder, "");
    refused(
        &train(dir.path(), &j),
        &["labels-idx1-ubyte", "byte-order mark"],
    );
}

#[test]
fn a_space_that_cannot_run_to_its_end_is_refused_when_it_loads() {
    let dir = sandbox();
    for (method, spec, key, says) in [
        // Every draw of this momentum lies in [0, 1) but for a tail the sampler reaches.
        (
            "bayes",
            ("momentum", "{distribution: normal, mu: 0.5, sigma: 0.1}"),
            "`parameters.momentum`",
            "standard deviations from its mean",
        ),
        (
            "random",
            (
                "batch_size",
                "{distribution: log_normal, mu: 4, sigma: 0.5}",
            ),
            "`parameters.batch_size`",
            "standard deviations from its mean",
        ),
        // A width that overflows a double: every draw would be infinite.
        (
            "random",
            ("momentum", "{min: -1e308, max: 1e308}"),
            "`parameters.momentum`",
            "wider than a double holds",
        ),
        (
            "bayes",
            (
                "weight_decay",
                "{min: 0, max: 1000, distribution: log_uniform}",
            ),
            "`parameters.weight_decay.max`",
            "overflows a double",
        ),
    ] {
        let j = dir.job(
            "space.yaml",
            tiny_sweep(40).method(method).param(spec.0, spec.1),
        );
        refused(&sweep_dry(dir.path(), &j), &[key, says]);
    }
    // An external command's parameter takes any number: the same ranges load there.
    let j = dir.job(
        "ext.yaml",
        JobYaml::new()
            .command("true {x}")
            .method("bayes")
            .run_cap(40)
            .param("x", "{distribution: normal, mu: 0.5, sigma: 0.1}"),
    );
    let o = sweep_dry(dir.path(), &j);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
