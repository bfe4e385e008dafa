//! Reading `.clif` files: finding them, parsing them with `cranelift-reader`,
//! and sorting each function into valid or invalid with the verifier.
//!
//! # What this module guarantees
//!
//! - Every `.clif` file under the given paths is visited exactly once, in
//!   sorted path order, so results are deterministic: two spellings of one
//!   file (a symlink, `..`) are one file ([`find_clif_files`]). A path that
//!   is not a regular file (a FIFO, socket or device) is listed as skipped
//!   and never opened, so it cannot block the reader.
//! - Every file ends in exactly one [`FileOutcome`]: parsed, a parse error
//!   (with the parser's message and line), an ISA Cranelift cannot build, or a
//!   read error. Nothing is dropped silently, and no input panics the caller:
//!   a panic inside Cranelift's parser or verifier is caught and reported as a
//!   [`FileOutcome::ParseError`] of that file, and prints nothing
//!   ([`quiet_catch`]). An entity number above [`MAX_ENTITY_NUMBER`] is a
//!   parse error found before the parser runs (it would allocate every
//!   entity up to it).
//! - A missing path, or paths that contain no `.clif` file, are a
//!   [`CorpusError`], not an empty result.
//! - [`bind_names`] makes a parsed function definable in a
//!   `cranelift_module::Module`: every function name it uses that belongs
//!   to its file is replaced by the module id given for it, or it is an
//!   [`UnboundName`] error; nothing is left pointing at a test-case name
//!   except the parser's unused gap placeholders, and no user name entry
//!   is left under its old name.
//! - [`qualify_test_case_names`] makes a function's test-case names its
//!   file's own, so that functions of several files can share one table.

use cranelift_codegen::entity::packed_option::ReservedValue;
use cranelift_codegen::ir::{
    ExternalName, Function, GlobalValueData, UserExternalName, UserExternalNameRef, UserFuncName,
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

/// The files [`find_clif_files`] found.
#[derive(Debug, Default)]
pub struct ClifFiles {
    /// Regular files to read, sorted by path as spelled, each file once.
    pub files: Vec<PathBuf>,
    /// Paths named `*.clif` (or given by the user) that are not regular
    /// files (FIFOs, sockets, devices, directories behind a symlink), which
    /// are not read, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Lists the `.clif` files under `paths` (files as given, directories
/// recursively), sorted and without repeats: two spellings of one file
/// (`a/x.clif` and `a/../a/x.clif`, or a symlink and its target) are one
/// file, listed under the spelling that sorts first. Paths that are not
/// regular files are listed in [`ClifFiles::skipped`] and never opened, so
/// that a FIFO cannot block the reader.
pub fn find_clif_files(paths: &[PathBuf]) -> Result<ClifFiles, CorpusError> {
    let mut found = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|_| CorpusError::Missing(path.clone()))?;
        if meta.is_dir() {
            walk_dir(path, &mut found)?;
        } else {
            found.push(path.clone());
        }
    }
    found.sort();
    found.dedup();
    let mut out = ClifFiles::default();
    let mut seen = std::collections::HashSet::new();
    for path in found {
        match std::fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => {
                out.skipped.push((path, not_regular(&meta.file_type())));
                continue;
            }
            // A dangling symlink: kept, so that reading it reports the error.
            Ok(_) | Err(_) => {}
        }
        let identity = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.insert(identity) {
            out.files.push(path);
        }
    }
    if out.files.is_empty() && out.skipped.is_empty() {
        return Err(CorpusError::NoClifFiles(paths.to_vec()));
    }
    Ok(out)
}

/// Why a file of this type is not read.
fn not_regular(kind: &std::fs::FileType) -> String {
    let mut what = if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            what = "a FIFO";
        } else if kind.is_socket() {
            what = "a socket";
        } else if kind.is_char_device() || kind.is_block_device() {
            what = "a device";
        }
    }
    format!("{what}, not a regular file: skipped")
}

/// The regular files of [`find_clif_files`], without the skipped ones.
pub fn clif_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    let found = find_clif_files(paths)?;
    if found.files.is_empty() {
        return Err(CorpusError::NoClifFiles(paths.to_vec()));
    }
    Ok(found.files)
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
        /// The file's `set` and `target` lines as Cranelift read them (every
        /// shared flag, and each target's triple and ISA flags): files
        /// with equal keys compile the same way, files with different keys
        /// may not.
        isa_key: String,
        /// The functions of the file.
        functions: Vec<ParsedFunction>,
    },
    /// The parser rejected the file.
    ParseError(String),
    /// The file names a target ISA that this Cranelift cannot build.
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
    match quiet_catch(|| parse_text(&text, default_isa)) {
        Ok(outcome) => outcome,
        Err(message) => {
            FileOutcome::ParseError(format!("cranelift panicked on this file: {message}"))
        }
    }
}

/// Runs `f`, turning a panic into its message, with the panic hook silenced
/// meanwhile (and restored after), so that a caught panic prints nothing.
pub fn quiet_catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    crate::compile::with_quiet_panics(|| {
        catch_unwind(AssertUnwindSafe(f)).map_err(|p| crate::compile::panic_message(&p))
    })
}

