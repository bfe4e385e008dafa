//! Claiming templates off the compiling thread: a [`Claimer`] owns a
//! thread that claims the keys it is sent ([`claim_many`], one
//! [`CodeStore::try_get_or_reserve_many`] per request), so that a batch
//! flush on a store whose every call is a round trip to a server
//! ([`CodeStore::round_trips`]) compiles one span of functions while the
//! claims of the next span travel, instead of waiting for each answer
//! between compiles.
//!
//! # What this module guarantees
//!
//! 1. **One answer per request, to the request.** [`Claimer::send`]
//!    returns a ticket, and [`Claimer::receive`] with that ticket returns
//!    the answer to that request: the claims of its keys, in their order,
//!    or `None` where the store failed, panicked or the thread is gone
//!    (the caller then knows nothing of those keys, as after a store
//!    error). Answers to requests sent before it and not received are
//!    dropped on the way.
//! 2. **Nothing held is kept unused.** A reservation in an answer that is
//!    dropped (not received, or received by no one since the claimer was
//!    dropped) is released by the drop of its [`Reservation`]
//!    (`load.rs`), so no other module waits for a key nobody compiles
//!    beyond the store's own bounds.
//! 3. Where no thread can be started, a request is claimed on the
//!    sender's thread when it is sent: the same answers, sooner waited
//!    for.
//!
//! [`Reservation`]: super::load::Reservation

use super::CodeStore;
use super::StoreKey;
use super::load::{Claimed, claim_many};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

/// A request's place in the order of requests (see 1 above).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// The claims of one request's keys, or `None` (see 1 above).
type Answer = (Ticket, Option<Vec<Claimed>>);

/// A thread claiming keys in one store (see the [module docs](self)).
pub struct Claimer {
    store: Arc<dyn CodeStore>,
    /// `None` once dropping, where no thread could be started, or once
    /// the thread is found ended.
    requests: Option<Sender<(Ticket, Vec<StoreKey>)>>,
    answers: Receiver<Answer>,
    thread: Option<JoinHandle<()>>,
    /// Answers claimed on the sender's thread (see 3 above), after those
    /// the thread gave before it ended, if it did.
    inline: VecDeque<Answer>,
    /// Requests sent.
    sent: u64,
}

impl Claimer {
    /// A claimer of keys in `store`, with a thread of its own if one can
    /// be started.
    pub fn new(store: Arc<dyn CodeStore>) -> Self {
        let (requests, requested) = channel::<(Ticket, Vec<StoreKey>)>();
        let (answer, answers) = channel::<Answer>();
        let thread_store = store.clone();
        let thread = std::thread::Builder::new()
            .name("jitfold-claimer".into())
            .spawn(move || {
                for (ticket, keys) in requested {
                    let claims = claims_of(&thread_store, &keys);
                    if answer.send((ticket, claims)).is_err() {
                        // The claimer is gone: the claims are dropped,
                        // their reservations released (see 2 above).
                        return;
                    }
                }
            })
            .ok();
        Self {
            store,
            requests: thread.is_some().then_some(requests),
            answers,
            thread,
            inline: VecDeque::new(),
            sent: 0,
        }
    }

    /// Sends `keys` to be claimed; the ticket receives the answer.
    pub fn send(&mut self, keys: Vec<StoreKey>) -> Ticket {
        let ticket = Ticket(self.sent);
        self.sent += 1;
        let keys = match &self.requests {
            Some(requests) => match requests.send((ticket, keys)) {
                Ok(()) => return ticket,
                // The thread ended: what it answered comes first, and
                // from now on requests are claimed here (see 3 above).
                Err(unsent) => {
                    self.requests = None;
                    self.inline.extend(self.answers.try_iter());
                    unsent.0.1
                }
            },
            None => keys,
        };
        self.inline
            .push_back((ticket, claims_of(&self.store, &keys)));
        ticket
    }

    /// The answer to the request `ticket` was given for (see 1 above).
    pub fn receive(&mut self, ticket: Ticket) -> Option<Vec<Claimed>> {
        if self.requests.is_some() {
            // From the thread, in the order of the requests: an answer to
            // an earlier one is dropped.
            while let Ok((at, claims)) = self.answers.recv() {
                if at >= ticket {
                    return (at == ticket).then_some(claims).flatten();
                }
            }
            return None;
        }
        while let Some((at, claims)) = self.inline.pop_front() {
            if at >= ticket {
                if at > ticket {
                    self.inline.push_front((at, claims));
                    return None;
                }
                return claims;
            }
        }
        None
    }
}

impl Drop for Claimer {
    /// Ends the thread once it has answered what it was sent; the answers
    /// no one received are dropped with the channel (see 2 above).
    fn drop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The claims of `keys` in `store`, or `None` where the store failed or
/// panicked.
fn claims_of(store: &Arc<dyn CodeStore>, keys: &[StoreKey]) -> Option<Vec<Claimed>> {
    catch_unwind(AssertUnwindSafe(|| claim_many(store, keys).ok()))
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SharedStore;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 16])
    }

    /// Each ticket gets its own request's answer, and an answer skipped
    /// is dropped, its reservations released: another module can then
    /// reserve those keys.
    #[test]
    fn answers_go_to_their_tickets_and_skipped_ones_release() {
        let store: Arc<dyn CodeStore> = Arc::new(SharedStore::new());
        store.put(&key(9), b"stored").unwrap();
        let mut claimer = Claimer::new(store.clone());
        // The first request's answer is never asked for.
        claimer.send(vec![key(1), key(2)]);
        let second = claimer.send(vec![key(3), key(9)]);
        let claims = claimer.receive(second).expect("claimed");
        assert!(matches!(claims[0], Claimed::Reserved(_)));
        assert!(matches!(&claims[1], Claimed::Found(v) if v == b"stored"));
        // It was dropped on the way: its keys are free again.
        let again = claim_many(&store, &[key(1), key(2), key(3)]).unwrap();
        assert!(matches!(again[0], Claimed::Reserved(_)));
        assert!(matches!(again[1], Claimed::Reserved(_)));
        // The second answer's reservation is still held.
        assert!(matches!(again[2], Claimed::Busy));
    }
}
