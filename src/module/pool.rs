//! A batch flush's pool of threads: the flushing thread and `threads - 1`
//! scoped threads (with the 8 MiB stack of a main thread), each taking the
//! next job from an atomic counter and keeping scratch state of its own
//! from one job to the next. A flush runs its walks (`parallel.rs`), the
//! checks of the entries it fetched (`stored.rs`) and its compiles
//! (`parallel.rs`) here.
//!
//! # What this module guarantees
//!
//! 1. [`run`] runs each job at most once, on one thread, and hands back
//!    each result with the job's index; no lock is taken (the jobs are
//!    borrowed, each thread's results are its own until it ends).
//! 2. A thread that cannot be started leaves its share to the others. A
//!    thread that dies (a panic `work` does not catch) loses only its own
//!    results: the caller finds those jobs without a result, and does
//!    them itself. A panic on the flushing thread's share is the
//!    caller's; which thread does a job is not decided, so every `work`
//!    of a flush catches its own panics (a walk, an entry's checks and a
//!    compile each make a panic that job's result).
//! 3. With one thread, or one job, nothing is started: the flushing
//!    thread does every job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The stack of each thread started for a flush: a main thread's, so that
/// what runs on the flushing thread runs on any.
const STACK_BYTES: usize = 8 << 20;

/// What [`run`] did.
pub(super) struct Done<R> {
    /// Each job's result, with its index among the jobs, in no order.
    pub(super) results: Vec<(usize, R)>,
    /// How many jobs each thread did, the flushing thread's first.
    pub(super) per_thread: Vec<u64>,
    /// The wall time of the whole run.
    pub(super) wall_time: Duration,
}

/// Runs `work` on each of `jobs` on up to `threads` threads (see the
/// module docs), each with a `scratch` of its own, made when it starts.
pub(super) fn run<J, R, S>(
    threads: usize,
    jobs: &[J],
    scratch: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, &J) -> R + Sync,
) -> Done<R>
where
    J: Sync,
    R: Send,
{
    let threads = threads.clamp(1, jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let (next, scratch, work) = (&next, &scratch, &work);
        let share = move || {
            let mut state = scratch();
            let mut done = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(index) else {
                    return done;
                };
                done.push((index, work(&mut state, job)));
            }
        };
        let started: Vec<_> = (1..threads)
            .filter_map(|t| {
                std::thread::Builder::new()
                    .name(format!("jitfold-flush-{t}"))
                    .stack_size(STACK_BYTES)
                    .spawn_scoped(scope, share)
                    .ok()
            })
            .collect();
        let mut done = vec![share()];
        done.extend(started.into_iter().map(|t| t.join().unwrap_or_default()));
        done
    });
    Done {
        per_thread: done.iter().map(|d| d.len() as u64).collect(),
        results: done.into_iter().flatten().collect(),
        wall_time: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::run;

    #[test]
    fn every_job_runs_once_with_its_index() {
        for threads in [0, 1, 2, 5] {
            let jobs: Vec<u64> = (0..100).collect();
            let done = run(
                threads,
                &jobs,
                || 0u64,
                |seen, job| {
                    *seen += 1;
                    job * 3
                },
            );
            let mut results = done.results;
            results.sort();
            let expected: Vec<(usize, u64)> = (0..100).map(|i| (i, i as u64 * 3)).collect();
            assert_eq!(results, expected, "{threads} threads");
            assert_eq!(done.per_thread.iter().sum::<u64>(), 100);
            assert_eq!(done.per_thread.len(), threads.clamp(1, 100));
        }
    }

    #[test]
    fn a_thread_that_dies_loses_only_its_own_results() {
        let jobs: Vec<usize> = (0..64).collect();
        let flushing = std::thread::current().id();
        // Every thread but the flushing one panics on its first job.
        let done = run(
            4,
            &jobs,
            || (),
            |(), &job| {
                assert_eq!(
                    std::thread::current().id(),
                    flushing,
                    "a started thread dies"
                );
                job
            },
        );
        for (index, result) in &done.results {
            assert_eq!(index, result);
        }
        let lost = 64 - done.results.len();
        assert!(lost <= 3, "at most one job lost per thread that died");
        assert_eq!(done.per_thread[1..], [0, 0, 0]);
    }

    #[test]
    fn no_job_starts_no_thread() {
        let done = run(8, &[] as &[u8], || (), |(), _| ());
        assert!(done.results.is_empty());
        assert_eq!(done.per_thread, [0]);
    }
}
