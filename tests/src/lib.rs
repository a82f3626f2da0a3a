//! cx-e2e: cross-process tests live in `tests/`; this library is empty.
