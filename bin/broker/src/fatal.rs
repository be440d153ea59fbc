//! How a write path reports that it failed: the broker stops so that a restart recovers from
//! its durable state (see `ServerError::WritePathFailed`).

use std::sync::Arc;

use futureq_net::Shutdown;

/// Where a failure goes: `(what failed, why)`.
type Report = Arc<dyn Fn(&'static str, &str) + Send + Sync>;

/// Reports a failed write path to [`crate::run`]'s thread and starts the shutdown. The
/// thread returns on the first report; later ones go nowhere.
#[derive(Clone)]
pub(crate) struct FatalReporter {
    report: Report,
    shutdown: Shutdown,
}

impl FatalReporter {
    /// A reporter that calls `report(what, reason)` and then triggers `shutdown`.
    pub(crate) fn new(
        report: impl Fn(&'static str, &str) + Send + Sync + 'static,
        shutdown: Shutdown,
    ) -> Self {
        FatalReporter {
            report: Arc::new(report),
            shutdown,
        }
    }

    /// Reports the failure ([`crate::run`]'s caller logs it).
    pub(crate) fn fail(&self, what: &'static str, reason: &str) {
        (self.report)(what, reason);
        self.shutdown.trigger();
    }
}
