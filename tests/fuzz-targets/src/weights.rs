//! Files a provider loads from disk: PEFT adapters and a base model's safetensors.

use std::path::Path;

use cx_provider::lora::{AdapterLimits, adapter_bytes, adapter_from_bytes, adapter_id};
use cx_provider::model::{Projection, tensors_from_bytes};
use safetensors::{Dtype, SafeTensors};

use crate::fixtures::{MAX_RANK, fixtures};

/// Splits a PEFT input: `config length (u32 little-endian) ‖ adapter_config.json ‖
/// adapter_model.safetensors`. [`crate::seeds`] writes inputs this way.
pub(crate) fn split_adapter(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    rest.split_at_checked(len)
}

/// Joins the two files of a PEFT adapter into one input (see [`split_adapter`]).
pub(crate) fn join_adapter(config: &[u8], weights: &[u8]) -> Vec<u8> {
    let mut out = (config.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(config);
    out.extend_from_slice(weights);
    out
}

/// A PEFT adapter directory's two files (see [`split_adapter`] for the layout), loaded as the
/// provider loads `POST /v1/load_lora_adapter`'s directory (`adapter_from_bytes`, the function
/// `load_adapter` calls once it has read the files within [`AdapterLimits`]), against a base of
/// 2 layers, hidden 8, rank at most 8.
///
/// Asserts: nothing panics; an accepted adapter has a rank in `1..=8`, adapts only the targets
/// its config names and only existing layers, has a finite scale, is named by the content id of
/// its two files, and holds no more bytes than `adapter_bytes` (what the residency cache admits
/// it by) says an adapter of its rank and targets holds.
pub fn peft_adapter(data: &[u8]) {
    let fx = fixtures();
    let Some((config, weights)) = split_adapter(data) else {
        return;
    };
    let limits = AdapterLimits::new(&fx.base, MAX_RANK);
    if config.len() as u64 > limits.config_bytes || weights.len() as u64 > limits.weight_bytes {
        // `read_regular_file` refuses these before anything parses them.
        return;
    }
    let dir = Path::new("/fuzz/adapter");
    let Ok(adapter) = adapter_from_bytes(dir, config, weights, &fx.base, MAX_RANK) else {
        return;
    };
    assert!(
        (1..=MAX_RANK).contains(&adapter.rank()),
        "rank {}",
        adapter.rank()
    );
    assert!(adapter.scale().is_finite());
    assert!(!adapter.targets().is_empty());
    assert_eq!(adapter.id(), adapter_id(config, weights));
    assert!(
        adapter.bytes() <= adapter_bytes(&fx.base, adapter.rank(), adapter.targets()),
        "an adapter holds {} bytes, more than the {} its rank and targets admit it by",
        adapter.bytes(),
        adapter_bytes(&fx.base, adapter.rank(), adapter.targets())
    );
    for layer in 0..fx.base.num_hidden_layers + 1 {
        for target in Projection::ALL {
            if adapter.projection(layer, target).is_some() {
                assert!(layer < fx.base.num_hidden_layers, "adapts layer {layer}");
                assert!(adapter.targets().contains(&target), "adapts {target:?}");
            }
        }
    }
}

/// A base model's `model.safetensors` as `Model::load` reads it (`tensors_from_bytes`: the
/// provider's own header and data reader, over bytes instead of a file).
///
/// Asserts: nothing panics; every tensor holds exactly as many values as its shape says; where
/// the `safetensors` crate (what adapters and the rest of the ecosystem read with) accepts the
/// same file, both read the same tensors with the same shapes and bit-identical values.
pub fn model_weights(data: &[u8]) {
    let Ok(tensors) = tensors_from_bytes(Path::new("/fuzz/model.safetensors"), data) else {
        return;
    };
    for (name, (shape, values)) in &tensors {
        let elements: usize = shape.iter().product();
        assert_eq!(
            values.len(),
            elements,
            "{name}: {shape:?} but {} values",
            values.len()
        );
    }
    let Ok(theirs) = SafeTensors::deserialize(data) else {
        return;
    };
    assert_eq!(
        theirs.len(),
        tensors.len(),
        "the two readers see different tensors"
    );
    for (name, view) in theirs.tensors() {
        let (shape, values) = tensors
            .get(&name)
            .unwrap_or_else(|| panic!("{name} is read by safetensors only"));
        assert_eq!(shape.as_slice(), view.shape(), "{name}: shapes differ");
        let bits: Vec<u32> = match view.dtype() {
            Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => view
                .data()
                .chunks_exact(2)
                .map(|b| half_bits(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()))
                .collect(),
            Dtype::F16 => view
                .data()
                .chunks_exact(2)
                .map(|b| half_bits(half::f16::from_le_bytes([b[0], b[1]]).to_f32()))
                .collect(),
            other => panic!("{name}: dtype {other:?} accepted by the provider's reader"),
        };
        let ours: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        assert!(
            ours == bits,
            "{name}: values differ between the two readers"
        );
    }
}

fn half_bits(value: f32) -> u32 {
    value.to_bits()
}
