//! Units of measure shared by every layer.

/// Bytes in a mebibyte.
pub const MIB: f64 = (1u64 << 20) as f64;
