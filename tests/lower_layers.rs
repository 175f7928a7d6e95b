//! The layering check of the lower floors: `engine`, `models`, `data`, `gpu`, `rng` and `units` import only from their own floor and the floors below, never from `job`, `plan`, the runners or the CLI above them.

use std::path::{Path, PathBuf};

/// What each lower floor may name as `crate::<module>` (besides itself): the floors below it and
/// the crate's shared errors and helpers.
const FLOORS: &[(&str, &[&str])] = &[
    ("src/rng.rs", &[]),
    ("src/units.rs", &[]),
    (
        "src/data",
        &["error", "rng", "units", "hash", "note", "test_root"],
    ),
    (
        "src/gpu",
        &["error", "rng", "units", "hash", "note", "test_root"],
    ),
    (
        "src/engine",
        &[
            "data",
            "gpu",
            "error",
            "rng",
            "units",
            "hash",
            "note",
            "test_root",
        ],
    ),
    (
        "src/models",
        &[
            "engine",
            "data",
            "gpu",
            "error",
            "rng",
            "units",
            "hash",
            "note",
            "test_root",
        ],
    ),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|e| e.expect("a folder entry").path())
            .collect();
        entries.sort();
        for p in entries {
            rust_files(&p, out);
        }
    } else if path.extension().is_some_and(|x| x == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The modules named as `crate::<module>` in the code of `text` (comments skipped).
fn crate_imports(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push((i + 1, name));
        }
    }
    out
}

#[test]
fn lower_floors_import_nothing_from_above() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut upward = Vec::new();
    for (floor, allowed) in FLOORS {
        let own = Path::new(floor)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let mut files = Vec::new();
        rust_files(&root.join(floor), &mut files);
        assert!(!files.is_empty(), "{floor} holds no Rust file");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, name) in crate_imports(&text) {
                if name != own && !allowed.contains(&name.as_str()) {
                    let shown = file.strip_prefix(root).unwrap_or(&file).display();
                    upward.push(format!("{shown}:{line}: crate::{name}"));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "lower floors import from above:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_finds_imports_in_code_only() {
    let text = "use crate::job::Hyper;\n//! see [`crate::plan`]\nlet x = crate::rng::derive(1, 2); // crate::sched\n";
    assert_eq!(
        crate_imports(text),
        [(1, "job".to_string()), (3, "rng".to_string())]
    );
}
