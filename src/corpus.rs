//! Reading `.clif` files: finding them, parsing them with `cranelift-reader`,
//! and sorting each function into valid or invalid with the verifier.
//!
//! # What this module guarantees
//!
//! - Every `.clif` file under the given paths is visited exactly once, in
//!   sorted path order, so results are deterministic.
//! - Every file ends in exactly one [`FileOutcome`]: parsed, a parse error
//!   (with the parser's message and line), an ISA Cranelift cannot build, or a
//!   read error. Nothing is dropped silently, and no input panics the caller:
//!   a panic inside Cranelift's parser or verifier is caught and reported as a
//!   [`FileOutcome::ParseError`] of that file.
//! - A missing path, or paths that contain no `.clif` file, are a
//!   [`CorpusError`], not an empty result.
//! - [`bind_names`] makes a parsed function definable in a
//!   `cranelift_module::Module`: every function name it uses that belongs
//!   to its file is replaced by the module id given for it, or it is an
//!   [`UnboundName`] error; nothing is left pointing at a test-case name.

use cranelift_codegen::ir::{
    ExternalName, Function, GlobalValueData, UserExternalName, UserFuncName,
};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::FlagsOrIsa;
use cranelift_module::FuncId;
use cranelift_reader::{IsaSpec, ParseOptions, parse_test};
use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// Why a set of paths could not be turned into a corpus.
#[derive(Debug)]
pub enum CorpusError {
    /// A path given by the user does not exist.
    Missing(PathBuf),
    /// A directory could not be listed.
    Io(PathBuf, std::io::Error),
    /// No path was given, or no `.clif` file was found under the paths.
    NoClifFiles(Vec<PathBuf>),
}

impl fmt::Display for CorpusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorpusError::Missing(p) => write!(f, "{}: no such file or directory", p.display()),
            CorpusError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            CorpusError::NoClifFiles(paths) if paths.is_empty() => {
                write!(f, "no input: give at least one .clif file or directory")
            }
            CorpusError::NoClifFiles(paths) => {
                write!(f, "no .clif files found under")?;
                for p in paths {
                    write!(f, " {}", p.display())?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CorpusError {}

/// Lists the `.clif` files under `paths` (files as given, directories
/// recursively), sorted and without repeats.
pub fn clif_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|_| CorpusError::Missing(path.clone()))?;
        if meta.is_dir() {
            walk_dir(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(CorpusError::NoClifFiles(paths.to_vec()));
    }
    Ok(files)
}

fn walk_dir(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), CorpusError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CorpusError::Io(dir.to_path_buf(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CorpusError::Io(dir.to_path_buf(), e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| CorpusError::Io(path.clone(), e))?;
        if kind.is_dir() {
            walk_dir(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "clif") {
            files.push(path);
        }
    }
    Ok(())
}

/// A function read from a file, with the verifier's verdict.
pub struct ParsedFunction {
    /// The function as parsed.
    pub func: Function,
    /// `None` if the verifier accepted it, else the verifier's message.
    pub verifier_error: Option<String>,
}

/// What became of one file.
pub enum FileOutcome {
    /// The file parsed; its functions in file order.
    Parsed {
        /// The ISAs named by the file's `target` lines (empty if none).
        isas: Vec<OwnedTargetIsa>,
        /// The functions of the file.
        functions: Vec<ParsedFunction>,
    },
    /// The parser rejected the file.
    ParseError(String),
    /// The file names a target ISA that Cranelift 0.135.8 cannot build.
    UnsupportedIsa(String),
    /// The file could not be read.
    ReadError(String),
}

/// Reads, parses and verifies one file. Functions of a file without a
/// `target` line are verified against `default_isa` when given (instructions
/// such as `get_frame_pointer` need an ISA), else against flags alone.
pub fn load_file(path: &Path, default_isa: Option<&dyn TargetIsa>) -> FileOutcome {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return FileOutcome::ReadError(e.to_string()),
    };
    match catch_unwind(AssertUnwindSafe(|| parse_text(&text, default_isa))) {
        Ok(outcome) => outcome,
        Err(panic) => FileOutcome::ParseError(format!(
            "cranelift panicked on this file: {}",
            crate::compile::panic_message(&panic)
        )),
    }
}

/// Parses and verifies CLIF text (the body of [`load_file`]).
pub fn parse_text(text: &str, default_isa: Option<&dyn TargetIsa>) -> FileOutcome {
    let file = match parse_test(text, ParseOptions::default()) {
        Ok(file) => file,
        Err(e) if e.is_warning && e.message.starts_with("unsupported target") => {
            return FileOutcome::UnsupportedIsa(e.message);
        }
        Err(e) => {
            return FileOutcome::ParseError(format!(
                "line {}: {}",
                e.location.line_number, e.message
            ));
        }
    };
    let (isas, flags) = match file.isa_spec {
        IsaSpec::Some(isas) => (isas, None),
        IsaSpec::None(flags) => (Vec::new(), Some(flags)),
    };
    let fisa = match (&flags, isas.first(), default_isa) {
        (_, Some(isa), _) => FlagsOrIsa::from(&**isa),
        (Some(_), None, Some(isa)) => FlagsOrIsa::from(isa),
        (Some(flags), None, None) => FlagsOrIsa::from(flags),
        (None, None, _) => return FileOutcome::ParseError("target list is empty".to_string()),
    };
    let functions = file
        .functions
        .into_iter()
        .map(|(func, _)| {
            let verifier_error = cranelift_codegen::verify_function(&func, fisa)
                .err()
                .map(|e| e.to_string());
            ParsedFunction {
                func,
                verifier_error,
            }
        })
        .collect();
    FileOutcome::Parsed { isas, functions }
}

/// Every verifier-clean function under `paths`, in file order, skipping files
/// that do not parse. For benchmarks and tests that need a body of real CLIF.
pub fn valid_functions(
    paths: &[PathBuf],
    default_isa: Option<&dyn TargetIsa>,
) -> Result<Vec<Function>, CorpusError> {
    let mut out = Vec::new();
    for file in clif_files(paths)? {
        if let FileOutcome::Parsed { functions, .. } = load_file(&file, default_isa) {
            out.extend(
                functions
                    .into_iter()
                    .filter(|f| f.verifier_error.is_none())
                    .map(|f| f.func),
            );
        }
    }
    Ok(out)
}

/// A function names (calls, or takes the address of) a function its file
/// does not define.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnboundName {
    /// The function that uses the name.
    pub function: String,
    /// The name, as CLIF prints it (`%foo`, `u0:3`).
    pub name: String,
}

