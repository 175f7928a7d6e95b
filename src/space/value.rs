//! A parameter's value (a number or a word), and a problem with one parameter.

use serde::{Deserialize, Serialize};
use serde_yaml::Value;

/// A parameter's value: a number or a word.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Num(f64),
    Word(String),
}

/// Whole numbers are written as integers (`batch_size: 32`, not `32.0`).
impl Serialize for ParamValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamValue::Num(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                s.serialize_i64(*x as i64)
            }
            ParamValue::Num(x) => s.serialize_f64(*x),
            ParamValue::Word(w) => s.serialize_str(w),
        }
    }
}

impl ParamValue {
    /// About how many bytes a trial spends holding this value: its text, or a number's cell.
    pub fn held_bytes(&self) -> usize {
        match self {
            ParamValue::Num(_) => NUMBER_BYTES,
            ParamValue::Word(w) => w.len(),
        }
    }
}

/// What a number is counted as in [`ParamValue::held_bytes`]: the longest text of an `f64`.
pub const NUMBER_BYTES: usize = 24;

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Num(x) => write!(f, "{x}"),
            ParamValue::Word(s) => f.write_str(s),
        }
    }
}

/// A problem with one parameter: the key under `parameters.<name>` and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct SpaceError {
    pub key: String,
    pub message: String,
}

pub(super) fn err(key: impl Into<String>, message: impl Into<String>) -> SpaceError {
    SpaceError {
        key: key.into(),
        message: message.into(),
    }
}

pub(super) fn to_value(v: &Value, key: &str) -> Result<ParamValue, SpaceError> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(ParamValue::Num)
            .ok_or_else(|| err(key, "is not a representable number")),
        Value::String(s) => Ok(ParamValue::Word(s.clone())),
        Value::Bool(b) => Ok(ParamValue::Word(b.to_string())),
        _ => Err(err(key, "must be a number or a word")),
    }
}

pub(super) fn finite(x: f64, key: &str) -> Result<f64, SpaceError> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(err(key, "must be finite"))
    }
}
