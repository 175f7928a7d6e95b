//! The CPU twins of `kernels/loss.cu`: softmax cross-entropy, with and without its gradient.

/// One row of softmax cross-entropy: its max logit, `Σ exp(logit − max)`, loss, and whether the
/// first argmax equals the label.
struct XentRow {
    max: f32,
    sum: f32,
    loss: f32,
    correct: bool,
}

fn xent_row(row: &[f32], label: f32) -> XentRow {
    let t = label as usize;
    assert!(
        label >= 0.0 && t < row.len(),
        "label {label} is not a class of 0..{}",
        row.len()
    );
    let (arg, max) =
        row.iter().copied().enumerate().fold(
            (0, row[0]),
            |best, (j, v)| if v > best.1 { (j, v) } else { best },
        );
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    // logsumexp − logit[t] = ln(sum) + max − logit[t]
    let loss = sum.ln() - (row[t] - max);
    XentRow {
        max,
        sum,
        loss,
        correct: arg == t,
    }
}

/// Softmax cross-entropy with integer labels stored as `f32`. Writes `dlogits = (softmax − onehot)/rows`
/// and returns `(Σ_r loss_r, #rows whose argmax equals the label)`; the argmax takes the first maximum.
pub fn softmax_xent(
    logits: &[f32],
    labels: &[f32],
    dlogits: &mut [f32],
    rows: usize,
    classes: usize,
) -> (f32, f32) {
    let mut stats = XentStats::default();
    for r in 0..rows {
        let row = &logits[r * classes..(r + 1) * classes];
        let x = xent_row(row, labels[r]);
        let t = labels[r] as usize;
        let drow = &mut dlogits[r * classes..(r + 1) * classes];
        for (j, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            let onehot = if j == t { 1.0 } else { 0.0 };
            *d = ((v - x.max).exp() / x.sum - onehot) / rows as f32;
        }
        stats.add(&x);
    }
    stats.finish()
}

/// [`softmax_xent`] over `trials` trials, each operand's copies one after another: trial `i`'s
/// logits and dlogits at `i·rows·classes`, labels at `i·rows`, and its `[Σ loss, #correct]`
/// added into `stats[2i..2i + 2]`. Each trial is one call of [`softmax_xent`], so it is
/// bit-identical to that call.
pub fn softmax_xent_fused(
    logits: &[f32],
    labels: &[f32],
    dlogits: &mut [f32],
    stats: &mut [f32],
    rows: usize,
    classes: usize,
    trials: usize,
) {
    use crate::engine::STATS_LEN;
    let per = rows * classes;
    for i in 0..trials {
        let at = i * per..(i + 1) * per;
        let y = &labels[i * rows..(i + 1) * rows];
        let (loss, correct) = softmax_xent(&logits[at.clone()], y, &mut dlogits[at], rows, classes);
        let s = &mut stats[i * STATS_LEN..(i + 1) * STATS_LEN];
        s[0] += loss;
        s[1] += correct;
    }
}

/// The loss sum and correct count of [`softmax_xent`] without the gradient.
pub fn eval_xent(logits: &[f32], labels: &[f32], rows: usize, classes: usize) -> (f32, f32) {
    let mut stats = XentStats::default();
    for r in 0..rows {
        stats.add(&xent_row(
            &logits[r * classes..(r + 1) * classes],
            labels[r],
        ));
    }
    stats.finish()
}

/// The running loss sum (in f64) and correct count of a batch.
#[derive(Default)]
struct XentStats {
    loss: f64,
    correct: usize,
}

