//! The backend's launch ops, each written once (its signature and what it computes): the `Backend` trait declares them, `Counted` counts them, and each backend implements them.
//!
//! Adding an op: its entry here (and its shape rule in `contract/` when no rule there fits), its
//! CPU twin (`cpu/ops/<family>.rs`, called from the CPU backend), its CUDA launcher
//! (`cuda/ops.rs`) with its kernel (`kernels/<family>.cu`: the kernel is found by its name), and
//! its test. Every op returns `Result<(), EngineError>`; an entry with a body gives the trait a
//! default (a composition of other ops) that a backend may override.

/// Calls `$then!` with every launch op: `fn name(&mut self, arg: Type, ...)` then `;` or a
/// default body, each with its documentation.
macro_rules! launch_ops {
    ($then:ident) => {
        $then! {
            fn fill(&mut self, dst: Region, value: f32);
            /// Gathers samples `start..start+rows` (in the epoch's order for `Train`, in file order for
            /// `Test`) into `x` (rows × sample length) and their labels, as `f32`, into `y` (rows).
            fn gather(
                &mut self,
                split: Split,
                start: usize,
                rows: usize,
                x: Region,
                y: Region,
            );
            /// Gathers training batch number `count % steps_per_epoch` of the epoch's order, where
            /// `count` is read from the step counter: samples `start..start+batch` with
            /// `start = (count % steps_per_epoch)·batch`.
            fn gather_train(
                &mut self,
                counter: Region,
                steps_per_epoch: usize,
                batch: usize,
                x: Region,
                y: Region,
            );
            /// [`Backend::gather_train`] for a fused group of `trials` trials, each from its own order:
            /// `orders` holds `trials` permutations of the training split one after another (trial `i`'s
            /// starts `i·n_train` elements in), each element a `u32` stored as the bits of an `f32`
            /// (written with `f32::from_bits`). Trial `i`'s batch `count % steps_per_epoch` (count read
            /// from the step counter) goes into `x` at `i·batch·sample_len` and its labels into `y` at
            /// `i·batch`. Each trial gathers what `gather_train` gathers after `set_train_order` with its
            /// order.
            #[allow(clippy::too_many_arguments)]
            fn gather_train_fused(
                &mut self,
                counter: Region,
                orders: Region,
                steps_per_epoch: usize,
                batch: usize,
                x: Region,
                y: Region,
                trials: usize,
            );
            /// Adds one to the step counter.
            fn advance(&mut self, counter: Region);
            /// Row-major `C = alpha·op(A)·op(B) + beta·C`.
            fn gemm(&mut self, g: GemmShape, a: Region, b: Region, c: Region);
            /// [`Backend::gemm`] over a batch: `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` for
            /// `i < batch.count`, where `X_i` starts `i·stride_x` elements into region `X` (a stride of 0
            /// shares the operand). Each GEMM computes what [`Backend::gemm`] computes on its operands.
            fn gemm_batched(
                &mut self,
                g: GemmShape,
                batch: GemmBatch,
                a: Region,
                b: Region,
                c: Region,
            );
            /// `y[r, c] += bias[c]` for `rows × cols`.
            fn bias_add(
                &mut self,
                y: Region,
                bias: Region,
                rows: usize,
                cols: usize,
            );
            /// `db[c] = Σ_r dy[r, c]`.
            fn bias_grad(
                &mut self,
                dy: Region,
                db: Region,
                rows: usize,
                cols: usize,
            );
            /// [`Backend::bias_add`] over a fused group of `trials` trials: trial `i`'s `rows × cols`
            /// block of `y` starts `i·rows·cols` elements in, and its bias `i·bias_stride` elements into
            /// `bias` (`bias_stride ≥ cols` when there are several trials). Each trial computes what
            /// [`Backend::bias_add`] computes on its operands.
            fn bias_add_fused(
                &mut self,
                y: Region,
                bias: Region,
                rows: usize,
                cols: usize,
                trials: usize,
                bias_stride: usize,
            );
            /// [`Backend::bias_grad`] over a fused group of `trials` trials: trial `i`'s `rows × cols`
            /// block of `dy` starts `i·rows·cols` elements in, and its gradient `i·db_stride` elements
            /// into `db` (`db_stride ≥ cols` when there are several trials; the elements between the
            /// trials' gradients are left as they are). Each trial computes what [`Backend::bias_grad`]
            /// computes on its operands.
            fn bias_grad_fused(
                &mut self,
                dy: Region,
                db: Region,
                rows: usize,
                cols: usize,
                trials: usize,
                db_stride: usize,
            );
            /// `y = max(x, 0)` on the first `len` elements.
            fn relu_fwd(&mut self, x: Region, y: Region, len: usize);
            /// `dx = dy · [y > 0]`.
            fn relu_bwd(
                &mut self,
                y: Region,
                dy: Region,
                dx: Region,
                len: usize,
            );
            /// Convolution, NCHW, weights `[c_out, c_in, k, k]`, with a bias `[c_out]` when `b` is given;
            /// `ws` holds [`Backend::conv_workspace_len`] elements of lowering scratch.
            fn conv2d_fwd(
                &mut self,
                s: &Conv2dShape,
                x: Region,
                w: Region,
                b: Option<Region>,
                y: Region,
                ws: Region,
            );
            /// Gradients of the convolution: `dw` is overwritten; `db` and `dx` too when given.
            #[allow(clippy::too_many_arguments)]
            fn conv2d_bwd(
                &mut self,
                s: &Conv2dShape,
                x: Region,
                w: Region,
                dy: Region,
                dx: Option<Region>,
                dw: Region,
                db: Option<Region>,
                ws: Region,
            );
            /// [`Backend::conv2d_fwd`] over a fused group (see [`FusedConv`]): `s` is one trial's
            /// convolution; trial `i`'s `x` and `y` start `i·x_len` and `i·y_len` elements in, its `w`
            /// and `b` `i·w_stride` elements into `w` and `b`, its workspace `i·ws_stride` elements into
            /// `ws` (at least [`Backend::conv_workspace_len`] with several trials). Each trial computes
            /// what [`Backend::conv2d_fwd`] computes on its operands.
            #[allow(clippy::too_many_arguments)]
            fn conv2d_fwd_fused(
                &mut self,
                s: &Conv2dShape,
                x: Region,
                w: Region,
                b: Option<Region>,
                y: Region,
                ws: Region,
                f: FusedConv,
            );
            /// [`Backend::conv2d_bwd`] over a fused group, laid out as in
            /// [`Backend::conv2d_fwd_fused`] (`dx` as `x`, `dy` as `y`, `dw` and `db` as `w` and `b`).
            #[allow(clippy::too_many_arguments)]
            fn conv2d_bwd_fused(
                &mut self,
                s: &Conv2dShape,
                x: Region,
                w: Region,
                dy: Region,
                dx: Option<Region>,
                dw: Region,
                db: Option<Region>,
                ws: Region,
                f: FusedConv,
            );
            /// Batch normalisation per channel (see `cpu::ops::batchnorm_fwd`): `running` holds
            /// `[mean; c] ++ [var; c]`, `saved` receives `[mean; c] ++ [1/√(var+eps); c]` in training.
            #[allow(clippy::too_many_arguments)]
            fn batchnorm_fwd(
                &mut self,
                s: &PlaneShape,
                x: Region,
                gamma: Region,
                beta: Region,
                running: Region,
                saved: Region,
                y: Region,
                p: BnParams,
            );
            /// Gradients of training-mode batch normalisation: overwrites `dx`, `dgamma` and `dbeta`.
            #[allow(clippy::too_many_arguments)]
            fn batchnorm_bwd(
                &mut self,
                s: &PlaneShape,
                x: Region,
                gamma: Region,
                saved: Region,
                dy: Region,
                dx: Region,
                dgamma: Region,
                dbeta: Region,
            );
            /// [`Backend::batchnorm_fwd`] for every trial of a fused group laid out as [`FusedNorm`]
            /// says: `x` and `y` span every trial's copy, the other regions run from trial 0's to the last
            /// trial's. Each trial computes what [`Backend::batchnorm_fwd`] computes on its operands.
            #[allow(clippy::too_many_arguments)]
            fn batchnorm_fwd_fused(
                &mut self,
                s: &PlaneShape,
                x: Region,
                gamma: Region,
                beta: Region,
                running: Region,
                saved: Region,
                y: Region,
                p: BnParams,
                f: FusedNorm,
            ) {
                let op = "batchnorm_fwd_fused";
                let planes = [("x", x), ("y", y)];
                let params = [("gamma", gamma), ("beta", beta)];
                contract::fused_norm(op, s, f, &planes, &params, Some(running), saved)?;
                for i in 0..f.trials {
                    let [x, gamma, beta, running, saved, y] =
                        f.fwd_trial(s, [x, gamma, beta, running, saved, y], i);
                    self.batchnorm_fwd(s, x, gamma, beta, running, saved, y, p)?;
                }
                Ok(())
            }
            /// [`Backend::batchnorm_bwd`] for every trial of a fused group, laid out as in
            /// [`Backend::batchnorm_fwd_fused`] (`dy` and `dx` as `x`, `dgamma` and `dbeta` as `gamma`).
            #[allow(clippy::too_many_arguments)]
            fn batchnorm_bwd_fused(
                &mut self,
                s: &PlaneShape,
                x: Region,
                gamma: Region,
                saved: Region,
                dy: Region,
                dx: Region,
                dgamma: Region,
                dbeta: Region,
                f: FusedNorm,
            ) {
                let op = "batchnorm_bwd_fused";
                let planes = [("x", x), ("dy", dy), ("dx", dx)];
                let params = [("gamma", gamma), ("dgamma", dgamma), ("dbeta", dbeta)];
                contract::fused_norm(op, s, f, &planes, &params, None, saved)?;
                for i in 0..f.trials {
                    let [x, gamma, saved, dy, dx, dgamma, dbeta] =
                        f.bwd_trial(s, [x, gamma, saved, dy, dx, dgamma, dbeta], i);
                    self.batchnorm_bwd(s, x, gamma, saved, dy, dx, dgamma, dbeta)?;
                }
                Ok(())
            }
            /// Global average pooling: `y[n, c]` is the mean of plane `(n, c)`.
            fn avgpool_fwd(&mut self, s: &PlaneShape, x: Region, y: Region);
            /// `dx[n, c, :] = dy[n, c] / hw`.
            fn avgpool_bwd(&mut self, s: &PlaneShape, dy: Region, dx: Region);
            /// `y = a + b` over `len` elements (a residual connection).
            fn add(&mut self, a: Region, b: Region, y: Region, len: usize);
            /// `y += x` over `len` elements (a gradient reaching a tensor by a second path).
            fn add_assign(&mut self, y: Region, x: Region, len: usize);
            /// `y = x` over `len` elements.
            fn copy(&mut self, x: Region, y: Region, len: usize);
            fn maxpool_fwd(&mut self, s: &PoolShape, x: Region, y: Region);
            fn maxpool_bwd(
                &mut self,
                s: &PoolShape,
                x: Region,
                y: Region,
                dy: Region,
                dx: Region,
            );
            /// Inverted dropout with a counter-based mask: element `i` is dropped when
            /// `crate::rng::uniform(seed, dropout_stream(count, layer), first + i) < p`, else scaled by
            /// `1/(1-p)`, where `count` is read from the step counter.
            fn dropout_fwd(
                &mut self,
                x: Region,
                y: Region,
                len: usize,
                mask: DropoutMask,
            );
            /// The gradient of [`Backend::dropout_fwd`] with the same mask.
            fn dropout_bwd(
                &mut self,
                dy: Region,
                dx: Region,
                len: usize,
                mask: DropoutMask,
            );
            /// Dropout over a fused group, forward or backward alike: trial `i`'s `len` elements at
            /// `i·len` of `src` go to `dst` through the mask of its row of the hyper table `hyper` (its
            /// rate [`fused_hyper::HYPER_DROPOUT`] and its seed, [`fused_hyper::seed_bits`]), the step counter's
            /// count, `layer` and `first`, as [`Backend::dropout_fwd`] applies a [`DropoutMask`]. Each
            /// trial computes what `dropout_fwd` (or `dropout_bwd`) computes with its own mask.
            #[allow(clippy::too_many_arguments)]
            fn dropout_fused(
                &mut self,
                src: Region,
                dst: Region,
                len: usize,
                trials: usize,
                hyper: Region,
                counter: Region,
                layer: u32,
                first: u64,
            );
            /// Softmax cross-entropy over `rows × classes` logits and `f32` labels. Writes
            /// `dlogits = (softmax − onehot)/rows` and adds `[Σ loss, #correct]` into `stats`.
            fn softmax_xent(
                &mut self,
                logits: Region,
                labels: Region,
                dlogits: Region,
                stats: Region,
                rows: usize,
                classes: usize,
            );
            /// [`Backend::softmax_xent`] over a fused group of `trials` trials, each operand's copies one
            /// right after another: trial `i`'s logits and dlogits start `i·rows·classes` elements in,
            /// its labels `i·rows` and its stats `i·STATS_LEN`. Each trial computes what
            /// [`Backend::softmax_xent`] computes on its operands (dlogits scaled by `1/rows`, its own
            /// stats).
            #[allow(clippy::too_many_arguments)]
            fn softmax_xent_fused(
                &mut self,
                logits: Region,
                labels: Region,
                dlogits: Region,
                stats: Region,
                rows: usize,
                classes: usize,
                trials: usize,
            );
            /// Counts correct predictions (and sums the loss) without a gradient: adds into `stats`.
            fn eval_xent(
                &mut self,
                logits: Region,
                labels: Region,
                stats: Region,
                rows: usize,
                classes: usize,
            );
            fn sgd_step(
                &mut self,
                w: Region,
                g: Region,
                v: Region,
                p: SgdParams,
            );
            /// Adam with bias correction for step `t = count + 1`, `count` read from the step counter.
            #[allow(clippy::too_many_arguments)]
            fn adam_step(
                &mut self,
                w: Region,
                g: Region,
                m: Region,
                v: Region,
                p: AdamParams,
                counter: Region,
            );
            /// [`Backend::sgd_step`] over a fused group of `trials` trials of `w.len / trials`
            /// parameters each (trial `i`'s at `i·P` in `w`, `g` and `v`), each with the lr, momentum and
            /// weight decay of its row of the hyper table `hyper` ([`fused_hyper`]); a trial whose `live` is 0
            /// is left untouched. Each trial computes what [`Backend::sgd_step`] computes.
            fn sgd_step_batched(
                &mut self,
                w: Region,
                g: Region,
                v: Region,
                hyper: Region,
                trials: usize,
            );
            /// [`Backend::adam_step`] over a fused group, as [`Backend::sgd_step_batched`] is over
            /// [`Backend::sgd_step`]: one shared step counter, each trial's lr, betas, eps and weight
            /// decay from its row of `hyper`.
            #[allow(clippy::too_many_arguments)]
            fn adam_step_batched(
                &mut self,
                w: Region,
                g: Region,
                m: Region,
                v: Region,
                hyper: Region,
                trials: usize,
                counter: Region,
            );
            /// A dense layer over a batch of `batch.count` trials, as one op:
            /// `y_i = op(x_i)·op(w_i)` ([`Backend::gemm_batched`] with `g`), then trial `i`'s bias
            /// (at `i·bias_stride` in `bias`) added to each of its `g.m` rows of `g.n`, then, with
            /// `relu`, `y = max(y, 0)`. Trial `i`'s `y` lies at `i·g.m·g.n` (`batch.stride_c` is that
            /// length). Each trial computes what `gemm`, `bias_add` and `relu_fwd` compute in turn.
            #[allow(clippy::too_many_arguments)]
            fn dense_fwd(
                &mut self,
                g: GemmShape,
                batch: GemmBatch,
                x: Region,
                w: Region,
                y: Region,
                bias: Region,
                bias_stride: usize,
                relu: bool,
            );
            /// The input gradient of a dense layer whose input came out of a ReLU, with that ReLU's
            /// gradient and the bias gradient of the layer before it, as one op: `dx_i = op(dy_i)·op(w_i)`
            /// ([`Backend::gemm_batched`] with `g`), then `dx = dx · [y > 0]` where `y` (laid out as `dx`,
            /// trial `i`'s at `i·g.m·g.n`) is the ReLU's output, then `db` the sums of `dx`'s rows
            /// ([`Backend::bias_grad_fused`]). Each trial computes what `gemm`, `relu_bwd` and
            /// `bias_grad` compute in turn.
            #[allow(clippy::too_many_arguments)]
            fn dense_bwd_relu(
                &mut self,
                g: GemmShape,
                batch: GemmBatch,
                dy: Region,
                w: Region,
                dx: Region,
                y: Region,
                db: BiasGrad,
            );
            /// [`Backend::softmax_xent_fused`] that also writes the bias gradient of the layer that made
            /// the logits: trial `i`'s `Σ_r dlogits[r, :]` into `db` ([`Backend::bias_grad_fused`]).
            #[allow(clippy::too_many_arguments)]
            fn softmax_xent_bias(
                &mut self,
                logits: Region,
                labels: Region,
                dlogits: Region,
                stats: Region,
                rows: usize,
                classes: usize,
                trials: usize,
                db: BiasGrad,
            ) {
                self.softmax_xent_fused(logits, labels, dlogits, stats, rows, classes, trials)?;
                self.bias_grad_fused(dlogits, db.db, rows, classes, trials, db.stride)
            }
            /// [`Backend::gather`] into each of `trials` trials' rows: trial `i`'s samples at
            /// `i·batch·sample_len` of `x` and its labels at `i·batch` of `y` (`rows ≤ batch`).
            #[allow(clippy::too_many_arguments)]
            fn gather_fused(
                &mut self,
                split: Split,
                start: usize,
                rows: usize,
                batch: usize,
                x: Region,
                y: Region,
                trials: usize,
            ) {
                for r in contract::gather_fused(rows, batch, self.sample_len(), trials, x, y)? {
                    self.gather(split, start, rows, r.x, r.y)?;
                }
                Ok(())
            }
            /// [`Backend::eval_xent`] over `trials` trials: trial `i`'s logits at `i·batch·classes`,
            /// labels at `i·batch` and stats at `i·STATS_LEN`, each over its first `rows` rows.
            #[allow(clippy::too_many_arguments)]
            fn eval_xent_fused(
                &mut self,
                logits: Region,
                labels: Region,
                stats: Region,
                rows: usize,
                batch: usize,
                classes: usize,
                trials: usize,
            ) {
                contract::eval_xent_fused(logits, labels, stats, rows, batch, classes, trials)?;
                for i in 0..trials {
                    let l = Region::new(logits.offset + i * batch * classes, rows * classes);
                    let y = Region::new(labels.offset + i * batch, rows);
                    let s = Region::new(stats.offset + i * STATS_LEN, STATS_LEN);
                    self.eval_xent(l, y, s, rows, classes)?;
                }
                Ok(())
            }
            /// One optimizer step and then the step counter's advance, as one op: what the step's op
            /// ([`Update`]) and then [`Backend::advance`] compute. Adam's `t` is read from `counter`
            /// before it advances.
            fn update(&mut self, u: Update, counter: Region) {
                match u {
                    Update::Sgd { w, g, v, p } => self.sgd_step(w, g, v, p)?,
                    Update::Adam { w, g, m, v, p } => self.adam_step(w, g, m, v, p, counter)?,
                    Update::SgdBatched {
                        w,
                        g,
                        v,
                        hyper,
                        trials,
                    } => self.sgd_step_batched(w, g, v, hyper, trials)?,
                    Update::AdamBatched {
                        w,
                        g,
                        m,
                        v,
                        hyper,
                        trials,
                    } => self.adam_step_batched(w, g, m, v, hyper, trials, counter)?,
                }
                self.advance(counter)
            }
            /// Runs the recorded graph once.
            fn replay(&mut self) {
                self.replay_slot(0)
            }
            /// Runs the graph in `slot` once.
            fn replay_slot(&mut self, slot: usize) {
                let _ = slot;
                Err(EngineError::Device(
                    "this backend cannot capture graphs".into(),
                ))
            }
        }
    };
}
pub(crate) use launch_ops;

/// The launch ops as the `Backend` trait declares them.
macro_rules! declare_launch_ops {
    ($( $(#[$m:meta])* fn $name:ident(&mut $self:ident $(, $arg:ident : $ty:ty)* $(,)?) $tail:tt )*) => {
        $(
            $(#[$m])*
            fn $name(&mut $self $(, $arg: $ty)*) -> Result<(), EngineError> $tail
        )*
    };
}
pub(crate) use declare_launch_ops;
