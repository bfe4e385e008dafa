//! The code store: entries of real compiled code round-trip and serve every
//! function with their template; every kind of damaged, foreign or
//! unauthenticated entry is rejected; the directory store is safe with
//! concurrent threads and processes, with a writer killed mid-way, and
//! stays bounded with least-recently-used eviction; the Redis store
//! (feature `redis`) survives a server that is down, slow, full, killed and
//! restarted.

use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::OwnedTargetIsa;
use jitfold::Fingerprinter;
use jitfold::code::MachineCode;
use jitfold::isa::{flags, host_isa, jit_flags};
use jitfold::store::{
    CodeContext, CodeStore, DirectoryStore, Entry, EntryRejected, EntryTarget, EntryUnwind,
    MemoryStore, Secret, StoreError, StoreKey,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Calls a name twice and a colocated name, reads two symbols (one with an
/// offset, one colocated), and calls a libcall: relocations by slot of
/// several kinds, and one by libcall.
const F: &str = "function %f(i64, i64) -> i64 {
    gv0 = symbol u1:5+8
    gv1 = symbol colocated u1:6
    sig0 = (i64) -> i64
    sig1 = (i64, i64, i64)
    fn0 = u0:1 sig0
    fn1 = colocated u0:2 sig0
    fn2 = %Memcpy sig1
block0(v0: i64, v1: i64):
    v2 = call fn0(v0)
    v3 = call fn1(v2)
    v4 = call fn0(v3)
    v5 = symbol_value.i64 gv0
    v6 = symbol_value.i64 gv1
    call fn2(v5, v6, v1)
    v7 = iadd v4, v5
    v8 = iadd v7, v6
    return v8
}";

/// `F` with other names in every slot, and other value and block numbers:
/// the same template.
const G: &str = "function %g(i64, i64) -> i64 {
    gv3 = symbol u1:50+8
    gv7 = symbol colocated u1:60
    sig2 = (i64) -> i64
    sig4 = (i64, i64, i64)
    fn5 = u0:10 sig2
    fn6 = colocated u0:20 sig2
    fn9 = %Memcpy sig4
block7(v10: i64, v11: i64):
    v22 = call fn5(v10)
    v23 = call fn6(v22)
    v24 = call fn5(v23)
    v25 = symbol_value.i64 gv3
    v26 = symbol_value.i64 gv7
    call fn9(v25, v26, v11)
    v27 = iadd v24, v25
    v28 = iadd v27, v26
    return v28
}";

/// Another template (one constant differs).
const H: &str = "function %h(i64) -> i64 {
    sig0 = (i64) -> i64
    fn0 = u0:1 sig0
block0(v0: i64):
    v1 = iconst.i64 7
    v2 = iadd v0, v1
    v3 = call fn0(v2)
    return v3
}";

fn parse(text: &str) -> Function {
    cranelift_reader::parse_functions(text).unwrap().remove(0)
}

fn isa() -> OwnedTargetIsa {
    host_isa(jit_flags()).unwrap()
}

/// A compiled function, as the module would have it.
struct Compiled {
    template: jitfold::Template,
    names: Vec<jitfold::SymbolName>,
    code: MachineCode,
    unwind: Option<cranelift_codegen::isa::unwind::UnwindInfo>,
}

fn compiled(text: &str, isa: &OwnedTargetIsa) -> Compiled {
    let func = parse(text);
    let mut walker = Fingerprinter::new();
    let walk = walker.walk(&func);
    let (template, names) = (walk.template(), walk.names().to_vec());
    let mut ctx = Context::for_function(func);
    ctx.compile(&**isa, &mut ControlPlane::default()).unwrap();
    let code = MachineCode::of(&ctx).unwrap();
    let unwind = ctx
        .compiled_code()
        .unwrap()
        .create_unwind_info(&**isa)
        .unwrap();
    Compiled {
        template,
        names,
        code,
        unwind,
    }
}

fn entry_of(c: &Compiled) -> Entry {
    Entry::new(
        &c.template,
        &c.names,
        &c.code,
        Duration::from_micros(1234),
        c.unwind.as_ref(),
    )
    .expect("compiled code with every name in the slot list makes an entry")
}

/// A compiled `F`, its entry, the context, and the entry's bytes without
/// and with a MAC.
struct Sample {
    isa: OwnedTargetIsa,
    context: CodeContext,
    f: Compiled,
    entry: Entry,
    plain: Vec<u8>,
    signed: Vec<u8>,
    secret: Secret,
}

fn sample() -> Sample {
    let isa = isa();
    let context = CodeContext::of(&*isa);
    let f = compiled(F, &isa);
    let entry = entry_of(&f);
    let secret = Secret::derive(b"test key material");
    Sample {
        plain: entry.encode(&context, None),
        signed: entry.encode(&context, Some(&secret)),
        isa,
        context,
        f,
        entry,
        secret,
    }
}

#[test]
fn real_code_round_trips_and_serves_every_function_with_its_template() {
    let s = sample();
    // The sample has relocations of every target kind the test means to
    // cover: by slot (several slots), and by libcall.
    let slots: Vec<u32> = s
        .entry
        .relocs()
        .iter()
        .filter_map(|r| match r.target {
            EntryTarget::Slot(slot) => Some(slot),
            _ => None,
        })
        .collect();
    assert!(slots.len() >= 4, "{:?}", s.entry.relocs());
    assert!(
        s.entry
            .relocs()
            .iter()
            .any(|r| matches!(r.target, EntryTarget::LibCall(_))),
        "{:?}",
        s.entry.relocs()
    );
    assert_eq!(s.entry.slots() as usize, s.f.names.len());
    // The host ISA gives unwind information, which the entry carries
    // with `store-unwind` and records as left out without it.
    let expected = match &s.f.unwind {
        None => EntryUnwind::None,
        Some(info) if cfg!(feature = "store-unwind") => EntryUnwind::Info(info.clone()),
        Some(_) => EntryUnwind::Omitted,
    };
    assert!(s.f.unwind.is_some());
    assert_eq!(s.entry.unwind(), &expected);

    for (bytes, secret) in [(&s.plain, None), (&s.signed, Some(&s.secret))] {
        let decoded = Entry::decode(bytes, &s.context, &s.f.template, secret).unwrap();
        assert_eq!(decoded, s.entry);
        assert_eq!(decoded.code(&s.f.names).as_ref(), Some(&s.f.code));
        assert_eq!(decoded.compile_time(), Duration::from_micros(1234));
        assert_eq!(
            decoded.template_digest(),
            &jitfold::store::entry::template_digest(s.f.template.key())
        );
        assert_eq!(
            decoded.template_sha256(),
            &jitfold::store::entry::template_sha256(s.f.template.key())
        );
    }
    // A MAC'd entry is usable without the secret (which cannot check it).
    assert_eq!(
        Entry::decode(&s.signed, &s.context, &s.f.template, None).unwrap(),
        s.entry
    );

    // One entry serves another function with the template: its code is
    // what compiling that function gives.
    let g = compiled(G, &s.isa);
    assert_eq!(g.template, s.f.template);
    assert_ne!(g.names, s.f.names);
    assert_eq!(
        StoreKey::of(&s.context, &g.template),
        StoreKey::of(&s.context, &s.f.template)
    );
    let decoded = Entry::decode(&s.plain, &s.context, &g.template, None).unwrap();
    assert_eq!(decoded.code(&g.names), Some(g.code));
    // Names of another length are not this template's.
    assert_eq!(decoded.code(&g.names[1..]), None);
}

#[test]
fn code_against_a_name_outside_the_slot_list_makes_no_entry() {
    let s = sample();
    let fewer = &s.f.names[..s.f.names.len() - 1];
    assert!(Entry::new(&s.f.template, fewer, &s.f.code, Duration::ZERO, None).is_none());
}

#[test]
fn truncated_entries_are_rejected_at_every_length() {
    let s = sample();
    for (bytes, secret) in [
        (&s.plain, None),
        (&s.signed, Some(&s.secret)),
        (&s.signed, None),
    ] {
        for len in 0..bytes.len() {
            let result = Entry::decode(&bytes[..len], &s.context, &s.f.template, secret);
            assert!(result.is_err(), "accepted a prefix of {len} bytes");
        }
        // A byte more is rejected too.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Entry::decode(&longer, &s.context, &s.f.template, secret).is_err());
    }
    assert_eq!(
        Entry::decode(&s.plain[..5], &s.context, &s.f.template, None),
        Err(EntryRejected::Truncated)
    );
    assert_eq!(
        Entry::decode(b"", &s.context, &s.f.template, None),
        Err(EntryRejected::Truncated)
    );
}

