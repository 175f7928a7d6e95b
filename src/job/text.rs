//! A job file's text before it is parsed: read bounded from a regular file, then checked for size, nesting depth, alias expansion and duplicate keys, so that no job file makes parsing slow or large.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

use crate::data::input_file::{open_regular, read_at_most, OpenError, UTF8_BOM};
use crate::error::JobError;

/// The largest job file read, in bytes.
pub const MAX_JOB_BYTES: usize = 1 << 20;
/// The deepest nesting of mappings and lists a job file may have (a job needs about 4).
pub const MAX_DEPTH: usize = 32;
/// The most YAML nodes (scalars, lists, mappings) a job file may hold once its aliases are
/// expanded: a "billion laughs" of aliases is refused here, before anything is built from it.
pub const MAX_NODES: usize = 100_000;

/// A problem in a job's text: the message, the 1-based line when known, and the dotted key
/// when one is concerned.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub line: Option<usize>,
    pub key: Option<String>,
    pub message: String,
}

impl Problem {
    fn at(line: usize, message: impl Into<String>) -> Problem {
        Problem {
            line: Some(line),
            key: None,
            message: message.into(),
        }
    }
}

/// Reads a job file: a regular file (a directory or a FIFO is refused, never waited on) of at
/// most [`MAX_JOB_BYTES`], UTF-8 with or without a byte-order mark.
pub fn read(path: &Path) -> Result<String, JobError> {
    let syntax = |message: String| JobError::Syntax {
        path: path.to_path_buf(),
        message,
    };
    let too_big = |len: u64| {
        syntax(format!(
            "the job file is {len} bytes, more than {MAX_JOB_BYTES} (1 MiB): a job is a short YAML text"
        ))
    };
    let (file, len) = open_regular(path).map_err(|e| match e {
        OpenError::Missing => JobError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        },
        OpenError::Io(source) => JobError::Read {
            path: path.to_path_buf(),
            source,
        },
        other => syntax(other.describe("a job file (YAML)")),
    })?;
    if len > MAX_JOB_BYTES as u64 {
        return Err(too_big(len));
    }
    let bytes = read_at_most(file, MAX_JOB_BYTES)
        .map_err(|source| JobError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| too_big(MAX_JOB_BYTES as u64 + 1))?;
    decode(bytes).map_err(syntax)
}

/// The text of a job file's bytes: UTF-8, a leading byte-order mark dropped.
pub fn decode(bytes: Vec<u8>) -> Result<String, String> {
    if bytes.starts_with(&[0xff, 0xfe]) || bytes.starts_with(&[0xfe, 0xff]) {
        return Err(
            "the job file is UTF-16 text (it starts with a UTF-16 byte-order mark): save it as UTF-8"
                .into(),
        );
    }
    let body = bytes.strip_prefix(&UTF8_BOM[..]).unwrap_or(&bytes);
    match std::str::from_utf8(body) {
        Ok(text) => Ok(text.to_string()),
        Err(e) => {
            let at = e.valid_up_to();
            let line = body[..at].iter().filter(|&&b| b == b'\n').count() + 1;
            Err(format!(
                "line {line}: the job file is not UTF-8 text (byte {} is not valid UTF-8): save it as UTF-8",
                at + (bytes.len() - body.len())
            ))
        }
    }
}

/// Drops a leading byte-order mark (U+FEFF), which YAML takes for a second document.
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Every check of a job's text that bounds what parsing it costs: its size, its nesting depth
/// (looked at before the YAML parser sees it: deep flow nesting makes that parser quadratic),
/// then its nodes with aliases expanded, and duplicate keys in any mapping.
pub fn check(text: &str) -> Result<(), Problem> {
    if text.len() > MAX_JOB_BYTES {
        return Err(Problem {
            line: None,
            key: None,
            message: format!(
                "the job is {} bytes, more than {MAX_JOB_BYTES} (1 MiB): a job is a short YAML text",
                text.len()
            ),
        });
    }
    depth(text)?;
    walk(text)
}

