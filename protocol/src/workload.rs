//! What a job computes: an inference, a matrix product or a training run. The kind is a type,
//! decided once where an order comes in (by which of its three keys it sent) and carried from
//! there, in the books and in every assignment, so that no party works it out again from a
//! market's name.
//!
//! In JSON a workload is one key beside the others of its object, as orders have always sent
//! it: `request` (an [`InferenceRequest`]), `matmul` (a [`MatmulRequest`], the `cx/matmul-f32`
//! market) or `train` (a [`TrainRequest`], a `cx/train/<base>` market).
//!
//! ```
//! use cx_protocol::workload::{Workload, WorkloadKind};
//! use cx_protocol::order::InferenceRequest;
//!
//! let request = InferenceRequest { prompt: "hi".into(), max_tokens: 4, ..Default::default() };
//! let workload = Workload::exactly_one(Some(request.clone()), None, None).unwrap();
//! assert_eq!(workload.kind(), WorkloadKind::Inference);
//! assert_eq!(workload.hash(), cx_protocol::order::request_hash(&request));
//! let stored = Workload::from_stored(workload.kind(), workload.request_value()).unwrap();
//! assert_eq!(stored, workload);
//! // None, or two at once, is refused naming a key.
//! assert!(Workload::exactly_one(None, None, None).is_err());
//! ```

use crate::error::{Error, Result};
use crate::matmul::MatmulRequest;
use crate::order::{B256, InferenceRequest, request_value_hash};
use crate::train::TrainRequest;
use serde::{Deserialize, Serialize};

/// What a job computes, with its request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Workload {
    /// An inference (a completion or a chat) in a catalog model's market.
    #[serde(rename = "request")]
    Inference(InferenceRequest),
    /// A matrix product in the `cx/matmul-f32` market ([`crate::matmul`]).
    #[serde(rename = "matmul")]
    Matmul(MatmulRequest),
    /// A LoRA trained in a `cx/train/<base>` market ([`crate::train`]).
    #[serde(rename = "train")]
    Train(TrainRequest),
}

/// A workload's kind without its request: what the books' `workload` column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WorkloadKind {
    /// [`Workload::Inference`].
    Inference,
    /// [`Workload::Matmul`].
    Matmul,
    /// [`Workload::Train`].
    Train,
}

impl WorkloadKind {
    /// Every kind.
    pub const ALL: [WorkloadKind; 3] = [Self::Inference, Self::Matmul, Self::Train];

    /// The name the books and the API use (`inference`, `matmul`, `train`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Inference => "inference",
            Self::Matmul => "matmul",
            Self::Train => "train",
        }
    }

    /// The JSON key an order or an assignment carries this kind's request under.
    pub const fn key(self) -> &'static str {
        match self {
            Self::Inference => "request",
            Self::Matmul => "matmul",
            Self::Train => "train",
        }
    }

    /// The kind named `name` ([`Self::as_str`]), if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl Workload {
    /// The one workload of an order that may send any of the three keys: exactly one must be
    /// given. None names `request`; two or more name the later of them.
    pub fn exactly_one(
        request: Option<InferenceRequest>,
        matmul: Option<MatmulRequest>,
        train: Option<TrainRequest>,
    ) -> Result<Self> {
        match (request, matmul, train) {
            (Some(request), None, None) => Ok(Self::Inference(request)),
            (None, Some(matmul), None) => Ok(Self::Matmul(matmul)),
            (None, None, Some(train)) => Ok(Self::Train(train)),
            (request, _, train) => {
                let field = match (request, train) {
                    (None, None) => "request",
                    (_, Some(_)) => "train",
                    (Some(_), None) => "matmul",
                };
                Err(Error::InvalidField {
                    field: field.to_owned(),
                    reason: "send exactly one of `request` (an inference), `matmul` (a product \
                             in the cx/matmul-f32 market) and `train` (training in the \
                             cx/train/<base> market)"
                        .to_owned(),
                })
            }
        }
    }

    /// A workload as the books keep it: its kind and its request's JSON.
    pub fn from_stored(kind: WorkloadKind, request: serde_json::Value) -> serde_json::Result<Self> {
        Ok(match kind {
            WorkloadKind::Inference => Self::Inference(serde_json::from_value(request)?),
            WorkloadKind::Matmul => Self::Matmul(serde_json::from_value(request)?),
            WorkloadKind::Train => Self::Train(serde_json::from_value(request)?),
        })
    }

    /// Its kind.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            Self::Inference(_) => WorkloadKind::Inference,
            Self::Matmul(_) => WorkloadKind::Matmul,
            Self::Train(_) => WorkloadKind::Train,
        }
    }

    /// The request's JSON, without its key: what the books store and what is hashed.
    pub fn request_value(&self) -> serde_json::Value {
        let value = match self {
            Self::Inference(request) => serde_json::to_value(request),
            Self::Matmul(request) => serde_json::to_value(request),
            Self::Train(request) => serde_json::to_value(request),
        };
        value.expect("a request always serializes")
    }

    /// The intent's `request_hash`, the assignment's and the receipt's `input_hash`: SHA-256 of
    /// the request's canonical JSON, the one rule of every kind.
    pub fn hash(&self) -> B256 {
        request_value_hash(&self.request_value())
    }

    /// The inference request, if this is one.
    pub fn inference(&self) -> Option<&InferenceRequest> {
        match self {
            Self::Inference(request) => Some(request),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul() -> MatmulRequest {
        MatmulRequest {
            m: 2,
            k: 3,
            n: 4,
            seed_a: 1,
            seed_b: 2,
        }
    }

    #[test]
    fn each_kind_hashes_as_its_request_always_did() {
        let request = InferenceRequest {
            prompt: "hello".into(),
            max_tokens: 3,
            ..Default::default()
        };
        assert_eq!(
            Workload::Inference(request.clone()).hash(),
            crate::order::request_hash(&request)
        );
        assert_eq!(Workload::Matmul(matmul()).hash(), matmul().hash());
    }

    #[test]
    fn a_workload_is_one_key_beside_the_others_of_its_object() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Carrier {
            job: u32,
            #[serde(flatten)]
            workload: Workload,
        }
        let carrier = Carrier {
            job: 7,
            workload: Workload::Matmul(matmul()),
        };
        let json = serde_json::to_value(&carrier).unwrap();
        assert_eq!(json["matmul"]["m"], 2);
        assert_eq!(json["job"], 7);
        assert_eq!(serde_json::from_value::<Carrier>(json).unwrap(), carrier);
    }

    #[test]
    fn exactly_one_names_the_key_that_is_wrong() {
        let field = |r: Result<Workload>| match r {
            Err(Error::InvalidField { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(Workload::exactly_one(None, None, None)), "request");
        assert_eq!(
            field(Workload::exactly_one(
                Some(InferenceRequest::default()),
                Some(matmul()),
                None
            )),
            "matmul"
        );
    }

    #[test]
    fn kinds_round_trip_by_name() {
        for kind in WorkloadKind::ALL {
            assert_eq!(WorkloadKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(WorkloadKind::parse("search"), None);
    }
}
