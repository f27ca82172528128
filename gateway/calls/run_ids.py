"""Whose run a client's `writ/runId` names: always one of its own principal's.

A client names its run with any string it likes, and another agent of the tenant (or of another
tenant) may name one the same. Writ's run id is therefore derived from the tenant, the subject and the
client's string: the same principal naming the same string is in the same run, anyone else naming it
is in a run of their own, and no client can name a run it did not start.
"""

from __future__ import annotations

import hashlib

from policy.model import Principal
from store.canonical import canonical_json


def scoped_run_id(principal: Principal, client_run_id: str) -> str:
    """Writ's id for the run `principal` calls `client_run_id`."""
    body = canonical_json([principal.tenant, principal.subject, client_run_id])
    return "run_" + hashlib.sha256(body.encode()).hexdigest()[:40]