/// Checks that no line nests mappings and lists deeper than [`MAX_DEPTH`], counting block
/// levels by indentation, `- ` entries, and `[`/`{` outside quotes and comments. The count may
/// exceed YAML's own (a continuation line is counted as a level), never fall short of it where
/// YAML nests flow collections, which is what makes parsing slow.
fn depth(text: &str) -> Result<(), Problem> {
    let deep = |line: usize, depth: usize| {
        Problem::at(
            line,
            format!(
                "the job nests mappings and lists {depth} deep, more than {MAX_DEPTH}: a job needs a few levels"
            ),
        )
    };
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // Where a node may start (a quote then opens a quoted scalar, `[` or `{` a collection).
    let mut start = true;
    // A block scalar whose lines are being skipped: the indentation of the line that opened it,
    // and that of its first line of content once seen.
    let mut block_scalar: Option<(usize, Option<usize>)> = None;
    for (n, raw) in text.split('\n').enumerate() {
        let line = n + 1;
        let indent = raw.len() - raw.trim_start_matches(' ').len();
        let body = raw[indent..].trim_end_matches('\r');
        if let Some((parent, content)) = block_scalar {
            if body.trim().is_empty() {
                continue;
            }
            if indent > parent && content.is_none_or(|c| indent >= c) {
                block_scalar = Some((parent, Some(content.unwrap_or(indent))));
                continue;
            }
            block_scalar = None;
        }
        if flow == 0 {
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            if body.starts_with("---") || body.starts_with("...") {
                indents.clear();
            }
            while indents.last().is_some_and(|&i| i > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
                if indents.len() > MAX_DEPTH {
                    return Err(deep(line, indents.len()));
                }
            }
            start = true;
        }
        let bytes = body.as_bytes();
        let mut dashes = 0usize;
        let mut i = 0;
        let mut space_before = true;
        let mut after_quote = false;
        // A document marker, then a node on the same line.
        if flow == 0
            && (body.starts_with("---") || body.starts_with("..."))
            && bytes.get(3).is_none_or(|b| b.is_ascii_whitespace())
        {
            i = 3;
            start = true;
        }
        while i < bytes.len() {
            let c = bytes[i];
            let next_blank = bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace());
            if c == b' ' || c == b'\t' {
                space_before = true;
                i += 1;
                continue;
            }
            let was_after_quote = std::mem::replace(&mut after_quote, false);
            match c {
                b'#' if space_before => break,
                b'"' | b'\'' if start => {
                    // A quoted scalar, up to its closing quote on this line (a quote that goes
                    // on is taken as closed here: the rest is then counted, never skipped).
                    i += 1;
                    while i < bytes.len() {
                        match (c, bytes[i]) {
                            (b'"', b'\\') => i += 1,
                            (b'\'', b'\'') if bytes.get(i + 1) == Some(&b'\'') => i += 1,
                            (q, b) if q == b => break,
                            _ => {}
                        }
                        i += 1;
                    }
                    start = false;
                    after_quote = true;
                }
                b'[' | b'{' if start || flow > 0 => {
                    flow += 1;
                    start = true;
                    if indents.len() + dashes + flow > MAX_DEPTH {
                        return Err(deep(line, indents.len() + dashes + flow));
                    }
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    start = false;
                }
                b',' if flow > 0 => start = true,
                b'-' | b'?' if start && flow == 0 && next_blank => {
                    dashes += 1;
                    if indents.len() + dashes > MAX_DEPTH {
                        return Err(deep(line, indents.len() + dashes));
                    }
                }
                b':' if next_blank || was_after_quote => start = true,
                b'&' | b'!' | b'*' if start => {
                    while i + 1 < bytes.len() && !bytes[i + 1].is_ascii_whitespace() {
                        if flow > 0 && b",[]{}".contains(&bytes[i + 1]) {
                            break;
                        }
                        i += 1;
                    }
                    // An anchor or a tag comes before its node; an alias is the node.
                    start = c != b'*';
                }
                b'|' | b'>' if start && flow == 0 => {
                    block_scalar = Some((indent, None));
                    break;
                }
                _ => start = false,
            }
            space_before = false;
            i += 1;
        }
    }
    Ok(())
}

/// What the walk over the parsed nodes has seen.
struct Walk {
    nodes: Cell<usize>,
    path: RefCell<Vec<String>>,
    /// The dotted key given twice, once found.
    duplicate: RefCell<Option<String>>,
}

/// Walks every node of the text as the YAML deserializer produces it (aliases expanded), and
/// stops past [`MAX_NODES`] or at a key given twice in one mapping.
fn walk(text: &str) -> Result<(), Problem> {
    let w = Walk {
        nodes: Cell::new(0),
        path: RefCell::new(Vec::new()),
        duplicate: RefCell::new(None),
    };
    let result = Node(&w).deserialize(serde_yaml::Deserializer::from_str(text));
    let Err(e) = result else {
        return Ok(());
    };
    let line = e.location().map(|l| l.line());
    if let Some(key) = w.duplicate.borrow_mut().take() {
        // The parser's position is past the first one, not always at the second: the caller
        // finds the lines.
        let _ = line;
        return Err(Problem {
            line: None,
            key: Some(key),
            message: "is given twice in the same mapping: keep one (the last would silently win)"
                .into(),
        });
    }
    // The deserializer's own bound on alias jumps may stop a bomb before the count does.
    if w.nodes.get() > MAX_NODES || e.to_string().contains("repetition limit") {
        return Err(Problem {
            line: None,
            key: None,
            message: format!(
                "the job holds more than {MAX_NODES} values once its aliases (*name) are expanded: \
                 a job is a short YAML text"
            ),
        });
    }
    // Anything else (bad syntax, several documents) is said by the parse that follows.
    Ok(())
}

