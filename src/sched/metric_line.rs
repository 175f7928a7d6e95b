//! An external command's stdout lines read as metrics: epoch lines and the result line, JSON or Python's print of a dict, with numpy/JAX/PyTorch scalars and common metric names accepted.
//!
//! A line is split at carriage returns (a progress bar redraws itself with them, and what
//! follows the last one is what shows); terminal colours, backspaces and other control
//! characters are dropped.
//! Each part is read as an object on its own; text before the object's `{` (a progress bar's)
//! is skipped. Within the object, a number may be written as JSON writes it, as Python's
//! `json.dumps` writes a non-finite one (`NaN`, `Infinity`, `-Infinity`), as Python prints one
//! (`nan`, `inf`), or wrapped in a call, as a library's scalar prints itself
//! (`np.float32(0.97)`, `Array(0.97, dtype=float32)`, `tensor(0.97, device='cuda:0')`). Strings
//! may be single-quoted and `True`/`False`/`None` stand for themselves, as in Python's print of
//! a dict. Only the object's own numeric values are kept; anything else is ignored.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::train::EpochStats;

/// The names Keras and most scripts print, and gpumux's name for each. gpumux's own name wins
/// when a line has both; of two common names for one of gpumux's, the first here wins.
pub use crate::train::COMMON_METRIC_NAMES as COMMON_NAMES;

/// Nesting deeper than this is not a metrics line (and would cost stack to read).
const MAX_DEPTH: usize = 64;

/// The parts of a line a terminal would show as lines of their own: split at `\r`, control
/// characters dropped, trimmed, empty ones skipped.
pub fn parts(line: &str) -> impl DoubleEndedIterator<Item = String> + '_ {
    line.split('\r')
        .map(|p| plain(p).trim().to_string())
        .filter(|p| !p.is_empty())
}

