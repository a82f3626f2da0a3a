-- Receipts taken out of settlement after the committee refused them (bad signature, provider not
-- registered, escrow not open), with the reason; kept for audit and for the provider to see.
CREATE TABLE settlement_rejected_receipts (
    job_id      BYTEA PRIMARY KEY,
    receipt     JSONB NOT NULL,
    reason      TEXT NOT NULL,
    rejected_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
