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
/// The trial's dropout rate in every dropout layer.
pub const HYPER_DROPOUT: usize = 7;
/// The low and high 32 bits of the trial's dropout seed, each stored as the bits of an `f32`
/// ([`seed_bits`]).
pub const HYPER_SEED_LO: usize = 8;
pub const HYPER_SEED_HI: usize = 9;
/// The group's step counter when the trial started (a `u32` stored as the bits of an `f32`):
/// the trial's own steps are the counter's value less this, so a trial that takes a slot freed
/// in a running group counts its steps (Adam's bias correction, its dropout masks) from 0, as
/// alone.
pub const HYPER_STEP0: usize = 10;
/// f32 elements in one trial's row; trial `i`'s row starts at `i·HYPER_LEN`.
pub const HYPER_LEN: usize = 11;

/// A dropout seed as the two table entries that hold it: its low and its high 32 bits.
pub fn seed_bits(seed: u64) -> [f32; 2] {
    [
        f32::from_bits(seed as u32),
        f32::from_bits((seed >> 32) as u32),
    ]
}

/// The trial's own step count of a row of the hyper table, at the group's counter `count`.
pub fn row_steps(row: &[f32], count: u32) -> u32 {
    count.wrapping_sub(row[HYPER_STEP0].to_bits())
}

/// The dropout seed of a row of the hyper table.
pub fn row_seed(row: &[f32]) -> u64 {
    (row[HYPER_SEED_LO].to_bits() as u64) | ((row[HYPER_SEED_HI].to_bits() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels read the table with their own copies of the offsets.
    #[test]
    fn the_kernels_use_the_same_offsets() {
        let src = include_str!("../../kernels/common.cuh");
        for (name, value) in [
            ("HYPER_LR", HYPER_LR),
            ("HYPER_WD", HYPER_WD),
            ("HYPER_MOMENTUM", HYPER_MOMENTUM),
            ("HYPER_BETA1", HYPER_BETA1),
            ("HYPER_BETA2", HYPER_BETA2),
            ("HYPER_EPS", HYPER_EPS),
            ("HYPER_LIVE", HYPER_LIVE),
            ("HYPER_DROPOUT", HYPER_DROPOUT),
            ("HYPER_SEED_LO", HYPER_SEED_LO),
            ("HYPER_SEED_HI", HYPER_SEED_HI),
            ("HYPER_STEP0", HYPER_STEP0),
            ("HYPER_LEN", HYPER_LEN),
        ] {
            let line = format!("#define {name} {value}u\n");
            assert!(
                src.contains(&line),
                "kernels/common.cuh lacks `{}`",
                line.trim()
            );
        }
    }
}

#[cfg(test)]
mod seed_tests {
    use super::*;

    #[test]
    fn a_seed_survives_the_table() {
        for seed in [0u64, 1, u64::MAX, 0x1234_5678_9abc_def0, 1 << 63] {
            let mut row = [0f32; HYPER_LEN];
            let [lo, hi] = seed_bits(seed);
            row[HYPER_SEED_LO] = lo;
            row[HYPER_SEED_HI] = hi;
            assert_eq!(row_seed(&row), seed);
        }
    }
}
