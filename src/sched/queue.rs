//! The queue of a round's trials between the thread that hands them out and the slices' workers: groups taken in order, and, where fused groups refill their slots, single trials taken from its head by a group that they fit.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::plan::TrialSpec;

/// A round's queue of trials (groups of one or more), shared by the slices' workers.
///
/// In a fed round (trials proposed one by one, [`super::run_round_fed`]) each trial's end is
/// answered by the next trial, or by the end of the feed: a worker [`TrialQueue::owe`]s an
/// answer before it reports an end, and [`TrialQueue::answer`] settles it. A fused group that
/// looks for a trial for a freed slot ([`TrialQueue::take_if`]) waits while answers are owed and
/// nothing is queued, so that a slot freed at a boundary takes the trial proposed after its
/// trial ended instead of training empty for an epoch.
pub struct TrialQueue {
    state: Mutex<State>,
    ready: Condvar,
    /// Whether a worker may take single trials for a fused group's slots.
    refill: bool,
    /// Whether each trial's end is answered ([`TrialQueue::owe`]).
    fed: bool,
}

#[derive(Default)]
struct State {
    items: VecDeque<Vec<TrialSpec>>,
    closed: bool,
    /// Ends reported whose answer has not come yet.
    owed: usize,
}

/// How long a waiting worker sleeps before it looks again, should a wake-up be missed.
const RECHECK: Duration = Duration::from_millis(50);

impl TrialQueue {
    /// An empty queue; `refill`: fused groups take single trials into freed slots; `fed`: each
    /// trial's end is answered by the next trial or the end of the feed.
    pub fn new(refill: bool, fed: bool) -> TrialQueue {
        TrialQueue {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            refill,
            fed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked while holding the lock left the queue as it was: go on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether fused groups take single trials into freed slots.
    pub fn refills(&self) -> bool {
        self.refill
    }

    /// Queues a group (or a single trial) at the back. A closed queue takes nothing more.
    pub fn push(&self, group: Vec<TrialSpec>) {
        let mut s = self.lock();
        if !s.closed {
            s.items.push_back(group);
        }
        drop(s);
        self.ready.notify_all();
    }

    /// Nothing more will be queued: workers take what is left, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// A trial's end is about to be reported, in a fed round: its answer is owed.
    pub fn owe(&self) {
        if self.fed {
            self.lock().owed += 1;
        }
    }

    /// The answer to one end reported: the next trial, queued, or none.
    pub fn answer(&self, next: Option<TrialSpec>) {
        let mut s = self.lock();
        s.owed = s.owed.saturating_sub(1);
        if let (Some(t), false) = (next, s.closed) {
            s.items.push_back(vec![t]);
        }
        drop(s);
        self.ready.notify_all();
    }

    /// The next group, waiting for one; `None` once the queue is closed and empty.
    pub fn recv(&self) -> Option<Vec<TrialSpec>> {
        let mut s = self.lock();
        loop {
            if let Some(g) = s.items.pop_front() {
                return Some(g);
            }
            if s.closed {
                return None;
            }
            s = self.wait(s);
        }
    }

    /// The single trial at the head of the queue, if `fits` takes it: waiting, while nothing is
    /// queued, for the answers owed. `None` when the queue does not refill, when the head is a
    /// group or a trial that does not fit (trials are taken in order: it waits for a worker
    /// that takes it), or when nothing is queued and nothing more is coming now.
    pub fn take_if(&self, fits: &dyn Fn(&TrialSpec) -> bool) -> Option<TrialSpec> {
        if !self.refill {
            return None;
        }
        let mut s = self.lock();
        loop {
            match s.items.front().map(Vec::as_slice) {
                Some([one]) if fits(one) => return s.items.pop_front()?.pop(),
                Some(_) => return None,
                None if s.closed || s.owed == 0 => return None,
                None => s = self.wait(s),
            }
        }
    }

    fn wait<'g>(&self, s: MutexGuard<'g, State>) -> MutexGuard<'g, State> {
        match self.ready.wait_timeout(s, RECHECK) {
            Ok((s, _)) => s,
            Err(p) => p.into_inner().0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn trial(index: u32) -> TrialSpec {
        TrialSpec {
            id: format!("t{index}"),
            index,
            hyper: crate::models::Hyper {
                lr: 0.1,
                batch_size: 8,
                optimizer: crate::models::Optimizer::Sgd,
                momentum: 0.0,
                weight_decay: 0.0,
                dropout: 0.0,
            },
            params: Default::default(),
            seed: 1,
            fault: None,
        }
    }

    #[test]
    fn groups_come_in_order_until_the_queue_is_closed_and_empty() {
        let q = TrialQueue::new(false, false);
        q.push(vec![trial(0), trial(1)]);
        q.push(vec![trial(2)]);
        q.close();
        q.push(vec![trial(3)]);
        let got: Vec<usize> = std::iter::from_fn(|| q.recv()).map(|g| g.len()).collect();
        assert_eq!(got, [2, 1], "nothing is queued once closed");
        // A queue that does not refill gives no single trial.
        let q = TrialQueue::new(false, false);
        q.push(vec![trial(0)]);
        assert!(q.take_if(&|_| true).is_none());
    }

    #[test]
    fn a_refill_takes_the_head_only_when_it_fits() {
        let q = TrialQueue::new(true, false);
        q.push(vec![trial(1)]);
        q.push(vec![trial(2)]);
        assert!(
            q.take_if(&|t| t.index == 2).is_none(),
            "the head comes first"
        );
        assert_eq!(q.take_if(&|t| t.index == 1).map(|t| t.index), Some(1));
        assert_eq!(q.take_if(&|_| true).map(|t| t.index), Some(2));
        // Nothing queued, nothing owed: no wait.
        assert!(q.take_if(&|_| true).is_none());
        q.push(vec![trial(3), trial(4)]);
        assert!(
            q.take_if(&|_| true).is_none(),
            "a group is not a single trial"
        );
    }

    #[test]
    fn a_refill_waits_for_the_answer_owed_and_not_after_the_close() {
        let q = Arc::new(TrialQueue::new(true, true));
        q.owe();
        let answer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                q.answer(Some(trial(7)));
            })
        };
        assert_eq!(q.take_if(&|_| true).map(|t| t.index), Some(7));
        answer.join().expect("the answering thread");
        // An answer of none settles the debt; a closed queue stops the wait.
        q.owe();
        q.answer(None);
        assert!(q.take_if(&|_| true).is_none());
        q.owe();
        let closer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                q.close();
            })
        };
        assert!(q.take_if(&|_| true).is_none());
        closer.join().expect("the closing thread");
        assert!(q.recv().is_none());
    }
}