impl XentStats {
    fn add(&mut self, row: &XentRow) {
        self.loss += row.loss as f64;
        self.correct += usize::from(row.correct);
    }
    fn finish(&self) -> (f32, f32) {
        (self.loss as f32, self.correct as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::ops::testing::*;
    use crate::rng::HostRng;

    #[test]
    fn softmax_xent_by_hand() {
        #[rustfmt::skip]
        let logits = [
            1.0, 2.0, 3.0,        // label 2: loss = ln(1 + e⁻¹ + e⁻²), correct
            5.0, 5.0, 1.0,        // label 1: loss = ln(2 + e⁻⁴), the first max (class 0) is wrong
            1000.0, 0.0, -1000.0, // label 0: loss = 0 without overflow, correct
        ];
        let labels = [2.0, 1.0, 0.0];
        let mut d = [f32::NAN; 9];
        let (loss, correct) = softmax_xent(&logits, &labels, &mut d, 3, 3);
        let want = (1.0 + (-1.0f64).exp() + (-2.0f64).exp()).ln() + (2.0 + (-4.0f64).exp()).ln();
        assert!((loss as f64 - want).abs() < 1e-6, "loss {loss} vs {want}");
        assert_eq!(correct, 2.0);
        let z = 1.0 + (-1.0f64).exp() + (-2.0f64).exp();
        let z2 = 2.0 + (-4.0f64).exp();
        #[rustfmt::skip]
        let want_d = [
            (-2.0f64).exp() / z, (-1.0f64).exp() / z, 1.0 / z - 1.0,
            1.0 / z2, 1.0 / z2 - 1.0, (-4.0f64).exp() / z2,
            0.0, 0.0, 0.0,
        ];
        for (i, (&got, &want)) in d.iter().zip(&want_d).enumerate() {
            assert!(
                (got as f64 - want / 3.0).abs() < 1e-7,
                "dlogits[{i}]: {got} vs {}",
                want / 3.0
            );
        }
        assert_eq!(eval_xent(&logits, &labels, 3, 3), (loss, correct));
    }

    #[test]
    fn softmax_xent_gradient_matches_finite_differences() {
        let (rows, classes) = (4, 6);
        let mut rng = HostRng::new(71);
        let logits = random(&mut rng, rows * classes, -3.0, 3.0);
        let labels: Vec<f32> = (0..rows).map(|_| rng.below(classes) as f32).collect();
        let mut d = vec![f32::NAN; logits.len()];
        let (loss, correct) = softmax_xent(&logits, &labels, &mut d, rows, classes);
        assert_eq!(eval_xent(&logits, &labels, rows, classes), (loss, correct));
        // dlogits is the gradient of the mean loss.
        check_grad("softmax_xent dlogits", &logits, &d, |l| {
            eval_xent(l, &labels, rows, classes).0 as f64 / rows as f64
        });
    }

    /// Trial counts 1, 2, 5 and 13 over odd shapes, stats starting from non-zero values: each
    /// trial bit for bit one call of the single op.
    #[test]
    fn fused_softmax_xent_is_bit_identical_to_one_call_per_trial() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = HostRng::new(72);
        for trials in [1, 2, 5, 13] {
            let (rows, classes) = (1 + rng.below(9), 1 + rng.below(12));
            let per = rows * classes;
            let logits = random(&mut rng, trials * per, -4.0, 4.0);
            let labels: Vec<f32> = (0..trials * rows)
                .map(|_| rng.below(classes) as f32)
                .collect();
            let stats0 = random(&mut rng, trials * 2, 0.0, 5.0);
            let mut d = vec![f32::NAN; trials * per];
            let mut stats = stats0.clone();
            softmax_xent_fused(&logits, &labels, &mut d, &mut stats, rows, classes, trials);
            for i in 0..trials {
                let at = i * per..(i + 1) * per;
                let mut di = vec![f32::NAN; per];
                let y = &labels[i * rows..(i + 1) * rows];
                let (loss, correct) = softmax_xent(&logits[at.clone()], y, &mut di, rows, classes);
                assert_eq!(bits(&d[at]), bits(&di), "dlogits of trial {i} of {trials}");
                let want = [stats0[2 * i] + loss, stats0[2 * i + 1] + correct];
                assert_eq!(
                    bits(&stats[2 * i..2 * i + 2]),
                    bits(&want),
                    "stats of trial {i}"
                );
            }
        }
    }

    // ---- optimisers ----
}
