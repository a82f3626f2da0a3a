-- A slash the committee or the chain refuses is retried with backoff instead of being given up
-- after a fixed number of tries (a provider that changes its key or stalls the committee for five
-- passes must not walk away): each pending slash carries when it may be tried next.
ALTER TABLE exchange_slashes ADD COLUMN next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now();
DROP INDEX exchange_slashes_pending;
CREATE INDEX exchange_slashes_pending ON exchange_slashes (next_attempt_at) WHERE status = 'pending';