/// The largest entity number (`v`, `block`, `ss`, `gv`, `fn`, `sig`, ...)
/// a file may use. cranelift-reader allocates every entity up to the
/// largest number it reads (it fills gaps with placeholders), so a number
/// near `u32::MAX` would make it allocate tens of gigabytes and abort the
/// process; this bound is far above the numbers real CLIF uses (the largest
/// in the shared corpora is `v146416`).
pub const MAX_ENTITY_NUMBER: u32 = 1 << 22;

/// Entity prefixes whose numbers cranelift-reader allocates up to.
const ALLOCATED_ENTITIES: [&str; 10] = [
    "v", "block", "ss", "dss", "dt", "gv", "mt", "sig", "fn", "const",
];

/// Checks that `text` uses no entity number above [`MAX_ENTITY_NUMBER`]
/// outside comments and function names; the error names the first such
/// entity and its line.
pub fn check_entity_numbers(text: &str) -> Result<(), String> {
    for (n, line) in text.lines().enumerate() {
        let code = line.split(';').next().unwrap_or(line);
        // Words, without the `%names` of functions (`%block7` is a name).
        let words = code
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '%'))
            .filter(|w| !w.starts_with('%'));
        for word in words {
            let digits = word.trim_start_matches(|c: char| !c.is_ascii_digit());
            let prefix = &word[..word.len() - digits.len()];
            if digits.is_empty()
                || !digits.bytes().all(|b| b.is_ascii_digit())
                || !ALLOCATED_ENTITIES.contains(&prefix)
            {
                continue;
            }
            if digits
                .parse::<u32>()
                .map_or(true, |d| d > MAX_ENTITY_NUMBER)
            {
                return Err(format!(
                    "line {}: entity number {word} is above {MAX_ENTITY_NUMBER}, the most this tool reads",
                    n + 1
                ));
            }
        }
    }
    Ok(())
}

/// Parses and verifies CLIF text (the body of [`load_file`]).
pub fn parse_text(text: &str, default_isa: Option<&dyn TargetIsa>) -> FileOutcome {
    if let Err(message) = check_entity_numbers(text) {
        return FileOutcome::ParseError(message);
    }
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
    let isa_key = isa_key(&file.isa_spec);
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
    FileOutcome::Parsed {
        isas,
        isa_key,
        functions,
    }
}

