//! Calls to a code store off the compiling thread: a [`Courier`] owns a
//! thread that makes one call for each list of keys it is sent, so that
//! a batch flush goes on while the call travels.
//!
//! Two kinds carry the calls a flush makes ahead of its need:
//!
//! - a [`Claimer`] claims keys ([`claim_many`], one
//!   [`CodeStore::try_get_or_reserve_many`] per request), so that a flush
//!   on a store whose every call is a round trip to a server
//!   ([`CodeStore::round_trips`]) compiles one span of functions while
//!   the claims of the next span travel, instead of waiting for each
//!   answer between compiles;
//! - a [`Fetcher`] fetches entries ([`CodeStore::get_many`] per request),
//!   so that a flush reads the entries of the functions recorded so far
//!   while it records and plans the rest (files opened, a server's round
//!   trips), instead of after.
//!
//! # What this module guarantees
//!
//! 1. **One answer per request, to the request.** [`Courier::send`]
//!    returns a ticket, and [`Courier::receive`] with that ticket returns
//!    the answer to that request: the claims of its keys, or their
//!    values, in their order, or `None` where the store failed, panicked
//!    or the thread is gone (the caller then knows nothing of those keys,
//!    as after a store error). Answers to requests sent before it and not
//!    received are dropped on the way. A ticket received before (its
//!    answer taken), skipped, or not this courier's, gets `None` at once: a
//!    receive never waits for an answer that cannot come.
//! 2. **Nothing held is kept unused.** A reservation in an answer that is
//!    dropped (not received, or received by no one since the courier was
//!    dropped) is released by the drop of its [`Reservation`]
//!    (`load.rs`), so no other module waits for a key nobody compiles
//!    beyond the store's own bounds.
//! 3. Where no thread can be started, a request is carried out on the
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

/// A request's place in the order of one courier's requests (see 1
/// above).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket {
    /// The courier's number, unique in the process.
    courier: u64,
    /// The request's number among the courier's.
    request: u64,
}

/// Numbers the couriers of the process, so that a ticket names its own.
static NEXT_COURIER: AtomicU64 = AtomicU64::new(0);

/// The call a courier makes for each request: its answer for the keys,
/// or `None` where the store failed or panicked.
type Call<A> = fn(&Arc<dyn CodeStore>, &[StoreKey]) -> Option<A>;

/// A thread claiming keys in one store (see the [module docs](self)).
pub type Claimer = Courier<Vec<Claimed>>;

/// A thread fetching entries from one store (see the
/// [module docs](self)): the values of the keys, `None` for each key the
/// store does not hold.
pub type Fetcher = Courier<Vec<Option<Vec<u8>>>>;

/// A thread making one kind of call to one store (see the
/// [module docs](self)).
pub struct Courier<A> {
    store: Arc<dyn CodeStore>,
    call: Call<A>,
    /// `None` once dropping, where no thread could be started, or once
    /// the thread is found ended.
    requests: Option<Sender<(Ticket, Vec<StoreKey>)>>,
    answers: Receiver<(Ticket, Option<A>)>,
    thread: Option<JoinHandle<()>>,
    /// Answers given on the sender's thread (see 3 above), after those
    /// the thread gave before it ended, if it did.
    inline: VecDeque<(Ticket, Option<A>)>,
    /// Its number (see [`Ticket`]).
    number: u64,
    /// Requests sent.
    sent: u64,
    /// Requests whose answers the thread gave and were taken (received,
    /// or dropped on the way to a later one).
    taken: u64,
}

impl Claimer {
    /// A claimer of keys in `store`, with a thread of its own if one can
    /// be started.
    pub fn claimer(store: Arc<dyn CodeStore>) -> Self {
        Self::start(store, "jitfold-claimer", claims_of)
    }
}

impl Fetcher {
    /// A fetcher of entries from `store`, with a thread of its own if one
    /// can be started.
    pub fn fetcher(store: Arc<dyn CodeStore>) -> Self {
        Self::start(store, "jitfold-fetcher", values_of)
    }
}

