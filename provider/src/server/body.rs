//! A JSON request body read field by field, so that a type error names its field (serde's
//! derive names only missing fields) and every refusal is our JSON error shape.

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::ApiError;

/// The request fields, each read on its own so a type error names its field.
pub(super) struct Body(pub(super) serde_json::Map<String, Value>);

impl Body {
    pub(super) fn parse(bytes: &Bytes) -> Result<Self, ApiError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(mut map)) => {
                map.values_mut().for_each(integral_floats_as_integers);
                Ok(Self(map))
            }
            Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
        }
    }

    /// An empty body or `null` as no fields, anything else as [`Body::parse`] reads it (for a
    /// route whose whole body is optional).
    pub(super) fn parse_optional(bytes: &Bytes) -> Result<Self, ApiError> {
        if bytes.is_empty() || bytes.trim_ascii() == b"null" {
            return Ok(Self(serde_json::Map::new()));
        }
        Self::parse(bytes)
    }

    /// `name` as a `T`, `None` when absent or null.
    pub(super) fn get<T: for<'de> Deserialize<'de>>(
        &self,
        name: &'static str,
    ) -> Result<Option<T>, ApiError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|e| ApiError::bad_request(format!("`{name}`: {e}")).field(name)),
        }
    }

    /// Refuses a field outside `allowed`, naming it.
    pub(super) fn refuse_unknown(&self, allowed: &[&'static str]) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(ApiError::bad_request(format!(
                "unknown field `{key}`; expected one of {}",
                allowed.join(", ")
            ))),
        }
    }
}

/// `1.0` is an integer to JSON Schema (and to every JavaScript client), but serde refuses it
/// for a `u64`: an integral float within `u64` or `i64` becomes that integer (exactly: every
/// f64 below 2⁶⁴ with no fraction is one), so `"seed": 7.0` reads as 7. Floats stay floats
/// for the float fields, which read integers too.
fn integral_floats_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let Some(f) = n.as_f64() else { return };
            if f.fract() != 0.0 {
                return;
            }
            // 2⁶⁴ and -2⁶³ as f64 are exact: the casts below are in range, never saturated.
            if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                *value = Value::from(f as u64);
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards what schemathesis found: `"seed": 85914642.0` (an integer to JSON Schema) was
    /// refused 400 "expected u64".
    #[test]
    fn an_integral_float_reads_as_an_integer_and_fractions_stay_refused() {
        let body = Body::parse(&Bytes::from_static(
            br#"{"seed": 85914642.0, "prompt": [1.0, 2.0], "t": 0.5, "big": 1e300, "neg": -3.0}"#,
        ))
        .unwrap();
        assert_eq!(body.get::<u64>("seed").unwrap(), Some(85_914_642));
        assert_eq!(body.get::<Vec<u32>>("prompt").unwrap(), Some(vec![1, 2]));
        assert_eq!(body.get::<f64>("t").unwrap(), Some(0.5));
        assert!(body.get::<u64>("big").is_err(), "past u64 it stays a float");
        assert_eq!(body.get::<i64>("neg").unwrap(), Some(-3));
        let fraction = Body::parse(&Bytes::from_static(br#"{"seed": 1.5}"#)).unwrap();
        assert!(fraction.get::<u64>("seed").is_err());
        let none = Body::parse_optional(&Bytes::from_static(b" null ")).unwrap();
        assert!(none.0.is_empty());
    }
}
