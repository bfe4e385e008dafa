//! Reading `test run` files into a [`Suite`]: the files' functions, their
//! run lines, and the host configuration each file runs under.
//!
//! # What this module guarantees
//!
//! - Every `.clif` file under the paths whose text has a `test run` line is
//!   counted exactly once: as unparsable (with its run lines counted from
//!   the text), as for other architectures only, or as one [`Unit`] per
//!   `target` line the host can run (one unit, on the host, when it names
//!   no target), as Cranelift's own runner does.
//! - A unit's ISA is the host's triple with the file's shared flags and the
//!   target line's ISA flags, like Cranelift's runner builds it. A target
//!   asking for an ISA flag the host CPU lacks, a file enabling the pinned
//!   register (which Cranelift's runner refuses) and flags a JIT cannot use
//!   (`is_pic`) make the unit skipped with that reason, never dropped.
//! - Units with equal flags and ISA flags share one configuration
//!   ([`Unit::config`]), so a runner can compile them into one module.
//! - Each comment of a function that is a run or print command becomes one
//!   [`RunLine`], in file order; one that does not parse (or that the
//!   parser panics on) keeps the parser's message. A line that names
//!   another function than the one it follows (`; run: %g(1) == 2` under
//!   `%f`) is skipped ([`SkipReason::RunLineNamesOther`]): Cranelift's
//!   runner would call `%f`, the text says `%g`, and the arguments were
//!   read by `%f`'s signature, so neither call is sure to be the one meant.
//! - Paths named `*.clif` that are not regular files are listed in
//!   [`Suite::skipped_files`], never opened; a file reached by two paths is
//!   read once; a file with an entity number above
//!   [`crate::corpus::MAX_ENTITY_NUMBER`] is unparsed, not read by the
//!   parser.

use crate::corpus::{CorpusError, check_entity_numbers, find_clif_files, quiet_catch};
use crate::fingerprint::CRANELIFT_VERSION;
use cranelift_codegen::ir::{Function, UserFuncName};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_reader::{IsaSpec, ParseOptions, RunCommand, parse_run_command, parse_test};
use std::fmt;
use std::path::{Path, PathBuf};

/// Why run lines were not run. Ordered for stable reports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// The file does not parse with this cranelift-reader (mostly CLIF
    /// syntax newer than it).
    FileDoesNotParse,
    /// The target asks for an ISA flag (named) that the host CPU lacks.
    HostLacks(String),
    /// The file enables `enable_pinned_reg`; Cranelift's runner refuses
    /// such files too.
    PinnedRegister,
    /// The file's flags cannot be used by a JIT (named).
    NotJittable(String),
    /// The run line does not parse with this cranelift-reader.
    RunLineDoesNotParse,
    /// The run line names another function than the one it follows.
    RunLineNamesOther,
    /// A `; print:` line: it states no expected result to check.
    PrintOnly,
    /// A function of the file calls a function (named) that Cranelift's own
    /// runner provides to its tests and jitfold's runner does not (such as
    /// `%__cranelift_throw`, which throws an exception).
    NeedsRunnerFunction(String),
    /// A function of the file does not compile under plain Cranelift
    /// on this host (verifier error, unsupported feature, a call to
    /// a function the file does not define, or a Cranelift panic).
    DoesNotCompile,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::FileDoesNotParse => {
                write!(
                    f,
                    "file does not parse with cranelift-reader {CRANELIFT_VERSION}"
                )
            }
            SkipReason::HostLacks(flag) => write!(f, "host CPU lacks ISA flag {flag}"),
            SkipReason::PinnedRegister => write!(f, "file enables the pinned register"),
            SkipReason::NotJittable(what) => write!(f, "flags a JIT cannot use: {what}"),
            SkipReason::RunLineDoesNotParse => {
                write!(
                    f,
                    "run line does not parse with cranelift-reader {CRANELIFT_VERSION}"
                )
            }
            SkipReason::RunLineNamesOther => {
                write!(f, "run line names another function than the one it follows")
            }
            SkipReason::PrintOnly => write!(f, "print line (no expected result)"),
            SkipReason::NeedsRunnerFunction(name) => {
                write!(f, "calls {name}, a host function of Cranelift's runner")
            }
            SkipReason::DoesNotCompile => {
                write!(
                    f,
                    "file does not compile with plain Cranelift {CRANELIFT_VERSION}"
                )
            }
        }
    }
}

/// A `test run` file that did not parse.
pub struct UnparsedFile {
    /// The file.
    pub path: PathBuf,
    /// The parser's message (or a read error).
    pub message: String,
    /// Its run and print lines, counted from the text.
    pub run_lines: usize,
}

/// One run or print comment of a function.
pub struct RunLine {
    /// Index in [`Unit::functions`] of the function the comment follows,
    /// which the command calls.
    pub function: usize,
    /// The comment as written.
    pub text: String,
    /// The parsed command, or why it cannot be run.
    pub command: Result<RunCommand, LineError>,
}

