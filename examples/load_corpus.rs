//! Loads a corpus of CLIF functions (a directory of `.clif` files, such as
//! the wasm modules of `../shared/corpora` unpacked) into a
//! `DedupModule<ObjectModule>`, as a JIT would define them, once with each
//! of a few options, and prints what jitfold did: how to measure what a
//! mode gives on real code.
//!
//! Every function is declared first (as `f0`, `f1`, ...), then defined with
//! its references to other functions of the corpus turned into references
//! to their ids (each name entry renamed in place, so that no entry is left
//! naming whichever id has the old index); what the corpus does not define
//! is imported.
//!
//! ```sh
//! cargo run --release --features tools --example load_corpus -- DIR
//! ```
//!
//! `--jit` defines into a `DedupModule<JITModule>` (finalized) instead;
//! `--no-verifier` turns Cranelift's verifier off (as wasmtime ships);
//! `--store STORE_DIR --repeat N` runs eager and batch mode `N` times each
//! on a `DirectoryStore` in `STORE_DIR` (the first run fills it): warm
//! starts through the product; `--pack` uses a `PackStore` there instead.

use cranelift_codegen::ir::{
    ExternalName, Function, GlobalValueData, UserExternalName, UserExternalNameRef, UserFuncName,
};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_jit::JITBuilder;
use cranelift_module::{DataId, FuncId, Linkage, Module, ModuleResult, default_libcall_names};
use cranelift_object::ObjectBuilder;
use hashbrown::HashMap;
use jitfold::store::{CodeStore, DirectoryStore, PackStore};
use jitfold::{DedupModule, DedupOptions, similar::SimilarOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The ids of a module, by the names the corpus uses.
#[derive(Default)]
struct Names {
    functions: HashMap<UserFuncName, FuncId>,
    imported: HashMap<String, FuncId>,
    data: HashMap<String, DataId>,
}

impl Names {
    /// The module name `name` (a user name of the corpus, in `func`)
    /// stands for: a function of the corpus, or an import declared now
    /// (with `import_sig` for a function).
    fn resolve<M: Module>(
        &mut self,
        m: &mut M,
        name: &UserExternalName,
        import_sig: Option<&cranelift_codegen::ir::Signature>,
    ) -> ModuleResult<UserExternalName> {
        if let Some(&id) = self.functions.get(&UserFuncName::User(name.clone())) {
            return Ok(UserExternalName::new(0, id.as_u32()));
        }
        let label = format!("import_{}_{}", name.namespace, name.index);
        Ok(match import_sig {
            Some(sig) => {
                let label = format!("{label}_{}", sig.call_conv);
                let id = match self.imported.get(&label) {
                    Some(&id) => id,
                    None => {
                        let id = m.declare_function(&label, Linkage::Import, sig)?;
                        self.imported.insert(label, id);
                        id
                    }
                };
                UserExternalName::new(0, id.as_u32())
            }
            None => {
                let id = match self.data.get(&label) {
                    Some(&id) => id,
                    None => {
                        let id = m.declare_data(&label, Linkage::Import, false, false)?;
                        self.data.insert(label, id);
                        id
                    }
                };
                UserExternalName::new(1, id.as_u32())
            }
        })
    }

    /// `func` with every user name it refers to resolved.
    fn rename<M: Module>(&mut self, m: &mut M, mut func: Function) -> ModuleResult<Function> {
        // Each name entry is renamed in place, so that the function names
        // nothing but what it references (a name appended beside the old
        // one would leave the old one naming whichever id has its index).
        let mut renamed: HashMap<UserExternalNameRef, UserExternalName> = HashMap::new();
        let mut rename = |func: &mut Function, u: UserExternalNameRef, to: UserExternalName| {
            match renamed.get(&u) {
                None => {
                    renamed.insert(u, to.clone());
                    func.params.reset_user_func_name(u, to);
                    u
                }
                Some(prev) if *prev == to => u,
                // One name used as a function and as data, each imported
                // under its own id.
                Some(_) => func.declare_imported_user_function(to),
            }
        };
        let refs: Vec<_> = func.dfg.ext_funcs.keys().collect();
        for r in refs {
            let ExternalName::User(u) = func.dfg.ext_funcs[r].name else {
                continue;
            };
            let name = func.params.user_named_funcs()[u].clone();
            let sig = func.dfg.signatures[func.dfg.ext_funcs[r].signature].clone();
            let to = self.resolve(m, &name, Some(&sig))?;
            let to = rename(&mut func, u, to);
            func.dfg.ext_funcs[r].name = ExternalName::User(to);
        }
        let gvs: Vec<_> = func.global_values.keys().collect();
        for gv in gvs {
            let GlobalValueData::Symbol {
                name: ExternalName::User(u),
                ..
            } = func.global_values[gv]
            else {
                continue;
            };
            let name = func.params.user_named_funcs()[u].clone();
            let to = self.resolve(m, &name, None)?;
            let to = rename(&mut func, u, to);
            if let GlobalValueData::Symbol { name, .. } = &mut func.global_values[gv] {
                *name = ExternalName::User(to);
            }
        }
        Ok(func)
    }
}

/// How to run: the command line.
struct Args {
    /// The corpus folder.
    dir: PathBuf,
    /// `--jit`: a `DedupModule<JITModule>`, finalized, instead of an
    /// object file.
    jit: bool,
    /// `--store DIR`: warm starts from a `DirectoryStore` in `DIR`.
    store: Option<PathBuf>,
    /// `--repeat N`: runs of each mode on the store.
    repeat: usize,
    /// `--pack`: a `PackStore` instead.
    pack: bool,
    /// `--no-verifier`: Cranelift's verifier off, as wasmtime ships.
    verifier: bool,
}

impl Args {
    fn parse() -> Option<Args> {
        let mut args = std::env::args().skip(1);
        let mut parsed = Args {
            dir: PathBuf::new(),
            jit: false,
            store: None,
            repeat: 2,
            pack: false,
            verifier: true,
        };
        let mut dir = None;
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--jit" => parsed.jit = true,
                "--no-verifier" => parsed.verifier = false,
                "--pack" => parsed.pack = true,
                "--store" => parsed.store = Some(args.next()?.into()),
                "--repeat" => parsed.repeat = args.next()?.parse().ok()?,
                _ if !arg.starts_with("--") && dir.is_none() => dir = Some(arg.into()),
                _ => return None,
            }
        }
        parsed.dir = dir?;
        Some(parsed)
    }

    /// The ISA every module compiles for.
    fn isa(&self) -> Result<OwnedTargetIsa, String> {
        let verifier = if self.verifier { "true" } else { "false" };
        jitfold::isa::flags(&[
            ("opt_level", "speed"),
            ("preserve_frame_pointers", "true"),
            ("enable_verifier", verifier),
        ])
        .and_then(jitfold::isa::host_isa)
        .map_err(|e| e.to_string())
    }
}

