//! The one door of request bodies: [`Body`] reads a JSON object into the route's request type
//! (the same type `/openapi.json` describes), and every refusal is our JSON error shape with
//! the field to blame.
//!
//! Fields outside the type are refused by name before anything is read (the type says which
//! it has: [`fields`]); a value of the wrong type is a 400 naming its field, which serde's
//! derive alone does not say (`serde_path_to_error` does).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request as HttpRequest};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value};

use super::ApiError;

/// A route's request type, as the door reads it.
pub(super) trait Request: DeserializeOwned {
    /// Takes out of `body` each entry that is none of the type's `fields`, or refuses it by
    /// name. The default refuses every one; the completions take OpenAI's parameters they do
    /// not implement, at their neutral value.
    fn take_unknown(body: &mut Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
        match body.keys().find(|k| !fields.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(ApiError::bad_request(format!(
                "unknown field `{key}`; expected one of {}",
                fields.join(", ")
            ))),
        }
    }
}

/// A request body read into `T`: a JSON object, with no field `T` lacks.
pub(super) struct Body<T>(pub(super) T);

/// As [`Body`], with an empty body or `null` read as `{}` (for a route whose whole body is
/// optional).
pub(super) struct OptionalBody<T>(pub(super) T);

impl<S: Send + Sync, T: Request> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: HttpRequest, state: &S) -> Result<Self, ApiError> {
        read(&bytes(request, state).await?).map(Body)
    }
}

impl<S: Send + Sync, T: Request> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: HttpRequest, state: &S) -> Result<Self, ApiError> {
        read_optional(&bytes(request, state).await?).map(OptionalBody)
    }
}

/// The body's bytes, within the router's limit (a body over it is axum's 413, in our shape).
async fn bytes<S: Send + Sync>(request: HttpRequest, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| super::status_error(rejection.status()))
}

/// As [`read`], with an empty body or `null` read as `{}`.
fn read_optional<T: Request>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() || bytes.trim_ascii() == b"null" {
        return read(b"{}");
    }
    read(bytes)
}

/// Reads `bytes` as a `T`: a JSON object, its unknown fields refused or taken by
/// [`Request::take_unknown`] first, then every field deserialized at once.
pub(super) fn read<T: Request>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut body = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(ApiError::bad_request("the body must be a JSON object")),
        Err(e) => return Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    };
    // Before the neutral values are checked too: `"best_of": 1.0` is 1.
    body.values_mut().for_each(integral_floats_as_integers);
    let fields = fields::<T>();
    T::take_unknown(&mut body, fields)?;
    serde_path_to_error::deserialize(Value::Object(body)).map_err(|e| {
        // The body's own field the error is in (a message's `role` is `messages`'s fault).
        let field = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => {
                fields.iter().copied().find(|f| f == key)
            }
            _ => None,
        };
        match field {
            Some(name) => {
                ApiError::bad_request(format!("`{name}`: {}", e.into_inner())).field(name)
            }
            None => ApiError::bad_request(e.into_inner().to_string()),
        }
    })
}

/// The names of `T`'s fields, as its derived `Deserialize` declares them: serde hands them to
/// `deserialize_struct`, with the `'static` lifetime a refusal's `field` needs. Empty for a
/// type that is not a struct.
pub(super) fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The deserializer only notes the names and stops: its error is expected.
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A deserializer that notes the field names a struct asks for and gives nothing.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("field names noted"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
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
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Numbers {
        seed: Option<u64>,
        prompt: Option<Vec<u32>>,
        t: Option<f64>,
        big: Option<Value>,
        neg: Option<i64>,
    }

    impl Request for Numbers {}

    #[derive(Debug, Deserialize)]
    struct Seed {
        #[expect(dead_code, reason = "read only to be refused")]
        seed: Option<u64>,
    }

    impl Request for Seed {}

    /// Guards what schemathesis found: `"seed": 85914642.0` (an integer to JSON Schema) was
    /// refused 400 "expected u64".
    #[test]
    fn an_integral_float_reads_as_an_integer_and_fractions_stay_refused() {
        let body: Numbers = read(
            br#"{"seed": 85914642.0, "prompt": [1.0, 2.0], "t": 0.5, "big": 1e300, "neg": -3.0}"#,
        )
        .unwrap();
        assert_eq!(body.seed, Some(85_914_642));
        assert_eq!(body.prompt, Some(vec![1, 2]));
        assert_eq!(body.t, Some(0.5));
        assert!(
            body.big.as_ref().is_some_and(Value::is_f64),
            "past u64 it stays a float"
        );
        assert_eq!(body.neg, Some(-3));
        let fraction = read::<Seed>(br#"{"seed": 1.5}"#).unwrap_err();
        assert_eq!(fraction.field, Some("seed"));
        assert!(read::<Seed>(br#"{"seed": 1e300}"#).is_err());
        let none = read_optional::<Numbers>(b" null ").unwrap();
        assert_eq!(none.seed, None);
        assert!(
            read::<Numbers>(b" null ").is_err(),
            "a body is required but where optional"
        );
    }

    #[test]
    fn an_unknown_field_a_type_error_and_a_non_object_are_refused_by_name() {
        let unknown = read::<Seed>(br#"{"seed": 1, "frobnicate": null}"#).unwrap_err();
        assert!(unknown.message.contains("`frobnicate`"), "{unknown:?}");
        assert_eq!(unknown.field, None);
        let wrong = read::<Numbers>(br#"{"prompt": [1, -2]}"#).unwrap_err();
        assert_eq!(wrong.field, Some("prompt"));
        assert!(wrong.message.starts_with("`prompt`: "), "{wrong:?}");
        for body in [&b"[]"[..], b"null", b"7", b"{"] {
            assert!(read::<Seed>(body).is_err());
        }
        assert_eq!(fields::<Seed>(), ["seed"]);
    }
}
