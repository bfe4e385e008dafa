//! A code store in a Redis server, shared by a fleet (feature `redis`).
//!
//! Values are Redis strings under `PREFIX` followed by the key's hex
//! ([`StoreKey::hex`]); `put` is `SET` (with `PX` when a time to live is
//! set), `get` is `GETRANGE` (see 5 below). Bounding the server's memory
//! is the server's business: give it a `maxmemory` and `maxmemory-policy
//! allkeys-lru`. A full server with the `noeviction` policy refuses `SET`,
//! which is a [`StoreError`] like any other.
//!
//! Connections are plain TCP (or Unix sockets, `redis+unix://`), opened
//! by jitfold (see 5 below) with the `redis` crate's URL parsing and
//! protocol parser: TLS is not supported. Signed entries (see the
//! [trust model](super#trust-model)) stay safe over an untrusted network
//! path, but are not hidden from it.
//!
//! # What this module guarantees
//!
//! 1. **Bounded waits.** Connecting waits at most the connect timeout
//!    ([`DEFAULT_CONNECT_TIMEOUT`], 50 ms: a server on the same network
//!    answers a connect in well under a millisecond), and a command (its
//!    writes and reads) takes at most one and a half times the I/O
//!    timeout ([`DEFAULT_IO_TIMEOUT`], 100 ms: a read or `SET` of an
//!    entry of a few kilobytes takes a round trip, under a millisecond on
//!    a local network) and a microsecond for each byte it moves, however
//!    the server answers (a byte at a time, each in time, included: see
//!    `redis_link.rs`). Both are set with [`RedisStore::with_timeouts`]. A
//!    JIT that waits longer than that for a cache should compile instead.
//! 2. **Failure is an error, never a hang or a panic.** A server that is
//!    down, slow, restarted, full or answering garbage makes the operation
//!    return [`StoreError::Redis`]. After a failed connect, or a command
//!    that timed out, the store does not try again for the retry interval
//!    ([`DEFAULT_RETRY_INTERVAL`], 1 s), answering
//!    [`StoreError::RedisBackingOff`] at once (so it does after an answer
//!    longer than asked for, see 5), so that a server that is
//!    down or stalled costs one timeout per interval, not per function.
//!    A server that answers within the timeouts but slowly is given up
//!    on too: after [`SLOW_STREAK`] commands in a row each took longer
//!    than the slow-after time ([`DEFAULT_SLOW_AFTER`], 10 ms, set with
//!    [`RedisStore::with_slow_after`]; `None` turns this off), or than
//!    [`SLOW_PER_KEY`] for each key it names where that is longer, the
//!    store backs off (each still gives its answer). The interval doubles
//!    with each such back-off in a row (up to [`MAX_SLOW_DOUBLINGS`]
//!    times) and is the retry interval again after the first fast answer,
//!    so that a server slower than compiling costs a few slow commands
//!    at first and ever fewer after (a store slower than compiling is
//!    worth less than none: the JIT compiles instead). A streak, not one
//!    slow answer: the time is measured in the client, and a loaded
//!    machine (or a client built without optimizations) can delay a
//!    healthy server's answer now and then; a fast answer ends the streak.
//! 3. **Recovery.** A connection on which anything failed is dropped, never
//!    used again (a timed-out command's answer may still arrive on it); the
//!    next operation after the retry interval connects anew, so the store
//!    works again once the server is back.
//! 4. Connections are pooled: each operation takes an idle connection (or
//!    makes one), so threads do not wait for each other's round trips, and
//!    gives it back after a success.
//! 5. **Bounded values.** A read asks the server for at most one byte more
//!    than the largest value the store keeps ([`DEFAULT_MAX_VALUE_BYTES`],
//!    set with [`RedisStore::with_max_value_bytes`]): `GETRANGE` rather
//!    than `GET`, so that a value planted in the server by any of its
//!    clients costs the reader at most that much memory, and is then
//!    [`StoreError::TooLarge`] (in `get_many`, a miss of that key);
//!    `put` refuses a larger value the same way. A key holding something
//!    else than a string is an error of `get`, a miss in `get_many`.
//!    And whatever the server answers, the store reads no more than it
//!    asked for: its connections are its own (`redis_link.rs`), which
//!    read at most the largest value and its framing from the socket per
//!    reply (a pipeline of `n` values reads at most what `n` values of
//!    the largest size take), so that a server answering a lookup with
//!    300 MB is cut off after the budget: the command is an error, the
//!    connection is dropped, and the store backs off for the retry
//!    interval as after a timeout.
//! 6. **Leases: a fleet divides its compiles.** A key is reserved for the
//!    process that will compile it by a lease in the server (`SET` of
//!    `PREFIX` `lease:` and the key's hex, `NX PX`, with this store's own
//!    token), taken in the same script, and so the same round trip, that
//!    looks the value up ([`CodeStore::try_get_or_reserve`]): of several
//!    processes missing one key at once, one compiles it, and the others
//!    are told it is busy, so that a batch flush (and an eager define,
//!    see `DedupModule::with_store`) moves on to other work. The `put` of
//!    the value ends the lease (in one round trip with the `SET`), and so
//!    does [`CodeStore::release`], each only if this store still holds it
//!    (a script compares the token). A lease whose holder dies expires
//!    after the lease time ([`DEFAULT_LEASE`], set with
//!    [`RedisStore::with_lease`]). [`CodeStore::get_or_reserve`] waits
//!    for another holder's value at most that long, polling, and then
//!    compiles (a compile more, never other code: the key names the
//!    code). A server that is down or slow makes these calls errors like
//!    any other, and the caller compiles for itself.