/// The text of [`FileOutcome::Parsed::isa_key`].
fn isa_key(spec: &IsaSpec) -> String {
    match spec {
        IsaSpec::None(flags) => format!("no target\n{flags}"),
        IsaSpec::Some(isas) => {
            let mut key = String::new();
            for isa in isas {
                key.push_str(&format!("target {}\n{}", isa.triple(), isa.flags()));
                for v in isa.isa_flags() {
                    key.push_str(&format!("{v}\n"));
                }
            }
            key
        }
    }
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

/// Makes the test-case names (`%name`) of `func`, its own and those it
/// calls or takes the address of, names of file number `file` alone: `%g`
/// becomes the test-case name `<file>/g`, which no CLIF text can spell
/// (`/` is not a name character). Test-case names are local to their file,
/// as Cranelift's runner treats them, so that two files that each define
/// `%g` do not make callers of `%g` look alike. User names (`uN:M`), which
/// JITs give module-wide meaning, and the parser's gap placeholders are
/// left as they are.
pub fn qualify_test_case_names(func: &mut Function, file: usize) {
    let qualified = |name: &[u8]| {
        let mut bytes = format!("{file}/").into_bytes();
        bytes.extend_from_slice(name);
        bytes
    };
    let rename = |name: &mut ExternalName| {
        if let ExternalName::TestCase(t) = name
            && !t.raw().is_empty()
        {
            *name = ExternalName::testcase(qualified(t.raw()));
        }
    };
    for data in func.dfg.ext_funcs.values_mut() {
        rename(&mut data.name);
    }
    for data in func.global_values.values_mut() {
        match data {
            GlobalValueData::Symbol { name, .. } => rename(name),
            GlobalValueData::VMContext
            | GlobalValueData::Load { .. }
            | GlobalValueData::IAddImm { .. }
            | GlobalValueData::DynScaleTargetConst { .. } => {}
        }
    }
    if let UserFuncName::Testcase(t) = &func.name {
        func.name = UserFuncName::testcase(qualified(t.raw()));
    }
}

/// Whether `name` is the name cranelift-reader gives the placeholders it
/// fills numbering gaps with (`fn0` and `gv0` when a file declares only
/// `fn1` and `gv1`): the empty test-case name `%`. No instruction uses a
/// placeholder (the parser rejects references to undeclared entities).
fn is_gap_placeholder(name: &ExternalName) -> bool {
    matches!(name, ExternalName::TestCase(t) if t.raw().is_empty())
}

/// Points `func` and the functions it names at module ids, so that it can
/// be defined as `id` in a `cranelift_module::Module` (which names functions
/// `u0:<id>`): `func` itself becomes `u0:<id>`, and every callee and symbol
/// that names a function of `file` (by test-case name `%foo` or user name
/// `uN:M`, as the file's own functions are named) names that function's id.
/// Libcalls, known symbols and the parser's gap placeholders (which no
/// instruction uses) are left as they are. A user name's entry is renamed
/// in place, so that no entry is left behind under its old name (which, as
/// a module name, would name whichever id has its index: a function that
/// names a duplicate's id is rewritten by a batch flush, see
/// `module/roots.rs`).
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
        if is_gap_placeholder(&data.name) && data.signature.is_reserved_value() {
            continue;
        }
        if let Some(target) = lookup(func, &data.name)? {
            callees.push((r, target));
        }
    }
    let mut symbols = Vec::new();
    for (gv, data) in func.global_values.iter() {
        if let GlobalValueData::Symbol { name, .. } = data
            && !is_gap_placeholder(name)
            && let Some(target) = lookup(func, name)?
        {
            symbols.push((gv, target));
        }
    }
    // Each user name entry renamed once, to its target; a test-case name
    // (no entry) gets a new one.
    let mut renamed: HashMap<UserExternalNameRef, FuncId> = HashMap::new();
    let mut module_name = |func: &mut Function, old: &ExternalName, target: FuncId| {
        let to = UserExternalName::new(0, target.as_u32());
        ExternalName::User(match *old {
            ExternalName::User(r) if renamed.get(&r).is_none_or(|&t| t == target) => {
                renamed.insert(r, target);
                func.params.reset_user_func_name(r, to);
                r
            }
            _ => func.declare_imported_user_function(to),
        })
    };
    for (r, target) in callees {
        let old = func.dfg.ext_funcs[r].name.clone();
        func.dfg.ext_funcs[r].name = module_name(func, &old, target);
    }
    for (gv, target) in symbols {
        let GlobalValueData::Symbol { name: old, .. } = func.global_values[gv].clone() else {
            continue;
        };
        let name = module_name(func, &old, target);
        if let GlobalValueData::Symbol { name: old, .. } = &mut func.global_values[gv] {
            *old = name;
        }
    }
    func.name = UserFuncName::user(0, id.as_u32());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MAX_ENTITY_NUMBER, bind_names, check_entity_numbers};
    use cranelift_codegen::ir::{UserExternalName, UserFuncName};
    use cranelift_module::FuncId;
    use std::collections::HashMap;

    /// A user name is renamed in place: the function names its callee's
    /// and its symbol's ids and nothing else (an entry left under the old
    /// name would, as a module name, name whichever id has its index).
    #[test]
    fn bound_names_leave_no_entry_under_an_old_name() {
        let mut func = cranelift_reader::parse_functions(
            "function u0:9(i64) -> i64 {
                 gv0 = symbol colocated u0:7
                 sig0 = (i64) -> i64
                 fn0 = colocated u0:5 sig0
                 fn1 = colocated %g sig0
             block0(v0: i64):
                 v1 = call fn0(v0)
                 v2 = call fn1(v1)
                 v3 = symbol_value.i64 gv0
                 v4 = iadd v2, v3
                 return v4
             }",
        )
        .unwrap()
        .remove(0);
        let ids: HashMap<UserFuncName, FuncId> = [
            (UserFuncName::user(0, 9), FuncId::from_u32(0)),
            (UserFuncName::user(0, 5), FuncId::from_u32(1)),
            (UserFuncName::user(0, 7), FuncId::from_u32(2)),
            (UserFuncName::testcase("g"), FuncId::from_u32(3)),
        ]
        .into_iter()
        .collect();
        bind_names(&mut func, FuncId::from_u32(0), &ids).unwrap();
        let mut names: Vec<UserExternalName> =
            func.params.user_named_funcs().values().cloned().collect();
        names.sort_by_key(|n| n.index);
        let want: Vec<UserExternalName> = (1..=3).map(|i| UserExternalName::new(0, i)).collect();
        assert_eq!(names, want, "{func}");
    }

    #[test]
    fn entity_numbers_are_bounded_outside_comments() {
        let at = |word: String| check_entity_numbers(&format!("block0:\n  jump {word}\n"));
        assert!(at(format!("block{MAX_ENTITY_NUMBER}")).is_ok());
        let error = at(format!("block{}", MAX_ENTITY_NUMBER + 1)).unwrap_err();
        assert!(error.starts_with("line 2: entity number block"), "{error}");
        for word in ["v99999999999", "gv4294967295", "fn4294967290", "ss5000000"] {
            assert!(at(word.to_string()).is_err(), "{word}");
        }
        // Not entities: hex constants, other words, comments, user names.
        for text in [
            "v0 = iconst.i64 0x4294967290\n",
            "v0 = iconst.i64 4294967290\n",
            "fn0 = u0:4294967290 sig0\n",
            "; run: %f(v4294967290) == 1\n",
            "function %block4294967290() {\n",
        ] {
            assert!(check_entity_numbers(text).is_ok(), "{text}");
        }
    }
}
