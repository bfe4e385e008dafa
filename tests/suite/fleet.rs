//! Processes of a fleet dividing a program's compiles through a Redis
//! server: leases on the keys being compiled (see 6 in
//! `jitfold::store::redis`), against a real `redis-server` and real child
//! processes (this test binary, started again on an ignored test).

use crate::common::build::{call1, declare, define, leaf2, leaves_and_callers, template_key};
use crate::store::redis_store::{Server, command_calls, store_at};
use cranelift_jit::JITBuilder;
use cranelift_module::{Module, default_libcall_names};
use jitfold::store::{Claim, CodeStore, StoreKey};
use jitfold::{DedupModule, DedupOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Leaves in the program each process defines: one template each, and
/// one more for all their callers.
const LEAVES: i64 = 40;

fn builder() -> JITBuilder {
    JITBuilder::new(default_libcall_names()).unwrap()
}

/// The store key of `leaf2`'s template.
fn leaf2_key() -> StoreKey {
    template_key(leaf2)
}

/// The lease `server` holds on `key`, if any: its holder's token.
fn lease_in(server: &Server, key: &StoreKey) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(format!("jitfold:code:lease:{}", key.hex()))
        .query(&mut server.raw())
        .unwrap()
}

/// The program of `LEAVES` leaves and their callers, defined in a module
/// with `options` on `store` and finalized, every function checked.
fn leaves_and_callers_on(
    options: DedupOptions,
    store: Arc<dyn CodeStore>,
) -> DedupModule<cranelift_jit::JITModule> {
    let mut m = DedupModule::with_options(builder(), options).with_store(store, None);
    let order: Vec<i64> = (0..LEAVES).collect();
    let ids = leaves_and_callers(&mut m, &order, 1000);
    m.finalize_definitions().unwrap();
    for k in 0..LEAVES {
        let expected = 4 * (3 + k) + 1000 * k;
        assert_eq!(
            call1(m.get_finalized_function(ids[k as usize]), 4),
            expected
        );
        let caller = ids[(LEAVES + k) as usize];
        assert_eq!(call1(m.get_finalized_function(caller), 3), expected);
    }
    m
}

/// The child side of the fleet test: defines the program in batch mode
/// through the Redis server at `JITFOLD_FLEET_REDIS`, checks every result,
/// and prints how many functions it compiled (does nothing when the
/// variable is not set).
#[test]
#[ignore = "run by the fleet test as a child process"]
fn child_fleet_runtime() {
    let Ok(url) = std::env::var("JITFOLD_FLEET_REDIS") else {
        return;
    };
    let store = Arc::new(store_at(&url)) as Arc<dyn CodeStore>;
    let m = leaves_and_callers_on(DedupOptions::batch(), store);
    let stats = m.stats();
    assert_eq!(stats.store_errors, 0, "{stats}");
    println!("\nfleet-compiled={}", stats.compiled);
}

/// Three processes starting one program at once on one Redis server
/// compile each of its templates once in total (a key another process
/// holds a lease on is left to it, and loaded once it is stored), and every
/// function of each is right.
#[test]
fn a_fleet_compiles_each_template_once_in_total() {
    let Some(server) = Server::start("fleet", &[]) else {
        return;
    };
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "fleet::child_fleet_runtime"])
                .args(["--nocapture", "--test-threads", "1"])
                .env("JITFOLD_FLEET_REDIS", server.url())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut compiled = Vec::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "a runtime failed");
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split("fleet-compiled=").nth(1))
            .unwrap_or_else(|| panic!("no count in {text}"));
        compiled.push(line.trim().parse::<u64>().unwrap());
    }
    // One template per leaf, and one for the callers.
    let templates = LEAVES as u64 + 1;
    assert_eq!(compiled.iter().sum::<u64>(), templates, "{compiled:?}");
}

/// The child side of the killed-holder test: takes the lease on
/// `leaf2`'s template (for the lease in `JITFOLD_FLEET_LEASE_MS`), says
/// so, and waits to be killed.
#[test]
#[ignore = "run by the killed-holder test as a child process"]
fn child_lease_holder() {
    let (Ok(url), Ok(lease)) = (
        std::env::var("JITFOLD_FLEET_REDIS"),
        std::env::var("JITFOLD_FLEET_LEASE_MS"),
    ) else {
        return;
    };
    let lease = Duration::from_millis(lease.parse().unwrap());
    let store = store_at(&url).with_lease(Some(lease));
    assert_eq!(
        store.try_get_or_reserve(&leaf2_key()).unwrap(),
        Claim::Reserved
    );
    println!("held");
    std::thread::sleep(Duration::from_secs(120));
}