use super::redis_link::Link;
use super::{Claim, CodeStore, GET_MANY_CHUNK, StoreError, StoreKey};
use redis::{ConnectionInfo, IntoConnectionInfo};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long connecting may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(50);

/// How long writing a command or reading its answer may take by default.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_millis(100);

/// How long the store waits after a failed connect before it tries again,
/// by default.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// A good time for [`RedisStore::with_slow_after`] (see 2 in the module
/// docs): ten milliseconds, tens of times a round trip on a local
/// network, and more than a loaded machine's scheduler delays a process
/// by (a few milliseconds), so that only a server in trouble takes that
/// long (for a client built with optimizations).
pub const DEFAULT_SLOW_AFTER: Duration = Duration::from_millis(10);

/// How many slow commands in a row make the store back off (see 2 in
/// the module docs).
pub const SLOW_STREAK: u32 = 3;

/// How many times in a row the interval of a back-off after slow commands
/// doubles at most (see 2 in the module docs): 64 retry intervals.
pub const MAX_SLOW_DOUBLINGS: u32 = 6;

/// What a command may take for each key it names before it is slow, when
/// that is more than the store's slow-after time (see 2 in the module
/// docs): a quarter of a millisecond, about what Cranelift takes to
/// compile the median function of the shared wasm corpora (0.3 ms), so
/// that a server that is slow to give many entries at once is not kept
/// when compiling them would be as fast.
pub const SLOW_PER_KEY: Duration = Duration::from_micros(250);

/// The largest value a store keeps by default, in bytes: 16 MiB, thousands
/// of times the average entry of the shared wasm corpora (1.4 to 5.4 KB
/// per function, table 4 of the README).
pub const DEFAULT_MAX_VALUE_BYTES: u64 = 16 << 20;

/// The longest time to live Redis accepts in `PX` is below `i64::MAX`
/// milliseconds once added to the server's clock; a longer one fails
/// every `SET`. Longer times to live are cut to this (about 146 million
/// years).
const MAX_TTL_MILLIS: u64 = i64::MAX as u64 / 2;

/// The prefix of every key by default.
pub const DEFAULT_PREFIX: &str = "jitfold:code:";

