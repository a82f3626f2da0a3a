//! The books: the exchange's durable state in PostgreSQL (`migrations/` at the workspace root,
//! run by the server at start). Every state change that must survive a crash is written here
//! first; the matching engine's memory is a cache rebuilt from these tables. This module is the
//! one door to the database: handlers and loops ask it, they never hold a connection themselves.