/// What names outside the corpus resolve to in a JIT; never called.
extern "C" fn unresolved() {}

/// Defines `funcs` in a new module with `options` (and `store`), flushes
/// (a JIT also finalizes), prints the statistics and returns them.
fn load(
    args: &Args,
    funcs: &[Function],
    options: DedupOptions,
    store: Option<Arc<dyn CodeStore>>,
) -> Result<jitfold::Stats, String> {
    let isa = args.isa()?;
    if args.jit {
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        builder.symbol_lookup_fn(Box::new(|_| Some(unresolved as *const u8)));
        let mut m = DedupModule::with_options(builder, options);
        if let Some(store) = store {
            m = m.with_store(store, None);
        }
        let stats = define_all(&mut m, funcs, options, |m| m.finalize_definitions());
        // SAFETY: nothing of this module's code runs or is pointed to.
        unsafe { m.into_inner().free_memory() };
        stats
    } else {
        let builder = ObjectBuilder::new(isa, "corpus", default_libcall_names())
            .map_err(|e| e.to_string())?;
        let mut m = DedupModule::with_options(builder, options);
        if let Some(store) = store {
            m = m.with_store(store, None);
        }
        define_all(&mut m, funcs, options, |m| m.flush())
    }
}

/// Declares and defines `funcs` in `m`, then `finish`es it, timed.
fn define_all<M: Module>(
    m: &mut DedupModule<M>,
    funcs: &[Function],
    options: DedupOptions,
    finish: impl FnOnce(&mut DedupModule<M>) -> ModuleResult<()>,
) -> Result<jitfold::Stats, String> {
    let mut names = Names::default();
    let renamed = (|| -> ModuleResult<Vec<(FuncId, Function)>> {
        for (i, f) in funcs.iter().enumerate() {
            let id = m.declare_function(&format!("f{i}"), Linkage::Local, &f.signature)?;
            names.functions.insert(f.name.clone(), id);
        }
        funcs
            .iter()
            .map(|f| {
                let id = names.functions[&f.name];
                let mut func = names.rename(m, f.clone())?;
                func.name = UserFuncName::user(0, id.as_u32());
                Ok((id, func))
            })
            .collect()
    })()
    .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut failed = 0;
    let mut ctx = m.make_context();
    for (id, func) in renamed {
        ctx.clear();
        ctx.func = func;
        if m.define_function(id, &mut ctx).is_err() {
            failed += 1;
        }
    }
    if finish(m).is_err() {
        failed += m.take_failed_definitions().len();
    }
    let elapsed = start.elapsed();
    // Entries are written behind the flush; counted once all are.
    m.wait_for_store_writes();
    println!(
        "== {options}: {} functions in {:.3} s, {failed} failed\n{}\n",
        funcs.len(),
        elapsed.as_secs_f64(),
        m.stats()
    );
    Ok(m.stats().clone())
}