/// How long a lease on a key lasts by default (see 6 in the module docs):
/// far longer than compiling one function takes, short enough that a
/// fleet whose process died mid-compile is not held up for long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The longest pause between two looks at a key another process holds,
/// in [`CodeStore::get_or_reserve`].
const MAX_POLL: Duration = Duration::from_millis(2);

/// For each of its `n` keys (`KEYS[i]`, its lease `KEYS[n + i]`), looks
/// its value up (at most `ARGV[1]` + 1 bytes, see 5 in the module docs);
/// if there is none, takes its lease for the token `ARGV[2]` for `ARGV[3]`
/// milliseconds. Answers, for each key in order, the value, 1 (leased to
/// the caller, or held by its token already: a claim whose answer was
/// lost) or 0 (another holds the lease): one round trip, and one script
/// run in the server, for a whole batch of keys.
const CLAIM_SCRIPT: &str = "\
local n = #KEYS / 2 \
local answers = {} \
for i = 1, n do \
  local v = redis.call('GETRANGE', KEYS[i], 0, ARGV[1]) \
  if #v > 0 then answers[i] = v \
  elseif redis.call('SET', KEYS[n + i], ARGV[2], 'NX', 'PX', ARGV[3]) then answers[i] = 1 \
  elseif redis.call('GET', KEYS[n + i]) == ARGV[2] then answers[i] = 1 \
  else answers[i] = 0 end \
end \
return answers";

/// Deletes each lease of `KEYS` that the token `ARGV[1]` still holds: one
/// round trip, and one script run, for a batch of leases.
const RELEASE_SCRIPT: &str = "\
for _, lease in ipairs(KEYS) do \
  if redis.call('GET', lease) == ARGV[1] then redis.call('DEL', lease) end \
end \
return 0";

/// Whether a command naming `keys` keys that took `elapsed` is slow for a
/// store that backs off after `after` (see 2 in the module docs).
fn is_slow(elapsed: Duration, keys: usize, after: Duration) -> bool {
    let keys = u32::try_from(keys).unwrap_or(u32::MAX);
    elapsed > after.max(SLOW_PER_KEY.saturating_mul(keys))
}

/// A code store in a Redis server: see the [module docs](self).
pub struct RedisStore {
    /// Where the server is, and the handshake it wants (the URL parsed).
    server: ConnectionInfo,
    prefix: String,
    connect_timeout: Duration,
    io_timeout: Duration,
    retry_interval: Duration,
    /// A command slower than this (or than [`SLOW_PER_KEY`] for each key
    /// it names, if longer) is slow, and [`SLOW_STREAK`] in a row make the
    /// store back off (see 2 in the module docs); `None`: only timeouts
    /// do.
    slow_after: Option<Duration>,
    ttl: Option<Duration>,
    max_value_bytes: u64,
    /// How long a lease lasts; `None`: no leases (see 6 in the module
    /// docs).
    lease: Option<Duration>,
    /// This store's token in the leases it takes.
    token: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    idle: Vec<Link>,
    /// No connect is tried before this instant (after a failed connect).
    retry_at: Option<Instant>,
    /// The keys this store holds leases on.
    leased: std::collections::HashSet<StoreKey>,
    /// What the store has seen of the server's speed.
    slow: SlowStreak,
}

/// Slow answers in a row, and the back-offs they made (see 2 in the
/// module docs).
#[derive(Default, Debug, PartialEq)]
struct SlowStreak {
    /// Slow answers since the last fast one or back-off.
    in_a_row: u32,
    /// Back-offs after slow answers since the last fast answer.
    back_offs: u32,
}

impl State {
    /// Whether the store is backing off now (see 2 in the module docs).
    fn backing_off(&self) -> bool {
        self.retry_at.is_some_and(|at| Instant::now() < at)
    }

    /// Backs off for `interval`, dropping the idle connections to the
    /// server (which would be as slow).
    fn back_off(&mut self, interval: Duration) {
        self.retry_at = Some(later_by(interval));
        self.idle.clear();
    }
}