impl<A: Send + 'static> Courier<A> {
    /// A courier making `call` to `store` on a thread named `name`, if
    /// one can be started.
    fn start(store: Arc<dyn CodeStore>, name: &str, call: Call<A>) -> Self {
        let (requests, requested) = channel::<(Ticket, Vec<StoreKey>)>();
        let (answer, answers) = channel();
        let thread_store = store.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for (ticket, keys) in requested {
                    if answer.send((ticket, call(&thread_store, &keys))).is_err() {
                        // The courier is gone: the answer is dropped, its
                        // reservations released (see 2 above).
                        return;
                    }
                }
            })
            .ok();
        Self {
            store,
            call,
            requests: thread.is_some().then_some(requests),
            answers,
            thread,
            inline: VecDeque::new(),
            number: NEXT_COURIER.fetch_add(1, Ordering::Relaxed),
            sent: 0,
            taken: 0,
        }
    }

    /// Sends `keys` to be carried; the ticket receives the answer.
    pub fn send(&mut self, keys: Vec<StoreKey>) -> Ticket {
        let ticket = Ticket {
            courier: self.number,
            request: self.sent,
        };
        self.sent += 1;
        let keys = match &self.requests {
            Some(requests) => match requests.send((ticket, keys)) {
                Ok(()) => return ticket,
                // The thread ended: what it answered comes first, and
                // from now on requests are carried here (see 3 above).
                Err(unsent) => {
                    self.requests = None;
                    self.inline.extend(self.answers.try_iter());
                    unsent.0.1
                }
            },
            None => keys,
        };
        let answer = (self.call)(&self.store, &keys);
        self.inline.push_back((ticket, answer));
        ticket
    }

    /// The answer to the request `ticket` was given for (see 1 above);
    /// `None` at once for a ticket received before, skipped (a later one
    /// was received), or not given by this courier.
    pub fn receive(&mut self, ticket: Ticket) -> Option<A> {
        if ticket.courier != self.number || ticket.request >= self.sent {
            return None;
        }
        if self.requests.is_some() {
            // Its answer was taken: waiting would wait for an answer that
            // never comes.
            if ticket.request < self.taken {
                return None;
            }
            // From the thread, in the order of the requests: an answer to
            // an earlier one is dropped.
            while let Ok((at, answer)) = self.answers.recv() {
                self.taken = at.request + 1;
                if at >= ticket {
                    return (at == ticket).then_some(answer).flatten();
                }
            }
            return None;
        }
        while let Some((at, answer)) = self.inline.pop_front() {
            if at >= ticket {
                if at > ticket {
                    self.inline.push_front((at, answer));
                    return None;
                }
                return answer;
            }
        }
        None
    }
}

impl<A> Drop for Courier<A> {
    /// Ends the thread once the call it is making returns: the requests
    /// not carried out yet are dropped (but for one the thread may have
    /// taken up as the courier dropped, carried out and its answer
    /// dropped), and so are the answers no one received, with their
    /// channel (see 2 above; the thread's next answer finds no receiver,
    /// and it ends).
    fn drop(&mut self) {
        // The answers first: the thread's next answer then fails, and it
        // ends without taking up another request.
        let (_, closed) = channel();
        drop(std::mem::replace(&mut self.answers, closed));
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

/// The values of `keys` in `store`, or `None` where the store failed
/// (logged, as a flush's own fetch logs it) or panicked.
fn values_of(store: &Arc<dyn CodeStore>, keys: &[StoreKey]) -> Option<Vec<Option<Vec<u8>>>> {
    let values = catch_unwind(AssertUnwindSafe(|| store.get_many(keys))).ok()?;
    values
        .inspect_err(|e| log::debug!("code store: {e}; {} entries fetched later", keys.len()))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SharedStore;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 16])
    }

    /// A fetcher answers each ticket with its own request's values, in
    /// the order of its keys, and a request the store fails with `None`.
    #[test]
    fn a_fetcher_answers_each_request_with_its_values() {
        let store: Arc<dyn CodeStore> = Arc::new(SharedStore::new());
        store.put(&key(1), b"one").unwrap();
        store.put(&key(2), b"two").unwrap();
        // Another courier, made first (its tickets order before this
        // one's).
        let mut other = Fetcher::fetcher(Arc::new(SharedStore::new()));
        let mut fetcher = Fetcher::fetcher(store);
        let first = fetcher.send(vec![key(2), key(3), key(1)]);
        let second = fetcher.send(vec![key(1)]);
        assert_eq!(
            fetcher.receive(first),
            Some(vec![Some(b"two".to_vec()), None, Some(b"one".to_vec())])
        );
        assert_eq!(fetcher.receive(second), Some(vec![Some(b"one".to_vec())]));
        // A ticket received before, or skipped, or of another courier,
        // gets nothing, at once (the thread has no request left to answer).
        assert_eq!(fetcher.receive(first), None);
        assert_eq!(fetcher.receive(second), None);
        let third = fetcher.send(vec![key(2)]);
        let fourth = fetcher.send(vec![key(2)]);
        // The other courier, having sent as many requests.
        for _ in 0..4 {
            let _ = other.send(vec![key(1)]);
        }
        assert_eq!(other.receive(third), None);
        assert_eq!(fetcher.receive(fourth), Some(vec![Some(b"two".to_vec())]));
        assert_eq!(fetcher.receive(third), None);
        let mut failing = Fetcher::fetcher(Arc::new(Failing));
        let ticket = failing.send(vec![key(1)]);
        assert_eq!(failing.receive(ticket), None);
    }

    /// A store whose every call fails.
    struct Failing;

    impl CodeStore for Failing {
        fn get(&self, _: &StoreKey) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
            Err(crate::store::StoreError::Io {
                operation: "get",
                path: "/failing".into(),
                source: std::io::Error::other("failing for the test"),
            })
        }

        fn put(&self, _: &StoreKey, _: &[u8]) -> Result<(), crate::store::StoreError> {
            Ok(())
        }
    }

    /// Each ticket gets its own request's answer, and an answer skipped
    /// is dropped, its reservations released: another module can then
    /// reserve those keys.
    #[test]
    fn answers_go_to_their_tickets_and_skipped_ones_release() {
        let store: Arc<dyn CodeStore> = Arc::new(SharedStore::new());
        store.put(&key(9), b"stored").unwrap();
        let mut claimer = Claimer::claimer(store.clone());
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
