//! The one training loop: epochs of steps over the seed schedule's orders, each epoch's figures and evaluation, pruning, and each trial's result, whatever takes the steps (one backend, the replicas of a mirrored training, or a fused group of trials).

use std::time::Instant;

use super::stop::Stop;
use super::{seeds, EpochStats, Prune, TrialResult};
use crate::cancel::Cancel;
use crate::engine::STATS_LEN;

/// Where a step stands in the training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepAt {
    /// 1-based.
    pub epoch: u32,
    /// 0-based, within the epoch.
    pub step: usize,
    /// The steps this epoch takes.
    pub steps: usize,
}

/// What takes a training's steps: one backend, the replicas of a mirrored training, or a fused
/// group training several trials (its members) as one.
pub trait Steps {
    /// The trials trained together: 1, or a fused group's width.
    fn width(&self) -> usize {
        1
    }
    /// Starts an epoch: member `i`'s training samples are visited in `orders[i]` (one order
    /// per member, an ended member's too), and the epoch's sums start at zero.
    fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop>;
    /// Takes one training step of every member. An error ends every member still training; a
    /// member that diverged alone is ended in `ends` (`Failure::NonFiniteLoss`, see
    /// [`super::stop`]) and the others go on.
    fn step(&mut self, at: StepAt, ends: &mut Ends) -> Result<(), Stop>;
    /// Ends epoch `epoch`: each member's sums over its training rows (loss, then correct
    /// predictions), and, with `evaluate`, its mean loss and accuracy over the test split (NaN
    /// without). A member whose loss diverged is ended in `ends`.
    fn end_epoch(
        &mut self,
        epoch: u32,
        evaluate: bool,
        ends: &mut Ends,
    ) -> Result<Vec<EpochSums>, Stop>;
    /// Stops member `i` (pruned) while the others go on; a training of one ends with it.
    fn end_member(&mut self, _i: usize) -> Result<(), Stop> {
        Ok(())
    }
    /// Waits for the work issued, after the last epoch.
    fn finish(&mut self) -> Result<(), Stop>;
    /// Bytes of the arenas allocated for one member.
    fn arena_bytes(&self) -> u64;
    /// Parameters of one member's model.
    fn param_count(&self) -> u64;
}

/// One trial of a training: its seed (which gives its orders) and its pruning.
#[derive(Clone)]
pub struct Member {
    pub seed: u64,
    pub prune: Option<Prune>,
}

impl Member {
    /// The member that trains `cfg`.
    pub fn of(cfg: &super::TrialConfig) -> Member {
        Member {
            seed: cfg.seed,
            prune: cfg.prune.clone(),
        }
    }
}

/// How each slot of a training stands: a member training in it, a member that has ended (its
/// end not yet handed on), or nothing (a fused group's slot that waits for a member).
#[derive(Debug, Default)]
pub struct Ends(Vec<SlotState>);

#[derive(Debug)]
enum SlotState {
    Live,
    Ended(End),
    Free,
}

#[derive(Debug)]
enum End {
    /// Failed or interrupted.
    Stopped(Stop),
    /// Stopped by its pruning after this epoch, with the result of the epochs it trained.
    Pruned(EpochStats),
    /// Trained every epoch.
    Complete,
}

impl Ends {
    /// Whether the member in slot `i` still trains.
    pub fn live(&self, i: usize) -> bool {
        matches!(self.0.get(i), Some(SlotState::Live))
    }

    pub fn any_live(&self) -> bool {
        self.0.iter().any(|s| matches!(s, SlotState::Live))
    }

    /// Ends the member in slot `i` with `stop`, unless it has ended already.
    pub fn stop(&mut self, i: usize, stop: Stop) {
        if let Some(state @ SlotState::Live) = self.0.get_mut(i) {
            *state = SlotState::Ended(End::Stopped(stop));
        }
    }

    /// Ends every member still training with (a copy of) `stop`.
    fn stop_all(&mut self, stop: &Stop) {
        for state in self.0.iter_mut() {
            if matches!(state, SlotState::Live) {
                *state = SlotState::Ended(End::Stopped(stop.clone()));
            }
        }
    }

