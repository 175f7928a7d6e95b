//! Reading a job file and parsing it into a checked `Job`, and finding the line where a key is written.

use std::collections::BTreeMap;
use std::path::Path;

use super::{text, Concurrency, Job, JobFile};
use crate::error::JobError;
use crate::space::Space;

impl Job {
    /// Reads and checks a job file.
    ///
    /// The file must be a regular file of at most 1 MiB ([`text::read`]).
    pub fn load(path: &Path) -> Result<Job, JobError> {
        let text = text::read(path)?;
        Job::parse(&text, path)
    }

    /// Parses and checks job text; `path` is used in messages.
    ///
    /// Before the YAML parser sees it, the text is checked for what would make parsing slow or
    /// large ([`text::check`]: size, nesting depth, alias expansion) and for keys given twice.
    pub fn parse(text: &str, path: &Path) -> Result<Job, JobError> {
        let text = text::strip_bom(text);
        if text.trim().is_empty() {
            return Err(JobError::Syntax {
                path: path.into(),
                message: "the job file is empty".into(),
            });
        }
        text::check(text).map_err(|p| match p.key {
            Some(key) => {
                // A key given twice: the line of its second appearance, and the first named.
                let first = locate(text, &key);
                let second = first.and_then(|l| {
                    let blanked: Vec<&str> = text
                        .lines()
                        .enumerate()
                        .map(|(i, s)| if i + 1 == l { "" } else { s })
                        .collect();
                    locate(&blanked.join("\n"), &key)
                });
                let message = match (first, second) {
                    (Some(a), Some(b)) if a != b => format!("{} (first on line {a})", p.message),
                    _ => p.message,
                };
                JobError::Invalid {
                    path: path.into(),
                    line: p.line.or(second).or(first),
                    key,
                    message,
                }
            }
            None => JobError::Syntax {
                path: path.into(),
                message: match p.line {
                    Some(l) => format!("line {l}: {}", p.message),
                    None => p.message,
                },
            },
        })?;
        let file: JobFile = serde_yaml::from_str(text).map_err(|e| {
            key_error(text, path, &e).unwrap_or_else(|| JobError::Syntax {
                path: path.into(),
                message: one_line(&e.to_string()),
            })
        })?;
        let name = file.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "job".into())
        });
        let mut job = Job {
            name,
            space: Space {
                method: file.method,
                dists: BTreeMap::new(),
            },
            file,
            path: path.into(),
            text: text.into(),
        };
        job.check()?;
        job.say_notes();
        Ok(job)
    }

    /// Checks a job built in code (from command-line flags); errors carry no line.
    pub fn from_file(file: JobFile, origin: &Path) -> Result<Job, JobError> {
        let name = file.name.clone().unwrap_or_else(|| "train".into());
        let mut job = Job {
            name,
            space: Space {
                method: file.method,
                dists: BTreeMap::new(),
            },
            file,
            path: origin.into(),
            text: String::new(),
        };
        job.check()?;
        Ok(job)
    }
}

/// A parse error that comes from a key whose value the job file's schema checks itself
/// (`concurrency`), said as every other key's error is: naming the key, with its line.
fn key_error(text: &str, path: &Path, error: &serde_yaml::Error) -> Option<JobError> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text).ok()?;
    let message = Concurrency::from_value(doc.get("concurrency")?).err()?;
    error
        .to_string()
        .contains(&message)
        .then(|| JobError::Invalid {
            path: path.into(),
            key: "concurrency".into(),
            line: locate(text, "concurrency"),
            message,
        })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The 1-based line where a dotted key (e.g. `memory.fraction`, `faults.0.trial`) is written,
