//! The runners, one per command that trains: each builds its rounds from a job and hands them to the scheduler; none imports another.

pub mod batch_scan;
pub mod fib;
pub mod parallel;
pub mod sweep;
pub mod train;
