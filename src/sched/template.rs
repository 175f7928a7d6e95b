//! Command templates: a job's `command` with `{name}` placeholders, filled from a trial's parameters and its own names (`{seed}`, `{trial_id}`, `{slice}`, `{out_dir}`) and W&B's macros (`${program}`, `${args}`, ...) into argv, and checked when the job loads.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::JobError;
use crate::job::Job;
use crate::space::ParamValue;

/// The names every trial fills besides its parameters; a parameter of the space may not take one.
pub const TRIAL_NAMES: [&str; 4] = ["seed", "trial_id", "slice", "out_dir"];

pub use crate::job::WANDB_MACROS;

/// The macros that pass the sweep's parameters to the command.
const ARGS_MACROS: [&str; 4] = ["args", "args_no_hyphens", "args_json", "args_json_file"];

/// The file `${args_json_file}` names, in the trial's folder.
pub const ARGS_JSON_FILE: &str = "args.json";

/// What a trial fills [`TRIAL_NAMES`] and W&B's macros with.
#[derive(Clone, Copy, Debug)]
pub struct TrialNames<'a> {
    /// The trial's seed, as `trials.csv` records it.
    pub seed: u64,
    pub trial_id: &'a str,
    /// The index of the slice it runs on.
    pub slice: u32,
    /// Its own folder (`<out>/trials/<trial_id>`), made before the command starts.
    pub out_dir: &'a Path,
    /// The job's `program` (W&B), for `${program}`.
    pub program: Option<&'a str>,
    /// The names of the sweep's own parameters (its `parameters:`), which `${args}` and its kin
    /// pass, in name order.
    pub swept: &'a [String],
}

impl TrialNames<'_> {
    /// The value of `name`, when it is one of [`TRIAL_NAMES`].
    fn get(&self, name: &str) -> Option<String> {
        match name {
            "seed" => Some(self.seed.to_string()),
            "trial_id" => Some(self.trial_id.to_string()),
            "slice" => Some(self.slice.to_string()),
            "out_dir" => Some(self.out_dir.display().to_string()),
            _ => None,
        }
    }
}

/// The interpreter `${interpreter}` names: `python3` where it is on the PATH, else `python`.
fn interpreter() -> String {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
    };
    if on_path("python3") || !on_path("python") {
        "python3".into()
    } else {
        "python".into()
    }
}

/// A parameter's value as W&B passes it on the command line: numbers as Rust's f64 Display,
/// words as they are.
fn arg_value(v: &ParamValue) -> String {
    v.to_string()
}

/// The sweep's parameters as one JSON object, dotted names nested (`opt.lr` as
/// `{"opt": {"lr": ...}}`), as W&B's `${args_json}` passes them.
pub fn args_json(params: &BTreeMap<String, ParamValue>, swept: &[String]) -> String {
    let mut root = serde_json::Map::new();
    for name in swept {
        let Some(v) = params.get(name) else { continue };
        let value = serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
        let mut parts: Vec<&str> = name.split('.').collect();
        let last = parts.pop().unwrap_or(name);
        let mut node = &mut root;
        for p in parts {
            let entry = node
                .entry(p.to_string())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !entry.is_object() {
                *entry = serde_json::Value::Object(Default::default());
            }
            node = match entry {
                serde_json::Value::Object(m) => m,
                _ => unreachable!("made an object just above"),
            };
        }
        node.insert(last.to_string(), value);
    }
    serde_json::Value::Object(root).to_string()
}

