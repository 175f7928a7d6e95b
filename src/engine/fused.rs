//! The per-trial hyper table of a fused group: one row of [`HYPER_LEN`] f32 per trial, read by the batched optimizer steps (`kernels/optim.cu` mirrors these offsets).

/// Learning rate.
pub const HYPER_LR: usize = 0;
/// L2 weight decay, added to the gradient.
pub const HYPER_WD: usize = 1;
/// SGD momentum (0: none).
pub const HYPER_MOMENTUM: usize = 2;
/// Adam's β1.
pub const HYPER_BETA1: usize = 3;
/// Adam's β2.
pub const HYPER_BETA2: usize = 4;
/// Adam's eps.
pub const HYPER_EPS: usize = 5;
/// 1 while the trial trains, 0 once it has failed: the optimizer steps leave a dead trial's
/// parameters and moments untouched.
pub const HYPER_LIVE: usize = 6;
/// f32 elements in one trial's row; trial `i`'s row starts at `i·HYPER_LEN`.
pub const HYPER_LEN: usize = 7;

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels read the table with their own copies of the offsets.
    #[test]
    fn the_kernels_use_the_same_offsets() {
        let src = include_str!("../../kernels/optim.cu");
        for (name, value) in [
            ("HYPER_LR", HYPER_LR),
            ("HYPER_WD", HYPER_WD),
            ("HYPER_MOMENTUM", HYPER_MOMENTUM),
            ("HYPER_BETA1", HYPER_BETA1),
            ("HYPER_BETA2", HYPER_BETA2),
            ("HYPER_EPS", HYPER_EPS),
            ("HYPER_LIVE", HYPER_LIVE),
            ("HYPER_LEN", HYPER_LEN),
        ] {
            let line = format!("#define {name} {value}u\n");
            assert!(
                src.contains(&line),
                "kernels/optim.cu lacks `{}`",
                line.trim()
            );
        }
    }
}