    fn end(&mut self, i: usize, end: End) {
        self.0[i] = SlotState::Ended(end);
    }
}

/// What a training tells, and asks, as it goes: each epoch and each end of a member (members are
/// numbered in the order they start), and, at an epoch boundary, a member for a free slot.
pub trait Hooks<S: ?Sized> {
    /// Member `id` trained an epoch.
    fn epoch(&mut self, s: &mut S, id: usize, e: &Epoch);
    /// Member `id` ended: its result, or why it has none.
    fn end(&mut self, s: &mut S, id: usize, end: Result<TrialResult, Stop>);
    /// Slot `slot` is free after `epochs_done` epochs of the training: the next member, started
    /// in it by `s` (a fused group's refill), or why it could not start (it ends with that at
    /// once); `None` leaves the slot free until the next boundary.
    fn join(
        &mut self,
        _s: &mut S,
        _slot: usize,
        _epochs_done: u32,
    ) -> Option<Result<Member, Stop>> {
        None
    }
}

/// A member in its slot: its number, where it joined and when, and its last epoch's figures.
struct Slot {
    id: usize,
    member: Member,
    /// The training's epochs done when it joined: its own epoch is the training's less this.
    joined: u32,
    started: Instant,
    last: Option<EpochStats>,
}

/// An epoch's training sums (loss, then correct predictions) and its test `(loss, accuracy)`.
pub type EpochSums = ([f64; STATS_LEN], (f64, f64));

/// What a training runs: its epochs, and steps of `batch` rows (each member's orders come from
/// its own seed: [`Member`]).
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub epochs: u32,
    /// Training samples.
    pub n_train: usize,
    /// Rows of one step (the global batch of a mirrored training); at most `n_train`.
    pub batch: usize,
    /// Stop after this many steps per epoch and skip evaluation (short probes and tests).
    pub max_steps: Option<usize>,
    /// Evaluate after each epoch even with `max_steps` (a warm-up that loads every kernel).
    pub warm_up: bool,
}

impl Schedule {
    /// Steps of a whole epoch: every full batch of the epoch's order.
    pub fn steps_per_epoch(&self) -> usize {
        self.n_train / self.batch.max(1)
    }

    /// Whether each epoch ends with an evaluation: whole epochs, or a warm-up's.
    pub fn evaluates(&self) -> bool {
        self.max_steps.is_none() || self.warm_up
    }

    /// Whether every epoch runs all its steps. Only then may a member join a training at an
    /// epoch boundary: a fused group's data position is its step counter modulo the steps of an
    /// epoch, the same for every member.
    pub fn whole_epochs(&self) -> bool {
        self.steps() == self.steps_per_epoch()
    }

    /// Steps each epoch takes.
    pub fn steps(&self) -> usize {
        let all = self.steps_per_epoch();
        self.max_steps.map_or(all, |m| m.min(all))
    }
}

/// One epoch done.
#[derive(Clone, Debug, PartialEq)]
pub struct Epoch {
    pub stats: EpochStats,
    /// Seconds of the epoch's training steps (evaluation excluded).
    pub train_s: f64,
    /// Seconds of the whole epoch, evaluation included.
    pub epoch_s: f64,
    /// Steps it took.
    pub steps: usize,
}

/// Epoch `epoch`'s figures from its training sums and its test `(loss, accuracy)`.
pub fn epoch_stats(
    epoch: u32,
    plan: &Schedule,
    sums: [f64; STATS_LEN],
    (test_loss, test_acc): (f64, f64),
    started: Instant,
) -> EpochStats {
    let seen = (plan.steps() * plan.batch).max(1) as f64;
    EpochStats {
        epoch,
        train_loss: sums[0] / seen,
        train_acc: sums[1] / seen,
        test_loss,
        test_acc,
        wall_s: started.elapsed().as_secs_f64(),
        extra: Default::default(),
    }
}