/// Fills `{name}` in the template from the trial's params (numbers printed as Rust's f64 Display,
/// so 0.001 stays 0.001 and 64.0 prints as 64; words as they are; `{{`/`}}` are literal braces)
/// and from its [`TrialNames`], splits it into words with shell-words (no shell runs), and
/// returns argv. A `{name}` that is neither is an error naming it and listing the known names.
///
/// The template is split into words first and each word is then filled, so a value lands whole
/// inside the word where its `{name}` stands: spaces or quotes in a value never split it.
pub fn render(
    template: &str,
    params: &BTreeMap<String, ParamValue>,
    trial: &TrialNames,
) -> Result<Vec<String>, String> {
    let known = known_names(params.keys().map(String::as_str));
    let swept = || {
        trial
            .swept
            .iter()
            .filter_map(|n| params.get(n).map(|v| (n.as_str(), v)))
    };
    let mut macros = |name: &str| -> Result<Vec<String>, String> {
        Ok(match name {
            "env" => vec!["/usr/bin/env".into()],
            "interpreter" => vec![interpreter()],
            "program" => vec![trial
                .program
                .ok_or("uses `${program}`, but the job has no `program`")?
                .to_string()],
            "args" => swept()
                .map(|(n, v)| format!("--{n}={}", arg_value(v)))
                .collect(),
            "args_no_hyphens" => swept()
                .map(|(n, v)| format!("{n}={}", arg_value(v)))
                .collect(),
            "args_json" => vec![args_json(params, trial.swept)],
            "args_json_file" => {
                let path = trial.out_dir.join(ARGS_JSON_FILE);
                std::fs::create_dir_all(trial.out_dir)
                    .and_then(|()| {
                        crate::outdir::write_no_follow(
                            &path,
                            args_json(params, trial.swept).as_bytes(),
                        )
                    })
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                vec![path.display().to_string()]
            }
            other => return Err(format!("uses `${{{other}}}`, which is no W&B macro")),
        })
    };
    expand_template(template, &mut macros, &mut |name| match trial.get(name) {
        Some(v) => Ok(v),
        None => match params.get(name) {
            Some(v) => Ok(v.to_string()),
            None => Err(unknown(name, &known)),
        },
    })
    .map_err(|e| format!("the command {e}"))
}

/// The W&B macros a template uses (`args`, `program`, ...), each once.
pub fn macros(template: &str) -> Vec<String> {
    let mut used = Vec::new();
    let _ = expand_template(
        template,
        &mut |name| {
            if !used.iter().any(|u| u == name) {
                used.push(name.to_string());
            }
            Ok(Vec::new())
        },
        &mut |_| Ok(String::new()),
    );
    used
}

/// The names a template uses, each once, in the order they first appear.
pub fn placeholders(template: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    fill_template(template, &mut |name| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        Ok(String::new())
    })?;
    Ok(names)
}

/// Checks a template against the names its trials will have (a sweep checks its job's command
/// with this when it loads it): its words split, its braces pair, and every `{name}` is one of
/// `known` or of [`TRIAL_NAMES`]. The error says what is wrong, as in "uses `{lr_max}`, which
/// is not a parameter (known: batch_size, lr, seed, trial_id, slice, out_dir)".
pub fn check_template(template: &str, known: &[&str]) -> Result<(), String> {
    let known = known_names(known.iter().copied());
    fill_template(template, &mut |name| {
        if known.iter().any(|k| k == name) {
            Ok(String::new())
        } else {
            Err(unknown(name, &known))
        }
    })
    .map(|_| ())
}

/// Checks a job's `command` (when it has one) against the values its trials are given: an
/// unknown `{name}`, or a parameter of the space named like one of [`TRIAL_NAMES`], is a job
/// error (exit 2) found before anything runs.
pub fn check_job(job: &Job) -> Result<(), JobError> {
    let Some(template) = &job.file.command else {
        return Ok(());
    };
    let params = job.params(0)?;
    if let Some(name) = TRIAL_NAMES.iter().find(|n| params.contains_key(**n)) {
        return Err(job.invalid(
            &format!("parameters.{name}"),
            format!(
                "is one of the names gpumux fills in the command for every trial ({}); rename the parameter",
                TRIAL_NAMES.join(", ")
            ),
        ));
    }
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    check_template(template, &known).map_err(|e| job.invalid("command", e))?;
    if job.file.program.is_none() && macros(template).iter().any(|m| m == "program") {
        return Err(job.invalid(
            "command",
            "uses `${program}`, but the job has no `program` (give the script W&B's way, `program: train.py`)",
        ));
    }
    Ok(())
}

