//! The CPU reference backend: the arena is host memory, every op is a twin in [`ops`].

mod im2col;
pub mod ops;
