//! Group commit for ingest: reports that arrive together are written together. Each request
//! queues its report and waits; a writer takes every report queued while the previous group was
//! being written and stores them in one transaction (SQLite) or one statement (PostgreSQL), then
//! answers each. A report is acknowledged only after the commit that holds it, and each keeps its
//! own outcome (stored, a repeat, a refusal) exactly as if it had been written alone.
//!
//! Nothing waits for a group to fill: under light load a group is one report; under load the
//! per-transaction and per-statement work is shared by many reports.

use std::future::Future;
use std::sync::Arc;

use gpuledger_proto::Report;
use prometheus::{IntCounter, Opts};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{AgentStatus, IngestOutcome, StoreError};

/// Reports queued beyond this wait for room: the HTTP handlers slow down, and what waits is
/// bounded (each waiting report is held decoded, as its request is).
const QUEUE_DEPTH: usize = 4096;
/// A group stops growing at this many reports or GPU windows, so one statement or transaction
/// stays bounded in size and time (the first report always goes, however large).
const MAX_GROUP_REPORTS: usize = 256;
const MAX_GROUP_WINDOWS: usize = 8192;

/// One report waiting to be written, with what it is written with.
pub(crate) struct Job {
    pub report: Report,
    pub token_id: i64,
    pub content_sha256: String,
    pub agent: AgentStatus,
    pub now_ms: i64,
}

impl Job {
    fn gpu_windows(&self) -> usize {
        self.report.windows.iter().map(|w| w.gpus.len()).sum()
    }
}

/// What a writer answers for a group: one outcome per report, in order, and how many of them it
/// wrote alone.
pub(crate) struct Written {
    pub outcomes: Vec<Result<IngestOutcome, StoreError>>,
    pub alone: usize,
}

type Reply = oneshot::Sender<Result<IngestOutcome, StoreError>>;

/// The queue in front of a store's ingest writers.
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<(Job, Reply)>,
    pub counters: GroupCounters,
}

/// How many groups this replica's writers wrote, and how many reports were in them: their ratio
/// is the mean group size, what group commit shares each transaction's work over. Exposed on
/// `/metrics`.
#[derive(Clone)]
pub struct GroupCounters {
    pub groups: IntCounter,
    pub reports: IntCounter,
    /// Reports of a group written on their own, on PostgreSQL: a repeat or a refusal (which the
    /// single report's path names), a report that shares a host, batch id or GPU with another of
    /// its group, and the reports of a part of a group that failed as a whole. Many of them mean
    /// group commit is not doing its work.
    pub alone: IntCounter,
}

impl GroupCounters {
    fn new() -> Self {
        let counter = |name: &str, help: &str| {
            IntCounter::with_opts(Opts::new(name, help).namespace("gpuledger"))
                .unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        GroupCounters {
            groups: counter(
                "ingest_groups_total",
                "Groups of reports written together (one transaction or statement each)",
            ),
            reports: counter(
                "ingest_grouped_reports_total",
                "Reports in those groups, stored or not",
            ),
            alone: counter(
                "ingest_reports_written_alone_total",
                "Reports of a group written on their own (PostgreSQL): repeats, refusals, reports \
                 sharing a host, batch id or GPU with another of their group, and parts of a \
                 group that could not be written together",
            ),
        }
    }
}

impl GroupCommit {
    /// Starts `writers` tasks that each take a group off the queue and hand it to `write`. The
    /// tasks end when the store (the sender) is dropped. The metric definitions are fixed; a bad
    /// one is a programming error.
    pub fn start<W, F>(writers: usize, write: W) -> GroupCommit
    where
        W: Fn(Vec<Job>) -> F + Send + Sync + 'static,
        F: Future<Output = Written> + Send + 'static,
    {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let receiver = Arc::new(Mutex::new(receiver));
        let write = Arc::new(write);
        let counters = GroupCounters::new();
        for _ in 0..writers.max(1) {
            let (receiver, write, counters) = (receiver.clone(), write.clone(), counters.clone());
            tokio::spawn(async move {
                while let Some((jobs, replies)) = next_group(&receiver).await {
                    counters.groups.inc();
                    counters.reports.inc_by(jobs.len() as u64);
                    // Its own task, so that a panic writing one group fails that group's
                    // reports (the agents send them again) and not every report after it.
                    let written = match tokio::spawn(write(jobs)).await {
                        Ok(written) => written,
                        Err(e) => {
                            tracing::error!(error = %e, "an ingest writer failed");
                            Written {
                                outcomes: Vec::new(),
                                alone: 0,
                            }
                        }
                    };
                    counters.alone.inc_by(written.alone as u64);
                    let mut outcomes = written.outcomes.into_iter();
                    for reply in replies {
                        let outcome = outcomes.next().unwrap_or_else(|| {
                            Err(StoreError::Invalid(
                                "the ingest writer failed; send again".into(),
                            ))
                        });
                        // The request may have gone (the client hung up): its report is stored
                        // all the same, and a retry is answered as a repeat.
                        let _ = reply.send(outcome);
                    }
                }
            });
        }
        GroupCommit { queue, counters }
    }

    /// Queues a report and waits for the commit that holds it (or for why it was not stored).
    pub async fn ingest(&self, job: Job) -> Result<IngestOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Invalid("the ingest writer has stopped".into());
        self.queue.send((job, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Waits for one queued report, then takes whatever else is queued, within the group's bounds.
/// One writer at a time gathers, so concurrent writers split the queue rather than race for it.
async fn next_group(
    receiver: &Mutex<mpsc::Receiver<(Job, Reply)>>,
) -> Option<(Vec<Job>, Vec<Reply>)> {
    let mut receiver = receiver.lock().await;
    let (first, reply) = receiver.recv().await?;
    let mut windows = first.gpu_windows();
    let (mut jobs, mut replies) = (vec![first], vec![reply]);
    while jobs.len() < MAX_GROUP_REPORTS && windows < MAX_GROUP_WINDOWS {
        let Ok((job, reply)) = receiver.try_recv() else {
            break;
        };
        windows += job.gpu_windows();
        jobs.push(job);
        replies.push(reply);
    }
    Some((jobs, replies))
}
