//! The seed schedule of a training: which stream of the trial's seed drives what, named once for single trials and mirrored training alike.

use crate::rng::{derive, HostRng};

/// The label of the stream that orders epoch `e`'s training samples: `EPOCH_ORDER + e`.
const EPOCH_ORDER: u64 = 0x100;
/// The label of the stream that draws dropout masks.
const DROPOUT: u64 = 2;

/// The seed of the initial weights: the trial's seed itself (the network derives each
/// parameter block's stream from it), the same on every replica of a mirrored training.
pub fn init(seed: u64) -> u64 {
    seed
}

/// The seed of the dropout masks, for every step of the training.
pub fn dropout(seed: u64) -> u64 {
    derive(seed, DROPOUT)
}

/// The seed of the order in which epoch `epoch` (1-based) visits the training samples.
pub fn epoch_order_seed(seed: u64, epoch: u32) -> u64 {
    derive(seed, EPOCH_ORDER + epoch as u64)
}

/// The order in which epoch `epoch` (1-based) visits the `n_train` training samples.
pub fn epoch_order(seed: u64, epoch: u32, n_train: usize) -> Vec<u32> {
    HostRng::new(epoch_order_seed(seed, epoch)).permutation(n_train)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_keeps_its_streams() {
        // Changing a label changes every trial's numbers: these are fixed.
        assert_eq!(dropout(7), derive(7, 2));
        assert_eq!(epoch_order_seed(7, 1), derive(7, 0x101));
        assert_eq!(init(7), 7);
        let order = epoch_order(7, 3, 10);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<u32>>());
        assert_ne!(order, epoch_order(7, 4, 10));
    }
}
