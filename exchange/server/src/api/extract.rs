//! [`AppJson`]: `axum::Json` with our error shape, and the JSON path of the field to blame;
//! [`AppPath`]: `axum::extract::Path` with our error shape, naming the path parameter.

use super::error::ApiError;
use axum::extract::rejection::BytesRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A JSON body in, or a JSON body out.
///
/// As an extractor it requires `content-type: application/json`, stays within the router's
/// body limit, and reports a bad value with the JSON path of the field (through
/// `serde_path_to_error`), so `{"max_price_wei": -1}` is a 400 naming `max_price_wei` — never
/// axum's plain-text rejection.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppJson<T>(pub T);

impl<S, T> FromRequest<S> for AppJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(&req) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(from_bytes_rejection)?;
        Self::from_bytes(&bytes)
    }
}

impl<T: DeserializeOwned> AppJson<T> {
    /// Decodes a JSON body exactly as the extractor does once the body is read (the fuzz
    /// targets feed request bodies through this, the one door for JSON bodies).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ApiError> {
        parse(bytes).map(AppJson)
    }
}

/// Path parameters, deserialized into `T` (a struct whose fields name the route's
/// parameters): a value that does not parse is a 400 naming the parameter, in our JSON error
/// shape — never axum's plain-text rejection.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppPath<T>(pub T);

impl<S, T> FromRequestParts<S> for AppPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(AppPath(value)),
            Err(rejection) => Err(from_path_rejection(rejection)),
        }
    }
}

/// The token of `Authorization: Bearer <token>` (a provider's dispatch token or a session key),
/// required: as an extractor before the body's, so a caller without a credential gets 401
/// before anything it sent is read.
#[derive(Debug, Clone)]
pub struct Bearer(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Bearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        bearer(&parts.headers).map(|token| Bearer(token.to_owned()))
    }
}

fn from_path_rejection(rejection: PathRejection) -> ApiError {
    use axum::extract::path::ErrorKind;
    let field = match &rejection {
        PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
            ErrorKind::ParseErrorAtKey { key, .. }
            | ErrorKind::InvalidUtf8InPathParam { key }
            | ErrorKind::DeserializeError { key, .. } => Some(key.clone()),
            _ => None,
        },
        _ => None,
    };
    ApiError::Invalid {
        field,
        message: rejection.body_text(),
    }
}

impl<T: Serialize> IntoResponse for AppJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `application/json`, or any `+json` type, parameters allowed.
fn is_json(req: &Request) -> bool {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json") || subtype.to_ascii_lowercase().ends_with("+json"))
}

fn from_bytes_rejection(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge
    } else {
        ApiError::MalformedJson {
            message: "the body could not be read".to_owned(),
        }
    }
}

/// Parses one JSON value (nothing after it), naming the field a value is wrong in.
///
/// An integer written as a float (`20.0`) is an integer to JSON Schema, and so to the API's
/// document; serde refuses it for an integer field. Only when that refusal happens is the body
/// read again with such numbers made integers, so well-formed bodies pay nothing for it.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => value,
        Err(err)
            if err
                .inner()
                .to_string()
                .starts_with("invalid type: floating point") =>
        {
            let mut body: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| ApiError::MalformedJson {
                    message: e.to_string(),
                })?;
            integral_floats_to_integers(&mut body);
            return serde_path_to_error::deserialize(body).map_err(refusal);
        }
        Err(err) => return Err(refusal(err)),
    };
    deserializer.end().map_err(|err| ApiError::MalformedJson {
        message: err.to_string(),
    })?;
    Ok(value)
}

fn refusal(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let inner = err.into_inner();
    if inner.is_data() {
        ApiError::Invalid {
            // `.` is serde_path_to_error's name for the root: no one field is to blame.
            field: (path != ".").then_some(path),
            message: inner.to_string(),
        }
    } else {
        ApiError::MalformedJson {
            message: inner.to_string(),
        }
    }
}

/// Rewrites every float with no fractional part that an `i64` or `u64` holds exactly as that
/// integer (`20.0` → `20`); other numbers are left as they are.
fn integral_floats_to_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64())
                && f.fract() == 0.0
                && f.abs() < 9_007_199_254_740_992.0
            {
                // Below 2^53 the float is exactly this integer.
                *n = if f < 0.0 {
                    serde_json::Number::from(f as i64)
                } else {
                    serde_json::Number::from(f as u64)
                };
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
}

/// The token of `Authorization: Bearer <token>`.
pub(super) fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let missing = || ApiError::Unauthorized {
        message: "send the session key as `Authorization: Bearer <key>` (make one with `cx agent \
                  session`)"
            .to_owned(),
    };
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(missing)?
        .to_str()
        .map_err(|_| missing())?;
    let (scheme, token) = value.split_once(' ').ok_or_else(missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(missing());
    }
    Ok(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Body {
        count: u32,
        offsets: Vec<i64>,
        scale: f64,
    }

    #[test]
    fn an_integer_written_as_a_float_is_that_integer_and_a_fraction_is_refused_by_name() {
        let body: Body = parse(br#"{"count": 20.0, "offsets": [-3.0, 4], "scale": 2.0}"#).unwrap();
        assert_eq!(
            body,
            Body {
                count: 20,
                offsets: vec![-3, 4],
                scale: 2.0
            }
        );
        match parse::<Body>(br#"{"count": 20.5, "offsets": [], "scale": 1}"#) {
            Err(ApiError::Invalid { field, .. }) => assert_eq!(field.as_deref(), Some("count")),
            other => panic!("expected a refusal naming count, got {other:?}"),
        }
        assert!(matches!(
            parse::<Body>(br#"{"count": 1e300, "offsets": [], "scale": 1}"#),
            Err(ApiError::Invalid { .. })
        ));
    }
}
