//! Shared by the benches: reading back what criterion measured in this run,
//! so each bench can print ratios against its baseline.

use cranelift_codegen::ir::{
    AbiParam, Function, InstBuilder, Signature, UserFuncName, condcodes::IntCC, types::I64,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Mean time in nanoseconds of the benchmark `target/criterion/<id...>`
/// from this run's estimates, if criterion wrote them.
pub fn mean_ns(id: &[&str]) -> Option<f64> {
    let mut path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion");
    for part in id {
        path.push(part);
    }
    let text = std::fs::read_to_string(path.join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

/// Unpacks each `.tar.zst` of `corpora` into `dest/<name>` unless present.
fn unpack(corpora: &Path, dest: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut archives: Vec<_> = std::fs::read_dir(corpora)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .collect();
    archives.sort();
    for archive in archives {
        let name = archive
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".tar.zst", "");
        let dir = dest.join(&name);
        if !dir.join(".done").exists() {
            std::fs::create_dir_all(&dir).unwrap();
            let status = Command::new("tar")
                .arg("--zstd")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&dir)
                .status()
                .expect("tar runs (with zstd installed)");
            assert!(status.success(), "unpacking {}", archive.display());
            std::fs::write(dir.join(".done"), "").unwrap();
        }
        dirs.push(dir);
    }
    dirs
}

/// The shared corpora, unpacked once into `target/jitfold-bench-corpora`
/// (empty when `../shared/corpora` is absent), or the folders in
/// `JITFOLD_BENCH_CORPORA` where that is set.
pub fn corpus_dirs() -> Vec<PathBuf> {
    // A machine without `../shared`: the corpora unpacked elsewhere.
    if let Some(dir) = std::env::var_os("JITFOLD_BENCH_CORPORA") {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("JITFOLD_BENCH_CORPORA is a folder")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        return dirs;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    unpack(
        &root.join("../shared/corpora"),
        &root.join("target/jitfold-bench-corpora"),
    )
}

/// A function of about 40 instructions whose constants depend on `k`;
/// `renumbered` builds the same function with other value numbers.
pub fn distinct_function(k: i64, renumbered: bool, call_conv: CallConv) -> Function {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
    sig.returns.push(AbiParam::new(I64));
    let mut func = Function::with_name_signature(UserFuncName::default(), sig);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let entry = b.create_block();
    let (then_block, join) = (b.create_block(), b.create_block());
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    if renumbered {
        let dead = b.ins().iconst(I64, 0);
        let inst = b.func.dfg.value_def(dead).unwrap_inst();
        b.func.layout.remove_inst(inst);
    }
    let (mut x, y) = (b.block_params(entry)[0], b.block_params(entry)[1]);
    for i in 0..12 {
        let c = b
            .ins()
            .iconst(I64, k.wrapping_mul(1_000_003).wrapping_add(i));
        let t = b.ins().imul(x, c);
        x = b.ins().bxor(t, y);
    }
    let cond = b.ins().icmp(IntCC::SignedLessThan, x, y);
    b.append_block_param(join, I64);
    b.ins().brif(cond, then_block, &[], join, &[x.into()]);
    b.switch_to_block(then_block);
    let z = b.ins().iadd(x, y);
    b.ins().jump(join, &[z.into()]);
    b.switch_to_block(join);
    let r = b.block_params(join)[0];
    b.ins().return_(&[r]);
    b.seal_all_blocks();
    b.finalize(cranelift_codegen::isa::TargetFrontendConfig {
        default_call_conv: call_conv,
        pointer_width: target_lexicon::PointerWidth::U64,
        page_size_align_log2: 12,
    });
    func
}

/// `functions` functions of which `duplicate_percent`% are copies of
/// earlier ones (the first `unique` are distinct, function `i` is a copy of
/// function `i % unique`); `renumbered` copies have other value numbers
/// (the same function built by other code), the others are built the same
/// way as the original (the same code built twice).
pub fn workload(
    functions: usize,
    duplicate_percent: usize,
    renumbered: bool,
    call_conv: CallConv,
) -> Vec<Function> {
    let unique = (functions * (100 - duplicate_percent) / 100).max(1);
    (0..functions)
        .map(|i| distinct_function((i % unique) as i64, renumbered && i >= unique, call_conv))
        .collect()
}

/// The read-only floor of a fingerprint: every instruction in layout order,
/// its opcode, its results' types and its value arguments, summed so nothing
/// is optimised away. What any fingerprint must read, with nothing encoded.
pub fn read_only(func: &Function) -> u64 {
    let mut sum = 0u64;
    for block in func.layout.blocks() {
        let mut next = func.layout.first_inst(block);
        while let Some(inst) = next {
            sum = sum.wrapping_add(func.dfg.insts[inst].opcode() as u64);
            for &result in func.dfg.inst_results(inst) {
                sum = sum.wrapping_add(func.dfg.value_type(result).index() as u64);
            }
            for &arg in func.dfg.inst_args(inst) {
                sum = sum.wrapping_add(u64::from(arg.as_u32()));
            }
            next = func.layout.next_inst(inst);
        }
    }
    sum
}

/// The 1-, 5- and 15-minute load averages (Linux), for the record.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The file system the benches' stores are made on (under
/// `std::env::temp_dir()`, so `TMPDIR`), as `/proc/mounts` names it: its
/// mount point, its type and, for ext4, whether it keeps a journal (Linux;
/// "unknown" elsewhere). Creating a file costs far more on ext4 without a
/// journal once many files were deleted: ext4 then checks every free
/// inode it considers for a deletion in the last seconds, and skips those
/// (`recently_deleted` in `fs/ext4/ialloc.c`, only without a journal), so
/// a store directory's cold start depends on it.
pub fn store_file_system() -> String {
    let Ok(dir) = std::env::temp_dir().canonicalize() else {
        return "unknown".into();
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return "unknown".into();
    };
    // The mount whose point is the longest prefix of the directory.
    let mount = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then_some((device, point, kind))
        })
        .max_by_key(|(_, point, _)| point.len());
    let Some((device, point, kind)) = mount else {
        return "unknown".into();
    };
    let journal = (kind == "ext4")
        .then(|| {
            let name = device.rsplit('/').next().unwrap_or(device);
            let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")).ok()?;
            Some(if task.trim() == "<none>" {
                ", no journal"
            } else {
                ", journal"
            })
        })
        .flatten()
        .unwrap_or("");
    format!("{} on {point} ({kind}{journal})", dir.display())
}

