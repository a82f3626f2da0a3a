#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cx_fuzz_targets::receipt_signature(data));
