//! The layering check: every `crate::` path in src/ points down the floors of ARCHITECTURE.md, never up or sideways.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, top first. A module may use only the modules on floors below its own.
const FLOORS: &[&[&str]] = &[
    // The command line: one file per subcommand.
    &["cli"],
    // The runners (none imports another: see `no_runner_imports_another`).
    &["runners"],
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
        for item in items_of(rest) {
            named.insert(first_ident(&item));
        }
    }
    named.remove("");
    named
}

/// The paths a `use` or a path names right after its `crate::` or `super::`: each item of a
/// `{a, b::c}` group, or the one path that stands there.
fn items_of(after: &str) -> Vec<String> {
    let Some(group) = after.strip_prefix('{') else {
        return vec![after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect()];
    };
    let (mut items, mut depth, mut item) = (Vec::new(), 0usize, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    items
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

/// A file's module path under src/ (`engine/cuda/graph.rs` and `engine/cuda/graph/mod.rs` are
/// `["engine", "cuda", "graph"]`); empty for the crate's root files.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

/// The paths a file's code names through `crate::` and `super::` (`super::super::` too), each
/// made absolute from `own` (the file's module path) and split at `::`, with each name of a
/// `{a, b::c}` group as a path of its own. Code under `#[cfg(test)]` is left out: tests may
/// reach across.
fn paths_named(code: &str, own: &[String]) -> Vec<Vec<String>> {
    let code = code.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let (base, after): (Vec<String>, &str) = if boundary && rest.starts_with("crate::") {
            (Vec::new(), &rest["crate::".len()..])
        } else if boundary && rest.starts_with("super::") {
            let mut up = 0;
            let mut r = rest;
            while let Some(next) = r.strip_prefix("super::") {
                up += 1;
                r = next;
            }
            (own[..own.len().saturating_sub(up)].to_vec(), r)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let consumed = rest.len() - after.len();
        let items = items_of(after);
        for item in items {
            let mut path = base.clone();
            path.extend(
                item.trim()
                    .split("::")
                    .map(first_ident)
                    .take_while(|s| !s.is_empty()),
            );
            out.push(path);
        }
        i += consumed;
    }
    out
}

#[test]
fn no_import_circle_inside_any_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| {
            (
                module_path(f.strip_prefix(&src).expect("under src/")),
                f.clone(),
            )
        })
        .filter(|(m, _)| !m.is_empty())
        .collect();
    // An edge from a module to a sibling (the same folder) that it names.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (own, file) in &modules {
        let text = fs::read_to_string(file).expect("a readable source file");
        for mut path in paths_named(&code_of(&text), own) {
            while !path.is_empty() && !modules.contains_key(&path) {
                path.pop();
            }
            if path.len() == own.len()
                && path != *own
                && path[..path.len() - 1] == own[..own.len() - 1]
            {
                edges.entry(own.clone()).or_default().insert(path);
            }
        }
    }
    // Any circle: a module that reaches itself again through its siblings.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<Vec<Vec<String>>> = vec![vec![start.clone()]];
        while let Some(trail) = todo.pop() {
            let last = trail.last().expect("a trail is never empty");
            for next in edges.get(last).into_iter().flatten() {
                if next == start {
                    let names: Vec<String> = trail.iter().map(|m| m.join("/")).collect();
                    circles.push(format!("{} -> {}", names.join(" -> "), start.join("/")));
                } else if seen.insert(next.clone()) {
                    let mut longer = trail.clone();
                    longer.push(next.clone());
                    todo.push(longer);
                }
            }
        }
    }
    circles.sort();
    circles.dedup();
    assert!(
        circles.is_empty(),
        "modules of one folder that import each other, round a circle:\n{}",
        circles.join("\n")
    );
    assert!(
        edges.len() > 20,
        "the check found too few imports between siblings: {}",
        edges.len()
    );
}

#[test]
fn the_circle_check_resolves_super_and_groups() {
    let own: Vec<String> = ["engine", "cuda", "graph"].map(String::from).to_vec();
    let code = code_of(
        "use super::{entered::Entered, status::check};\nuse super::super::fused_hyper;\nx = crate::report::line::CHECK;\n// super::stream\n",
    );
    let got: Vec<String> = paths_named(&code, &own)
        .iter()
        .map(|p| p.join("/"))
        .collect();
    assert_eq!(
        got,
        [
            "engine/cuda/entered/Entered",
            "engine/cuda/status/check",
            "engine/fused_hyper",
            "report/line/CHECK"
        ]
    );
}

#[test]
fn no_runner_imports_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("runners"), &mut files);
    files.sort();
    let mut sideways = Vec::new();
    let mut runners = BTreeSet::new();
    for file in &files {
        let own = module_path(file.strip_prefix(&src).expect("under src/"));
        let Some(runner) = own.get(1).cloned() else {
            continue;
        };
        runners.insert(runner.clone());
        let text = fs::read_to_string(file).expect("a readable source file");
        for path in paths_named(&code_of(&text), &own) {
            if path.first().is_some_and(|p| p == "runners")
                && path.get(1).is_some_and(|other| *other != runner)
            {
                sideways.push(format!(
                    "{}: `{runner}` uses `{}`",
                    file.display(),
                    path.join("::")
                ));
            }
        }
    }
    assert!(
        sideways.is_empty(),
        "a runner uses another (what they share belongs in `rounds` or below):\n{}",
        sideways.join("\n")
    );
    assert!(runners.len() >= 5, "too few runners found: {runners:?}");
}