/// A process killed while it holds a lease (mid-compile) holds up the
/// fleet only until the lease expires: then another process takes the key
/// and compiles it, and its value ends the lease.
#[test]
fn a_lease_whose_holder_was_killed_expires() {
    let Some(server) = Server::start("killed-holder", &[]) else {
        return;
    };
    let lease_ms = 400;
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "fleet::child_lease_holder"])
        .args(["--nocapture", "--test-threads", "1"])
        .env("JITFOLD_FLEET_REDIS", server.url())
        .env("JITFOLD_FLEET_LEASE_MS", lease_ms.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("held"))),
        "the holder never took the lease"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        lease_in(&server, &leaf2_key()).is_some(),
        "the killed holder's lease is gone already"
    );
    // Eager mode leaves the busy function to the flush, which waits for the
    // lease to expire and then compiles it.
    let store = store_at(&server.url()).with_lease(Some(Duration::from_millis(lease_ms)));
    let mut m = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(Arc::new(store) as Arc<dyn CodeStore>, None);
    let conv = m.isa().default_call_conv();
    let id = declare(&mut m, "leaf2", conv);
    define(&mut m, id, leaf2).unwrap();
    assert_eq!(m.stats().store_deferred, 1, "{}", m.stats());
    m.finalize_definitions().unwrap();
    assert_eq!(call1(m.get_finalized_function(id), 4), 2020);
    assert_eq!(m.stats().compiled, 1, "{}", m.stats());
    assert_eq!(m.stats().store_writes, 1, "{}", m.stats());
    assert!(
        lease_in(&server, &leaf2_key()).is_none(),
        "the value did not end the lease"
    );
}

/// A lease is its holder's: claimed again by the store that holds it (an
/// answer that was lost), it is still that store's to compile; another
/// store is told it is busy until the holder writes the value or
/// releases it.
#[test]
fn a_lease_is_its_holders_own() {
    let Some(server) = Server::start("own-lease", &[]) else {
        return;
    };
    let holder = store_at(&server.url());
    let other = store_at(&server.url());
    let key = leaf2_key();
    assert_eq!(holder.try_get_or_reserve(&key).unwrap(), Claim::Reserved);
    assert_eq!(holder.try_get_or_reserve(&key).unwrap(), Claim::Reserved);
    assert_eq!(other.try_get_or_reserve(&key).unwrap(), Claim::Busy);
    holder.release(&key);
    assert_eq!(other.try_get_or_reserve(&key).unwrap(), Claim::Reserved);
    other.put(&key, b"value").unwrap();
    assert_eq!(
        holder.try_get_or_reserve(&key).unwrap(),
        Claim::Found(b"value".to_vec())
    );

    // Many keys in one claim (one script run): each answered in order,
    // and the values written at once end their leases at once.
    let keys: Vec<StoreKey> = (0..5).map(crate::store::key).collect();
    assert_eq!(
        holder.try_get_or_reserve_many(&keys[..3]).unwrap(),
        vec![Claim::Reserved; 3]
    );
    other.put(&keys[3], b"three").unwrap();
    assert_eq!(
        other.try_get_or_reserve_many(&keys).unwrap(),
        vec![
            Claim::Busy,
            Claim::Busy,
            Claim::Busy,
            Claim::Found(b"three".to_vec()),
            Claim::Reserved
        ]
    );
    let written: Vec<(StoreKey, Vec<u8>)> = keys[..2].iter().map(|k| (*k, b"v".to_vec())).collect();
    holder.put_many(&written).unwrap();
    // The third is still the holder's; the other two are written.
    assert_eq!(
        other.try_get_or_reserve_many(&keys[..3]).unwrap(),
        vec![
            Claim::Found(b"v".to_vec()),
            Claim::Found(b"v".to_vec()),
            Claim::Busy
        ]
    );
    for key in &keys[..2] {
        assert!(
            lease_in(&server, key).is_none(),
            "a value written did not end its lease"
        );
    }
}

/// A flush on threads claims the templates it would compile on them in
/// one script run (per 256), not one round trip each (see 7 in
/// `module/stored.rs`); what it defines is right, and each template is
/// compiled once.
#[test]
fn a_flush_on_threads_claims_its_templates_at_once() {
    let Some(server) = Server::start("threads-claim", &[]) else {
        return;
    };
    let store = Arc::new(store_at(&server.url())) as Arc<dyn CodeStore>;
    let m = leaves_and_callers_on(DedupOptions::batch().with_threads(2), store);
    let stats = m.stats().clone();
    assert_eq!(stats.store_errors, 0, "{stats}");
    assert_eq!(stats.compiled, LEAVES as u64 + 1, "{stats}");
    drop(m);
    // One claim, and the lease releases with the writes (a few batches):
    // far fewer than a claim per template.
    let evals = command_calls(&server, "eval");
    assert!(evals <= 4, "{evals} scripts run");
}

/// A value larger than the store keeps, planted under a key, is a miss to
/// a claim (no lease taken: the caller compiles, and its `put` replaces
/// the value), not an error that would fail the claims of the keys asked
/// with it.
#[test]
fn a_planted_oversized_value_is_a_miss_to_a_claim() {
    let Some(server) = Server::start("claim-large", &[]) else {
        return;
    };
    let store = store_at(&server.url()).with_max_value_bytes(4);
    let keys: Vec<StoreKey> = (0..2).map(crate::store::key).collect();
    redis::cmd("SET")
        .arg(format!("jitfold:code:{}", keys[0].hex()))
        .arg("more than four bytes")
        .exec(&mut server.raw())
        .unwrap();
    assert_eq!(
        store.try_get_or_reserve_many(&keys).unwrap(),
        vec![Claim::Reserved, Claim::Reserved]
    );
    assert!(lease_in(&server, &keys[0]).is_none());
    assert!(lease_in(&server, &keys[1]).is_some());
}
