//! The settlement loop: verified receipts go to the committee's coordinator (`cx-settlement`),
//! which batches them per chain, has t of n signers check and FROST-sign each batch, and posts it
//! exactly once (outbox in PostgreSQL).
