//! Job files built key by key, with shorthands for the model, data and training values tests use most.

use std::path::{Path, PathBuf};

use super::write_job;

/// A job file built key by key, written in the order the keys were first set. A key set again
/// keeps its place and takes the new value; list keys (`parameters`, `faults`, `slices`) gather
/// their items in one block.
#[derive(Clone, Debug, Default)]
pub struct JobYaml {
    entries: Vec<(String, Value)>,
}

#[derive(Clone, Debug)]
enum Value {
    /// `key: value` on one line.
    Inline(String),
    /// `key:` then each item on its own line, indented by two spaces.
    Block(Vec<String>),
}

/// `{kind: mlp, hidden: [..]}` (`{kind: mlp}` with no hidden sizes).
pub fn mlp(hidden: &[u32]) -> String {
    if hidden.is_empty() {
        return "{kind: mlp}".into();
    }
    let h: Vec<String> = hidden.iter().map(u32::to_string).collect();
    format!("{{kind: mlp, hidden: [{}]}}", h.join(", "))
}

/// `{source: synthetic, train_samples: .., test_samples: ..}`.
pub fn synthetic(train_samples: u32, test_samples: u32) -> String {
    format!("{{source: synthetic, train_samples: {train_samples}, test_samples: {test_samples}}}")
}

/// `{epochs: .., batch_size: ..}`.
pub fn epochs(epochs: u32, batch_size: u32) -> String {
    format!("{{epochs: {epochs}, batch_size: {batch_size}}}")
}

/// `{values: [..]}`: a parameter's values.
pub fn values(values: &[&str]) -> String {
    format!("{{values: [{}]}}", values.join(", "))
}

impl JobYaml {
    pub fn new() -> JobYaml {
        JobYaml::default()
    }

    /// Sets `key: value` (replacing its value where it is already set).
    pub fn set(mut self, key: &str, value: impl std::fmt::Display) -> JobYaml {
        let value = Value::Inline(value.to_string());
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.entries.push((key.to_string(), value)),
        }
        self
    }

    /// Adds one line under the block `key`.
    pub fn item(mut self, key: &str, line: impl std::fmt::Display) -> JobYaml {
        let line = line.to_string();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, Value::Block(lines))) => lines.push(line),
            Some((_, v)) => *v = Value::Block(vec![line]),
            None => self
                .entries
                .push((key.to_string(), Value::Block(vec![line]))),
        }
        self
    }

    /// Leaves `key` out.
    pub fn without(mut self, key: &str) -> JobYaml {
        self.entries.retain(|(k, _)| k != key);
        self
    }

    pub fn name(self, v: &str) -> JobYaml {
        self.set("name", v)
    }
    pub fn model(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("model", v)
    }
    pub fn data(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("data", v)
    }
    pub fn train(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("train", v)
    }
    pub fn backend(self, v: &str) -> JobYaml {
        self.set("backend", v)
    }
    pub fn split(self, v: &str) -> JobYaml {
        self.set("split", v)
    }
    /// fib's split modes, e.g. `[shared, logical]`.
    pub fn splits(self, v: &str) -> JobYaml {
        self.set("splits", v)
    }
    /// fib's numbers of trials, e.g. `[1, 2]`.
    pub fn n(self, v: &str) -> JobYaml {
        self.set("n", v)
    }
    pub fn seed(self, v: u64) -> JobYaml {
        self.set("seed", v)
    }
    pub fn run_cap(self, v: u64) -> JobYaml {
        self.set("run_cap", v)
    }
    pub fn method(self, v: &str) -> JobYaml {
        self.set("method", v)
    }
    pub fn concurrency(self, v: impl std::fmt::Display) -> JobYaml {
        self.set("concurrency", v)
    }
    pub fn memory(self, v: &str) -> JobYaml {
        self.set("memory", v)
    }
    /// An external command, written as a double-quoted YAML string.
    pub fn command(self, v: &str) -> JobYaml {
        self.set("command", format!("{v:?}"))
    }
    /// One parameter of the space: `name: spec` under `parameters`.
    pub fn param(self, name: &str, spec: impl std::fmt::Display) -> JobYaml {
        self.item("parameters", format!("{name}: {spec}"))
    }
    /// One injected fault, e.g. `{trial: 1, kind: nan}`.
    pub fn fault(self, spec: &str) -> JobYaml {
        self.item("faults", format!("- {spec}"))
    }
    /// One slice of an explicit slice plan, e.g. `{mem_mib: 300}`.
    pub fn slice(self, spec: &str) -> JobYaml {
        self.item("slices", format!("- {spec}"))
    }

    /// The job file's text.
    pub fn text(&self) -> String {
        let mut t = String::new();
        for (key, value) in &self.entries {
            match value {
                Value::Inline(v) => t.push_str(&format!("{key}: {v}\n")),
                Value::Block(lines) => {
                    t.push_str(&format!("{key}:\n"));
                    for l in lines {
                        t.push_str(&format!("  {l}\n"));
                    }
                }
            }
        }
        t
    }

    /// Writes it as `dir/name` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        write_job(dir, name, &self.text())
    }
}

impl std::fmt::Display for JobYaml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}