/// The instant `interval` from now, or as far as an `Instant` reaches.
fn later_by(interval: Duration) -> Instant {
    let now = Instant::now();
    let mut interval = interval;
    loop {
        if let Some(at) = now.checked_add(interval) {
            return at;
        }
        interval /= 2;
    }
}

impl SlowStreak {
    /// Notes an answer, `slow` or not: how long to back off for, if it
    /// ends a streak of slow answers (`retry_interval` doubled for each
    /// back-off since the last fast answer, up to [`MAX_SLOW_DOUBLINGS`]
    /// times).
    fn note(&mut self, slow: bool, retry_interval: Duration) -> Option<Duration> {
        if !slow {
            *self = SlowStreak::default();
            return None;
        }
        self.in_a_row += 1;
        if self.in_a_row < SLOW_STREAK {
            return None;
        }
        let doublings = self.back_offs.min(MAX_SLOW_DOUBLINGS);
        self.in_a_row = 0;
        self.back_offs += 1;
        Some(retry_interval.saturating_mul(1 << doublings))
    }
}

impl RedisStore {
    /// The store in the server at `url` (`redis://host:port/db`, with a
    /// user and password if the server wants them). Does not connect: the
    /// first operation does. Fails only on a URL that does not parse.
    pub fn new(url: &str) -> Result<Self, StoreError> {
        let server = url
            .into_connection_info()
            .map_err(|source| StoreError::Redis {
                operation: "parse URL",
                source,
            })?;
        Ok(Self {
            server,
            prefix: DEFAULT_PREFIX.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            io_timeout: DEFAULT_IO_TIMEOUT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            slow_after: Some(DEFAULT_SLOW_AFTER),
            ttl: None,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            lease: Some(DEFAULT_LEASE),
            token: token(),
            state: Mutex::default(),
        })
    }

    /// This store with leases of `lease` (at least a millisecond) instead
    /// of [`DEFAULT_LEASE`], or, with `None`, without leases: every
    /// process that misses a key compiles it (see 6 in the module docs).
    pub fn with_lease(mut self, lease: Option<Duration>) -> Self {
        self.lease = lease.map(|l| l.max(Duration::from_millis(1)));
        self
    }

    /// This store with other timeouts for connecting and for each
    /// command's I/O (each at least a microsecond).
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Self {
        self.connect_timeout = connect.max(Duration::from_micros(1));
        self.io_timeout = io.max(Duration::from_micros(1));
        self
    }

    /// This store waiting `interval` after a failed connect before trying
    /// again (zero: try at every operation).
    pub fn with_retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// This store backing off after [`SLOW_STREAK`] commands in a row
    /// that each took longer than `after` (or than [`SLOW_PER_KEY`] for
    /// each key it names, if longer), as after a timeout but for an
    /// interval that doubles while it goes on; [`DEFAULT_SLOW_AFTER`] by
    /// default; with `None`, only after a timeout (see 2 in the module
    /// docs).
    pub fn with_slow_after(mut self, after: Option<Duration>) -> Self {
        self.slow_after = after;
        self
    }

