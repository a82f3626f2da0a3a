#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cx_fuzz_targets::model_weights(data));
