//! What threads through every use case: where it reads and at which moment, and who is asking.

use crate::closing::ClosePolicy;
use crate::config::Config;
use crate::store::Store;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::scope::Scope;

/// Where a use case reads and as of when: the database chosen for this request (a read
/// replica or the primary), the server's settings, and the moment the request is answered
/// for, read once from the clock so every figure of one answer is of the same moment.
#[derive(Clone, Copy)]
pub struct ReadContext<'a> {
    pub store: &'a dyn Store,
    pub config: &'a Config,
    pub rate_card: &'a RateCard,
    pub close: ClosePolicy,
    pub now: i64,
}

/// Who is asking: the owner dimensions figures are grouped by, and the teams they may see.
#[derive(Clone, Copy)]
pub struct Viewer<'a> {
    pub schema: &'a OwnerSchema,
    pub scope: &'a Scope,
}

impl Viewer<'_> {
    /// Whether the viewer sees every team (and so the whole bill).
    pub fn sees_everything(&self) -> bool {
        self.scope.is_all()
    }
}