/// Cranelift's incremental-cache store on a directory: one file per key
/// (its hex digits), written to a temporary file and renamed.
pub struct DirKv(pub PathBuf);

impl cranelift_codegen::incremental_cache::CacheKvStore for DirKv {
    fn get(&self, key: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
        std::fs::read(self.0.join(hex(key)))
            .ok()
            .map(std::borrow::Cow::Owned)
    }

    fn insert(&mut self, key: &[u8], val: Vec<u8>) {
        let path = self.0.join(hex(key));
        let temp = path.with_extension("tmp");
        if std::fs::write(&temp, val).is_ok() {
            let _ = std::fs::rename(temp, path);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh, empty directory under the system's temporary directory, named
/// for the bench (`bench`), `name` and this process.
pub fn scratch(bench: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "jitfold-bench-{bench}-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Bytes of the files in `dir`.
pub fn size_of_dir(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// What [`alternate`] measured: per side, its best and median time, and
/// its time relative to the baseline's: best against best, and the median
/// over rounds of the ratio within each round.
pub struct Spread {
    /// Each side's best time.
    pub best: Vec<Duration>,
    /// Each side's median time.
    pub median: Vec<Duration>,
    /// Each side's best time over the baseline's best.
    pub best_ratio: Vec<f64>,
    /// The median over rounds of each side's time over the baseline's.
    pub median_ratio: Vec<f64>,
}

impl Spread {
    /// `side`'s time relative to the baseline, best-of and median of
    /// rounds, as `0.52 (0.55)`.
    pub fn ratio(&self, side: usize) -> String {
        format!(
            "{:.3} ({:.3})",
            self.best_ratio[side], self.median_ratio[side]
        )
    }

    /// How many times faster than the baseline `side` is (the inverse of
    /// [`Spread::ratio`]), as `1.92x (1.81x)`.
    pub fn speedup(&self, side: usize) -> String {
        format!(
            "{:.2}x ({:.2}x)",
            1.0 / self.best_ratio[side],
            1.0 / self.median_ratio[side]
        )
    }
}

/// The median of `v` (the upper one of an even count).
pub fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs `sides` sides `rounds` times each: in each round every side once,
/// starting with side `round % sides` (so that none always runs first or
/// right after the same other). `run(side)` returns the time to count.
pub fn alternate(
    sides: usize,
    rounds: usize,
    baseline: usize,
    mut run: impl FnMut(usize) -> Duration,
) -> Spread {
    let mut times = vec![Vec::with_capacity(rounds); sides];
    for round in 0..rounds {
        for k in 0..sides {
            let side = (round + k) % sides;
            times[side].push(run(side));
        }
    }
    let best: Vec<Duration> = times.iter().map(|t| *t.iter().min().unwrap()).collect();
    let median_ratio = (0..sides)
        .map(|s| {
            median(
                (0..rounds)
                    .map(|r| times[s][r].as_secs_f64() / times[baseline][r].as_secs_f64())
                    .collect(),
            )
        })
        .collect();
    Spread {
        best_ratio: best
            .iter()
            .map(|b| b.as_secs_f64() / best[baseline].as_secs_f64())
            .collect(),
        median: times.into_iter().map(median).collect(),
        best,
        median_ratio,
    }
}
