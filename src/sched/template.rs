//! Command templates: a job's `command` with `{name}` placeholders, filled from a trial's parameters into argv, and checked against the parameters when the job loads.

use std::collections::BTreeMap;

use crate::error::JobError;
use crate::job::Job;
use crate::space::ParamValue;

/// Fills `{name}` in the template from the trial's params (numbers printed as Rust's f64 Display,
/// so 0.001 stays 0.001 and 64.0 prints as 64; words as they are; `{{`/`}}` are literal braces),
/// splits it into words with shell-words (no shell runs), and returns argv. A `{name}` with no
/// such parameter is an error naming it and listing the known names.
///
/// The template is split into words first and each word is then filled, so a value lands whole
/// inside the word where its `{name}` stands: spaces or quotes in a value never split it.
pub fn render(
    template: &str,
    params: &BTreeMap<String, ParamValue>,
) -> Result<Vec<String>, String> {
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    fill_template(template, &mut |name| match params.get(name) {
        Some(v) => Ok(v.to_string()),
        None => Err(unknown(name, &known)),
    })
    .map_err(|e| format!("the command {e}"))
}

/// Checks a template against the names its trials will have (a sweep checks its job's command
/// with this when it loads it): its words split, its braces pair, and every `{name}` is one of
/// `known`. The error says what is wrong, as in "uses `{lr_max}`, which is not a parameter
/// (known: batch_size, lr)".
pub fn check_template(template: &str, known: &[&str]) -> Result<(), String> {
    fill_template(template, &mut |name| {
        if known.contains(&name) {
            Ok(String::new())
        } else {
            Err(unknown(name, known))
        }
    })
    .map(|_| ())
}

/// Checks a job's `command` (when it has one) against the values its trials are given: an
/// unknown `{name}` is a job error (exit 2) found before anything runs.
pub fn check_job(job: &Job) -> Result<(), JobError> {
    let Some(template) = &job.file.command else {
        return Ok(());
    };
    let params = job.params(0)?;
    let known: Vec<&str> = params.keys().map(String::as_str).collect();
    check_template(template, &known).map_err(|e| job.invalid("command", e))
}

/// The template split into words, each filled with `value(name)` for its `{name}`s.
fn fill_template(
    template: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<String>, String> {
    let words =
        shell_words::split(template).map_err(|e| format!("cannot be split into words: {e}"))?;
    if words.is_empty() {
        return Err("is empty".into());
    }
    words.iter().map(|w| fill(w, value)).collect()
}

/// One word with its `{name}`s replaced and `{{`/`}}` unescaped.
fn fill(
    word: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let name = take_name(&mut chars).ok_or_else(|| {
                    format!("has an unclosed `{{` in `{word}` (write `{{{{` for a brace)")
                })?;
                out.push_str(&value(name.trim())?);
            }
            '}' => {
                return Err(format!(
                    "has an unmatched `}}` in `{word}` (write `}}}}` for a brace)"
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
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
fn unknown(name: &str, known: &[&str]) -> String {
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
        assert!(e.contains("known: batch_size, lr"), "{e}");
        assert!(render("train {lr", &p).unwrap_err().contains("unclosed"));
        assert!(render("train lr}", &p).unwrap_err().contains("unmatched"));
        assert!(render("train 'open", &p).unwrap_err().contains("split"));
        assert!(render("   ", &p).unwrap_err().contains("empty"));
    }
}
