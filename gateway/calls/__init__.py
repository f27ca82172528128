"""The call domain: the pipeline of DESIGN §3, dispatch, approvals, reconciliation, workers."""
