//! The JSON a wallet signs: `{types, primaryType, domain, message}` exactly as
//! `eth_signTypedData_v4` takes it (EIP-712 §"Specification of the eth_signTypedData JSON RPC").
//!
//! Nothing here is written per kind: the struct's field list comes from alloy's
//! `SolStruct::eip712_root_type()` (the same string its type hash is computed from), the
//! `EIP712Domain` fields from the domain's present fields in the order EIP-712 fixes, and the
//! message from the `sol!` value itself, ABI-encoded and decoded field by field with
//! `alloy-dyn-abi`. A message's integers wider than 32 bits are decimal strings (JavaScript
//! numbers lose precision above 2⁵³; wallets and `eth-account` read decimal strings), addresses
//! are EIP-55 checksummed, byte strings are 0x-hex.

use alloy_dyn_abi::{DynSolType, DynSolValue};
use alloy_sol_types::{Eip712Domain, SolStruct, SolValue};
use serde_json::{Map, Value, json};

use super::{Kind, typed};

/// The `eth_signTypedData_v4` JSON of `kind` under `domain`; with `message` (the order's
/// [`eip712_message`]) it is what a wallet signs, without it the schema the exchange serves at
/// `GET /v1/eip712/{kind}`.
pub fn wallet_typed_data(kind: Kind, domain: &Eip712Domain, message: Option<Value>) -> Value {
    let root = match kind {
        Kind::Intent => typed::Intent::eip712_root_type(),
        Kind::Reserve => typed::Reserve::eip712_root_type(),
        Kind::Rent => typed::Rent::eip712_root_type(),
        Kind::Search => typed::Search::eip712_root_type(),
        Kind::TabTerms => typed::TabTerms::eip712_root_type(),
        Kind::SessionGrant => typed::SessionGrant::eip712_root_type(),
        Kind::PqBinding => typed::PqBinding::eip712_root_type(),
    };
    let (name, fields) = parse_root_type(&root);
    let struct_fields: Vec<Value> = fields
        .iter()
        .map(|(ty, field)| json!({"name": field, "type": ty}))
        .collect();
    let (domain_fields, domain_value) = domain_json(domain);
    let mut types = Map::new();
    types.insert("EIP712Domain".to_owned(), Value::Array(domain_fields));
    types.insert(name.to_owned(), Value::Array(struct_fields));
    let mut out = Map::new();
    out.insert("types".to_owned(), Value::Object(types));
    out.insert("primaryType".to_owned(), Value::String(name.to_owned()));
    out.insert("domain".to_owned(), domain_value);
    if let Some(message) = message {
        out.insert("message".to_owned(), message);
    }
    Value::Object(out)
}

/// The `message` object of a `sol!` struct: its camelCase fields and values as a wallet shows them.
pub fn eip712_message<T: SolStruct + SolValue>(value: &T) -> Value {
    let root = T::eip712_root_type();
    let (_, fields) = parse_root_type(&root);
    let ty = DynSolType::Tuple(
        fields
            .iter()
            .map(|(ty, _)| DynSolType::parse(ty).expect("sol! emits parseable Solidity types"))
            .collect(),
    );
    let encoded = value.abi_encode();
    let decoded = ty
        .abi_decode(&encoded)
        .expect("a sol! value decodes as the tuple of its own fields");
    let DynSolValue::Tuple(values) = decoded else {
        unreachable!("a tuple type decodes to a tuple")
    };
    let mut message = Map::new();
    for ((_, field), value) in fields.iter().zip(values) {
        message.insert((*field).to_owned(), json_value(value));
    }
    Value::Object(message)
}

/// `Name(type1 field1,type2 field2)` → (`Name`, [(type1, field1), …]). Our structs have no
/// nested struct or array members, so the fields split on commas and spaces.
fn parse_root_type(root: &str) -> (&str, Vec<(&str, &str)>) {
    let (name, rest) = root
        .split_once('(')
        .expect("an EIP-712 root type is Name(fields)");
    let body = rest.strip_suffix(')').expect("closed by a parenthesis");
    let fields = body
        .split(',')
        .filter(|f| !f.is_empty())
        .map(|f| f.split_once(' ').expect("each field is `type name`"))
        .collect();
    (name, fields)
}

fn domain_json(domain: &Eip712Domain) -> (Vec<Value>, Value) {
    let mut fields = Vec::new();
    let mut value = Map::new();
    if let Some(name) = &domain.name {
        fields.push(json!({"name": "name", "type": "string"}));
        value.insert("name".to_owned(), json!(name));
    }
    if let Some(version) = &domain.version {
        fields.push(json!({"name": "version", "type": "string"}));
        value.insert("version".to_owned(), json!(version));
    }
    if let Some(chain_id) = domain.chain_id {
        fields.push(json!({"name": "chainId", "type": "uint256"}));
        // A number, as wallets compare it with the connected chain's id.
        let id = u64::try_from(chain_id)
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(chain_id.to_string()));
        value.insert("chainId".to_owned(), id);
    }
    if let Some(contract) = domain.verifying_contract {
        fields.push(json!({"name": "verifyingContract", "type": "address"}));
        value.insert(
            "verifyingContract".to_owned(),
            json!(contract.to_checksum(None)),
        );
    }
    if let Some(salt) = domain.salt {
        fields.push(json!({"name": "salt", "type": "bytes32"}));
        value.insert("salt".to_owned(), json!(salt.to_string()));
    }
    (fields, Value::Object(value))
}

fn json_value(value: DynSolValue) -> Value {
    match value {
        DynSolValue::Bool(b) => Value::Bool(b),
        DynSolValue::Uint(v, bits) if bits <= 32 => Value::from(u64::try_from(v).unwrap_or(0)),
        DynSolValue::Uint(v, _) => Value::String(v.to_string()),
        DynSolValue::Int(v, _) => Value::String(v.to_string()),
        DynSolValue::Address(a) => Value::String(a.to_checksum(None)),
        DynSolValue::FixedBytes(word, size) => {
            Value::String(format!("0x{}", hex::encode(&word[..size])))
        }
        DynSolValue::Bytes(bytes) => Value::String(format!("0x{}", hex::encode(bytes))),
        DynSolValue::String(s) => Value::String(s),
        DynSolValue::Array(items) | DynSolValue::FixedArray(items) | DynSolValue::Tuple(items) => {
            Value::Array(items.into_iter().map(json_value).collect())
        }
        other => Value::String(format!("{other:?}")),
    }
}