    /// This store with values that expire `ttl` after they were put (at
    /// least a millisecond; a `get` does not extend it).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl.max(Duration::from_millis(1)));
        self
    }

    /// This store keeping values of at most `bytes` bytes (at least 1, and
    /// at most the 512 MiB a Redis string holds) instead of
    /// [`DEFAULT_MAX_VALUE_BYTES`] (see 5 in the module docs).
    pub fn with_max_value_bytes(mut self, bytes: u64) -> Self {
        self.max_value_bytes = bytes.clamp(1, 512 << 20);
        self
    }

    /// This store with keys under `prefix` instead of [`DEFAULT_PREFIX`]
    /// (to keep several stores apart in one server).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn redis_key(&self, key: &StoreKey) -> String {
        format!("{}{}", self.prefix, key.hex())
    }

    /// `SET` of `value` under `key`, with the time to live, if any.
    fn set_command(&self, key: &StoreKey, value: &[u8]) -> redis::Cmd {
        let mut command = redis::cmd("SET");
        command.arg(self.redis_key(key)).arg(value);
        if let Some(ttl) = self.ttl {
            command.arg("PX").arg(
                u64::try_from(ttl.as_millis()).map_or(MAX_TTL_MILLIS, |ms| ms.min(MAX_TTL_MILLIS)),
            );
        }
        command
    }

    /// The name of the lease on `key` (see 6 in the module docs).
    fn lease_key(&self, key: &StoreKey) -> String {
        format!("{}lease:{}", self.prefix, key.hex())
    }

    /// The script that deletes this store's leases on `keys`.
    fn release_command(&self, keys: &[StoreKey]) -> redis::Cmd {
        let mut command = redis::cmd("EVAL");
        command.arg(RELEASE_SCRIPT).arg(keys.len());
        for key in keys {
            command.arg(self.lease_key(key));
        }
        command.arg(&self.token);
        command
    }

    /// `GETRANGE` of at most one byte more than the largest value kept
    /// (see 5 in the module docs) of the key named `name`.
    fn bounded_get(&self, name: &str) -> redis::Cmd {
        let mut command = redis::cmd("GETRANGE");
        // The range's end is inclusive.
        command.arg(name).arg(0).arg(self.max_value_bytes);
        command
    }

    /// What a `GETRANGE` of [`RedisStore::bounded_get`] answered, as a
    /// value: none for an empty answer (a missing key reads as empty, and
    /// no entry is empty), [`StoreError::TooLarge`] for one longer than
    /// the largest value kept.
    fn value_of(&self, answer: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        let len = answer.len() as u64;
        if len > self.max_value_bytes {
            return Err(StoreError::TooLarge {
                len,
                limit: self.max_value_bytes,
            });
        }
        Ok((!answer.is_empty()).then_some(answer))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a push, a pop or a store of an
        // instant: a poisoned lock still holds a consistent state.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// An idle connection, or a new one.
    fn connection(&self) -> Result<Link, StoreError> {
        {
            let mut state = self.lock();
            // (Before the pool: a connection given back by a command that
            // was in flight when the store backed off is not used.)
            if state.backing_off() {
                return Err(StoreError::RedisBackingOff);
            }
            if let Some(connection) = state.idle.pop() {
                return Ok(connection);
            }
        }
        let connected = Link::connect(
            &self.server,
            self.connect_timeout,
            self.io_timeout,
            self.max_value_bytes,
        );
        let mut state = self.lock();
        match connected {
            Ok(connection) => {
                state.retry_at = None;
                Ok(connection)
            }
            Err(source) => {
                state.retry_at = Some(later_by(self.retry_interval));
                Err(StoreError::Redis {
                    operation: "connect",
                    source,
                })
            }
        }
    }

    /// Runs `command`, which names `keys` keys, on a connection, which
    /// goes back to the pool only if it succeeded (see 3 in the module
    /// docs); backs off after a timeout or a streak of slow answers (see
    /// 2).
    fn with_connection<T>(
        &self,
        operation: &'static str,
        keys: usize,
        command: impl FnOnce(&mut Link) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection()?;
        let start = Instant::now();
        let answered = command(&mut connection);
        let slow = self
            .slow_after
            .is_some_and(|after| is_slow(start.elapsed(), keys, after));
        match answered {
            Ok(value) => {
                self.note_answer(connection, slow, operation, keys, start.elapsed());
                Ok(value)
            }
            Err(source) => {
                // A server that took the whole I/O timeout is likely to
                // take it again, and one that answered more than it was
                // asked to answer it again.
                if source.is_timeout() || connection.was_cut_off() {
                    self.back_off();
                }
                Err(StoreError::Redis { operation, source })
            }
        }
    }

    /// Notes a command's answer, which took `took` and was `slow` (see 2
    /// in the module docs): its connection goes back to the pool, unless
    /// the answer ends a streak of slow ones, after which the store backs
    /// off, for an interval that doubles with each such back-off in a row.
    fn note_answer(
        &self,
        connection: Link,
        slow: bool,
        operation: &'static str,
        keys: usize,
        took: Duration,
    ) {
        let mut state = self.lock();
        // A command in flight when the store backed off says nothing new:
        // its connection is dropped, its time not counted.
        if state.backing_off() {
            return;
        }
        let Some(interval) = state.slow.note(slow, self.retry_interval) else {
            state.idle.push(connection);
            return;
        };
        log::debug!(
            "redis store: {operation} of {keys} keys took {took:?}, the last of {SLOW_STREAK} slow answers in a row; backing off for {interval:?}"
        );
        state.back_off(interval);
    }

    /// Backs off for the retry interval, as after a failed connect.
    fn back_off(&self) {
        self.lock().back_off(self.retry_interval);
    }
}

