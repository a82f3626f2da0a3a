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
//! let workload = Workload::Inference(request.clone());
//! assert_eq!(workload.kind(), WorkloadKind::Inference);
//! assert_eq!(workload.hash(), cx_protocol::order::request_hash(&request));
//! let stored = Workload::from_stored(workload.kind(), workload.request_value()).unwrap();
//! assert_eq!(stored, workload);
//! // Every party dispatches on a workload through one macro, one arm for every kind.
//! let key = cx_protocol::each_workload!(&workload, request => key_of(request));
//! fn key_of<R: cx_protocol::workload::Request>(_: &R) -> &'static str { R::KIND.key() }
//! assert_eq!(key, "request");
//! ```
//!
//! Adding a kind is adding it here: its variant in [`Workload`] and [`WorkloadKind`] (with
//! their arms in this file, [`each_workload!`] and the kind's `DeserializeSeed` among them) and [`Request`] for its request
//! type. Every party's own code for the kind is then an impl of that party's trait for the
//! request type, which the compiler asks for at each [`each_workload!`]
//! (`docs/adding-an-order-kind.md`).

use crate::matmul::MatmulRequest;
use crate::order::{B256, InferenceRequest, request_value_hash};
use crate::train::TrainRequest;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess};
use serde::{Deserialize, Serialize};

/// `match` on a [`Workload`] (or a reference to one) with the same arm for every kind, its
/// request bound to `$request`: the one list of kinds every party dispatches through, so a
/// party's code for a kind is an impl of its own trait for the kind's request type (which the
/// compiler then asks for), never an arm of its own.
#[macro_export]
macro_rules! each_workload {
    ($workload:expr, $request:ident => $body:expr) => {
        match $workload {
            $crate::workload::Workload::Inference($request) => $body,
            $crate::workload::Workload::Matmul($request) => $body,
            $crate::workload::Workload::Train($request) => $body,
        }
    };
}

/// What every workload's request is: the kind it is the request of, and its JSON.
pub trait Request: Serialize + DeserializeOwned + Into<Workload> {
    /// Its kind.
    const KIND: WorkloadKind;
}

impl Request for InferenceRequest {
    const KIND: WorkloadKind = WorkloadKind::Inference;
}

impl Request for MatmulRequest {
    const KIND: WorkloadKind = WorkloadKind::Matmul;
}

impl Request for TrainRequest {
    const KIND: WorkloadKind = WorkloadKind::Train;
}

impl From<InferenceRequest> for Workload {
    fn from(request: InferenceRequest) -> Self {
        Self::Inference(request)
    }
}

impl From<MatmulRequest> for Workload {
    fn from(request: MatmulRequest) -> Self {
        Self::Matmul(request)
    }
}

impl From<TrainRequest> for Workload {
    fn from(request: TrainRequest) -> Self {
        Self::Train(request)
    }
}

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

/// A workload's kind without its request: what the books' `workload` column holds. Ordered as
/// declared, which is [`WorkloadKind::ALL`]'s order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

    /// The kind whose request an object carries under `key` ([`Self::key`]), if any.
    pub fn by_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }

    /// Every kind's key, as a refusal lists them: `` `request`, `matmul`, `train` ``.
    pub fn keys() -> String {
        let keys: Vec<String> = Self::ALL.iter().map(|k| format!("`{}`", k.key())).collect();
        keys.join(", ")
    }
}

impl Workload {
    /// A workload as the books keep it: its kind and its request's JSON.
    pub fn from_stored(kind: WorkloadKind, request: serde_json::Value) -> serde_json::Result<Self> {
        kind.deserialize(request)
    }

    /// Its kind.
    pub fn kind(&self) -> WorkloadKind {
        fn kind_of<R: Request>(_: &R) -> WorkloadKind {
            R::KIND
        }
        crate::each_workload!(self, request => kind_of(request))
    }

    /// The request's JSON, without its key: what the books store and what is hashed.
    pub fn request_value(&self) -> serde_json::Value {
        crate::each_workload!(self, request => serde_json::to_value(request))
            .expect("a request always serializes")
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

/// A kind reads its own request: the one place a kind is mapped to its request type, for the
/// books' stored requests ([`Workload::from_stored`]) and an object's keyed value
/// (`map.next_value_seed(kind)`, as `wire::IntentSubmission` reads it).
impl<'de> DeserializeSeed<'de> for WorkloadKind {
    type Value = Workload;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Workload, D::Error> {
        fn read<'de, R: Request, D: Deserializer<'de>>(
            d: D,
        ) -> std::result::Result<Workload, D::Error> {
            R::deserialize(d).map(Into::into)
        }
        match self {
            WorkloadKind::Inference => read::<InferenceRequest, D>(d),
            WorkloadKind::Matmul => read::<MatmulRequest, D>(d),
            WorkloadKind::Train => read::<TrainRequest, D>(d),
        }
    }
}

/// A value refused whatever it is, with `reason`: how an object's visitor blames one of its keys.
struct Refuse(String);

impl<'de> DeserializeSeed<'de> for Refuse {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, _: D) -> std::result::Result<(), D::Error> {
        Err(serde::de::Error::custom(self.0))
    }
}

/// Refuses the value under an unknown key of an object whose keys are `known` and the
/// workloads': the refusal's path is that key.
pub fn refuse_unknown<'de, A: MapAccess<'de>>(
    key: &str,
    known: &[&str],
    map: &mut A,
) -> std::result::Result<(), A::Error> {
    let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
    let reason = format!(
        "unknown field `{key}`, expected {} or a workload ({})",
        known.join(", "),
        WorkloadKind::keys()
    );
    map.next_value_seed(Refuse(reason))
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
    fn kinds_round_trip_by_name() {
        for kind in WorkloadKind::ALL {
            assert_eq!(WorkloadKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(WorkloadKind::parse("search"), None);
        assert!(
            WorkloadKind::ALL.is_sorted(),
            "ALL lists the kinds in their order"
        );
    }
}