/// The parameters of `params` that a command run from `template` receives: those its template
/// names (gpumux passes parameters to a command through its placeholders only). A template that
/// cannot be read gives them all.
pub fn received(
    template: &str,
    params: BTreeMap<String, ParamValue>,
    swept: &[String],
) -> BTreeMap<String, ParamValue> {
    // `${args}` and its kin pass every parameter of the sweep.
    if macros(template)
        .iter()
        .any(|m| ARGS_MACROS.contains(&m.as_str()))
    {
        let used = placeholders(template).unwrap_or_default();
        return params
            .into_iter()
            .filter(|(k, _)| swept.contains(k) || used.contains(k))
            .collect();
    }
    match placeholders(template) {
        Ok(used) => params
            .into_iter()
            .filter(|(k, _)| used.contains(k))
            .collect(),
        Err(_) => params,
    }
}

/// The parameter names, then [`TRIAL_NAMES`].
fn known_names<'a>(params: impl Iterator<Item = &'a str>) -> Vec<String> {
    params.chain(TRIAL_NAMES).map(str::to_string).collect()
}

/// The template split into words, each filled with `value(name)` for its `{name}`s.
fn fill_template(
    template: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<String>, String> {
    expand_template(template, &mut |_| Ok(Vec::new()), value)
}

/// The template split into words: a word that is one of W&B's macros `${name}` becomes the
/// words `macros(name)` gives; a macro inside a word becomes its one word there; every other
/// word is filled with `value(name)` for its `{name}`s.
fn expand_template(
    template: &str,
    macros: &mut dyn FnMut(&str) -> Result<Vec<String>, String>,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<String>, String> {
    let words =
        shell_words::split(template).map_err(|e| format!("cannot be split into words: {e}"))?;
    if words.is_empty() {
        return Err("is empty".into());
    }
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if let Some(name) = whole_macro(w) {
            out.extend(macros(name)?);
            continue;
        }
        out.push(fill_word(w, is_shell_script(&words, i), macros, value)?);
    }
    Ok(out)
}

/// The shells whose `-c` argument is a script a value must not be read as code in.
const SHELLS: [&str; 7] = ["sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"];

/// Whether word `i` of a command is the script of a shell's `-c` (`sh -c '...'`, `bash -ec
/// '...'`, after `env` and its `NAME=value`s too): its values are substituted shell-quoted.
fn is_shell_script(words: &[String], i: usize) -> bool {
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
    let mut p = 0;
    if words.first().is_some_and(|w| base(w) == "env") {
        p = 1;
        while words
            .get(p)
            .is_some_and(|w| w.starts_with('-') || (w.contains('=') && !w.starts_with('=')))
        {
            p += 1;
        }
    }
    let Some(program) = words.get(p) else {
        return false;
    };
    if !SHELLS.contains(&base(program).as_str()) || i < p + 2 {
        return false;
    }
    let flag = &words[i - 1];
    let is_c = flag.len() > 1
        && flag.starts_with('-')
        && !flag.starts_with("--")
        && flag[1..].chars().all(|c| c.is_ascii_alphabetic())
        && flag.contains('c');
    is_c && words[p + 1..i - 1].iter().all(|w| w.starts_with('-'))
}

/// Where a shell script stands at a point of it: inside single quotes, double quotes, or
/// neither.
#[derive(Clone, Copy, PartialEq)]
enum Quoting {
    Bare,
    Single,
    Double,
}

/// `v` written into a shell script where `q` says, so that the shell reads it back as `v`,
/// one word, and never as code.
fn shell_quoted(v: &str, q: Quoting) -> String {
    match q {
        Quoting::Bare => shell_words::quote(v).into_owned(),
        Quoting::Single => v.replace('\'', r"'\''"),
        Quoting::Double => {
            let mut out = String::with_capacity(v.len());
            for c in v.chars() {
                if matches!(c, '\\' | '"' | '$' | '`') {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        }
    }
}

/// One word of the command filled: each `{name}` by `value(name)` and each W&B macro inside it
/// by its words joined with spaces; `{{`/`}}` are literal braces. In a shell's script
/// (`shell`), every value is quoted for where it stands in the script ([`shell_quoted`]);
/// elsewhere it is put in as it is, and `${args}`/`${args_no_hyphens}` may not stand inside
/// a word (they are words of their own).
fn fill_word(
    word: &str,
    shell: bool,
    macros: &mut dyn FnMut(&str) -> Result<Vec<String>, String>,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(word.len());
    let mut q = Quoting::Bare;
    let put = |v: &str, q: Quoting| {
        if shell {
            shell_quoted(v, q)
        } else {
            v.to_string()
        }
    };
    let mut chars = word.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (q, c) {
            (_, '{') if chars.peek().map(|p| p.1) == Some('{') => {
                chars.next();
                out.push('{');
            }
            (_, '}') if chars.peek().map(|p| p.1) == Some('}') => {
                chars.next();
                out.push('}');
            }
            (_, '$') if whole_macro_at(&word[at..]).is_some() => {
                let name = whole_macro_at(&word[at..]).unwrap_or_default();
                if !shell && matches!(name, "args" | "args_no_hyphens") {
                    return Err(format!(
                        "has `${{{name}}}` inside the word `{word}`: it stands alone, as a word of its own"
                    ));
                }
                let words = macros(name)?;
                let joined = match (shell, q) {
                    (true, Quoting::Bare) => words
                        .iter()
                        .map(|w| shell_quoted(w, q))
                        .collect::<Vec<_>>()
                        .join(" "),
                    _ => put(&words.join(" "), q),
                };
                out.push_str(&joined);
                for _ in 0..name.len() + 2 {
                    chars.next();
                }
            }
            (_, '{') => {
                let name = take_name(&mut chars.by_ref().map(|(_, c)| c)).ok_or_else(|| {
                    format!("has an unclosed `{{` in `{word}` (write `{{{{` for a brace)")
                })?;
                out.push_str(&put(&value(name.trim())?, q));
            }
            (_, '}') => {
                return Err(format!(
                    "has an unmatched `}}` in `{word}` (write `}}}}` for a brace)"
                ))
            }
            // Quotes and escapes are followed in a shell's script only.
            (Quoting::Bare | Quoting::Double, '\\') if shell => {
                out.push(c);
                if let Some((_, n)) = chars.next() {
                    out.push(n);
                }
            }
            (Quoting::Bare, '\'') if shell => {
                q = Quoting::Single;
                out.push(c);
            }
            (Quoting::Single, '\'') => {
                q = Quoting::Bare;
                out.push(c);
            }
            (Quoting::Bare, '"') if shell => {
                q = Quoting::Double;
                out.push(c);
            }
            (Quoting::Double, '"') => {
                q = Quoting::Bare;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// The W&B macro `text` starts with (`${name}`), if it is one.
fn whole_macro_at(text: &str) -> Option<&'static str> {
    WANDB_MACROS
        .iter()
        .copied()
        .find(|name| text.starts_with(&format!("${{{name}}}")))
}

/// The macro's name when `word` is exactly one of W&B's `${name}`.
fn whole_macro(word: &str) -> Option<&'static str> {
    whole_macro_at(word).filter(|name| word.len() == name.len() + 3)
}

/// The characters up to the next `}` (consumed); `None` when there is none.
fn take_name(chars: &mut dyn Iterator<Item = char>) -> Option<String> {
    let mut name = String::new();
    for c in chars {
        if c == '}' {
            return Some(name);
        }
        name.push(c);
    }
    None
}

/// The error for a `{name}` that is not a parameter, listing the known names.
fn unknown(name: &str, known: &[String]) -> String {
    let known = if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    };
    format!("uses `{{{name}}}`, which is not a parameter (known: {known})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, ParamValue)]) -> BTreeMap<String, ParamValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn num(x: f64) -> ParamValue {
        ParamValue::Num(x)
    }

    fn word(s: &str) -> ParamValue {
        ParamValue::Word(s.into())
    }

    fn render(
        template: &str,
        params: &BTreeMap<String, ParamValue>,
    ) -> Result<Vec<String>, String> {
        let trial = TrialNames {
            seed: 12345,
            trial_id: "t3-ab12",
            slice: 2,
            out_dir: Path::new("/out/trials/t3-ab12"),
            program: None,
            swept: &[],
        };
        super::render(template, params, &trial)
    }

    #[test]
    fn render_prints_numbers_as_display_and_words_as_they_are() {
        let p = params(&[
            ("lr", num(0.001)),
            ("batch_size", num(64.0)),
            ("opt", word("adam")),
            ("wd", num(1e-5)),
        ]);
        let argv = render(
            "train.py --lr {lr} --bs={batch_size} --opt {opt} --wd {wd}",
            &p,
        )
        .unwrap();
        assert_eq!(
            argv,
            ["train.py", "--lr", "0.001", "--bs=64", "--opt", "adam", "--wd", "0.00001"]
        );
    }

    #[test]
    fn render_keeps_escaped_braces_and_quoted_words() {
        let p = params(&[("lr", num(0.5)), ("name", word("two words"))]);
        let argv = render(
            r#"python3 -c 'print({{"lr": {lr}}})' "--tag {name}" {name}"#,
            &p,
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "python3",
                "-c",
                r#"print({"lr": 0.5})"#,
                "--tag two words",
                "two words"
            ]
        );
        let quoted = params(&[("q", word("it's \"x\""))]);
        assert_eq!(render("echo {q}", &quoted).unwrap(), ["echo", "it's \"x\""]);
    }

    #[test]
    fn render_names_an_unknown_parameter_and_lists_the_known_ones() {
        let p = params(&[("lr", num(0.1)), ("batch_size", num(8.0))]);
        let e = render("train --m {momentum}", &p).unwrap_err();
        assert!(e.contains("{momentum}"), "{e}");
        assert!(
            e.contains("known: batch_size, lr, seed, trial_id, slice, out_dir"),
            "{e}"
        );
        assert!(render("train {lr", &p).unwrap_err().contains("unclosed"));
        assert!(render("train lr}", &p).unwrap_err().contains("unmatched"));
        assert!(render("train 'open", &p).unwrap_err().contains("split"));
        assert!(render("   ", &p).unwrap_err().contains("empty"));
    }

    #[test]
    fn render_fills_the_names_of_the_trial() {
        let p = params(&[("lr", num(0.5))]);
        let argv = render(
            "train --lr {lr} --seed={seed} --id {trial_id} --slice {slice} --ckpt {out_dir}/last.pt",
            &p,
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "train",
                "--lr",
                "0.5",
                "--seed=12345",
                "--id",
                "t3-ab12",
                "--slice",
                "2",
                "--ckpt",
                "/out/trials/t3-ab12/last.pt"
            ]
        );
        assert!(check_template("train {seed} {trial_id} {slice} {out_dir} {lr}", &["lr"]).is_ok());
        let e = check_template("train {sead}", &["lr"]).unwrap_err();
        assert!(e.contains("{sead}") && e.contains("seed, trial_id"), "{e}");
    }

    #[test]
    fn placeholders_lists_each_name_once_and_received_keeps_those_parameters() {
        assert_eq!(
            placeholders("t --a {lr} {seed} {{x}} --b={lr},{opt}").unwrap(),
            ["lr", "seed", "opt"]
        );
        assert!(placeholders("t {lr").is_err());
        let p = params(&[
            ("lr", num(0.1)),
            ("batch_size", num(64.0)),
            ("opt", word("adam")),
        ]);
        let got = received("t --lr {lr} --opt {opt} --seed {seed}", p.clone(), &[]);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["lr", "opt"]);
        assert!(received("t --fixed", p.clone(), &[]).is_empty());
        assert_eq!(received("t {lr", p.clone(), &[]), p);
        // W&B's ${args} passes the sweep's own parameters.
        let swept = ["lr".to_string(), "opt".to_string()];
        let got = received("t ${args}", p.clone(), &swept);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["lr", "opt"]);
    }

    fn wandb(
        template: &str,
        params: &BTreeMap<String, ParamValue>,
        swept: &[String],
        out_dir: &Path,
    ) -> Result<Vec<String>, String> {
        let trial = TrialNames {
            seed: 1,
            trial_id: "t0",
            slice: 0,
            out_dir,
            program: Some("train.py"),
            swept,
        };
        super::render(template, params, &trial)
    }

    #[test]
    fn a_value_inside_a_shell_script_is_quoted_for_where_it_stands() {
        let p = params(&[("x", word("a'b\"$(touch pwned)`id`")), ("lr", num(0.5))]);
        let one = |template: &str| render(template, &p).unwrap();
        // Bare in the script: one shell-quoted word.
        let argv = one("sh -c 'echo {x} {lr} > {out_dir}/log'");
        assert_eq!(argv[..2], ["sh", "-c"]);
        assert_eq!(
            argv[2],
            r#"echo 'a'\''b"$(touch pwned)`id`' 0.5 > /out/trials/t3-ab12/log"#
        );
        // Inside double quotes, and inside single quotes, of the script.
        let argv = one(r#"bash -ec 'echo "{x}"'"#);
        assert_eq!(argv[2], r#"echo "a'b\"\$(touch pwned)\`id\`""#);
        let argv = one(r#"env A=1 /bin/sh -c "echo '{x}'""#);
        assert_eq!(argv[4], r#"echo 'a'\''b"$(touch pwned)`id`'"#);
        // The shell reads each back as the value itself.
        for template in [
            "sh -c 'printf %s {x}'",
            r#"sh -c 'printf %s "{x}"'"#,
            r#"sh -c "printf %s '{x}'""#,
        ] {
            let argv = one(template);
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(std::env::temp_dir())
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "a'b\"$(touch pwned)`id`",
                "{template}"
            );
        }
        // Not a shell's script: the value stands as it is, one argv word.
        assert_eq!(
            one("python3 -c 'print({lr})' {x}")[3],
            "a'b\"$(touch pwned)`id`"
        );
    }

    #[test]
    fn wandbs_macros_fill_the_command_as_its_agent_does() {
        let p = params(&[
            ("lr", num(0.001)),
            ("opt.name", word("adam")),
            ("opt.beta", num(0.9)),
            ("epochs", num(5.0)),
        ]);
        let swept: Vec<String> = ["lr", "opt.beta", "opt.name"].map(String::from).to_vec();
        let dir = tempfile::tempdir().unwrap();
        let argv = wandb(
            "${env} ${interpreter} ${program} ${args}",
            &p,
            &swept,
            dir.path(),
        )
        .unwrap();
        assert_eq!(argv[0], "/usr/bin/env");
        assert!(argv[1].starts_with("python"), "{argv:?}");
        assert_eq!(
            argv[2..],
            [
                "train.py",
                "--lr=0.001",
                "--opt.beta=0.9",
                "--opt.name=adam"
            ]
        );
        let argv = wandb(
            "x ${args_no_hyphens} --all=${args_json}",
            &p,
            &swept,
            dir.path(),
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "x",
                "lr=0.001",
                "opt.beta=0.9",
                "opt.name=adam",
                r#"--all={"lr":0.001,"opt":{"beta":0.9,"name":"adam"}}"#
            ]
        );
        let argv = wandb("x ${args_json_file} {lr}", &p, &swept, dir.path()).unwrap();
        let file = std::fs::read_to_string(&argv[1]).unwrap();
        assert_eq!(file, r#"{"lr":0.001,"opt":{"beta":0.9,"name":"adam"}}"#);
        assert_eq!(argv[2], "0.001");
        // ${args} stands alone; an unknown ${name} keeps gpumux's meaning of {name}.
        assert!(wandb("x --a${args}", &p, &swept, dir.path()).is_err());
        assert_eq!(
            wandb("x ${lr}", &p, &swept, dir.path()).unwrap(),
            ["x", "$0.001"]
        );
        assert_eq!(macros("a ${program} ${args} {lr}"), ["program", "args"]);
    }
}