impl CodeStore for RedisStore {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        let name = self.redis_key(key);
        let answer = self.with_connection("GETRANGE", 1, |connection| {
            self.bounded_get(&name).query(connection)
        })?;
        self.value_of(answer)
    }

    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut values = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(GET_MANY_CHUNK) {
            let names: Vec<String> = chunk.iter().map(|key| self.redis_key(key)).collect();
            let answers = self.with_connection("GETRANGE", chunk.len(), |connection| {
                let mut pipeline = redis::pipe();
                // A key's own error (another type than a string) is that
                // key's miss, not the call's failure.
                pipeline.ignore_errors();
                for name in &names {
                    pipeline.add_command(self.bounded_get(name));
                }
                let answers: Vec<redis::RedisResult<Vec<u8>>> = pipeline.query(connection)?;
                // One answer per key, or the answer is garbage (and the
                // connection is dropped).
                if answers.len() != names.len() {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "a pipeline of GETRANGEs answered another number of values than keys asked",
                    )));
                }
                Ok(answers)
            })?;
            for (name, answer) in names.iter().zip(answers) {
                let value = answer
                    .map_err(|source| StoreError::Redis {
                        operation: "GETRANGE",
                        source,
                    })
                    .and_then(|answer| self.value_of(answer));
                values.push(value.unwrap_or_else(|e| {
                    log::warn!("code store: {name}: {e}; a miss");
                    None
                }));
            }
        }
        Ok(values)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        let len = value.len() as u64;
        if len > self.max_value_bytes {
            return Err(StoreError::TooLarge {
                len,
                limit: self.max_value_bytes,
            });
        }
        let leased = self.lock().leased.remove(key);
        let written = self.with_connection("SET", 1, |connection| {
            let command = self.set_command(key, value);
            if !leased {
                return command.query::<()>(connection);
            }
            // The value, then the end of the lease, in one round trip.
            let mut pipeline = redis::pipe();
            pipeline.add_command(command).ignore();
            pipeline
                .add_command(self.release_command(std::slice::from_ref(key)))
                .ignore();
            pipeline.query::<()>(connection)
        });
        // Not written: the lease is still this store's, to release.
        if written.is_err() && leased {
            self.lock().leased.insert(*key);
        }
        written
    }

    fn put_many(&self, entries: &[(StoreKey, Vec<u8>)]) -> Result<(), StoreError> {
        let mut first_error = None;
        for chunk in entries.chunks(GET_MANY_CHUNK) {
            let mut pipeline = redis::pipe();
            let mut leased = Vec::new();
            for (key, value) in chunk {
                let len = value.len() as u64;
                if len > self.max_value_bytes {
                    first_error.get_or_insert(StoreError::TooLarge {
                        len,
                        limit: self.max_value_bytes,
                    });
                    continue;
                }
                pipeline.add_command(self.set_command(key, value)).ignore();
                if self.lock().leased.remove(key) {
                    leased.push(*key);
                }
            }
            // The values, then the end of their leases, in one round trip.
            if !leased.is_empty() {
                pipeline.add_command(self.release_command(&leased)).ignore();
            }
            let written = self.with_connection("SET", chunk.len(), |connection| {
                pipeline.query::<()>(connection)
            });
            if let Err(e) = written {
                // Not written: the leases are still this store's.
                self.lock().leased.extend(leased);
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn try_get_or_reserve(&self, key: &StoreKey) -> Result<Claim, StoreError> {
        let mut claims = self.try_get_or_reserve_many(std::slice::from_ref(key))?;
        claims
            .pop()
            .ok_or_else(|| garbage("another number of answers than keys"))
    }

    fn try_get_or_reserve_many(&self, keys: &[StoreKey]) -> Result<Vec<Claim>, StoreError> {
        let Some(lease) = self.lease else {
            return Ok(self
                .get_many(keys)?
                .into_iter()
                .map(|value| value.map_or(Claim::Reserved, Claim::Found))
                .collect());
        };
        let mut claims = Vec::with_capacity(keys.len());
        // The leases this call took, as far as its answers say.
        let mut leased = Vec::new();
        let asked = keys.chunks(GET_MANY_CHUNK).try_for_each(|chunk| {
            let answer: redis::Value = self.with_connection("EVAL", chunk.len(), |connection| {
                // One answer, an array of a value (or a number) per key.
                connection.expect_values_per_reply(chunk.len());
                self.claim_command(chunk, lease).query(connection)
            })?;
            let redis::Value::Array(answers) = answer else {
                return Err(garbage("no array of answers"));
            };
            if answers.len() != chunk.len() {
                return Err(garbage("another number of answers than keys"));
            }
            for (key, answer) in chunk.iter().zip(answers) {
                let (claim, took_lease) = self.claim_of(answer)?;
                if took_lease {
                    leased.push(*key);
                }
                claims.push(claim);
            }
            Ok(())
        });
        match asked {
            Ok(()) => {
                self.lock().leased.extend(leased);
                Ok(claims)
            }
            Err(e) => {
                // Nobody is to wait for what this call will not report
                // as reserved (a lease whose answer was garbage expires).
                if !leased.is_empty() {
                    let _ = self.with_connection("EVAL", leased.len(), |connection| {
                        self.release_command(&leased).query::<()>(connection)
                    });
                }
                Err(e)
            }
        }
    }

    fn get_or_reserve(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        // Another holder's lease ends with its value, its release, or its
        // expiry: at most the lease time from now.
        let deadline = later_by(self.lease.unwrap_or_default());
        let mut pause = Duration::from_millis(1);
        loop {
            match self.try_get_or_reserve(key)? {
                Claim::Found(value) => return Ok(Some(value)),
                Claim::Reserved => return Ok(None),
                Claim::Busy if Instant::now() >= deadline => {
                    log::debug!(
                        "code store: {} held longer than a lease; compiling",
                        key.hex()
                    );
                    return Ok(None);
                }
                Claim::Busy => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_POLL);
                }
            }
        }
    }

    fn reserves(&self) -> bool {
        self.lease.is_some()
    }

    fn round_trips(&self) -> bool {
        true
    }

    fn release(&self, key: &StoreKey) {
        if !self.lock().leased.remove(key) {
            return;
        }
        // A lease not ended here expires.
        let released = self.with_connection("EVAL", 1, |connection| {
            self.release_command(std::slice::from_ref(key))
                .query::<()>(connection)
        });
        if let Err(e) = released {
            log::debug!("code store: {e}; the lease on {} expires", key.hex());
        }
    }
}