/// `text` without terminal escape sequences (the colours of a progress bar) and control
/// characters (the backspaces it redraws with); tabs are kept.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            // A control sequence: `ESC [`, parameters, and a final byte from `@` to `~`.
            '\x1b' => {
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// What shows of a line: its last part, if it has one that is not empty.
pub fn shown(line: &str) -> Option<String> {
    parts(line).next_back()
}

/// The numeric values of one part of a line that is an object, by name, with gpumux's name
/// added for each common name it has (see [`COMMON_NAMES`]); None when the part is no object.
pub fn numbers(part: &str) -> Option<BTreeMap<String, f64>> {
    let mut map = object_at(part, 0).or_else(|| object_at(part, part.find('{')?))?;
    for (common, own) in COMMON_NAMES {
        if let Some(&v) = map.get(common) {
            map.entry(own.to_string()).or_insert(v);
        }
    }
    Some(map)
}

/// The keys of an epoch line that are no value of their own: the epoch, and the names that
/// fill `progress.csv`'s fixed columns (gpumux's and the common names mapped to them).
fn fixed_key(key: &str) -> bool {
    matches!(
        key,
        "epoch" | "epochs" | "train_loss" | "train_acc" | "test_loss" | "test_acc"
    ) || COMMON_NAMES.iter().any(|(common, _)| *common == key)
}

/// The epoch lines in a line of output (one for each part that is an object with an `epoch`
/// that is a whole number), with `wall_s` measured from `started`. Every other numeric key
/// (not the epoch, not a name of a fixed column or a common name mapped to one) is kept in
/// [`EpochStats::extra`]: the results file decides which become columns.
pub fn epochs(line: &str, started: Instant) -> Vec<EpochStats> {
    parts(line)
        .filter_map(|p| {
            let m = numbers(&p)?;
            let epoch = *m.get("epoch")?;
            if !(0.0..=f64::from(u32::MAX)).contains(&epoch) || epoch.fract() != 0.0 {
                return None;
            }
            let num = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
            Some(EpochStats {
                epoch: epoch as u32,
                train_loss: num("train_loss"),
                train_acc: num("train_acc"),
                test_loss: num("test_loss"),
                test_acc: num("test_acc"),
                wall_s: started.elapsed().as_secs_f64(),
                extra: m
                    .iter()
                    .filter(|(k, _)| !fixed_key(k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            })
        })
        .collect()
}

/// The numeric values of the object `text[at..]` is, to its end.
fn object_at(text: &str, at: usize) -> Option<BTreeMap<String, f64>> {
    let mut r = Reader {
        s: text.as_bytes(),
        at,
        depth: 0,
    };
    r.space();
    let fields = r.object()?;
    r.space();
    (r.at == r.s.len()).then(|| {
        fields
            .into_iter()
            .filter_map(|(k, v)| match v {
                Value::Number(x) => Some((k, x)),
                Value::Other => None,
            })
            .collect()
    })
}

/// A value as far as metrics care.
enum Value {
    Number(f64),
    Other,
}

/// Reads a JSON or Python literal from bytes; each method returns None where the text is not one.
struct Reader<'a> {
    s: &'a [u8],
    at: usize,
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// Skips `b` (and the space after it) if it comes next.
    fn eat(&mut self, b: u8) -> bool {
        let next = self.peek() == Some(b);
        if next {
            self.at += 1;
            self.space();
        }
        next
    }

    fn deeper(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// `{key: value, ...}`, its fields in order.
    fn object(&mut self) -> Option<Vec<(String, Value)>> {
        self.deeper()?;
        if !self.eat(b'{') {
            return None;
        }
        let mut fields = Vec::new();
        while !self.eat(b'}') {
            let key = self.string()?;
            self.space();
            if !self.eat(b':') {
                return None;
            }
            fields.push((key, self.value()?));
            if !self.eat(b',') && self.peek() != Some(b'}') {
                return None;
            }
        }
        self.depth -= 1;
        Some(fields)
    }

    /// A list or tuple, `open`ed and `close`d.
    fn sequence(&mut self, open: u8, close: u8) -> Option<Value> {
        self.deeper()?;
        if !self.eat(open) {
            return None;
        }
        while !self.eat(close) {
            self.value()?;
            if !self.eat(b',') && self.peek() != Some(close) {
                return None;
            }
        }
        self.depth -= 1;
        Some(Value::Other)
    }

    /// One value, and the space after it.
    fn value(&mut self) -> Option<Value> {
        let v = match self.peek()? {
            b'{' => self.object().map(|_| Value::Other),
            b'[' => self.sequence(b'[', b']'),
            b'(' => self.sequence(b'(', b')'),
            b'"' | b'\'' => self.string().map(|_| Value::Other),
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            b if b.is_ascii_alphabetic() || b == b'_' => self.word(),
            _ => None,
        }?;
        self.space();
        Some(v)
    }

    /// A number as JSON or Python writes it, `-Infinity` and `-inf` included.
    fn number(&mut self) -> Option<Value> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.at += 1;
        }
        if self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
            return match self.word()? {
                Value::Number(x) if x.is_infinite() => {
                    Some(Value::Number(if negative { -x } else { x }))
                }
                _ => None,
            };
        }
        while let Some(b) = self.peek() {
            let exponent_sign =
                matches!(b, b'-' | b'+') && matches!(self.s[self.at - 1], b'e' | b'E');
            if !(b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E') || exponent_sign) {
                break;
            }
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        text.parse().ok().map(Value::Number)
    }

    /// A name: a constant (`NaN`, `Infinity`, `nan`, `inf`, `true`, `True`, `null`, `None`, ...)
    /// or a call such as `np.float32(0.97)`, whose value is its first argument's when that is a
    /// number.
    fn word(&mut self) -> Option<Value> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            self.at += 1;
        }
        let name = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        match name {
            "NaN" | "nan" => return Some(Value::Number(f64::NAN)),
            "Infinity" | "inf" => return Some(Value::Number(f64::INFINITY)),
            "true" | "false" | "null" | "True" | "False" | "None" => return Some(Value::Other),
            _ => {}
        }
        self.space();
        if !self.eat(b'(') {
            return None;
        }
        // A call nests like a list: `f(f(f(...)))` is as deep as `[[[...]]]`.
        self.deeper()?;
        let (args, depth) = (self.at, self.depth);
        let first = match self.peek() {
            Some(b')') => None,
            _ => self.value(),
        };
        if first.is_none() {
            // Arguments that are no value (`<MeanBackward0>`) are skipped from the start.
            (self.at, self.depth) = (args, depth);
        }
        self.skip_to_close()?;
        self.depth -= 1;
        Some(first.unwrap_or(Value::Other))
    }

    /// Skips the rest of a call's arguments, whatever they are, to its `)`.
    fn skip_to_close(&mut self) -> Option<()> {
        let mut depth = 0usize;
        let mut quote = None;
        while let Some(b) = self.peek() {
            self.at += 1;
            match (quote, b) {
                (Some(_), b'\\') => self.at += 1,
                (Some(q), _) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'"' | b'\'') => quote = Some(b),
                (None, b'(' | b'[' | b'{') => depth += 1,
                (None, b')') if depth == 0 => return Some(()),
                (None, b')' | b']' | b'}') => depth = depth.checked_sub(1)?,
                (None, _) => {}
            }
        }
        None
    }

    /// A string in double quotes (JSON's escapes) or single ones (Python's common escapes).
    fn string(&mut self) -> Option<String> {
        let q = self.peek().filter(|b| matches!(b, b'"' | b'\''))?;
        let start = self.at;
        self.at += 1;
        loop {
            match self.peek()? {
                b'\\' => self.at += 2,
                b if b == q => break,
                _ => self.at += 1,
            }
        }
        self.at += 1;
        let raw = std::str::from_utf8(self.s.get(start..self.at)?).ok()?;
        let inner = &raw[1..raw.len() - 1];
        if q == b'"' {
            if let Ok(s) = serde_json::from_str::<String>(raw) {
                return Some(s);
            }
        }
        Some(unescape(inner))
    }
}