/// A node to walk.
#[derive(Clone, Copy)]
struct Node<'a>(&'a Walk);

impl Node<'_> {
    fn count<E: de::Error>(&self) -> Result<(), E> {
        let n = self.0.nodes.get() + 1;
        self.0.nodes.set(n);
        if n > MAX_NODES {
            return Err(E::custom("too many nodes"));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.count()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.count()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.count()
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.count()
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.count()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.count()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.count()
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        self.count()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.count()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.count()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.count()?;
        let mut i = 0usize;
        loop {
            self.0.path.borrow_mut().push(i.to_string());
            let more = seq.next_element_seed(self)?;
            self.0.path.borrow_mut().pop();
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.count()?;
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key_seed(Key(self))? {
            if !keys.insert(key.clone()) {
                let mut path = self.0.path.borrow().clone();
                path.push(key);
                *self.0.duplicate.borrow_mut() = Some(path.join("."));
                return Err(de::Error::custom("duplicate key"));
            }
            self.0.path.borrow_mut().push(key);
            let r = map.next_value_seed(self);
            self.0.path.borrow_mut().pop();
            r?;
        }
        Ok(())
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged node (`!tag value`): the tag, then the node.
        let (_, variant) = data.variant_seed(Key(self))?;
        variant.newtype_variant_seed(self)
    }
}

/// A mapping key: its text when it is a scalar (a complex key is walked, and never equal to
/// another).
#[derive(Clone, Copy)]
struct Key<'a>(Node<'a>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        self.0.count()?;
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        self.0.count()?;
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        self.0.count()?;
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        self.0.count()?;
        Ok(v.to_string())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.count()?;
        Ok(v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        self.0.count()?;
        Ok("~".into())
    }
    fn visit_none<E: de::Error>(self) -> Result<String, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<String, A::Error> {
        self.0.visit_seq(seq)?;
        Ok(format!("<list key {}>", self.0 .0.nodes.get()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<String, A::Error> {
        self.0.visit_map(map)?;
        Ok(format!("<mapping key {}>", self.0 .0.nodes.get()))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<String, A::Error> {
        self.0.visit_enum(data)?;
        Ok(format!("<tagged key {}>", self.0 .0.nodes.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_jobs_pass() {
        for text in [
            "model: {kind: mlp}\ndata: {source: synthetic}\n",
            include_str!("../../jobs/example.yaml"),
            "command: |\n  python t.py [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n      --x 1\nrun_cap: 2\n",
            "a: 'it''s [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\nb: \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"\n",
            "base: &b {lr: {value: 0.1}}\nparameters: *b\n",
        ] {
            assert_eq!(check(text), Ok(()), "{text}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_with_its_line() {
        let flow = format!("a: 1\nn: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = check(&flow).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("more than 32"), "{}", e.message);
        let block: String = (0..200)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check(&block).unwrap_err().message.contains("deep"));
        let dashes = format!("n: \n{}1\n", "- ".repeat(1000));
        assert!(check(&dashes).is_err());
        // Flow nesting hidden behind something that only looks like a quote is still counted.
        let hidden = format!("n: [a'b, {}]\n", "[".repeat(50));
        assert!(check(&hidden).is_err());
        // ... or behind a document marker, or after a block scalar ends.
        assert!(check(&format!("--- {}\n", "[".repeat(50))).is_err());
        let after = format!("a: |\n      text\n   {}\n", "[".repeat(50));
        assert!(check(&after).is_err());
    }

    #[test]
    fn an_alias_bomb_is_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        let e = check(&text).unwrap_err();
        assert!(e.message.contains("aliases"), "{}", e.message);
        // One list of 100k items referred to by many aliases.
        let big = format!(
            "a: &a [{}]\nb: [{}]\n",
            vec!["1"; 60_000].join(","),
            vec!["*a"; 100].join(",")
        );
        assert!(check(&big).is_err());
    }

    #[test]
    fn duplicate_keys_are_named_with_their_path() {
        let e = check("parameters:\n  lr: {value: 1}\n  lr: {value: 2}\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("parameters.lr"));
        let e = check("model: {kind: mlp}\nmodel: {kind: cnn}\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("model"));
        let e = check("slices:\n  - {sm: 1, sm: 2}\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("slices.0.sm"));
    }

    #[test]
    fn bytes_decode_with_or_without_a_bom() {
        assert_eq!(decode(b"\xef\xbb\xbfa: 1\n".to_vec()).unwrap(), "a: 1\n");
        assert!(decode(b"\xff\xfea\x00".to_vec())
            .unwrap_err()
            .contains("UTF-16"));
        assert!(decode(b"a: 1\nb: \xff\n".to_vec())
            .unwrap_err()
            .contains("line 2"));
    }
}