/// Trains `members` side by side (see [`train_slots`]), each from the first epoch, with no
/// member joining later. Returns each member's end, in order.
pub fn train<S: Steps + ?Sized>(
    s: &mut S,
    plan: &Schedule,
    members: &[Member],
    cancel: &Cancel,
    started: Instant,
    on_epoch: &mut dyn FnMut(&mut S, usize, &Epoch),
) -> Vec<Result<TrialResult, Stop>> {
    struct Collect<'f, S: ?Sized> {
        on_epoch: &'f mut dyn FnMut(&mut S, usize, &Epoch),
        ends: Vec<Option<Result<TrialResult, Stop>>>,
    }
    impl<S: ?Sized> Hooks<S> for Collect<'_, S> {
        fn epoch(&mut self, s: &mut S, id: usize, e: &Epoch) {
            (self.on_epoch)(s, id, e)
        }
        fn end(&mut self, _: &mut S, id: usize, end: Result<TrialResult, Stop>) {
            if let Some(slot) = self.ends.get_mut(id) {
                *slot = Some(end);
            }
        }
    }
    let mut hooks = Collect {
        on_epoch,
        ends: members.iter().map(|_| None).collect(),
    };
    let first = members.iter().cloned().map(Some).collect();
    train_slots(s, plan, first, cancel, started, &mut hooks);
    hooks
        .ends
        .into_iter()
        .map(|e| e.unwrap_or_else(|| Err(Stop::worker("no epoch ran"))))
        .collect()
}

/// Trains the members in their slots (`first[i]` in slot `i`; `None` leaves it free): each
/// epoch, each member's order from the seed schedule at its own epoch, the steps (checking
/// `cancel` before each), the training figures and, unless the steps are capped, an
/// evaluation; then, for each member still training, [`Hooks::epoch`], then its pruning, which
/// may stop it there with the result of its epochs so far. A member ends after its last epoch,
/// when pruned, when it diverges (alone), or with an error of the steps (every member still
/// training); each end goes to [`Hooks::end`] at the epoch boundary where it happened, and
/// every member gets one. When whole epochs run, a slot freed then takes the member
/// [`Hooks::join`] gives it, from its own first epoch. The training ends once no slot holds a
/// member. `started` is when the first members started.
pub fn train_slots<S: Steps + ?Sized>(
    s: &mut S,
    plan: &Schedule,
    first: Vec<Option<Member>>,
    cancel: &Cancel,
    started: Instant,
    hooks: &mut dyn Hooks<S>,
) {
    let mut ends = Ends(
        first
            .iter()
            .map(|m| match m {
                Some(_) => SlotState::Live,
                None => SlotState::Free,
            })
            .collect(),
    );
    let mut ids = 0..;
    let mut slots: Vec<Option<Slot>> = first
        .into_iter()
        .map(|m| {
            m.map(|member| Slot {
                id: ids.next().unwrap_or(0),
                member,
                joined: 0,
                started,
                last: None,
            })
        })
        .collect();
    let wrong = if s.width() != slots.len() {
        Some(format!(
            "a training of {} trials was given {} slots",
            s.width(),
            slots.len()
        ))
    } else {
        (plan.epochs == 0).then(|| "no epoch ran".to_string())
    };
    if let Some(why) = wrong {
        ends.stop_all(&Stop::worker(why));
        hand_on(s, plan, &mut slots, &mut ends, hooks);
        return;
    }
    let joins = plan.whole_epochs();
    let mut done = 0u32;
    loop {
        let epoch = done + 1;
        // Whether every step of the epoch ran: a training whose members all ended within it
        // stops there, its step counter short of the boundary a member could join at.
        let whole = match run_epoch(s, plan, epoch, &mut slots, cancel, &mut ends, hooks) {
            Ok(whole) => whole,
            Err(e) => {
                ends.stop_all(&e);
                hand_on(s, plan, &mut slots, &mut ends, hooks);
                return;
            }
        };
        done = epoch;
        if !ends.any_live() {
            // The last wait: a member that trained to its end has a result only once its work
            // is done.
            if let Err(e) = s.finish() {
                for state in ends.0.iter_mut() {
                    if matches!(state, SlotState::Ended(End::Complete)) {
                        *state = SlotState::Ended(End::Stopped(e.clone()));
                    }
                }
            }
        }
        hand_on(s, plan, &mut slots, &mut ends, hooks);
        if joins && whole && !cancel.draining() {
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                let Some(joined) = hooks.join(s, i, done) else {
                    continue;
                };
                let id = ids.next().unwrap_or(0);
                match joined {
                    Ok(member) => {
                        *slot = Some(Slot {
                            id,
                            member,
                            joined: done,
                            started: Instant::now(),
                            last: None,
                        });
                        ends.0[i] = SlotState::Live;
                    }
                    Err(e) => hooks.end(s, id, Err(e)),
                }
            }
        }
        if !ends.any_live() {
            return;
        }
    }
}