/// found by walking the keys in order of indentation. A numeric part picks that item of a block
/// list (`- ...` lines under the key); in a flow list (`[...]`) it is skipped.
pub fn locate(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut from = 0;
    let mut found = None;
    for part in key.split('.') {
        if let Ok(n) = part.parse::<usize>() {
            let Some(parent) = found.map(|f: usize| f - 1) else {
                continue;
            };
            let depth = indent(lines[parent]);
            let items = (parent + 1..lines.len())
                .take_while(|&i| {
                    lines[i].trim().is_empty()
                        || indent(lines[i]) > depth
                        || lines[i].trim_start().starts_with("- ")
                })
                .filter(|&i| lines[i].trim_start().starts_with("- "));
            if let Some(i) = items.clone().nth(n) {
                found = Some(i + 1);
                from = i;
            }
            continue;
        }
        let needle = format!("{part}:");
        let hit = (from..lines.len()).find(|&i| {
            let l = lines[i].split('#').next().unwrap_or("");
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&needle)
                || l.contains(&format!("{{{needle}"))
                || l.contains(&format!(" {needle}"))
        });
        match hit {
            Some(i) => {
                found = Some(i + 1);
                from = i;
            }
            None => break,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::test_jobs::{parse, OK};
    use crate::job::{CapPolicy, DEFAULT_N};

    #[test]
    fn a_minimal_job_gets_the_defaults() {
        let j = parse(OK).unwrap();
        assert_eq!(j.file.n, DEFAULT_N.to_vec());
        assert_eq!(j.file.train.epochs, 5);
        assert_eq!(j.file.memory.policy(), CapPolicy::Fraction(0.9));
        assert_eq!(j.name, "t");
    }

    #[test]
    fn a_concurrency_that_is_not_a_whole_number_or_auto_names_the_key_and_line() {
        for (value, shown) in [
            ("-3", "-3"),
            ("2.5", "2.5"),
            ("abc", "`abc`"),
            ("[1]", "a list"),
        ] {
            let e = parse(&format!("{OK}concurrency: {value}\n")).unwrap_err();
            assert!(
                matches!(e, JobError::Invalid { line: Some(3), .. }),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "t.yaml: line 3: `concurrency` must be a whole number from 1 to 1024, or auto, not {shown}"
                )
            );
        }
        for (value, want) in [
            ("7", Concurrency::Fixed(7)),
            ("auto", Concurrency::Auto(crate::job::AutoWord::Auto)),
        ] {
            let j = parse(&format!("{OK}concurrency: {value}\n")).unwrap();
            assert_eq!(j.file.concurrency, want);
        }
        let e = parse(&format!("{OK}concurrency: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3: `concurrency` must be from 1 to 1024, or auto, not 0"),
            "{e}"
        );
    }

    #[test]
    fn locate_walks_nested_keys() {
        let t = "a: 1\nmemory:\n  other: 2\n  fraction: 3\nfraction: 4\n";
        assert_eq!(locate(t, "memory.fraction"), Some(4));
        assert_eq!(locate(t, "fraction"), Some(4));
        assert_eq!(locate(t, "missing"), None);
        let t = "slices:\n  - {sm: 64}\n  - {sm: 0}\nn: [1]\n";
        assert_eq!(locate(t, "slices.1.sm"), Some(3));
        assert_eq!(locate(t, "slices.0.sm"), Some(2));
        let t = "faults:\n- {trial: 1}\n- trial: 2\n  kind: nan\nseed: 3\n";
        assert_eq!(locate(t, "faults.1.kind"), Some(4));
        assert_eq!(locate("faults: [{trial: 1}]\n", "faults.0.trial"), Some(1));
    }

    #[test]
    fn every_shipped_job_loads_and_its_model_plans() {
        let dir = crate::test_root().join("jobs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let job = Job::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let (Some(m), Some(d)) = (&job.file.model, &job.file.data) {
                let shape = d.shape.unwrap_or([1, 28, 28]);
                let shape = d.pad_to.map_or(shape, |[h, w]| [shape[0], h, w]);
                let classes = d.classes.unwrap_or(10);
                crate::models::nodes(m, shape, classes, 0.0)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            seen += 1;
        }
        assert!(seen >= 8, "{seen} jobs");
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn parsing_never_panics_on_mutated_jobs(cut in 0usize..400, insert in "[ :{}\\[\\],\\-a-z0-9.\\n]{0,12}") {
            let base = include_str!("../../jobs/example.yaml");
            let at = base.char_indices().map(|(i, _)| i).nth(cut % base.chars().count()).unwrap_or(0);
            let text = format!("{}{}{}", &base[..at], insert, &base[at..]);
            let _ = parse(&text);
        }
    }
}