/// Each mode `args.repeat` times on a `DirectoryStore` (or `PackStore`)
/// in `store` (one folder per mode; the first run fills an empty one): one
/// line a run.
fn warm_starts(args: &Args, store: &Path, funcs: &[Function]) -> Result<(), String> {
    for (label, mode) in [
        ("eager", DedupOptions::eager()),
        ("batch", DedupOptions::batch()),
    ] {
        let dir = store.join(label);
        for run in 0..args.repeat {
            let store: Arc<dyn CodeStore> = if args.pack {
                Arc::new(PackStore::new(&dir).map_err(|e| e.to_string())?)
            } else {
                Arc::new(DirectoryStore::new(&dir).map_err(|e| e.to_string())?)
            };
            let start = Instant::now();
            let stats = load(args, funcs, mode, Some(store))?;
            println!(
                "{label} run {run}: {:.3} s with printing; {} loaded, {} compiled, {} written",
                start.elapsed().as_secs_f64(),
                stats.loaded,
                stats.compiled,
                stats.store_writes
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(args) = Args::parse() else {
        eprintln!(
            "usage: load_corpus DIR [--jit] [--no-verifier] [--store STORE_DIR [--pack] [--repeat N]]"
        );
        return ExitCode::from(2);
    };
    let funcs = match args.isa().and_then(|isa| {
        jitfold::corpus::valid_functions(std::slice::from_ref(&args.dir), Some(&*isa))
            .map_err(|e| e.to_string())
    }) {
        Ok(funcs) => funcs,
        Err(e) => {
            eprintln!("load_corpus: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(store) = &args.store {
        return match warm_starts(&args, store, &funcs) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("load_corpus: {e}");
                ExitCode::from(1)
            }
        };
    }
    let similar = SimilarOptions::default();
    let mut summary = Vec::new();
    for mode in [DedupOptions::eager(), DedupOptions::batch()] {
        let mut code_bytes = [0; 2];
        for (i, options) in [mode, mode.with_similar(similar)].into_iter().enumerate() {
            match load(&args, &funcs, options, None) {
                Ok(stats) => {
                    code_bytes[i] = stats.code_bytes;
                    if i == 1 {
                        summary.push(format!(
                            "{mode}: thunks {} ({} bodies); code {} bytes with similar merging, {} without ({:+.2}%)",
                            stats.similar_merged,
                            stats.similar_groups,
                            code_bytes[1],
                            code_bytes[0],
                            (code_bytes[1] as f64 / code_bytes[0].max(1) as f64 - 1.0) * 100.0
                        ));
                    }
                }
                Err(e) => {
                    eprintln!("load_corpus: {options}: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    }
    for line in summary {
        println!("{line}");
    }
    ExitCode::SUCCESS
}