/// Epoch `epoch` of the training: the members' orders, the steps, the figures, each live
/// member's [`Hooks::epoch`], and its pruning or, after its last epoch, its end. `Ok(false)`
/// when every member ended within the epoch (it stopped there).
fn run_epoch<S: Steps + ?Sized>(
    s: &mut S,
    plan: &Schedule,
    epoch: u32,
    slots: &mut [Option<Slot>],
    cancel: &Cancel,
    ends: &mut Ends,
    hooks: &mut dyn Hooks<S>,
) -> Result<bool, Stop> {
    let epoch_start = Instant::now();
    // A free slot's order is never used for a member: any order of the split serves.
    let orders = slots
        .iter()
        .map(|slot| match slot {
            Some(m) => seeds::epoch_order(m.member.seed, epoch - m.joined, plan.n_train),
            None => (0..plan.n_train as u32).collect(),
        })
        .collect();
    s.begin_epoch(orders)?;
    let steps = plan.steps();
    let steps_start = Instant::now();
    for step in 0..steps {
        if cancel.aborted() {
            return Err(Stop::Interrupted);
        }
        s.step(StepAt { epoch, step, steps }, ends)?;
        if !ends.any_live() {
            return Ok(false);
        }
    }
    let train_s = steps_start.elapsed().as_secs_f64().max(1e-9);
    // Short runs (max_steps) time training alone and skip evaluation, warm-ups aside.
    let sums = s.end_epoch(epoch, plan.evaluates(), ends)?;
    for (i, (sums, test)) in sums.into_iter().enumerate() {
        let Some(slot) = slots.get_mut(i).and_then(Option::as_mut) else {
            continue;
        };
        if !ends.live(i) {
            continue;
        }
        let own = epoch - slot.joined;
        let e = Epoch {
            stats: epoch_stats(own, plan, sums, test, slot.started),
            train_s,
            epoch_s: epoch_start.elapsed().as_secs_f64(),
            steps,
        };
        hooks.epoch(s, slot.id, &e);
        // Stopped early: the result of the epochs trained ([`Prune::stopped`] says so).
        let pruned = slot
            .member
            .prune
            .as_ref()
            .is_some_and(|p| p.stops(&e.stats));
        if pruned {
            ends.end(i, End::Pruned(e.stats.clone()));
            s.end_member(i)?;
        } else if own >= plan.epochs {
            ends.end(i, End::Complete);
            // A training that may go on (another slot may take a member here) must not train
            // this one further.
            if plan.whole_epochs() {
                s.end_member(i)?;
            }
        }
        slot.last = Some(e.stats);
    }
    Ok(true)
}

/// Hands each member that has ended to [`Hooks::end`], and frees its slot.
fn hand_on<S: Steps + ?Sized>(
    s: &mut S,
    plan: &Schedule,
    slots: &mut [Option<Slot>],
    ends: &mut Ends,
    hooks: &mut dyn Hooks<S>,
) {
    let (arena, params) = (s.arena_bytes(), s.param_count());
    for (i, state) in ends.0.iter_mut().enumerate() {
        if !matches!(state, SlotState::Ended(_)) {
            continue;
        }
        let SlotState::Ended(end) = std::mem::replace(state, SlotState::Free) else {
            continue;
        };
        let Some(slot) = slots.get_mut(i).and_then(Option::take) else {
            continue;
        };
        let wall_s = slot.started.elapsed().as_secs_f64();
        let res = match (end, slot.last) {
            (End::Stopped(e), _) => Err(e),
            (End::Pruned(at), _) => {
                let mut cut = *plan;
                cut.epochs = at.epoch;
                Ok(result(at, &cut, wall_s, arena, params))
            }
            (End::Complete, Some(last)) => Ok(result(last, plan, wall_s, arena, params)),
            (End::Complete, None) => Err(Stop::worker("no epoch ran")),
        };
        hooks.end(s, slot.id, res);
    }
}

