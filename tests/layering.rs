//! The layering check: every `crate::` path in src/ points down the floors of ARCHITECTURE.md, never up or sideways.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, top first. A module may use only the modules on floors below its own.
const FLOORS: &[&[&str]] = &[
    // The command line: one file per subcommand.
    &["cli"],
    // The runners.
    &["trial", "fib", "sweep", "parallel", "batch_scan"],
    // What the runners share: a round's context and its result rows.
    &["rounds"],
    // Run setup: backend, devices, data, output folder, signals, telemetry.
    &["run"],
    &["sched"],
    &["plan"],
    &["job"],
    &["space"],
    &["train"],
    &["models"],
    &["engine"],
    &["gpu", "telemetry"],
    &["data"],
    &["report"],
    &["outdir", "rng", "hash", "units", "cancel"],
    &["error"],
];

/// Names at the crate root that are not modules, and the floor each belongs to: exported
/// macros, and the tests' root folder.
const ROOT_ITEMS: &[(&str, &str)] = &[("note", "error"), ("test_root", "error")];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and the insides of its string literals, so that a
/// path named in prose or in a message does not count.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut in_comment) = (false, false);
    while let Some(c) = chars.next() {
        if in_comment {
            if c == '\n' {
                in_comment = false;
                code.push(c);
            }
        } else if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    code.push(c);
                }
                _ => {}
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            in_comment = true;
        } else if c == '"' {
            in_string = true;
            code.push(c);
        } else if c == '\'' && chars.peek().is_some_and(|&n| n == '"') {
            // A char literal of a quote: '"'.
            code.push(c);
            code.push(chars.next().unwrap_or('"'));
        } else {
            code.push(c);
        }
    }
    code
}

/// The top-level modules a file names through `crate::`, including each name of a
/// `use crate::{a, b::c}` group.
fn modules_named(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        named.insert(first_ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            named.insert(first_ident(&item));
        } else {
            named.insert(first_ident(rest));
        }
    }
    named.remove("");
    named
}

fn first_ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn every_crate_path_points_down_the_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut upward = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src/");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a file name");
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(own) = floor_of(&top) else {
            upward.push(format!("{}: module `{top}` is on no floor", rel.display()));
            continue;
        };
        let text = fs::read_to_string(file).expect("a readable source file");
        for mut used in modules_named(&code_of(&text)) {
            if let Some((_, home)) = ROOT_ITEMS.iter().find(|(m, _)| *m == used) {
                used = home.to_string();
            }
            if used == top {
                continue;
            }
            edges.entry(top.clone()).or_default().insert(used.clone());
            match floor_of(&used) {
                Some(floor) if floor > own => {}
                Some(_) => upward.push(format!("{}: `{top}` uses `{used}`", rel.display())),
                None => upward.push(format!("{}: `{used}` is on no floor", rel.display())),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that go up or sideways (see ARCHITECTURE.md):\n{}",
        upward.join("\n")
    );
    assert!(
        edges.len() > 5,
        "the check found too few modules: {edges:?}"
    );
}

#[test]
fn the_parser_sees_groups_and_ignores_comments() {
    let code = code_of(
        "use crate::{engine::Tensor, data::{A, B}};\n// crate::cli\nx = crate::rng::derive(1);\nlet s = \"crate::sched \\\" crate::run\";\nlet q = '\"';\ny = crate::hash::fnv1a(b\"\");",
    );
    let named: Vec<_> = modules_named(&code).into_iter().collect();
    assert_eq!(named, ["data", "engine", "hash", "rng"]);
}