/// Python's common escapes undone; any other is kept as written.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(c @ ('\\' | '\'' | '"')) => out.push(c),
            Some(c) => {
                out.push('\\');
                out.push(c);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn nesting_ten_times_the_limit_is_no_line_and_no_crash() {
        // Calls, lists, tuples and objects, each 10× MAX_DEPTH deep, read on a small stack.
        let deep = 10 * MAX_DEPTH;
        let lines = [
            format!(
                "{{'test_acc': {}0.5{}}}",
                "f(".repeat(deep),
                ")".repeat(deep)
            ),
            format!("{{\"a\": {}1{}}}", "[".repeat(deep), "]".repeat(deep)),
            format!("{{\"a\": {}1{}}}", "(".repeat(deep), ")".repeat(deep)),
            format!("{}{}", "{\"a\": ".repeat(deep), "}".repeat(deep)),
        ];
        let read = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                lines
                    .iter()
                    .map(|l| numbers(l).is_some_and(|m| !m.is_empty()))
                    .collect::<Vec<_>>()
            })
            .unwrap()
            .join()
            .expect("no stack overflow");
        // No value from any of them (the call's argument is too deep to be one).
        assert_eq!(read, [false, false, false, false]);
        // Within the limit a call still gives its value.
        let ok = format!("{{'test_acc': {}0.5{}}}", "f(".repeat(8), ")".repeat(8));
        assert_eq!(numbers(&ok).unwrap()["test_acc"], 0.5);
    }

    use super::*;

    fn nums(line: &str) -> Option<Vec<(String, f64)>> {
        Some(numbers(&shown(line)?)?.into_iter().collect())
    }

    fn get(line: &str, key: &str) -> f64 {
        let m = numbers(&shown(line).unwrap()).unwrap_or_else(|| panic!("no object: {line:?}"));
        m.get(key)
            .copied()
            .unwrap_or_else(|| panic!("no {key} in {m:?}"))
    }

    #[test]
    fn common_names_get_gpumuxs_and_keep_their_own() {
        let line = r#"{"epoch": 2, "loss": 0.3, "accuracy": 0.9, "val_loss": 0.4, "val_accuracy": 0.8, "lr": 0.01, "note": "x"}"#;
        let m = numbers(line).unwrap();
        assert_eq!(m["train_loss"], 0.3);
        assert_eq!(m["train_acc"], 0.9);
        assert_eq!(m["test_loss"], 0.4);
        assert_eq!(m["test_acc"], 0.8);
        assert_eq!(m["val_accuracy"], 0.8);
        assert_eq!(m["lr"], 0.01);
        assert!(!m.contains_key("note"));
        // gpumux's own name wins; of two common names, the first in the table.
        let m =
            numbers(r#"{"test_acc": 0.7, "val_acc": 0.1, "acc": 0.2, "accuracy": 0.3}"#).unwrap();
        assert_eq!((m["test_acc"], m["train_acc"]), (0.7, 0.3));
        let e = &epochs(line, Instant::now())[0];
        assert_eq!(e.epoch, 2);
        assert_eq!(
            (e.train_loss, e.train_acc, e.test_loss, e.test_acc),
            (0.3, 0.9, 0.4, 0.8)
        );
    }

    #[test]
    fn other_numeric_keys_of_an_epoch_line_are_kept_as_extras() {
        let line = r#"{"epoch": 2, "loss": 0.3, "val_accuracy": 0.9, "lr": 0.001, "grad_norm": 1.7, "note": "x", "epochs": 5, "acc": 0.8, "test_loss": 0.2}"#;
        let e = &epochs(line, Instant::now())[0];
        let extra: Vec<(&str, f64)> = e.extra.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(extra, [("grad_norm", 1.7), ("lr", 0.001)]);
        assert_eq!((e.train_loss, e.test_acc, e.test_loss), (0.3, 0.9, 0.2));
        // A built-in figure alone has none.
        assert!(
            epochs(r#"{"epoch": 1, "train_loss": 0.5}"#, Instant::now())[0]
                .extra
                .is_empty()
        );
    }

    #[test]
    fn scalars_of_numpy_jax_and_pytorch_and_pythons_dicts_are_read() {
        // print({...}) of each library's scalars, as they print themselves.
        assert_eq!(get("{'test_acc': np.float32(0.97)}", "test_acc"), 0.97);
        assert_eq!(
            get(
                r#"{"test_acc": np.float64(0.5), "epochs": np.int64(3)}"#,
                "epochs"
            ),
            3.0
        );
        assert_eq!(get("{'acc': Array(0.97, dtype=float32)}", "acc"), 0.97);
        assert_eq!(
            get(
                "{'acc': Array(0.25, dtype=float32, weak_type=True)}",
                "train_acc"
            ),
            0.25
        );
        assert_eq!(
            get(
                "{'loss': tensor(0.2900, grad_fn=<MeanBackward0>)}",
                "train_loss"
            ),
            0.29
        );
        assert_eq!(
            get("{'loss': tensor(1.5e-3, device='cuda:0')}", "loss"),
            1.5e-3
        );
        assert_eq!(
            get("{'loss': tf.Tensor(0.5, shape=(), dtype=float32)}", "loss"),
            0.5
        );
        assert_eq!(
            get(
                "{'ok': True, 'name': 'it\\'s', 'x': None, 'y': (1, 2), 'z': -2e-2}",
                "z"
            ),
            -0.02
        );
        // Non-finite values as json.dumps and Python write them.
        assert!(get(r#"{"test_acc": NaN}"#, "test_acc").is_nan());
        assert_eq!(
            get(r#"{"a": Infinity, "b": -Infinity}"#, "b"),
            f64::NEG_INFINITY
        );
        assert_eq!(get("{'a': inf, 'b': -inf}", "a"), f64::INFINITY);
        assert!(get("{'a': np.float32(nan)}", "a").is_nan());
        // A wrapper of something else than a number is no number; the rest of the line counts.
        let m = nums("{'a': tensor([0.5, 0.6]), 'b': Decimal('0.5'), 'c': 1}").unwrap();
        assert_eq!(m, [("c".to_string(), 1.0)]);
    }

    #[test]
    fn what_is_not_an_object_is_none() {
        for line in [
            "",
            "epoch 1: loss 0.3",
            "[1, 2]",
            r#"{"a": 1} trailing"#,
            r#"{"a": 1"#,
            r#"{"a": foo}"#,
            r#"{"a": 1,, "b": 2}"#,
            r#"{"a": "unclosed}"#,
            "{'a': np.float32(0.5}",
            r#"{"a": --1}"#,
            "{1: 2}",
        ] {
            assert_eq!(nums(line), None, "{line:?}");
        }
        let deep = format!(r#"{{"a": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(nums(&deep), None);
        let fine = format!(r#"{{"a": {}{}, "b": 1}}"#, "[".repeat(40), "]".repeat(40));
        assert_eq!(nums(&fine).unwrap(), [("b".to_string(), 1.0)]);
    }

    /// What Keras 3's `fit(verbose=1)` writes to a pipe for the last steps of an epoch, when a
    /// callback prints an epoch line at the epoch's end, and then the finished bar.
    const KERAS: &str = "\u{8}\u{8}\u{8}\r\u{1b}[1m1874/1875\u{1b}[0m \u{1b}[32m\u{2501}\u{2501}\u{2501}\u{1b}[0m\u{1b}[37m\u{1b}[0m \u{1b}[1m0s\u{1b}[0m 1ms/step - accuracy: 0.9123 - loss: 0.2900\u{8}\u{8}\u{8}\u{8}\r\u{1b}[1m1875/1875\u{1b}[0m \u{1b}[32m\u{2501}\u{2501}\u{2501}\u{1b}[0m\u{1b}[37m\u{1b}[0m \u{1b}[1m3s\u{1b}[0m 1ms/step - accuracy: 0.9124 - loss: 0.2899{\"epoch\": 1, \"loss\": 0.2899, \"accuracy\": 0.9124, \"val_loss\": 0.15, \"val_accuracy\": 0.955}";

    #[test]
    fn a_keras_progress_bar_before_an_epoch_line_is_skipped() {
        let e = epochs(KERAS, Instant::now());
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].epoch, e[0].train_loss, e[0].test_acc),
            (1, 0.2899, 0.955)
        );
        // A carriage return before the line, or a bar redrawn after it: each part is a line.
        let line = "1875/1875 [====] - 3s 1ms/step - loss: 0.29\r{\"epoch\": 2, \"val_acc\": 0.5}\r1/1875 [...] - loss: 0.3";
        let e = epochs(line, Instant::now());
        assert_eq!((e.len(), e[0].epoch, e[0].test_acc), (1, 2, 0.5));
        assert_eq!(shown(line).unwrap(), "1/1875 [...] - loss: 0.3");
        // The finished bar alone is no epoch line, and what shows of it is plain text.
        let bar = "\u{8}\u{8}\r\u{1b}[1m1875/1875\u{1b}[0m \u{1b}[1m3s\u{1b}[0m 1ms/step - loss: 0.29 - val_loss: 0.1";
        assert!(epochs(bar, Instant::now()).is_empty());
        assert_eq!(
            shown(bar).unwrap(),
            "1875/1875 3s 1ms/step - loss: 0.29 - val_loss: 0.1"
        );
        assert_eq!(shown("\u{8}\u{8}\r  \r"), None);
        // Several epoch lines in one line, and epochs that are no whole number.
        let e = epochs("{\"epoch\": 1}\r{\"epoch\": 2}\r{\"epoch\": 2.5}\r{\"epoch\": -1}\r{\"epoch\": np.int64(3)}", Instant::now());
        assert_eq!(e.iter().map(|e| e.epoch).collect::<Vec<_>>(), [1, 2, 3]);
    }
}