/// The end of a training of one member ([`train`]'s only end).
pub fn only_end(ends: Vec<Result<TrialResult, Stop>>) -> Result<TrialResult, Stop> {
    ends.into_iter()
        .next()
        .unwrap_or_else(|| Err(Stop::worker("a training of one ended with no result")))
}

/// The order of a training of one member, from [`Steps::begin_epoch`]'s orders.
pub fn only_order(orders: &[Vec<u32>]) -> Result<&[u32], Stop> {
    match orders {
        [one] => Ok(one),
        _ => Err(Stop::worker(format!(
            "a training of one was given {} orders",
            orders.len()
        ))),
    }
}

/// A training's result from its last epoch's figures: `wall_s` seconds in all, `arena_bytes`
/// of memory, `param_count` parameters.
pub fn result(
    last: EpochStats,
    plan: &Schedule,
    wall_s: f64,
    arena_bytes: u64,
    param_count: u64,
) -> TrialResult {
    let train_samples = (plan.steps() * plan.batch) as u64 * plan.epochs as u64;
    let metrics = [
        ("test_acc", last.test_acc),
        ("test_loss", last.test_loss),
        ("final_loss", last.train_loss),
        ("train_acc", last.train_acc),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_finite())
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    TrialResult {
        metrics,
        test_acc: last.test_acc,
        final_loss: last.train_loss,
        epochs: plan.epochs,
        wall_s,
        train_samples,
        samples_per_s: train_samples as f64 / wall_s.max(1e-9),
        peak_mem_bytes: arena_bytes,
        param_count,
        launches_per_step: None,
        host_syncs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::stop::Failure;

    /// Steps of a group of `width` members that take nothing: member `diverges` diverges at
    /// step 1 of epoch 2, and the steps fail as a whole at epoch `fails_at`.
    struct Fake {
        width: usize,
        diverges: Option<usize>,
        fails_at: Option<u32>,
        ended: Vec<usize>,
        finished: bool,
        orders: Vec<Vec<Vec<u32>>>,
    }

    impl Steps for Fake {
        fn width(&self) -> usize {
            self.width
        }
        fn begin_epoch(&mut self, orders: Vec<Vec<u32>>) -> Result<(), Stop> {
            self.orders.push(orders);
            Ok(())
        }
        fn step(&mut self, at: StepAt, ends: &mut Ends) -> Result<(), Stop> {
            if Some(at.epoch) == self.fails_at {
                return Err(Stop::worker("the device is gone"));
            }
            if let (Some(i), 2, 1) = (self.diverges, at.epoch, at.step) {
                let nan = Failure::NonFiniteLoss {
                    value: f64::NAN,
                    epoch: 2,
                    step: 1,
                };
                ends.stop(i, Stop::Failed(nan));
            }
            Ok(())
        }
        fn end_epoch(&mut self, epoch: u32, _: bool, _: &mut Ends) -> Result<Vec<EpochSums>, Stop> {
            // Member i's loss sum is i + epoch; every row correct.
            let rows = 4.0 * 8.0;
            Ok((0..self.width)
                .map(|i| ([(i as u32 + epoch) as f64 * rows, rows], (0.5, 0.9)))
                .collect())
        }
        fn end_member(&mut self, i: usize) -> Result<(), Stop> {
            self.ended.push(i);
            Ok(())
        }
        fn finish(&mut self) -> Result<(), Stop> {
            self.finished = true;
            Ok(())
        }
        fn arena_bytes(&self) -> u64 {
            100
        }
        fn param_count(&self) -> u64 {
            7
        }
    }

    fn fake(width: usize, diverges: Option<usize>, fails_at: Option<u32>) -> Fake {
        Fake {
            width,
            diverges,
            fails_at,
            ended: Vec::new(),
            finished: false,
            orders: Vec::new(),
        }
    }

    const PLAN: Schedule = Schedule {
        epochs: 3,
        n_train: 32,
        batch: 8,
        max_steps: None,
        warm_up: false,
    };

    #[test]
    fn a_group_member_diverges_or_is_pruned_alone_and_the_others_train_on() {
        let prune = Prune::new(std::sync::Arc::new(|s: &EpochStats| s.epoch == 1));
        let members = [
            Member {
                seed: 1,
                prune: None,
            },
            Member {
                seed: 2,
                prune: Some(prune.clone()),
            },
            Member {
                seed: 3,
                prune: None,
            },
        ];
        let mut s = fake(3, Some(0), None);
        let mut seen = Vec::new();
        let ends = train(
            &mut s,
            &PLAN,
            &members,
            &Cancel::new(),
            Instant::now(),
            &mut |_, i, e| seen.push((i, e.stats.epoch)),
        );
        // Each member's orders come from its own seed.
        assert_eq!(s.orders[0][1], seeds::epoch_order(2, 1, 32));
        assert_ne!(s.orders[0][0], s.orders[0][1]);
        assert!(matches!(
            &ends[0],
            Err(Stop::Failed(Failure::NonFiniteLoss { epoch: 2, .. }))
        ));
        let pruned = ends[1].as_ref().unwrap();
        assert_eq!((pruned.epochs, pruned.final_loss), (1, 2.0));
        let done = ends[2].as_ref().unwrap();
        assert_eq!((done.epochs, done.final_loss, done.test_acc), (3, 5.0, 0.9));
        assert_eq!((done.peak_mem_bytes, done.param_count), (100, 7));
        // The loop ends the pruned member, and the one done (its slot could take another); the
        // diverged one the steps ended themselves.
        assert_eq!(s.ended, [1, 2]);
        assert!(s.finished);
        // Epoch 1 of all three, then member 2 alone (member 0 diverged in epoch 2).
        assert_eq!(seen, [(0, 1), (1, 1), (2, 1), (2, 2), (2, 3)]);
    }

    #[test]
    fn an_error_of_the_steps_ends_the_members_still_training_and_a_width_mismatch_fails() {
        let prune = Prune::new(std::sync::Arc::new(|s: &EpochStats| s.epoch == 1));
        let members = [
            Member {
                seed: 1,
                prune: Some(prune.clone()),
            },
            Member {
                seed: 2,
                prune: None,
            },
        ];
        let mut s = fake(2, None, Some(2));
        let ends = train(
            &mut s,
            &PLAN,
            &members,
            &Cancel::new(),
            Instant::now(),
            &mut |_, _, _| {},
        );
        assert_eq!(ends[0].as_ref().map(|r| r.epochs).ok(), Some(1));
        assert!(matches!(&ends[1], Err(e) if e.to_string().contains("the device is gone")));
        assert!(
            !s.finished,
            "an error of the steps does not wait for the work issued"
        );
        let mut s = fake(3, None, None);
        let ends = train(
            &mut s,
            &PLAN,
            &members,
            &Cancel::new(),
            Instant::now(),
            &mut |_, _, _| {},
        );
        assert_eq!(ends.len(), 2);
        assert!(ends.iter().all(Result::is_err));
    }

    #[test]
    fn an_aborted_cancel_interrupts_every_member() {
        let members = [
            Member {
                seed: 1,
                prune: None,
            },
            Member {
                seed: 2,
                prune: None,
            },
        ];
        let cancel = Cancel::new();
        cancel.abort();
        let ends = train(
            &mut fake(2, None, None),
            &PLAN,
            &members,
            &cancel,
            Instant::now(),
            &mut |_, _, _| {},
        );
        assert!(ends.iter().all(|e| matches!(e, Err(Stop::Interrupted))));
    }

    /// Hooks that give `queue`'s seeds to freed slots and record every member's epochs and end.
    #[derive(Default)]
    struct Joins {
        queue: Vec<u64>,
        /// (slot, the training's epochs done) of each join.
        joined: Vec<(usize, u32)>,
        epochs: BTreeMap<usize, Vec<u32>>,
        ends: BTreeMap<usize, Result<u32, String>>,
    }

    impl Hooks<Fake> for Joins {
        fn epoch(&mut self, _: &mut Fake, id: usize, e: &Epoch) {
            self.epochs.entry(id).or_default().push(e.stats.epoch);
        }
        fn end(&mut self, _: &mut Fake, id: usize, end: Result<TrialResult, Stop>) {
            let end = end.map(|r| r.epochs).map_err(|e| e.to_string());
            assert!(
                self.ends.insert(id, end).is_none(),
                "member {id} ended twice"
            );
        }
        fn join(&mut self, _: &mut Fake, slot: usize, done: u32) -> Option<Result<Member, Stop>> {
            if self.queue.is_empty() {
                return None;
            }
            let seed = self.queue.remove(0);
            self.joined.push((slot, done));
            Some(Ok(Member { seed, prune: None }))
        }
    }

    use std::collections::BTreeMap;

    #[test]
    fn a_freed_slot_takes_the_next_member_from_its_own_first_epoch() {
        // Slot 0's member is pruned after epoch 1 and slot 2 starts free: both take a member
        // at the first boundary, which trains its own 3 epochs (to the training's epoch 4).
        let prune = Prune::new(std::sync::Arc::new(|s: &EpochStats| s.epoch == 1));
        let first = vec![
            Some(Member {
                seed: 1,
                prune: Some(prune),
            }),
            Some(Member {
                seed: 2,
                prune: None,
            }),
            None,
        ];
        let mut s = fake(3, None, None);
        let mut hooks = Joins {
            queue: vec![10, 11, 12],
            ..Joins::default()
        };
        train_slots(
            &mut s,
            &PLAN,
            first,
            &Cancel::new(),
            Instant::now(),
            &mut hooks,
        );
        // Two join after epoch 1; the third takes member 1's slot after epoch 3.
        assert_eq!(hooks.joined, [(0, 1), (2, 1), (1, 3)]);
        assert_eq!(hooks.ends.len(), 5);
        assert_eq!(hooks.ends[&0], Ok(1), "pruned after its first epoch");
        for id in 1..5 {
            assert_eq!(hooks.ends[&id], Ok(3), "member {id}");
            assert_eq!(
                hooks.epochs[&id],
                [1, 2, 3],
                "member {id} counts its own epochs"
            );
        }
        // A member's orders are its seed's at its own epochs; a free slot's, any order.
        assert_eq!(s.orders[1][0], seeds::epoch_order(10, 1, 32));
        assert_eq!(s.orders[1][2], seeds::epoch_order(11, 1, 32));
        assert_eq!(s.orders[3][1], seeds::epoch_order(12, 1, 32));
        assert_eq!(s.orders[3][0], seeds::epoch_order(10, 3, 32));
        // Epochs 1-6: member 4 joined after epoch 3 and trained 4, 5 and 6.
        assert_eq!(s.orders.len(), 6);
        assert!(s.finished);
        // Without joins (a training of fixed members), a freed slot stays free.
        let capped = Schedule {
            max_steps: Some(2),
            ..PLAN
        };
        let mut hooks = Joins {
            queue: vec![10],
            ..Joins::default()
        };
        let first = vec![
            Some(Member {
                seed: 1,
                prune: Some(Prune::new(std::sync::Arc::new(|s: &EpochStats| {
                    s.epoch == 1
                }))),
            }),
            None,
        ];
        let mut s = fake(2, None, None);
        train_slots(
            &mut s,
            &capped,
            first,
            &Cancel::new(),
            Instant::now(),
            &mut hooks,
        );
        assert!(hooks.joined.is_empty(), "capped epochs take no member");
        assert_eq!(hooks.ends.len(), 1);
    }
}
