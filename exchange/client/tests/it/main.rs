//! Integration tests of cx-client, one binary: the client against a real exchange (router, books
//! in a throwaway PostgreSQL database, HTTPS with the development CA) on a loopback port.

mod exchange;
