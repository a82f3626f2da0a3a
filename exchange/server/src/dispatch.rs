//! Dispatch: signed assignments handed to providers over the provider's own outbound connection
//! (the exchange never reaches into a provider's network), queued per market shard in PostgreSQL
//! so that any exchange node can serve any provider.
