"""The HTTP API face: /api routes for calls, approvals, runs and principals."""