/// Every bit of every byte flipped, one at a time: rejected, or (only
/// where nothing can check it: the MAC read without a secret) accepted
/// with exactly the same content.
#[test]
fn flipped_bits_are_never_accepted_with_other_content() {
    let s = sample();
    for (bytes, secret) in [
        (&s.plain, None),
        (&s.signed, Some(&s.secret)),
        (&s.signed, None),
    ] {
        let mut accepted = 0;
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                match Entry::decode(&flipped, &s.context, &s.f.template, secret) {
                    Err(_) => {}
                    Ok(entry) => {
                        assert_eq!(entry, s.entry, "byte {i} bit {bit}");
                        accepted += 1;
                    }
                }
            }
        }
        // Only the 32 MAC bytes of a signed entry read without a secret.
        let expected = if secret.is_none() && bytes == &s.signed {
            32 * 8
        } else {
            0
        };
        assert_eq!(accepted, expected);
    }
}

/// Recomputes the checksum of an entry changed in place, as anyone
/// without the secret can; a `signed` entry gets a MAC, but under a key
/// other than the writers' (the best such a forger can do).
fn reseal(bytes: &mut Vec<u8>, signed: bool) {
    let body_end = bytes.len() - 16 - if signed { 32 } else { 0 };
    bytes.truncate(body_end);
    let checksum = xxhash_rust::xxh3::xxh3_128(bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    if signed {
        let forged = blake3::keyed_hash(&[7; 32], bytes);
        bytes.extend_from_slice(forged.as_bytes());
    }
}

#[test]
fn tampering_that_fixes_the_checksum_is_caught_by_the_mac() {
    let s = sample();
    // Change a code byte and fix the checksum: without a secret that is
    // indistinguishable from a real entry (the trust model); with one,
    // the MAC is invalid.
    let code_at = s
        .plain
        .windows(s.entry.bytes().len())
        .position(|w| w == s.entry.bytes())
        .unwrap();
    let mut tampered = s.plain.clone();
    tampered[code_at] ^= 0xff;
    reseal(&mut tampered, false);
    let accepted = Entry::decode(&tampered, &s.context, &s.f.template, None).unwrap();
    assert_ne!(accepted.bytes(), s.entry.bytes());
    assert_eq!(
        Entry::decode(&tampered, &s.context, &s.f.template, Some(&s.secret)),
        Err(EntryRejected::MacMissing)
    );

    let mut tampered = s.signed.clone();
    tampered[code_at] ^= 0xff;
    reseal(&mut tampered, true);
    assert_eq!(
        Entry::decode(&tampered, &s.context, &s.f.template, Some(&s.secret)),
        Err(EntryRejected::MacInvalid)
    );
}

#[test]
fn macs_are_checked_when_a_secret_is_set() {
    let s = sample();
    assert_eq!(
        Entry::decode(&s.plain, &s.context, &s.f.template, Some(&s.secret)),
        Err(EntryRejected::MacMissing)
    );
    let other = Secret::new([9; 32]);
    assert_eq!(
        Entry::decode(&s.signed, &s.context, &s.f.template, Some(&other)),
        Err(EntryRejected::MacInvalid)
    );
    assert_eq!(
        Entry::decode(
            &s.signed,
            &s.context,
            &s.f.template,
            Some(&Secret::derive(b"test key material"))
        )
        .unwrap(),
        s.entry
    );
    // The secret is never printed.
    assert_eq!(format!("{:?}", s.secret), "Secret(..)");
}

#[test]
fn entries_of_another_context_or_template_are_rejected() {
    let s = sample();
    // Other shared flags: another context, another key.
    let other_isa = host_isa(flags(&[("opt_level", "none")]).unwrap()).unwrap();
    let other = CodeContext::of(&*other_isa);
    assert_ne!(other, s.context);
    assert_ne!(
        StoreKey::of(&other, &s.f.template),
        StoreKey::of(&s.context, &s.f.template)
    );
    assert_eq!(
        Entry::decode(&s.plain, &other, &s.f.template, None),
        Err(EntryRejected::OtherContext)
    );
    // The same ISA built twice is the same context.
    assert_eq!(CodeContext::of(&*isa()), s.context);
    assert!(
        s.context.text().contains("opt_level=speed"),
        "{}",
        s.context.text()
    );
    // Another version of jitfold does not read this one's entries.
    assert!(
        s.context
            .text()
            .contains(&format!("\njitfold {}\n", env!("CARGO_PKG_VERSION"))),
        "{}",
        s.context.text()
    );

    // Another template (a key collision, as far as decoding can tell).
    let h = compiled(H, &s.isa);
    assert_eq!(
        Entry::decode(&s.plain, &s.context, &h.template, None),
        Err(EntryRejected::OtherTemplate)
    );
    assert_eq!(
        Entry::decode(&s.signed, &s.context, &h.template, Some(&s.secret)),
        Err(EntryRejected::OtherTemplate)
    );
    // A template of the same length that differs in one word.
    let h8 = compiled(&H.replace("iconst.i64 7", "iconst.i64 8"), &s.isa);
    assert_eq!(h8.template.key().len(), h.template.key().len());
    assert_ne!(h8.template, h.template);
    let h_bytes = entry_of(&h).encode(&s.context, None);
    assert_eq!(
        Entry::decode(&h_bytes, &s.context, &h8.template, None),
        Err(EntryRejected::OtherTemplate)
    );
}

/// An entry stored under another entry's key (a copied file, a replayed
/// Redis value) is rejected when that key is looked up, in every store.
#[test]
fn an_entry_under_another_key_is_rejected() {
    let s = sample();
    let h = compiled(H, &s.isa);
    let h_key = StoreKey::of(&s.context, &h.template);
    let dir = TempDir::new("other-key");
    let stores: Vec<Box<dyn CodeStore>> = vec![
        Box::new(MemoryStore::new()),
        Box::new(DirectoryStore::new(dir.path()).unwrap()),
    ];
    for store in stores {
        store.put(&h_key, &s.signed).unwrap();
        let bytes = store.get(&h_key).unwrap().unwrap();
        assert_eq!(
            Entry::decode(&bytes, &s.context, &h.template, Some(&s.secret)),
            Err(EntryRejected::OtherTemplate)
        );
        // Storing the right entry replaces it.
        let right = entry_of(&h).encode(&s.context, Some(&s.secret));
        store.put(&h_key, &right).unwrap();
        let bytes = store.get(&h_key).unwrap().unwrap();
        assert!(Entry::decode(&bytes, &s.context, &h.template, Some(&s.secret)).is_ok());
    }
}

#[test]
fn another_version_magic_or_flags_is_rejected() {
    let s = sample();
    let mut other = s.plain.clone();
    other[8] = other[8].wrapping_add(1);
    reseal(&mut other, false);
    assert!(matches!(
        Entry::decode(&other, &s.context, &s.f.template, None),
        Err(EntryRejected::OtherVersion(_))
    ));
    let mut other = s.plain.clone();
    other[11] |= 0x80;
    reseal(&mut other, false);
    assert!(matches!(
        Entry::decode(&other, &s.context, &s.f.template, None),
        Err(EntryRejected::UnknownFlags(_))
    ));
    let mut other = s.plain.clone();
    other[0] = b'X';
    assert_eq!(
        Entry::decode(&other, &s.context, &s.f.template, None),
        Err(EntryRejected::BadMagic)
    );
    assert_eq!(
        Entry::decode(
            b"not an entry at all, but long enough",
            &s.context,
            &s.f.template,
            None
        ),
        Err(EntryRejected::BadMagic)
    );
}

/// A scratch directory, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("jitfold-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The key numbered `id` in the tests.
pub(crate) fn key(id: u32) -> StoreKey {
    StoreKey::of_words(&CodeContext::from_text("tests".into()), &[id])
}

/// A value that says which key and version it is, and checks itself: key
/// id, version, length, pseudo-random bytes, and an XXH3 of all of it.
pub(crate) fn value(id: u32, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 28);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    let mut state = (u64::from(id) << 32 ^ version).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    v.extend((0..len).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    }));
    let hash = xxhash_rust::xxh3::xxh3_64(&v);
    v.extend_from_slice(&hash.to_le_bytes());
    v
}

/// Whether `bytes` is a whole value made by [`value`] for key `id`.
pub(crate) fn check_value(id: u32, bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 28 {
        return Err(format!("key {id}: {} bytes", bytes.len()));
    }
    let (body, hash) = bytes.split_at(bytes.len() - 8);
    if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != hash {
        return Err(format!(
            "key {id}: torn or mixed value of {} bytes",
            bytes.len()
        ));
    }
    let got = u32::from_le_bytes(body[..4].try_into().unwrap());
    let len = u64::from_le_bytes(body[12..20].try_into().unwrap());
    if got != id || len as usize + 20 != body.len() {
        return Err(format!("key {id}: value of key {got}, length {len}"));
    }
    Ok(())
}

