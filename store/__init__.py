"""The append-only event log, its projections and the effect ledger, on SQLite or PostgreSQL."""

from store.model import (
    Admission,
    ApprovalNeed,
    ApprovalView,
    AuditReport,
    CallIdentity,
    CallRequest,
    CallView,
    ConfirmationMismatch,
    DecisionRecord,
    KeyClaimLost,
    NotFound,
    OutcomeRecord,
    RefusalRequest,
    StaleLease,
    StoredEvent,
    StoreError,
    Unavailable,
)
from store.store import Store

__all__ = [
    "Admission",
    "ApprovalNeed",
    "ApprovalView",
    "AuditReport",
    "CallIdentity",
    "CallRequest",
    "CallView",
    "ConfirmationMismatch",
    "DecisionRecord",
    "KeyClaimLost",
    "NotFound",
    "OutcomeRecord",
    "RefusalRequest",
    "StaleLease",
    "Store",
    "StoreError",
    "StoredEvent",
    "Unavailable",
]
