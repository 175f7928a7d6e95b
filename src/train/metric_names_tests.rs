//! A metric answers to its common names: Keras's and W&B's `val_accuracy`, `val_loss`, `loss` for gpumux's own, and the other way round.

use std::collections::BTreeMap;

use super::{metric_in, own_metric_name, EpochStats};

#[test]
fn common_names_map_to_gpumuxs_own() {
    assert_eq!(own_metric_name("val_accuracy"), "test_acc");
    assert_eq!(own_metric_name("val_loss"), "test_loss");
    assert_eq!(own_metric_name("loss"), "train_loss");
    assert_eq!(own_metric_name("grad_norm"), "grad_norm");
}

#[test]
fn an_epoch_answers_to_either_name() {
    let e = EpochStats {
        epoch: 2,
        train_loss: 0.3,
        train_acc: 0.9,
        test_loss: 0.4,
        test_acc: 0.8,
        wall_s: 0.0,
        extra: BTreeMap::from([("grad_norm".to_string(), 1.5)]),
    };
    assert_eq!(e.metric("val_accuracy"), Some(0.8));
    assert_eq!(e.metric("test_acc"), Some(0.8));
    assert_eq!(e.metric("val_loss"), Some(0.4));
    assert_eq!(e.metric("loss"), Some(0.3));
    assert_eq!(e.metric("grad_norm"), Some(1.5));
    assert_eq!(e.metric("nothing"), None);
}

#[test]
fn a_result_answers_to_either_name() {
    // A built-in trial's result, read by a sweep whose metric has a Keras name.
    let builtin = BTreeMap::from([
        ("test_acc".to_string(), 0.8),
        ("final_loss".to_string(), 0.3),
    ]);
    assert_eq!(metric_in(&builtin, "val_accuracy"), Some(0.8));
    assert_eq!(metric_in(&builtin, "loss"), Some(0.3));
    // A Keras script's result, read by a sweep whose metric is gpumux's name.
    let keras = BTreeMap::from([("val_accuracy".to_string(), 0.7)]);
    assert_eq!(metric_in(&keras, "test_acc"), Some(0.7));
    assert_eq!(metric_in(&keras, "val_accuracy"), Some(0.7));
    assert_eq!(metric_in(&keras, "test_loss"), None);
}
