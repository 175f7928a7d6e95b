//! gpumux: multiplex one GPU among many concurrent trainings, split into slices, and measure the time per training.
//!
//! Data flow: [`job`] → [`plan`] → [`sched`] → slice → [`engine`] (with [`models`] and [`data`]) → [`report`].

pub mod commands;
pub mod data;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod hash;
pub mod job;
pub mod models;
pub mod parallel;
pub mod plan;
pub mod report;
pub mod sched;
pub mod space;
pub mod sweep;
pub mod telemetry;
pub mod train;

pub use error::{Error, Result};
