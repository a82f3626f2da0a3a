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
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
        }
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