impl RedisStore {
    /// The claim script for `keys` with a lease of `lease` (see 6 in the
    /// module docs).
    fn claim_command(&self, keys: &[StoreKey], lease: Duration) -> redis::Cmd {
        let millis = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut command = redis::cmd("EVAL");
        command.arg(CLAIM_SCRIPT).arg(2 * keys.len());
        for key in keys {
            command.arg(self.redis_key(key));
        }
        for key in keys {
            command.arg(self.lease_key(key));
        }
        command
            .arg(self.max_value_bytes)
            .arg(&self.token)
            .arg(millis);
        command
    }

    /// What the claim script's `answer` for a key says, and whether it
    /// took the key's lease. A value larger than the store keeps is a
    /// miss, as in `get_many` (no lease taken: the caller compiles, and
    /// its `put` replaces the value).
    fn claim_of(&self, answer: redis::Value) -> Result<(Claim, bool), StoreError> {
        match answer {
            redis::Value::BulkString(value) => match self.value_of(value) {
                Ok(Some(value)) => Ok((Claim::Found(value), false)),
                Ok(None) => Err(garbage("an empty value")),
                Err(StoreError::TooLarge { .. }) => Ok((Claim::Reserved, false)),
                Err(e) => Err(e),
            },
            redis::Value::Int(1) => Ok((Claim::Reserved, true)),
            redis::Value::Int(0) => Ok((Claim::Busy, false)),
            _ => Err(garbage("neither a value nor a lease")),
        }
    }
}