/// Why a run line cannot be run.
#[derive(Clone, Debug)]
pub struct LineError {
    /// Why, as counted.
    pub reason: SkipReason,
    /// What the parser or the check said.
    pub message: String,
}

/// One file under one of its targets.
pub struct Unit {
    /// The file.
    pub file: PathBuf,
    /// The target as the file names it (`x86_64 has_avx`), or `host`.
    pub target: String,
    /// Index of the configuration in [`Suite::configs`] (`None` when
    /// Cranelift cannot build that ISA, and the unit is skipped).
    pub config: Option<usize>,
    /// The file's functions, in file order, as parsed.
    pub functions: Vec<Function>,
    /// Their run lines, in file order.
    pub lines: Vec<RunLine>,
    /// Why the whole unit is not run, if it is not.
    pub skip: Option<SkipReason>,
}

/// An ISA for the host built from a file's flags and target line.
pub struct Config {
    /// The flags and ISA flags, as text; equal keys mean equal ISAs.
    pub key: String,
    /// The ISA.
    pub isa: OwnedTargetIsa,
}

/// The `test run` files under some paths, ready to compile and run.
pub struct Suite {
    /// `.clif` files read.
    pub files_read: usize,
    /// Of which `test run` files.
    pub run_files: usize,
    /// `test run` files whose targets are all for other architectures.
    pub other_arch_files: usize,
    /// `test run` files that did not parse.
    pub unparsed: Vec<UnparsedFile>,
    /// Paths named `*.clif` that are not regular files, not read (see
    /// [`crate::corpus::ClifFiles::skipped`]).
    pub skipped_files: Vec<(PathBuf, String)>,
    /// Each runnable (file, target), in path order then target order.
    pub units: Vec<Unit>,
    /// The distinct ISAs of the units.
    pub configs: Vec<Config>,
}

/// Why a suite could not be loaded.
#[derive(Debug)]
pub enum SuiteError {
    /// The paths hold no `.clif` file, or one is missing.
    Corpus(CorpusError),
    /// Cranelift cannot build an ISA for this host.
    Host(String),
}

impl fmt::Display for SuiteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuiteError::Corpus(e) => write!(f, "{e}"),
            SuiteError::Host(e) => write!(f, "cannot build an ISA for this host: {e}"),
        }
    }
}

impl std::error::Error for SuiteError {}

impl Suite {
    /// Reads every `test run` file under `paths` (files, or directories
    /// searched recursively).
    pub fn load(paths: &[PathBuf]) -> Result<Suite, SuiteError> {
        let found = find_clif_files(paths).map_err(SuiteError::Corpus)?;
        let files = found.files;
        let host = cranelift_native::builder_with_options(true)
            .map_err(|e| SuiteError::Host(e.to_string()))?
            .finish(settings::Flags::new(settings::builder()))
            .map_err(|e| SuiteError::Host(e.to_string()))?;
        let mut suite = Suite {
            files_read: files.len(),
            run_files: 0,
            other_arch_files: 0,
            unparsed: Vec::new(),
            skipped_files: found.skipped,
            units: Vec::new(),
            configs: Vec::new(),
        };
        for path in files {
            suite.add_file(&path, &*host)?;
        }
        Ok(suite)
    }

    /// Run and print lines of all units (whether run or skipped).
    pub fn run_lines(&self) -> usize {
        self.units.iter().map(|u| u.lines.len()).sum()
    }