#[test]
fn memory_store_round_trips() {
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    assert_eq!(store.get(&key(1)).unwrap(), None);
    store.put(&key(1), b"one").unwrap();
    store.put(&key(2), b"two").unwrap();
    store.put(&key(1), b"uno").unwrap();
    assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"uno"[..]));
    assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b"two"[..]));
    assert_eq!(store.get(&key(3)).unwrap(), None);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    store.put(&key(100 + t), &value(100 + t, i, 64)).unwrap();
                    check_value(100 + t, &store.get(&key(100 + t)).unwrap().unwrap()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn directory_store_round_trips() {
    let dir = TempDir::new("round-trip");
    let store = DirectoryStore::new(dir.path().join("nested/store")).unwrap();
    assert_eq!(store.get(&key(1)).unwrap(), None);
    store.put(&key(1), b"one").unwrap();
    store.put(&key(1), b"uno").unwrap();
    store.put(&key(2), b"").unwrap();
    assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"uno"[..]));
    assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b""[..]));
    // One file per entry, named by the key's hex.
    assert!(store.dir().join(key(1).hex()).is_file());
    let usage = store.usage().unwrap();
    assert_eq!((usage.entries, usage.bytes), (2, 3));
    // A second store on the same directory sees the entries.
    let again = DirectoryStore::new(store.dir()).unwrap();
    assert_eq!(again.get(&key(1)).unwrap().as_deref(), Some(&b"uno"[..]));
    // A value larger than the store keeps is an error, and not stored.
    let small = DirectoryStore::new(store.dir()).unwrap().with_limit(100);
    assert!(matches!(
        small.put(&key(3), &[0; 81]),
        Err(StoreError::TooLarge { len: 81, limit: 80 })
    ));
    assert_eq!(small.get(&key(3)).unwrap(), None);
}

#[test]
fn corrupt_or_truncated_files_are_rejected_not_errors() {
    let s = sample();
    let dir = TempDir::new("corrupt");
    let store = DirectoryStore::new(dir.path()).unwrap();
    let k = StoreKey::of(&s.context, &s.f.template);
    store.put(&k, &s.plain).unwrap();
    let path = store.path_of(&k);
    // Truncated in place.
    std::fs::write(&path, &s.plain[..s.plain.len() / 2]).unwrap();
    let bytes = store.get(&k).unwrap().unwrap();
    assert!(Entry::decode(&bytes, &s.context, &s.f.template, None).is_err());
    // Garbage.
    std::fs::write(&path, b"garbage").unwrap();
    let bytes = store.get(&k).unwrap().unwrap();
    assert_eq!(
        Entry::decode(&bytes, &s.context, &s.f.template, None),
        Err(EntryRejected::BadMagic)
    );
    // Empty.
    std::fs::write(&path, b"").unwrap();
    let bytes = store.get(&k).unwrap().unwrap();
    assert!(Entry::decode(&bytes, &s.context, &s.f.template, None).is_err());
    // A put replaces it.
    store.put(&k, &s.plain).unwrap();
    let bytes = store.get(&k).unwrap().unwrap();
    assert_eq!(
        Entry::decode(&bytes, &s.context, &s.f.template, None).unwrap(),
        s.entry
    );
}

#[test]
fn a_removed_directory_is_an_error_or_a_miss_never_a_panic() {
    let dir = TempDir::new("removed");
    let store = DirectoryStore::new(dir.path()).unwrap();
    store.put(&key(1), b"one").unwrap();
    std::fs::remove_dir_all(dir.path()).unwrap();
    assert_eq!(store.get(&key(1)).unwrap(), None);
    let error = store.put(&key(1), b"one").unwrap_err();
    assert!(matches!(error, StoreError::Io { .. }), "{error}");
    assert!(std::error::Error::source(&error).is_some());
    assert!(store.trim().is_err());
}

/// Whoever can write the directory may plant a file under an entry's name
/// that is no entry: a FIFO (opening it would wait for a writer forever),
/// a link to an endless device, a file longer than any entry. Each is an
/// error at once, not a hang, nor memory without bound; a put replaces it.
#[cfg(unix)]
#[test]
fn a_planted_file_that_is_no_entry_is_an_error_at_once() {
    let dir = TempDir::new("planted");
    let store = Arc::new(DirectoryStore::new(dir.path()).unwrap());
    let path_of = |k: &StoreKey| dir.path().join(k.hex());
    let status = std::process::Command::new("mkfifo")
        .arg(path_of(&key(1)))
        .status()
        .unwrap();
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/zero", path_of(&key(2))).unwrap();
    // Longer than the low-water mark of the default limit (sparse: it
    // takes no room).
    let long = std::fs::File::create(path_of(&key(3))).unwrap();
    // (The store has the default limit.)
    long.set_len(store.low_water_bytes() + 1).unwrap();
    drop(long);
    for k in [key(1), key(2), key(3)] {
        let (sender, receiver) = std::sync::mpsc::channel();
        let reader = store.clone();
        let kept = k;
        std::thread::spawn(move || {
            let _ = sender.send(reader.get(&kept).map(|v| v.map(|v| v.len())));
        });
        let got = receiver
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("get of {} hangs", k.hex()));
        let error = got.unwrap_err();
        assert!(matches!(error, StoreError::Io { .. }), "{error}");
    }
    for k in [key(1), key(2), key(3)] {
        store.put(&k, b"entry").unwrap();
        assert_eq!(store.get(&k).unwrap().as_deref(), Some(&b"entry"[..]));
    }
}

/// A link planted under an entry's name is not followed, even to a valid
/// entry outside the directory: `get` is an error, and the file it points
/// to is neither read nor touched (its time stays).
#[test]
fn a_link_out_of_the_store_is_not_followed() {
    let dir = TempDir::new("link");
    let outside = TempDir::new("link-target");
    let store = DirectoryStore::new(dir.path()).unwrap();
    let elsewhere = DirectoryStore::new(outside.path()).unwrap();
    elsewhere.put(&key(1), &value(1, 0, 100)).unwrap();
    let target = elsewhere.path_of(&key(1));
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&target)
        .unwrap()
        .set_modified(old)
        .unwrap();
    std::os::unix::fs::symlink(&target, store.path_of(&key(1))).unwrap();
    let error = store.get(&key(1)).unwrap_err();
    assert!(matches!(error, StoreError::Io { .. }), "{error}");
    let error = store.get_many(&[key(1)]).unwrap_err();
    assert!(matches!(error, StoreError::Io { .. }), "{error}");
    assert_eq!(std::fs::metadata(&target).unwrap().modified().unwrap(), old);
    // Eviction deletes the link (a file of the store's), never its target.
    assert_eq!(store.trim().unwrap().entries, 0);
    assert!(target.exists());
}

/// `get_many` reads at most `GET_MANY_BYTES` in all: planted entries
/// (sparse files, each no longer than an entry may be) adding up to more
/// make it fail before it reads the one that would pass the bound, while
/// each is still read on its own.
#[test]
fn get_many_holds_a_bounded_number_of_bytes() {
    use jitfold::store::directory::{GET_MANY_BYTES, MAX_ENTRY_BYTES};
    let dir = TempDir::new("budget");
    let store = DirectoryStore::new(dir.path()).unwrap();
    let n = (GET_MANY_BYTES / MAX_ENTRY_BYTES + 1) as u32;
    let keys: Vec<StoreKey> = (0..n).map(key).collect();
    for k in &keys {
        let f = std::fs::File::create(store.path_of(k)).unwrap();
        f.set_len(MAX_ENTRY_BYTES).unwrap();
    }
    let error = store.get_many(&keys).unwrap_err();
    assert!(
        // Two entries read take the whole budget: the third is not read.
        matches!(error, StoreError::TooLarge { len, limit } if len == MAX_ENTRY_BYTES && limit == 0),
        "{error}"
    );
    let one = store.get(&keys[0]).unwrap().unwrap();
    assert_eq!(one.len() as u64, MAX_ENTRY_BYTES);
    // Longer than any entry: refused before it is read.
    let f = std::fs::File::create(store.path_of(&keys[0])).unwrap();
    f.set_len(MAX_ENTRY_BYTES + 1).unwrap();
    assert!(matches!(store.get(&keys[0]), Err(StoreError::Io { .. })));
    // And no longer value is stored.
    let long = vec![0u8; MAX_ENTRY_BYTES as usize + 1];
    assert!(matches!(
        store.put(&keys[0], &long),
        Err(StoreError::TooLarge { .. })
    ));
}

/// Threads writing the same and different keys while others read: every
/// read is a whole value of its key, and the last writes are all there.
#[test]
fn concurrent_threads_never_see_a_torn_entry() {
    let dir = TempDir::new("threads");
    let store = Arc::new(DirectoryStore::new(dir.path()).unwrap());
    threads_share(|_| store.clone(), &*store);
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 10, "{names:?}");
}

