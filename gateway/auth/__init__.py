"""Who is asking: token verification, issuers, the dev issuer, a principal's standing and reach."""