    fn add_file(&mut self, path: &Path, host: &dyn TargetIsa) -> Result<(), SuiteError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                // Unreadable: it may well be a run file; say so rather than
                // drop it.
                self.run_files += 1;
                self.unparsed.push(UnparsedFile {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                    run_lines: 0,
                });
                return Ok(());
            }
        };
        if !text.lines().any(|l| l.trim() == "test run") {
            return Ok(());
        }
        self.run_files += 1;
        let parsed = check_entity_numbers(&text).and_then(|()| {
            quiet_catch(|| {
                parse_test(&text, ParseOptions::default())
                    .map_err(|e| format!("line {}: {}", e.location.line_number, e.message))
            })
            .unwrap_or_else(|panic| Err(format!("cranelift-reader panicked: {panic}")))
        });
        let file = match parsed {
            Ok(file) => file,
            Err(message) => {
                self.unparsed.push(UnparsedFile {
                    path: path.to_path_buf(),
                    message,
                    run_lines: count_run_lines(&text),
                });
                return Ok(());
            }
        };
        let targets: Vec<(String, settings::Flags, Vec<settings::Value>)> = match &file.isa_spec {
            IsaSpec::None(flags) => vec![("host".to_string(), flags.clone(), host.isa_flags())],
            IsaSpec::Some(isas) => isas
                .iter()
                .filter(|isa| isa.triple().architecture == host.triple().architecture)
                .map(|isa| (target_name(&**isa), isa.flags().clone(), isa.isa_flags()))
                .collect(),
        };
        if targets.is_empty() {
            self.other_arch_files += 1;
            return Ok(());
        }
        for (target, flags, isa_flags) in targets {
            let mut skip = unit_skip(&flags, &isa_flags, host);
            let config = match self.config(&flags, &isa_flags) {
                Ok(config) => Some(config),
                Err(e) => {
                    skip = skip.or(Some(SkipReason::NotJittable(e)));
                    None
                }
            };
            let functions: Vec<Function> = file.functions.iter().map(|(f, _)| f.clone()).collect();
            let lines = file
                .functions
                .iter()
                .enumerate()
                .flat_map(|(i, (func, details))| {
                    details
                        .comments
                        .iter()
                        .filter_map(move |c| run_line(func, i, c.text))
                })
                .collect();
            self.units.push(Unit {
                file: path.to_path_buf(),
                target,
                config,
                functions,
                lines,
                skip,
            });
        }
        Ok(())
    }

    /// The index of the configuration for these flags, added if new.
    fn config(
        &mut self,
        flags: &settings::Flags,
        isa_flags: &[settings::Value],
    ) -> Result<usize, String> {
        let mut key = flags.to_string();
        for v in isa_flags {
            key.push_str(&format!("{v}\n"));
        }
        if let Some(i) = self.configs.iter().position(|c| c.key == key) {
            return Ok(i);
        }
        let mut builder = cranelift_native::builder_with_options(false).map_err(str::to_string)?;
        for v in isa_flags {
            builder
                .set(v.name, &v.value_string())
                .map_err(|e| format!("{v}: {e}"))?;
        }
        let isa = builder.finish(flags.clone()).map_err(|e| e.to_string())?;
        self.configs.push(Config { key, isa });
        Ok(self.configs.len() - 1)
    }
}

/// The run line of comment `text` of function `i`, `func`, if the comment
/// is a run or print command. A parser panic (cranelift-reader panics on
/// some malformed vector constants) is a parse error of the line.
fn run_line(func: &Function, i: usize, text: &str) -> Option<RunLine> {
    let parsed = quiet_catch(|| parse_run_command(text, &func.signature).map_err(|e| e.message))
        .unwrap_or_else(|panic| Err(format!("cranelift-reader panicked: {panic}")));
    let error = |reason, message| Err(LineError { reason, message });
    let command = match parsed {
        Ok(None) => return None,
        Err(message) => error(SkipReason::RunLineDoesNotParse, message),
        Ok(Some(command)) => {
            let invocation = match &command {
                RunCommand::Print(invocation) | RunCommand::Run(invocation, ..) => invocation,
            };
            let named = UserFuncName::testcase(&invocation.func);
            if named == func.name {
                Ok(command)
            } else {
                let message = format!("the line names {named} but follows {}", func.name);
                error(SkipReason::RunLineNamesOther, message)
            }
        }
    };
    Some(RunLine {
        function: i,
        text: text.trim().to_string(),
        command,
    })
}

/// Why a unit with these flags cannot run on `host`, if it cannot.
fn unit_skip(
    flags: &settings::Flags,
    isa_flags: &[settings::Value],
    host: &dyn TargetIsa,
) -> Option<SkipReason> {
    if flags.enable_pinned_reg() {
        return Some(SkipReason::PinnedRegister);
    }
    if flags.is_pic() {
        return Some(SkipReason::NotJittable("is_pic".to_string()));
    }
    let host_flags = host.isa_flags();
    for wanted in isa_flags {
        if wanted.as_bool() != Some(true) {
            continue;
        }
        let host_has = host_flags
            .iter()
            .any(|h| h.name == wanted.name && h.as_bool() == Some(true));
        if !host_has {
            return Some(SkipReason::HostLacks(wanted.name.to_string()));
        }
    }
    None
}

/// `x86_64` followed by the ISA flags the target line turns on.
fn target_name(isa: &dyn TargetIsa) -> String {
    let mut name = isa.triple().architecture.to_string();
    for v in isa.isa_flags() {
        if v.as_bool() == Some(true) {
            name.push(' ');
            name.push_str(v.name);
        }
    }
    name
}

/// Comments that are run or print commands, by their text alone (for files
/// that do not parse).
fn count_run_lines(text: &str) -> usize {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix(';'))
        .map(|c| c.trim_start_matches([' ', ';']))
        .filter(|c| {
            ["run", "print"].iter().any(|word| {
                c.strip_prefix(word)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with([':', ' ']))
            })
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::count_run_lines;

    #[test]
    fn run_lines_are_counted_from_text() {
        let text = "test run\n; run: %f(1) == 2\n  ;run\n; print: %g()\n; running is fun\n; runs\nv0 = iconst.i8 1 ; run: no\n";
        assert_eq!(count_run_lines(text), 3);
    }
}