/// Six threads, thread `t` on `store_of(t)`, each writing shared keys 0..4
/// (with lengths that differ by writer: a torn or mixed read would show)
/// and a key of its own, in one `put_many`, and reading while the others
/// write: every read is a whole value of its key; at the end (once a pack
/// store would look again) every key is in `last`.
pub(crate) fn threads_share(store_of: impl Fn(u32) -> Arc<dyn CodeStore>, last: &dyn CodeStore) {
    let threads: Vec<_> = (0..6u32)
        .map(|t| {
            let store = store_of(t);
            std::thread::spawn(move || {
                for i in 0..150u64 {
                    let shared = (i % 4) as u32;
                    let batch = [
                        (key(shared), value(shared, i, 1000 + 997 * t as usize)),
                        (key(10 + t), value(10 + t, i, 300)),
                    ];
                    store.put_many(&batch).unwrap();
                    for id in [shared, (shared + 1) % 4, 10 + t] {
                        if let Some(bytes) = store.get(&key(id)).unwrap() {
                            check_value(id, &bytes).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(jitfold::store::pack::REFRESH_AFTER);
    for id in (0..4).chain(10..16) {
        check_value(id, &last.get(&key(id)).unwrap().unwrap()).unwrap();
    }
}

/// The child side of the multi-process tests: writes and reads values in
/// the directory given by `JITFOLD_STORE_CHILD_DIR`, through a
/// `DirectoryStore`, or a `PackStore` if `JITFOLD_STORE_CHILD_PACK` is set
/// (does nothing when the directory is not set, so running ignored tests
/// by hand is harmless).
#[test]
#[ignore = "run by the multi-process tests as a child process"]
fn child_writer() {
    let Ok(dir) = std::env::var("JITFOLD_STORE_CHILD_DIR") else {
        return;
    };
    let seed: u64 = std::env::var("JITFOLD_STORE_CHILD_SEED")
        .unwrap()
        .parse()
        .unwrap();
    // `forever`: write until killed (the killed-writer test).
    let forever = std::env::var("JITFOLD_STORE_CHILD_FOREVER").is_ok();
    let store: Box<dyn CodeStore> = if std::env::var("JITFOLD_STORE_CHILD_PACK").is_ok() {
        Box::new(jitfold::store::PackStore::new(dir).unwrap())
    } else {
        Box::new(DirectoryStore::new(dir).unwrap())
    };
    let mut i = 0u64;
    while forever || i < 200 {
        let id = (i % 4) as u32;
        let len = if forever {
            1 << 20
        } else {
            500 + 311 * seed as usize
        };
        store
            .put(&key(id), &value(id, seed << 32 | i, len))
            .unwrap();
        if let Some(bytes) = store.get(&key((id + 1) % 4)).unwrap() {
            check_value((id + 1) % 4, &bytes).unwrap();
        }
        i += 1;
    }
}

/// A child process running [`child_writer`] on `dir` (through a
/// `PackStore` if `pack`), writing 200 values or (`forever`) until killed.
pub(crate) fn child(dir: &Path, seed: u64, forever: bool, pack: bool) -> std::process::Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            "store::child_writer",
            "--test-threads=1",
        ])
        .env("JITFOLD_STORE_CHILD_DIR", dir)
        .env("JITFOLD_STORE_CHILD_SEED", seed.to_string())
        .stdout(Stdio::null());
    if forever {
        command.env("JITFOLD_STORE_CHILD_FOREVER", "1");
    }
    if pack {
        command.env("JITFOLD_STORE_CHILD_PACK", "1");
    }
    command.spawn().unwrap()
}

#[test]
fn several_processes_share_a_directory_without_torn_entries() {
    let dir = TempDir::new("processes");
    let store = DirectoryStore::new(dir.path()).unwrap();
    share_with_children(dir.path(), false, &store);
}

/// Three child processes write and read `dir` (through a `PackStore` if
/// `pack`) while this one reads and writes it through `store`: every value
/// read is whole, the children's checks pass, and every key is there at
/// the end.
pub(crate) fn share_with_children(dir: &Path, pack: bool, store: &dyn CodeStore) {
    let children: Vec<_> = (1..=3).map(|seed| child(dir, seed, false, pack)).collect();
    for i in 0..300u64 {
        let id = (i % 4) as u32;
        if let Some(bytes) = store.get(&key(id)).unwrap() {
            check_value(id, &bytes).unwrap();
        }
        if i % 10 == 0 {
            store.put(&key(id), &value(id, i, 2000)).unwrap();
        }
    }
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child failed its checks");
    }
    // (A pack store sees what other processes wrote at a miss once this
    // long has passed since it last looked.)
    std::thread::sleep(jitfold::store::pack::REFRESH_AFTER);
    for id in 0..4 {
        check_value(id, &store.get(&key(id)).unwrap().unwrap()).unwrap();
    }
}

/// A writer killed at an arbitrary point leaves no torn entry: every entry
/// file is a whole value, and a temporary file left over is not an entry
/// and is deleted once stale.
#[test]
fn a_killed_writer_leaves_no_torn_entry() {
    let dir = TempDir::new("killed");
    std::fs::create_dir_all(dir.path()).unwrap();
    let store = DirectoryStore::new(dir.path()).unwrap();
    for round in 0..3 {
        let mut writer = child(dir.path(), 10 + round, true, false);
        // Until it has written every key at least once (bounded: the child
        // writes a value in milliseconds).
        let mut polls = 0;
        while (0..4).any(|id| !store.path_of(&key(id)).exists()) {
            assert!(polls < 2000, "the writer wrote nothing");
            std::thread::sleep(Duration::from_millis(5));
            polls += 1;
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        writer.kill().unwrap();
        writer.wait().unwrap();
        for id in 0..4 {
            check_value(id, &store.get(&key(id)).unwrap().unwrap()).unwrap();
        }
    }
    // What a writer killed between creating and renaming its temporary
    // file leaves: never read, counted while fresh, deleted when stale.
    let temp = dir.path().join(format!(".tmp-{}-1-1", &key(0).hex()[..16]));
    std::fs::write(&temp, &value(0, 99, 100)[..50]).unwrap();
    check_value(0, &store.get(&key(0)).unwrap().unwrap()).unwrap();
    store.trim().unwrap();
    assert!(temp.exists(), "a fresh temporary file may still be written");
    let stale =
        SystemTime::now() - jitfold::store::directory::STALE_TEMP_AGE - Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(stale)
        .unwrap();
    store.trim().unwrap();
    assert!(!temp.exists(), "a stale temporary file is deleted");
    for id in 0..4 {
        check_value(id, &store.get(&key(id)).unwrap().unwrap()).unwrap();
    }
}

/// Over its limit, the store deletes the least recently used entries (a
/// `get` counts as a use, to within `TOUCH_AFTER`) until it is at most the
/// low-water mark.
#[test]
fn eviction_keeps_the_bound_in_lru_order() {
    use jitfold::store::directory::TOUCH_AFTER;
    let dir = TempDir::new("evict");
    let store = DirectoryStore::new(dir.path()).unwrap().with_limit(10_000);
    assert_eq!(store.low_water_bytes(), 8_000);
    // Stored an hour ago, a second apart, in this order.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for id in 0..10 {
        store.put(&key(id), &[id as u8; 1000]).unwrap();
        set_time(
            &store.path_of(&key(id)),
            hour_ago + Duration::from_secs(id.into()),
        );
    }
    assert_eq!(store.usage().unwrap().bytes, 10_000);
    // Used again: 0 and 2 are now the most recent.
    store.get(&key(0)).unwrap().unwrap();
    store.get(&key(2)).unwrap().unwrap();
    // Used within `TOUCH_AFTER` of being stored: its time stays.
    let recent = SystemTime::now() - TOUCH_AFTER / 2;
    set_time(&store.path_of(&key(9)), recent);
    store.get(&key(9)).unwrap().unwrap();
    assert_eq!(modified(&store.path_of(&key(9))), recent);
    assert!(modified(&store.path_of(&key(0))) > recent);
    store.put(&key(10), &[10; 1000]).unwrap();
    // 11 000 > 10 000: down to 8 000, the oldest first (1, 3, 4).
    let usage = store.usage().unwrap();
    assert_eq!((usage.entries, usage.bytes), (8, 8_000));
    let present: Vec<u32> = (0..=10)
        .filter(|id| store.get(&key(*id)).unwrap().is_some())
        .collect();
    assert_eq!(present, [0, 2, 5, 6, 7, 8, 9, 10]);
    // Files that are not entries are neither counted nor deleted.
    std::fs::write(dir.path().join("README"), [0; 5000]).unwrap();
    assert_eq!(store.trim().unwrap().bytes, 8_000);
    assert!(dir.path().join("README").exists());
}

/// Sets the modification time of the file at `path`.
pub(crate) fn set_time(path: &Path, time: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(time)
        .unwrap();
}

/// The modification time of the file at `path`.
pub(crate) fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// Many writers of many keys: the directory stays within its bound (up to
/// the values written while a scan runs), and a trim brings it under.
#[test]
fn eviction_bounds_concurrent_writers() {
    let dir = TempDir::new("evict-threads");
    let limit = 50_000;
    let store = Arc::new(DirectoryStore::new(dir.path()).unwrap().with_limit(limit));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let id = t * 1000 + i;
                    store.put(&key(id), &value(id, 0, 700)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let usage = store.usage().unwrap();
    assert!(usage.bytes <= limit + 4 * 728, "{usage:?}");
    assert!(store.trim().unwrap().bytes <= limit);
    // What is left is whole, and the entry written last is there.
    store.put(&key(5000), &value(5000, 0, 700)).unwrap();
    let mut left = 0;
    for id in (0..4).flat_map(|t| t * 1000..t * 1000 + 200).chain([5000]) {
        if let Some(bytes) = store.get(&key(id)).unwrap() {
            check_value(id, &bytes).unwrap();
            left += 1;
        }
    }
    assert!(left >= 40_000 / 728, "{left} entries left");
    assert!(store.get(&key(5000)).unwrap().is_some());
}

#[cfg(feature = "redis")]
pub(crate) mod redis_store {
    //! Against a real `redis-server` on a loopback port, started by each
    //! test (skipped when it is not installed, unless `CI` is set).

    use super::*;
    use jitfold::store::RedisStore;
    use jitfold::store::redis::SLOW_STREAK;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::process::Child;
    use std::time::Instant;

    /// A `redis-server` child process on a port of its own, killed when
    /// dropped.
    pub(crate) struct Server {
        child: Option<Child>,
        port: u16,
        dir: TempDir,
        extra: Vec<String>,
    }

    impl Server {
        /// A running server, or `None` (with a message) when `redis-server`
        /// is not installed outside CI.
        pub(crate) fn start(name: &str, extra: &[&str]) -> Option<Self> {
            if Command::new("redis-server")
                .arg("--version")
                .output()
                .is_err()
            {
                if std::env::var_os("CI").is_some() {
                    panic!("redis-server is not installed, and CI must run the Redis tests");
                }
                eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
                return None;
            }
            let mut server = Self {
                child: None,
                port: free_port(),
                dir: TempDir::new(&format!("redis-{name}")),
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            server.restart();
            Some(server)
        }

        pub(crate) fn url(&self) -> String {
            format!("redis://127.0.0.1:{}/", self.port)
        }

        /// Starts the server (again, on the same port) and waits until it
        /// answers `PING`.
        fn restart(&mut self) {
            std::fs::create_dir_all(self.dir.path()).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .args(&self.extra)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            self.child = Some(child);
            for _ in 0..400 {
                if ping(self.port) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            panic!("redis-server did not answer on port {}", self.port);
        }

        fn kill(&mut self) {
            if let Some(mut child) = self.child.take() {
                child.kill().unwrap();
                child.wait().unwrap();
            }
        }

        /// A plain client, for what the store does not do.
        pub(crate) fn raw(&self) -> redis::Connection {
            redis::Client::open(self.url())
                .unwrap()
                .get_connection()
                .unwrap()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.kill();
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn ping(port: u16) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut answer).is_ok()
            && &answer == b"+PONG\r\n"
    }

    /// How many times `server` ran `command` (its `INFO commandstats`).
    pub(crate) fn command_calls(server: &Server, command: &str) -> u64 {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut server.raw())
            .unwrap();
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|l| l.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    }

    /// A store in the server at `url`, with the default settings but one:
    /// it does not give up on a server whose answers are slow, so that a
    /// test of anything else does not depend on how loaded the machine
    /// is (`a_slow_server_is_given_up_on_by_default` tests the default).
    pub(crate) fn store_at(url: &str) -> RedisStore {
        RedisStore::new(url).unwrap().with_slow_after(None)
    }

    /// Generous: the store's own timeouts are milliseconds; this only
    /// catches a hang.
    const HANG: Duration = Duration::from_secs(10);

    /// A value planted larger than the store keeps is read only up to one
    /// byte past the limit and is an error, alone or in a batch; one of
    /// exactly the limit is read whole; a larger `put` is refused; a time
    /// to live too long for Redis is cut, not refused by the server.
    #[test]
    fn values_are_bounded_and_long_times_to_live_are_cut() {
        let Some(server) = Server::start("bounded", &[]) else {
            return;
        };
        let store = store_at(&server.url()).with_max_value_bytes(1000);
        let mut raw = server.raw();
        let name = |k: u32| format!("jitfold:code:{}", key(k).hex());
        redis::cmd("SET")
            .arg(name(1))
            .arg(vec![7u8; 5_000_000])
            .query::<()>(&mut raw)
            .unwrap();
        match store.get(&key(1)) {
            Err(StoreError::TooLarge { len, limit }) => assert_eq!((len, limit), (1001, 1000)),
            other => panic!("{other:?}"),
        }
        redis::cmd("SET")
            .arg(name(2))
            .arg(vec![9u8; 1000])
            .query::<()>(&mut raw)
            .unwrap();
        assert_eq!(store.get(&key(2)).unwrap(), Some(vec![9u8; 1000]));
        // In a batch, a value too large or of another type is that key's
        // miss; the others are read.
        redis::cmd("LPUSH")
            .arg(name(5))
            .arg("x")
            .query::<()>(&mut raw)
            .unwrap();
        assert!(matches!(store.get(&key(5)), Err(StoreError::Redis { .. })));
        assert_eq!(
            store.get_many(&[key(1), key(2), key(5), key(3)]).unwrap(),
            vec![None, Some(vec![9u8; 1000]), None, None]
        );
        assert!(matches!(
            store.put(&key(3), &[1u8; 1001]),
            Err(StoreError::TooLarge {
                len: 1001,
                limit: 1000
            })
        ));
        assert_eq!(store.get(&key(3)).unwrap(), None);
        // The store is still usable after those errors.
        store.put(&key(3), &[1u8; 1000]).unwrap();
        assert_eq!(store.get(&key(3)).unwrap(), Some(vec![1u8; 1000]));
        // A limit beyond what Redis holds is cut to it, not refused by
        // the server.
        let unbounded = store_at(&server.url()).with_max_value_bytes(u64::MAX);
        assert_eq!(unbounded.get(&key(2)).unwrap(), Some(vec![9u8; 1000]));
        let forever = store_at(&server.url()).with_ttl(Duration::MAX);
        forever.put(&key(4), b"x").unwrap();
        assert_eq!(forever.get(&key(4)).unwrap().as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn round_trip_overwrite_and_ttl() {
        let Some(server) = Server::start("round-trip", &[]) else {
            return;
        };
        let store = store_at(&server.url());
        assert_eq!(store.get(&key(1)).unwrap(), None);
        store.put(&key(1), &value(1, 0, 5000)).unwrap();
        store.put(&key(1), &value(1, 1, 3000)).unwrap();
        let bytes = store.get(&key(1)).unwrap().unwrap();
        assert_eq!(bytes, value(1, 1, 3000));
        // Keys are the prefix and the hex.
        let mut raw = server.raw();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("jitfold:code:{}", key(1).hex()))
            .query(&mut raw)
            .unwrap();
        assert_eq!(ttl, -1, "no expiry by default");
        let expiring = store_at(&server.url())
            .with_ttl(Duration::from_secs(300))
            .with_prefix("other:");
        expiring.put(&key(1), b"x").unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("other:{}", key(1).hex()))
            .query(&mut raw)
            .unwrap();
        assert!(ttl > 0 && ttl <= 300_000, "{ttl}");
        // Prefixes keep stores apart.
        assert_eq!(expiring.get(&key(1)).unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(store.get(&key(1)).unwrap().unwrap(), value(1, 1, 3000));
        // Threads share the pool.
        let store = Arc::new(store);
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        store.put(&key(20 + t), &value(20 + t, i, 800)).unwrap();
                        check_value(20 + t, &store.get(&key(20 + t)).unwrap().unwrap()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn get_many_answers_every_key_in_order_in_few_commands() {
        let Some(server) = Server::start("get-many", &[]) else {
            return;
        };
        let store = store_at(&server.url());
        // More keys than one command asks for; every third one is held.
        let keys: Vec<StoreKey> = (0..300).map(key).collect();
        for id in (0..300).step_by(3) {
            store.put(&key(id), &value(id, 0, 700)).unwrap();
        }
        let values = store.get_many(&keys).unwrap();
        assert_eq!(values.len(), keys.len());
        for (id, value) in (0..300).zip(&values) {
            match value {
                Some(bytes) => {
                    assert_eq!(id % 3, 0);
                    check_value(id, bytes).unwrap();
                }
                None => assert_ne!(id % 3, 0, "{id}"),
            }
        }
        assert!(store.get_many(&[]).unwrap().is_empty());
        // Bounded reads only (in two pipelines: 256 keys, then 44).
        let calls = |command: &str| command_calls(&server, command);
        assert_eq!(
            (calls("getrange"), calls("mget"), calls("get")),
            (300, 0, 0)
        );
        // A server that is gone is an error, not a hang.
        let mut server = server;
        server.kill();
        let start = Instant::now();
        assert!(store.get_many(&keys).is_err());
        assert!(start.elapsed() < HANG);
    }

    /// The child side of the two-process test: compiles `F` and stores
    /// its signed entry in the Redis server at `JITFOLD_STORE_CHILD_REDIS`
    /// (does nothing when it is not set).
    #[test]
    #[ignore = "run by the two-process Redis test as a child process"]
    fn child_redis_writer() {
        let Ok(url) = std::env::var("JITFOLD_STORE_CHILD_REDIS") else {
            return;
        };
        let s = sample();
        let store = store_at(&url);
        store
            .put(&StoreKey::of(&s.context, &s.f.template), &s.signed)
            .unwrap();
    }

    /// An entry stored by another process is a hit here, for a function
    /// built with other names and other value and block numbers.
    #[test]
    fn another_process_entry_serves_this_process() {
        let Some(server) = Server::start("two-processes", &[]) else {
            return;
        };
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "store::redis_store::child_redis_writer",
            ])
            .env("JITFOLD_STORE_CHILD_REDIS", server.url())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let isa = isa();
        let context = CodeContext::of(&*isa);
        let g = compiled(G, &isa);
        let store = store_at(&server.url());
        let bytes = store
            .get(&StoreKey::of(&context, &g.template))
            .unwrap()
            .expect("the child stored the entry of F, which has G's template");
        let secret = Secret::derive(b"test key material");
        let entry = Entry::decode(&bytes, &context, &g.template, Some(&secret)).unwrap();
        assert_eq!(entry.code(&g.names), Some(g.code));
    }

    #[test]
    fn corrupt_and_misplaced_entries_in_redis_are_rejected() {
        let Some(server) = Server::start("corrupt", &[]) else {
            return;
        };
        let s = sample();
        let store = store_at(&server.url());
        let k = StoreKey::of(&s.context, &s.f.template);
        let redis_key = format!("jitfold:code:{}", k.hex());
        let mut raw = server.raw();
        let corruptions: Vec<Vec<u8>> = vec![
            s.signed[..s.signed.len() - 1].to_vec(),
            {
                let mut flipped = s.signed.clone();
                flipped[40] ^= 4;
                flipped
            },
            s.plain.clone(),
            entry_of(&compiled(H, &s.isa)).encode(&s.context, Some(&s.secret)),
            Vec::new(),
        ];
        for bytes in corruptions {
            let _: () = redis::cmd("SET")
                .arg(&redis_key)
                .arg(&bytes)
                .query(&mut raw)
                .unwrap();
            // An empty value reads as missing (a missing key reads empty).
            match store.get(&k).unwrap() {
                Some(got) => assert!(
                    Entry::decode(&got, &s.context, &s.f.template, Some(&s.secret)).is_err()
                ),
                None => assert!(bytes.is_empty()),
            }
        }
        store.put(&k, &s.signed).unwrap();
        let got = store.get(&k).unwrap().unwrap();
        assert_eq!(
            Entry::decode(&got, &s.context, &s.f.template, Some(&s.secret)).unwrap(),
            s.entry
        );
    }

    /// Asserts that `error` is the Redis store's failure of `operation`.
    fn assert_failed_in(error: &StoreError, operation: &str) {
        assert!(
            matches!(error, StoreError::Redis { operation: op, .. } if *op == operation),
            "{error}"
        );
    }

    /// A socket bound to a port of its own and not listening: a connection
    /// to the port is refused for as long as it is held, and no other test
    /// binds the port meanwhile (a port found free and let go may be).
    fn refusing_port() -> (socket2::Socket, u16) {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).unwrap();
        let port = socket.local_addr().unwrap().as_socket().unwrap().port();
        (socket, port)
    }

    #[test]
    fn a_server_that_is_down_is_an_error_at_once() {
        // (Once a port found free and let go: another test's listener got
        // it, and the store connected.)
        let (_held, port) = refusing_port();
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/")).unwrap();
        let start = Instant::now();
        let error = store.get(&key(1)).unwrap_err();
        assert_failed_in(&error, "connect");
        // Within the retry interval, no new connect is tried.
        assert!(matches!(
            store.put(&key(1), b"x").unwrap_err(),
            StoreError::RedisBackingOff
        ));
        assert!(start.elapsed() < HANG);
        // A URL that does not parse is the only error `new` gives.
        assert!(RedisStore::new("not a url").is_err());
    }

    /// A server that accepts connections and never answers: the store's
    /// timeouts end every operation.
    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::thread::spawn(move || {
            // Hold the connections open without a word, until the test
            // is done with them.
            let mut held = Vec::new();
            listener.set_nonblocking(true).unwrap();
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if let Ok((stream, _)) = listener.accept() {
                    held.push(stream);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .with_retry_interval(Duration::ZERO);
        for _ in 0..3 {
            let start = Instant::now();
            let error = store.get(&key(1)).unwrap_err();
            let StoreError::Redis { source, .. } = &error else {
                panic!("{error}");
            };
            assert!(source.is_timeout(), "{error}");
            assert!(start.elapsed() < HANG);
        }
        accepted.join().unwrap();
    }

    /// A server on a loopback port of its own that takes one connection,
    /// reads a request, and answers it with `answer`: its port, and its
    /// thread.
    fn answering_once(
        answer: impl FnOnce(&mut TcpStream) + Send + 'static,
    ) -> (u16, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            answer(&mut stream);
        });
        (port, server)
    }

    /// A server that trickles its answer a byte at a time, each byte well
    /// within the I/O timeout: the request times out all the same, about
    /// when its I/O timeout is spent (`redis_link.rs` 2), and the store
    /// backs off.
    #[test]
    fn a_server_trickling_its_answer_times_out() {
        let (port, server) = answering_once(|stream| {
            // A 1,000-byte value, a byte every 10 ms: 10 s in all.
            let until = Instant::now() + HANG;
            let mut answer = b"$1000\r\n".to_vec();
            answer.extend(std::iter::repeat_n(b'x', 1000));
            for byte in answer {
                if Instant::now() > until || stream.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let io = Duration::from_millis(200);
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .with_timeouts(Duration::from_secs(1), io);
        let start = Instant::now();
        let error = store.get(&key(1)).unwrap_err();
        let took = start.elapsed();
        let StoreError::Redis { source, .. } = &error else {
            panic!("{error}");
        };
        assert!(source.is_timeout(), "{error}");
        // The I/O timeout (and at most half of it more, see
        // `redis_link.rs`), and a microsecond for each of the few bytes
        // moved; the margin is for a loaded machine.
        assert!(took >= io && took < 5 * io, "{took:?}");
        assert!(matches!(
            store.get(&key(1)).unwrap_err(),
            StoreError::RedisBackingOff
        ));
        drop(store);
        server.join().unwrap();
    }

    /// A server whose answer pauses, each pause within the I/O timeout,
    /// while the request still has time (a microsecond a byte moved) is
    /// not cut short: the socket waits as long as the time left allows,
    /// even after a wait that had less time left (`redis_link.rs` 2).
    #[test]
    fn a_server_pausing_within_a_request_allowance_is_answered() {
        const LEN: usize = 600_000;
        let (port, server) = answering_once(|stream| {
            // Late to start (three quarters of the I/O timeout), then half
            // the value at once (300 ms more allowed), a pause of 60% of
            // the timeout, and the rest.
            std::thread::sleep(Duration::from_millis(150));
            let mut answer = format!("${LEN}\r\n").into_bytes();
            answer.extend(std::iter::repeat_n(b'x', LEN / 2));
            stream.write_all(&answer).unwrap();
            std::thread::sleep(Duration::from_millis(120));
            let mut rest = vec![b'x'; LEN / 2];
            rest.extend_from_slice(b"\r\n");
            stream.write_all(&rest).unwrap();
        });
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .with_timeouts(Duration::from_secs(1), Duration::from_millis(200))
            .with_slow_after(None);
        let value = store.get(&key(1)).unwrap().expect("the value");
        assert_eq!(value.len(), LEN);
        server.join().unwrap();
    }

    /// A proxy on a loopback port of its own to the server on `port`, which
    /// holds every read of a request `delay` before passing it on.
    fn slow_proxy(port: u16, delay: Duration) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(("127.0.0.1", port)))
                else {
                    return;
                };
                let (mut from_client, mut to_server) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = from_client.read(&mut buf) {
                        std::thread::sleep(delay);
                        if to_server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown(std::net::Shutdown::Both);
                });
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        proxy
    }

    /// A server that answers every command 15 ms late, within the
    /// timeouts: by default, the first [`SLOW_STREAK`] slow answers are
    /// used, and then the store backs off for the retry interval, so that
    /// the next operations answer at once (a JIT compiles instead of
    /// waiting 15 ms a function); a fast answer from a direct connection
    /// would start over, but the server stays slow, so the next streak
    /// backs off for twice the interval; with `with_slow_after(None)`,
    /// every operation waits. (How long a command of many keys may take,
    /// and the doubling, are unit tests in `redis.rs`: through a proxy on
    /// a loaded machine, a test cannot time them finely.)
    #[test]
    fn a_slow_server_is_given_up_on_by_default() {
        let Some(server) = Server::start("slow", &[]) else {
            return;
        };
        let direct = store_at(&server.url());
        for i in 0..4 {
            direct.put(&key(i), b"value").unwrap();
        }
        let proxy = slow_proxy(server.port, Duration::from_millis(15));
        let url = format!("redis://127.0.0.1:{proxy}/");
        let retry = Duration::from_millis(400);
        let slow = RedisStore::new(&url).unwrap().with_retry_interval(retry);
        let answered_slowly = |store: &RedisStore| {
            for i in 0..SLOW_STREAK {
                let start = Instant::now();
                assert_eq!(store.get(&key(i)).unwrap().as_deref(), Some(&b"value"[..]));
                assert!(start.elapsed() >= Duration::from_millis(15));
            }
        };
        // Every operation until `until` answers at once that the store
        // backs off (checked call by call, so that a stall of the machine
        // past the back-off's end proves nothing rather than fails).
        let backs_off = |store: &RedisStore, until: Instant| {
            for i in 0..50 {
                let result = store.get(&key(i % 4));
                if Instant::now() >= until {
                    break;
                }
                let error = result.unwrap_err();
                assert!(matches!(error, StoreError::RedisBackingOff), "{error}");
            }
        };
        answered_slowly(&slow);
        let backed_off = Instant::now();
        backs_off(&slow, backed_off + retry * 3 / 4);
        // After the interval the store asks again, and is slow again: the
        // second back-off lasts twice as long.
        std::thread::sleep(retry.saturating_sub(backed_off.elapsed()) + retry / 4);
        answered_slowly(&slow);
        let backed_off = Instant::now();
        std::thread::sleep(retry + retry / 4);
        backs_off(&slow, backed_off + 2 * retry * 7 / 8);
        // Without the limit, each operation waits for its answer.
        let patient = RedisStore::new(&url).unwrap().with_slow_after(None);
        for _ in 0..2 {
            answered_slowly(&patient);
        }
    }

    /// Commands in flight when the store backs off after slow answers do
    /// not bring it back early: four slow gets at once, the third answer
    /// backs the store off, and the connection of the fourth, answered
    /// after that, is not used for the next operation (which answers at
    /// once that the store backs off).
    #[test]
    fn a_command_in_flight_does_not_end_a_back_off() {
        let Some(server) = Server::start("in-flight", &[]) else {
            return;
        };
        store_at(&server.url()).put(&key(1), b"value").unwrap();
        let proxy = slow_proxy(server.port, Duration::from_millis(15));
        let store = RedisStore::new(&format!("redis://127.0.0.1:{proxy}/"))
            .unwrap()
            .with_retry_interval(HANG);
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    barrier.wait();
                    // The fourth may find the store backing off already.
                    let _ = store.get(&key(1));
                });
            }
        });
        let error = store.get(&key(1)).unwrap_err();
        assert!(matches!(error, StoreError::RedisBackingOff), "{error}");
    }

    /// One request, as a client sends it (an array of bulk strings), read
    /// from `reader`: its arguments.
    fn read_request(reader: &mut impl std::io::BufRead) -> Vec<Vec<u8>> {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let count: usize = line.trim().trim_start_matches('*').parse().unwrap();
        (0..count)
            .map(|_| {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let len: usize = line.trim().trim_start_matches('$').parse().unwrap();
                let mut arg = vec![0u8; len + 2];
                reader.read_exact(&mut arg).unwrap();
                arg.truncate(len);
                arg
            })
            .collect()
    }

    /// A claim whose answers turn to garbage midway is an error, and the
    /// lease its first answer says it took is released at once (one
    /// script), rather than left for other processes to wait on until it
    /// expires.
    #[test]
    fn a_claim_answered_garbage_midway_releases_the_leases_it_took() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(HANG)).unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            // The claim: a lease taken for the first key, garbage for the
            // second.
            let claim = read_request(&mut reader);
            writer.write_all(b"*2\r\n:1\r\n:7\r\n").unwrap();
            // What the store sends next, on the same connection.
            let next = read_request(&mut reader);
            let _ = writer.write_all(b":0\r\n");
            (claim, next)
        });
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .with_slow_after(None);
        let keys = [key(1), key(2)];
        assert!(store.try_get_or_reserve_many(&keys).is_err());
        let (claim, next) = server.join().unwrap();
        assert_eq!(claim[0], b"EVAL");
        assert_eq!(next[0], b"EVAL");
        let lease = |k: &StoreKey| format!("jitfold:code:lease:{}", k.hex()).into_bytes();
        // The release script names the first key's lease, and only it.
        assert_eq!(next[2], b"1");
        assert_eq!(next[3], lease(&keys[0]));
    }

    /// A server that answers garbage: an error, and the connection is not
    /// kept.
    #[test]
    fn a_server_answering_garbage_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().unwrap();
                let mut buf = [0u8; 256];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"%%% not RESP %%%\r\n");
            }
        });
        let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .with_retry_interval(Duration::ZERO);
        for _ in 0..2 {
            assert!(store.get(&key(1)).is_err());
        }
        server.join().unwrap();
    }

    /// A server that answers every request with a 300 MB value, whatever
    /// it was asked (`redis_link.rs` 1): the store reads no more than it
    /// asked for (its largest value, and the framing, per reply) before it
    /// hangs up, so the server gets to send little of its answer; the
    /// request is an error, and the store backs off as after a timeout.
    /// Through the `redis` crate's own connection, the whole 300 MB is
    /// read into memory first.
    #[test]
    fn a_server_answering_more_than_asked_is_cut_off() {
        const HUGE: usize = 300 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let mut sent = Vec::new();
            for _ in 0..3 {
                let (mut stream, _) = listener.accept().unwrap();
                stream.set_write_timeout(Some(HANG)).unwrap();
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let mut total = 0;
                if stream.write_all(format!("${HUGE}\r\n").as_bytes()).is_ok() {
                    let chunk = vec![b'x'; 1 << 16];
                    while total < HUGE {
                        match stream.write(&chunk) {
                            Ok(n) => total += n,
                            Err(_) => break,
                        }
                    }
                }
                sent.push(total);
            }
            sent
        });
        let url = format!("redis://127.0.0.1:{port}/");
        let store = RedisStore::new(&url).unwrap().with_max_value_bytes(1024);
        let start = Instant::now();
        let error = store.get(&key(1)).unwrap_err();
        assert_failed_in(&error, "GETRANGE");
        // The store backs off: the next operation answers at once.
        assert!(matches!(
            store.get(&key(1)).unwrap_err(),
            StoreError::RedisBackingOff
        ));
        // A pipeline reads at most its replies' worth.
        let many = RedisStore::new(&url)
            .unwrap()
            .with_max_value_bytes(1024)
            .with_retry_interval(Duration::ZERO);
        let keys: Vec<StoreKey> = (0..4).map(key).collect();
        assert!(many.get_many(&keys).is_err());
        // So does a claim of several keys, answered as one array.
        assert!(many.try_get_or_reserve_many(&keys).is_err());
        assert!(start.elapsed() < HANG);
        let sent = server.join().unwrap();
        // What the kernel's socket buffers took, at most, and the few
        // kilobytes read: far from the 300 MB answered.
        for bytes in sent {
            assert!(bytes < 32 << 20, "the server sent {bytes} bytes");
        }
    }

    /// The handshake a URL asks for (`redis_link.rs` 4): a user and
    /// password, and a database other than 0.
    #[test]
    fn a_store_authenticates_and_selects_its_database() {
        let Some(server) = Server::start("auth", &[]) else {
            return;
        };
        let port = server.port;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("secret")
            .exec(&mut server.raw())
            .unwrap();
        let at = |credentials: &str, db: u32| format!("redis://{credentials}127.0.0.1:{port}/{db}");
        store_at(&at(":secret@", 3))
            .put(&key(1), b"in three")
            .unwrap();
        let name = format!("jitfold:code:{}", key(1).hex());
        let value_in = |db: u32| -> Option<Vec<u8>> {
            let mut connection = redis::Client::open(at(":secret@", db))
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("GET").arg(&name).query(&mut connection).unwrap()
        };
        assert_eq!(value_in(3).as_deref(), Some(&b"in three"[..]));
        assert_eq!(value_in(0), None);
        // A user named, as Redis 6's ACLs have them.
        let named = store_at(&at("default:secret@", 3));
        assert_eq!(
            named.get(&key(1)).unwrap().as_deref(),
            Some(&b"in three"[..])
        );
        // A wrong password, or none: an error.
        assert!(store_at(&at(":wrong@", 3)).get(&key(1)).is_err());
        assert!(store_at(&at("", 3)).get(&key(1)).is_err());
    }

    /// A store on a Unix socket (`redis+unix://`, `redis_link.rs` 4), and
    /// its database: what it puts, a plain client on the same socket and
    /// database reads.
    #[test]
    fn a_store_on_a_unix_socket_reaches_its_server() {
        let dir = TempDir::new("redis-unix-socket");
        std::fs::create_dir_all(dir.path()).unwrap();
        let socket = dir.path().join("redis.sock");
        let socket_arg = socket.to_str().unwrap().to_string();
        let Some(_server) = Server::start("unix", &["--unixsocket", &socket_arg]) else {
            return;
        };
        let url = format!("redis+unix://{}?db=2", socket.display());
        let store = store_at(&url);
        store.put(&key(1), b"over a socket").unwrap();
        assert_eq!(
            store.get(&key(1)).unwrap().as_deref(),
            Some(&b"over a socket"[..])
        );
        let mut plain = redis::Client::open(url).unwrap().get_connection().unwrap();
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(format!("jitfold:code:{}", key(1).hex()))
            .query(&mut plain)
            .unwrap();
        assert_eq!(value.as_deref(), Some(&b"over a socket"[..]));
    }

    /// A server that stops answering mid-use (stopped with `SIGSTOP`, as a
    /// server stalled by a long command, a fork or swapping): an operation
    /// on the open connection times out, and once the server resumes the
    /// store works again.
    #[test]
    fn a_stalled_server_times_out_and_is_used_again() {
        let Some(mut server) = Server::start("stalled", &[]) else {
            return;
        };
        let store = store_at(&server.url()).with_retry_interval(Duration::ZERO);
        store.put(&key(1), b"before").unwrap();
        // And one with the default retry interval, also connected.
        let patient = store_at(&server.url());
        patient.put(&key(2), b"before").unwrap();
        let pid = server.child.as_ref().unwrap().id().to_string();
        let signal = |name: &str| {
            let status = Command::new("kill").args([name, &pid]).status().unwrap();
            assert!(status.success());
        };
        signal("-STOP");
        // Should the store hang, the server resumes after a while, so that
        // the test fails instead of hanging too.
        let (resumed, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = {
            let pid = pid.clone();
            std::thread::spawn(move || {
                let timed_out = watch.recv_timeout(HANG);
                if timed_out == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    let _ = Command::new("kill").args(["-CONT", &pid]).status();
                }
            })
        };
        let start = Instant::now();
        let error = store.get(&key(1)).unwrap_err();
        let StoreError::Redis { operation, source } = &error else {
            panic!("{error}");
        };
        assert_eq!(*operation, "GETRANGE");
        assert!(source.is_timeout(), "{error}");
        // A new connection cannot be set up either.
        assert!(store.get(&key(1)).is_err());
        // A command that timed out is followed by backing off, as a failed
        // connect is: the next operations answer at once.
        let error = patient.get(&key(2)).unwrap_err();
        assert!(
            matches!(&error, StoreError::Redis { operation: "GETRANGE", source } if source.is_timeout()),
            "{error}"
        );
        for _ in 0..3 {
            let error = patient.put(&key(2), b"x").unwrap_err();
            assert!(matches!(error, StoreError::RedisBackingOff), "{error}");
        }
        assert!(start.elapsed() < HANG);
        signal("-CONT");
        resumed.send(()).unwrap();
        watchdog.join().unwrap();
        assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"before"[..]));
        server.kill();
    }

    #[test]
    fn a_restarted_server_is_used_again() {
        let Some(mut server) = Server::start("restart", &[]) else {
            return;
        };
        let store = store_at(&server.url()).with_retry_interval(Duration::ZERO);
        store.put(&key(1), b"before").unwrap();
        assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"before"[..]));
        server.kill();
        // The pooled connection is dead: an error, then a failed connect.
        let start = Instant::now();
        assert!(store.get(&key(1)).is_err());
        assert!(store.put(&key(1), b"lost").is_err());
        assert!(start.elapsed() < HANG);
        server.restart();
        // Nothing was saved, and the store works again.
        assert_eq!(store.get(&key(1)).unwrap(), None);
        store.put(&key(1), b"after").unwrap();
        assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"after"[..]));
    }

    /// The retry interval passes, then the store connects again.
    #[test]
    fn backing_off_ends_after_the_retry_interval() {
        let Some(mut server) = Server::start("backoff", &[]) else {
            return;
        };
        server.kill();
        let store = store_at(&server.url()).with_retry_interval(Duration::from_millis(200));
        assert!(matches!(
            store.get(&key(1)).unwrap_err(),
            StoreError::Redis { .. }
        ));
        assert!(matches!(
            store.get(&key(1)).unwrap_err(),
            StoreError::RedisBackingOff
        ));
        server.restart();
        // Bounded: each try costs at most a connect timeout.
        let start = Instant::now();
        loop {
            match store.get(&key(1)) {
                Ok(None) => break,
                Ok(Some(_)) => panic!("nothing was stored"),
                Err(StoreError::RedisBackingOff) => {
                    assert!(start.elapsed() < HANG);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Threads using the store while the server is killed and restarted:
    /// each operation returns (a value, a miss or an error), every value
    /// read is whole, and afterwards the store works.
    #[test]
    fn a_server_killed_mid_use() {
        let Some(mut server) = Server::start("killed", &[]) else {
            return;
        };
        let store = Arc::new(
            RedisStore::new(&server.url())
                .unwrap()
                .with_retry_interval(Duration::from_millis(10))
                // What it tests is a dead server, not a slow one.
                .with_slow_after(None),
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = (0..3u32)
            .map(|t| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::spawn(move || {
                    let (mut ok, mut errors) = (0u32, 0u32);
                    let mut i = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let id = t * 10 + i % 3;
                        match store.put(&key(id), &value(id, u64::from(i), 20_000)) {
                            Ok(()) => ok += 1,
                            Err(_) => errors += 1,
                        }
                        match store.get(&key(id)) {
                            Ok(Some(bytes)) => check_value(id, &bytes).unwrap(),
                            Ok(None) => {}
                            Err(_) => errors += 1,
                        }
                        i += 1;
                    }
                    (ok, errors)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        server.kill();
        std::thread::sleep(Duration::from_millis(100));
        server.restart();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut ok, mut errors) = (0, 0);
        for t in threads {
            let (o, e) = t.join().unwrap();
            ok += o;
            errors += e;
        }
        assert!(ok > 0 && errors > 0, "{ok} successes, {errors} errors");
        // Working again.
        let mut tries = 0;
        while store.put(&key(99), b"back").is_err() {
            tries += 1;
            assert!(tries < 500, "the store does not recover");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(store.get(&key(99)).unwrap().as_deref(), Some(&b"back"[..]));
    }

    /// A server out of memory refuses `SET`: an error, and `GET` still
    /// works.
    #[test]
    fn a_full_server_refuses_puts_with_an_error() {
        let Some(server) = Server::start(
            "full",
            &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"],
        ) else {
            return;
        };
        let store = store_at(&server.url())
            .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
        store.put(&key(0), &value(0, 0, 1000)).unwrap();
        let mut refused = None;
        for id in 1..200 {
            if let Err(e) = store.put(&key(id), &value(id, 0, 100_000)) {
                refused = Some(e);
                break;
            }
        }
        let refused = refused.expect("a 2 MB server takes 20 MB");
        assert!(
            matches!(
                refused,
                StoreError::Redis {
                    operation: "SET",
                    ..
                }
            ),
            "{refused}"
        );
        check_value(0, &store.get(&key(0)).unwrap().unwrap()).unwrap();
    }
}
