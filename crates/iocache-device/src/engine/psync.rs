//! The baseline engine, which works everywhere and on
//! every device: plain `pread`/`pwrite` through the devices' own methods,
//! either on the calling thread or spread over a small pool of worker
//! threads so the several I/Os of one request overlap.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::{IoEngine, IoRequest};
use crate::error::DeviceError;

/// A countdown the submitter waits on; shared by `Arc` so a worker's last
/// touch never outlives it.
struct Latch {
    remaining: Mutex<usize>,
    cv: Condvar,
}

impl Latch {
    fn count_down(&self) {
        let mut r = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        *r -= 1;
        if *r == 0 {
            self.cv.notify_all();
        }
    }

    fn wait(&self) {
        let mut r = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        while *r > 0 {
            r = self.cv.wait(r).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// One request handed to a worker.
struct Job {
    req: *mut IoRequest<'static>,
    latch: Arc<Latch>,
}

// SAFETY: the request's buffers and device reference are `Send`/`Sync`
// (`BlockDevice: Sync`); the pointer stays valid because `submit` does not
// return (nor touch the request) before the job's latch reaches zero.
unsafe impl Send for Job {}

impl Job {
    fn run(self) {
        // SAFETY: see `unsafe impl Send for Job`; only this job touches the request.
        let req = unsafe { &mut *self.req };
        if catch_unwind(AssertUnwindSafe(|| req.run_sync())).is_err() {
            req.result = Some(Err(DeviceError::Engine {
                what: "psync worker panicked",
                source: std::io::Error::other("panic while running a request"),
            }));
        }
        self.latch.count_down();
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl Shared {
    fn pop_nowait(&self) -> Option<Job> {
        self.queue.lock().unwrap().jobs.pop_front()
    }
}

/// `pread`/`pwrite` engine. With zero workers every batch runs on the
/// calling thread; with workers, a batch of more than one request is spread
/// over them and the calling thread, which also helps with queued jobs.
pub struct PsyncEngine {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    name: String,
}

impl PsyncEngine {
    /// Runs every batch on the calling thread.
    pub fn inline() -> Self {
        Self::with_workers(0)
    }

    /// Spreads batches over `workers` threads (0: inline).
    pub fn with_workers(workers: usize) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            cv: Condvar::new(),
        });
        let handles = (0..workers)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("psync-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawn psync worker")
            })
            .collect();
        PsyncEngine {
            shared,
            workers: handles,
            name: if workers == 0 {
                "psync".to_string()
            } else {
                format!("psync-pool{workers}")
            },
        }
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queue.lock().unwrap();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.shutdown {
                    return;
                }
                q = shared.cv.wait(q).unwrap();
            }
        };
        job.run();
    }
}

impl IoEngine for PsyncEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit(&self, ops: &mut [IoRequest<'_>]) -> Result<(), DeviceError> {
        if self.workers.is_empty() || ops.len() <= 1 {
            for op in ops.iter_mut() {
                op.run_sync();
            }
            return Ok(());
        }
        let (first, rest) = ops.split_first_mut().expect("non-empty");
        let latch = Arc::new(Latch {
            remaining: Mutex::new(rest.len()),
            cv: Condvar::new(),
        });
        {
            let mut q = self.shared.queue.lock().unwrap();
            for op in rest.iter_mut() {
                let req = (op as *mut IoRequest<'_>).cast::<IoRequest<'static>>();
                q.jobs.push_back(Job {
                    req,
                    latch: Arc::clone(&latch),
                });
            }
        }
        self.shared.cv.notify_all();
        first.run_sync();
        while let Some(job) = self.shared.pop_nowait() {
            job.run();
        }
        latch.wait();
        Ok(())
    }
}

impl Drop for PsyncEngine {
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap().shutdown = true;
        self.shared.cv.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