impl fmt::Display for UnboundName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} names {}, which the file does not define",
            self.function, self.name
        )
    }
}

impl std::error::Error for UnboundName {}

/// Points `func` and the functions it names at module ids, so that it can
/// be defined as `id` in a `cranelift_module::Module` (which names functions
/// `u0:<id>`): `func` itself becomes `u0:<id>`, and every callee and symbol
/// that names a function of `file` (by test-case name `%foo` or user name
/// `uN:M`, as the file's own functions are named) names that function's id.
/// Libcalls and known symbols are left as they are.
pub fn bind_names(
    func: &mut Function,
    id: FuncId,
    file: &HashMap<UserFuncName, FuncId>,
) -> Result<(), UnboundName> {
    let lookup = |func: &Function, name: &ExternalName| -> Result<Option<FuncId>, UnboundName> {
        let as_func_name = match name {
            ExternalName::TestCase(t) => UserFuncName::Testcase(t.clone()),
            ExternalName::User(r) => UserFuncName::User(func.params.user_named_funcs()[*r].clone()),
            ExternalName::LibCall(_) | ExternalName::KnownSymbol(_) => return Ok(None),
        };
        match file.get(&as_func_name) {
            Some(&id) => Ok(Some(id)),
            None => Err(UnboundName {
                function: func.name.to_string(),
                name: as_func_name.to_string(),
            }),
        }
    };
    let mut callees = Vec::new();
    for (r, data) in func.dfg.ext_funcs.iter() {
        if let Some(target) = lookup(func, &data.name)? {
            callees.push((r, target));
        }
    }
    let mut symbols = Vec::new();
    for (gv, data) in func.global_values.iter() {
        if let GlobalValueData::Symbol { name, .. } = data
            && let Some(target) = lookup(func, name)?
        {
            symbols.push((gv, target));
        }
    }
    let module_name = |func: &mut Function, target: FuncId| {
        ExternalName::User(
            func.declare_imported_user_function(UserExternalName::new(0, target.as_u32())),
        )
    };
    for (r, target) in callees {
        func.dfg.ext_funcs[r].name = module_name(func, target);
    }
    for (gv, target) in symbols {
        let name = module_name(func, target);
        if let GlobalValueData::Symbol { name: old, .. } = &mut func.global_values[gv] {
            *old = name;
        }
    }
    func.name = UserFuncName::user(0, id.as_u32());
    Ok(())
}
