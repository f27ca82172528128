"""Evidence for auditors: signed checkpoints of the log kept outside the database."""
