//! HTTP tests (filled below).
