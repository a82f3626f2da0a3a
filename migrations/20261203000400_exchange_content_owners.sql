-- Who stored which content (adapters, datasets): an upload needs an account's credential, and
-- what an account owns counts against its store quota. Content is stored once by id; each
-- account that stores the same bytes owns them too and is charged their size. The owners are the
-- accounts an adapter is served to (besides the providers whose work needs it).
CREATE TABLE exchange_content_owners (
    kind       TEXT NOT NULL CHECK (kind IN ('adapter', 'dataset')),
    id         TEXT NOT NULL CHECK (id ~ '^[0-9a-f]{64}$'),
    account    BYTEA NOT NULL CHECK (length(account) = 20),
    bytes      BIGINT NOT NULL CHECK (bytes > 0),
    stored_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, id, account)
);
-- An account's quota is summed over what it owns.
CREATE INDEX exchange_content_owners_account ON exchange_content_owners (account);