/// The error of an answer that is neither of the script's.
fn garbage(what: &str) -> StoreError {
    StoreError::Redis {
        operation: "EVAL",
        source: redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the lease script answered something else",
            what.to_string(),
        )),
    }
}

/// A token no other store holds: this process, this instant, and a count
/// of the stores it made.
fn token() -> String {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{nanos}-{made}", std::process::id())
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: only the address.
        f.debug_struct("RedisStore")
            .field("address", &self.server.addr().to_string())
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("ttl", &self.ttl)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<RedisStore>();
};

#[cfg(test)]
mod tests {
    use super::{MAX_SLOW_DOUBLINGS, SLOW_PER_KEY, SLOW_STREAK, SlowStreak, is_slow};
    use std::time::Duration;

    #[test]
    fn a_streak_of_slow_answers_backs_off_ever_longer_until_a_fast_one() {
        let retry = Duration::from_secs(1);
        let mut streak = SlowStreak::default();
        // A slow answer alone, or two, between fast ones: no back-off.
        for _ in 0..3 {
            for _ in 1..SLOW_STREAK {
                assert_eq!(streak.note(true, retry), None);
            }
            assert_eq!(streak.note(false, retry), None);
        }
        // Streaks in a row: 1, 2, 4, ... retry intervals, up to 64.
        let mut intervals = Vec::new();
        for _ in 0..9 {
            for _ in 1..SLOW_STREAK {
                assert_eq!(streak.note(true, retry), None);
            }
            intervals.push(streak.note(true, retry).expect("a streak").as_secs());
        }
        assert_eq!(intervals, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(1 << MAX_SLOW_DOUBLINGS, 64);
        // A fast answer starts over.
        assert_eq!(streak.note(false, retry), None);
        assert_eq!(streak, SlowStreak::default());
        for _ in 1..SLOW_STREAK {
            assert_eq!(streak.note(true, retry), None);
        }
        assert_eq!(streak.note(true, retry), Some(retry));
    }

    #[test]
    fn a_command_is_slow_past_its_time_or_a_quarter_millisecond_a_key() {
        let ms = Duration::from_millis;
        let after = ms(10);
        assert!(!is_slow(ms(10), 1, after));
        assert!(is_slow(ms(11), 1, after));
        assert!(is_slow(ms(11), 0, after));
        // 40 keys: 10 ms still; 256 keys: 64 ms.
        assert!(is_slow(ms(11), 40, after));
        assert!(!is_slow(ms(64), 256, after));
        assert!(is_slow(ms(65), 256, after));
        assert_eq!(SLOW_PER_KEY * 256, ms(64));
        // No overflow for absurd counts.
        assert!(!is_slow(ms(1000), usize::MAX, after));
    }
}
