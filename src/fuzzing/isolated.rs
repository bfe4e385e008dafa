//! Calls that may trap, run in child processes, so that a trap ends a child
//! and not the fuzzer or the test.
//!
//! # What this module guarantees
//!
//! - [`run`] makes the calls in order and returns, for each, `Some(bits)`
//!   when it returned and `None` when it trapped (its child ended with
//!   `SIGILL` or `SIGFPE`, the signals Cranelift's traps raise on the hosts
//!   jitfold supports). The call after a trap runs in a new child.
//! - Any other end of a child is an `Err` that says what happened: another
//!   signal (a memory fault, which generated code never causes), no end
//!   within [`TIMEOUT_S`] seconds (an endless loop), or a lost result.
//! - A child only calls the given functions, writes each result to a pipe
//!   and exits: it allocates nothing and takes no lock, which is what may be
//!   done after `fork` in a process with other threads. It restores the
//!   default action of the signals a trap or the timeout raises, so a
//!   fuzzer's or sanitizer's handlers never see its end.

use std::io::Read;
use std::os::fd::FromRawFd;

/// A generated function as the host calls it.
pub type Entry = extern "C" fn(i64, i64) -> i64;

/// Seconds a child may run before it is taken to loop forever.
pub const TIMEOUT_S: u32 = 20;

/// Makes every call (see the module docs).
pub fn run(calls: &[(Entry, i64, i64)]) -> Result<Vec<Option<i64>>, String> {
    let mut out = Vec::with_capacity(calls.len());
    while out.len() < calls.len() {
        let start = out.len();
        let (returned, end) = run_from(&calls[start..])?;
        out.extend(returned.into_iter().map(Some));
        match end {
            ChildEnd::Exited if out.len() == calls.len() => {}
            ChildEnd::Trapped if out.len() < calls.len() => out.push(None),
            end => {
                let what = match end {
                    ChildEnd::Other(what) => what,
                    ChildEnd::Exited => "exit before its last call".to_string(),
                    ChildEnd::Trapped => "a trap after its last call".to_string(),
                };
                return Err(format!(
                    "call {} of {} ended its child process: {what}",
                    out.len(),
                    calls.len()
                ));
            }
        }
    }
    Ok(out)
}

/// How a child process ended.
enum ChildEnd {
    /// It made every call.
    Exited,
    /// A call trapped.
    Trapped,
    /// Anything else, described.
    Other(String),
}

/// Runs `calls` in one child until the first trap; returns the results of
/// the calls that returned and how the child ended.
fn run_from(calls: &[(Entry, i64, i64)]) -> Result<(Vec<i64>, ChildEnd), String> {
    let mut fds = [0; 2];
    // SAFETY: `pipe` writes two descriptors into the array it is given.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let [read_end, write_end] = fds;
    // SAFETY: the child runs only `child`, which is safe after `fork` (see
    // there); the parent only reads the pipe and waits for the child.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let error = std::io::Error::last_os_error();
        // SAFETY: both ends are ours, open, and used by no one else.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return Err(format!("fork: {error}"));
    }
    if pid == 0 {
        child(calls, read_end, write_end);
    }
    // SAFETY: the write end is ours and open; the read end is ours and
    // owned by the `File` from here on.
    let mut results = unsafe {
        libc::close(write_end);
        std::fs::File::from_raw_fd(read_end)
    };
    let mut bytes = Vec::new();
    let read = results.read_to_end(&mut bytes);
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid place for its status.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    read.map_err(|e| format!("reading results: {e}"))?;
    let end = if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        ChildEnd::Exited
    } else if libc::WIFSIGNALED(status)
        && matches!(libc::WTERMSIG(status), libc::SIGILL | libc::SIGFPE)
    {
        ChildEnd::Trapped
    } else if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGALRM {
        ChildEnd::Other(format!("no end within {TIMEOUT_S} s"))
    } else if libc::WIFSIGNALED(status) {
        ChildEnd::Other(format!("signal {}", libc::WTERMSIG(status)))
    } else {
        ChildEnd::Other(format!("exit status {}", libc::WEXITSTATUS(status)))
    };
    let returned = bytes
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    Ok((returned, end))
}

/// The child's work: make the calls, write each result, exit.
fn child(calls: &[(Entry, i64, i64)], read_end: i32, write_end: i32) -> ! {
    // SAFETY: only async-signal-safe functions (`close`, `signal`, `alarm`,
    // `write`, `_exit`) and the generated code, which allocates nothing and
    // takes no lock, run here; the slice was made before `fork` and is
    // still mapped in the child.
    unsafe {
        libc::close(read_end);
        for signal in [
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGTRAP,
            libc::SIGALRM,
        ] {
            libc::signal(signal, libc::SIG_DFL);
        }
        libc::alarm(TIMEOUT_S);
        for &(entry, a, b) in calls {
            let bits = entry(a, b).to_ne_bytes();
            if libc::write(write_end, bits.as_ptr().cast(), bits.len()) != bits.len() as isize {
                libc::_exit(2);
            }
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn add(a: i64, b: i64) -> i64 {
        a.wrapping_add(b)
    }

    extern "C" fn trap_on_zero(a: i64, b: i64) -> i64 {
        if b == 0 {
            // SAFETY: raising a signal is what this test function is for.
            unsafe { libc::raise(libc::SIGILL) };
        }
        a / b.max(1)
    }

    extern "C" fn segfault(_: i64, _: i64) -> i64 {
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGSEGV) };
        0
    }

    #[test]
    fn traps_become_none_and_later_calls_still_run() {
        let calls: Vec<(Entry, i64, i64)> = vec![
            (add, 1, 2),
            (trap_on_zero, 7, 0),
            (trap_on_zero, 8, 2),
            (trap_on_zero, 1, 0),
            (add, -1, 1),
        ];
        assert_eq!(
            run(&calls).unwrap(),
            [Some(3), None, Some(4), None, Some(0)]
        );
    }

    #[test]
    fn a_memory_fault_is_an_error_not_a_trap() {
        let calls: Vec<(Entry, i64, i64)> = vec![(add, 1, 2), (segfault, 0, 0)];
        let error = run(&calls).unwrap_err();
        assert!(error.contains("call 1 of 2"), "{error}");
        assert!(
            error.contains(&format!("signal {}", libc::SIGSEGV)),
            "{error}"
        );
    }
}
