//! The bodies of the exchange's provider door, declared once: the exchange writes them, its
//! providers and `cx-client` read them, and the other way round for what a provider sends.
//!
//! - `POST /v1/providers/register` answers [`Registered`];
//! - `POST /v1/providers/jobs` takes [`Pull`] and answers [`Pulled`], a list of [`Assignment`]s;
//! - `POST /v1/jobs/{id}/result` takes [`ResultSubmission`] (an [`Output`] and its signed receipt)
//!   and answers [`Completed`].
//!
//! And the buyer's: `POST /v1/intents` takes [`IntentSubmission`]; an intent, a door call or a
//! train order placed answers [`Accepted`];
//! `GET /v1/jobs/{id}` and `GET /v1/jobs` answer [`JobRecord`]s.
//!
//! A body a party reads is read leniently where it is another's answer (an exchange that adds a
//! field does not break a running provider) and strictly where it is a request the exchange
//! checks (`deny_unknown_fields`: a misspelt field is refused by name, never ignored).

use crate::assignment::SignedAssignment;
use crate::class::{DeterminismClass, Tier};
use crate::decision::{DecisionRecord, Terms};
use crate::error::Error;
use crate::job_status::JobStatus;
use crate::order::{Address, B256};
use crate::receipt::SignedReceipt;
use crate::train::Trained;
use crate::workload::{Workload, WorkloadKind};
use serde::{Deserialize, Serialize};

/// `POST /v1/intents`: the signed intent and the workload its `request_hash` commits to, under
/// its kind's key (`request`, `matmul` or `train`).
#[derive(Clone, Debug, PartialEq)]
pub struct IntentSubmission {
    /// The intent with both signatures.
    pub intent: crate::order::Signed<crate::order::Intent>,
    /// The workloads under their kinds' keys, as sent: exactly one is valid
    /// ([`Self::workload`]), kept as sent so that the refusal can name the key to blame.
    pub workloads: Vec<Workload>,
    /// Answer when the job is done (or its deadline passed) instead of at once with 202.
    pub wait: bool,
}

impl IntentSubmission {
    /// A submission of `workload`, answered at once (202), without `wait`.
    pub fn new(intent: crate::order::Signed<crate::order::Intent>, workload: Workload) -> Self {
        Self {
            intent,
            workloads: vec![workload],
            wait: false,
        }
    }

    /// Its one workload. None is refused naming `request`, two or more naming the later of
    /// them in the kinds' order (`request`, `matmul`, `train`).
    pub fn workload(&self) -> Result<&Workload, Error> {
        match self.workloads.as_slice() {
            [one] => Ok(one),
            many => {
                let field = many
                    .iter()
                    .map(Workload::kind)
                    .max()
                    .map_or("request", WorkloadKind::key);
                Err(Error::InvalidField {
                    field: field.to_owned(),
                    reason: format!(
                        "send exactly one workload, under one of {}: an inference, a product in \
                         the cx/matmul-f32 market or training in the cx/train/<base> market",
                        WorkloadKind::keys()
                    ),
                })
            }
        }
    }
}

impl Serialize for IntentSubmission {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("intent", &self.intent)?;
        for workload in &self.workloads {
            let key = workload.kind().key();
            crate::each_workload!(workload, request => map.serialize_entry(key, request))?;
        }
        if self.wait {
            map.serialize_entry("wait", &true)?;
        }
        map.end()
    }
}

/// Read by hand rather than derived: `deny_unknown_fields` does not combine with a flattened
/// workload, and an unknown key must still be refused by name.
impl<'de> Deserialize<'de> for IntentSubmission {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use crate::workload::refuse_unknown;
        use serde::de::{Error as _, MapAccess, Visitor};
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = IntentSubmission;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object: `intent`, a workload and `wait`")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut intent, mut workloads, mut wait) = (None, Vec::new(), None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "intent" if intent.is_none() => intent = Some(map.next_value()?),
                        "wait" if wait.is_none() => wait = Some(map.next_value()?),
                        "intent" => return Err(A::Error::duplicate_field("intent")),
                        "wait" => return Err(A::Error::duplicate_field("wait")),
                        other => match WorkloadKind::by_key(other) {
                            Some(kind) => workloads.push(map.next_value_seed(kind)?),
                            None => refuse_unknown(other, &["intent", "wait"], &mut map)?,
                        },
                    }
                }
                Ok(IntentSubmission {
                    intent: intent.ok_or_else(|| A::Error::missing_field("intent"))?,
                    workloads,
                    wait: wait.unwrap_or(false),
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

/// The API document's view of [`IntentSubmission`]: the intent, one workload flattened beside
/// it, and `wait` (the type itself keeps every workload sent, to name the one to blame).
#[cfg(feature = "openapi")]
mod intent_schema {
    use super::Workload;
    use crate::order::{Intent, Signed};

    #[derive(serde::Serialize, utoipa::ToSchema)]
    #[allow(
        dead_code,
        reason = "a schema only: never built, read by utoipa's derive"
    )]
    pub(super) struct IntentSubmission {
        /// The intent with both signatures.
        intent: Signed<Intent>,
        /// What it asks computed: the request's SHA-256 (canonical JSON) must be the intent's
        /// `request_hash`. An inference's `want` is a catalog model, a product's
        /// `cx/matmul-f32`, a training's `cx/train/<base>` (its `data` a stored dataset).
        #[serde(flatten)]
        workload: Workload,
        /// Answer when the job is done (or its deadline passed) instead of at once with 202.
        #[serde(default)]
        wait: bool,
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for IntentSubmission {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        intent_schema::IntentSubmission::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for IntentSubmission {
    fn name() -> std::borrow::Cow<'static, str> {
        "IntentSubmission".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        intent_schema::IntentSubmission::schemas(schemas);
    }
}

/// Most jobs one pull hands out.
pub const MAX_PULL_JOBS: u32 = 32;

/// Longest a pull waits for work, seconds.
pub const MAX_PULL_WAIT_S: u32 = 30;

/// A job handed to a provider: what to run, for whom, by when, and at most for how much.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Assignment {
    /// The job id (the receipt's `job_id`).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub job_id: B256,
    /// The bundle it was cleared onto.
    pub bundle_id: String,
    /// The buyer (the receipt's `buyer`).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$"))]
    pub buyer: Address,
    /// The tab's chain (the receipt's `chain_id`).
    pub chain_id: u64,
    /// The tab (the receipt's `escrow_id`).
    pub escrow_id: u64,
    /// The market: a catalog model, `cx/matmul-f32` or `cx/train/<base>`.
    pub model: String,
    /// The adapter by content id (fetch it from `GET /v1/adapters/{id}`), if any.
    #[serde(default)]
    pub adapter: Option<String>,
    /// What to compute, under its kind's key (`request`, `matmul` or `train`); the request's
    /// SHA-256 (canonical JSON) is the receipt's `input_hash`.
    #[serde(flatten)]
    pub workload: Workload,
    /// The most the receipt may claim, wei (what the job holds on the tab).
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub price_wei: u128,
    /// When the result must be in, unix seconds.
    pub deadline_s: u64,
    /// The determinism class the job was cleared for: the receipt must claim it or a stricter
    /// one (D satisfies every class, D∞ also S).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub determinism: DeterminismClass,
    /// The exchange's ML-DSA-65 signature on these terms for this provider (check it under the
    /// key `GET /v1/exchange` publishes, pinned); set when it is handed out.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub signed: Option<SignedAssignment>,
}

/// `POST /v1/providers/jobs`: a long poll for assigned jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pull {
    /// Most jobs to take (1 to [`MAX_PULL_JOBS`]).
    #[serde(default = "one")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 32))]
    pub max_jobs: u32,
    /// Seconds to wait for one when none is assigned (0 to [`MAX_PULL_WAIT_S`]).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 30))]
    pub wait_s: u32,
}

fn one() -> u32 {
    1
}

/// The jobs a pull handed out (none when the wait ran out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pulled {
    /// The jobs.
    pub jobs: Vec<Assignment>,
}

/// What a job produced, as its provider returns it and the books keep it in the job's `result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Output {
    /// The generated text.
    pub text: String,
    /// `stop` (an end token or a stop sequence) or `length` (`max_tokens` reached).
    pub finish_reason: String,
    /// Tokens of the prompt, as the provider's tokenizer counted them.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// A `cx/matmul-f32` job's product `C`: its `f32` little-endian bytes, base64 (standard
    /// alphabet, padded); the receipt's `output_hash` is SHA-256 of the bytes. Absent for
    /// inference (whose `text` is the output; a matmul job's `text` is empty, its tokens 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// A training job's adapter (stored at the exchange before the result is sent) and its
    /// losses; the receipt's `output_hash` is the adapter's content id. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained: Option<Trained>,
}

impl Output {
    /// An inference's output: its text, why it ended and its token counts.
    pub fn text(
        text: String,
        finish_reason: &str,
        prompt_tokens: u32,
        completion_tokens: u32,
    ) -> Self {
        Self {
            text,
            finish_reason: finish_reason.to_owned(),
            prompt_tokens,
            completion_tokens,
            product: None,
            trained: None,
        }
    }
}

/// `POST /v1/jobs/{id}/result`: the output and the provider's signed receipt for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultSubmission {
    /// What the job produced.
    pub output: Output,
    /// The provider's ML-DSA-signed receipt for it.
    #[cfg_attr(feature = "openapi", schema(value_type = Object, required = true))]
    pub receipt: SignedReceipt,
}

/// What the exchange did with a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Completed {
    /// What the job is charged, wei (the receipt's amount).
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub charged_wei: u128,
    /// What went back to the tab (and the session's cap), wei.
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub released_wei: u128,
    /// `done`, or `verifying` when the job is verified by replication (T1, T3) and is paid only
    /// once the majority of its runs agrees with it.
    pub status: JobStatus,
}

/// `POST /v1/providers/register`: what the exchange registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Registered {
    /// The provider's name from now on: SHA-256 of its ML-DSA-65 key.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub key_hash: B256,
    /// Its operator.
    pub operator: String,
    /// The account its receipts pay.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$"))]
    pub payout: Address,
    /// The bundles registered.
    pub bundles: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::MatmulRequest;

    #[test]
    fn an_assignment_carries_its_workload_under_the_kind_s_key() {
        let assignment = Assignment {
            job_id: B256::repeat_byte(1),
            bundle_id: "b".into(),
            buyer: Address::repeat_byte(2),
            chain_id: 31337,
            escrow_id: 4,
            model: crate::matmul::MATMUL_MODEL.into(),
            adapter: None,
            workload: Workload::Matmul(MatmulRequest {
                m: 1,
                k: 2,
                n: 3,
                seed_a: 4,
                seed_b: 5,
            }),
            price_wei: 10,
            deadline_s: 20,
            determinism: DeterminismClass::D,
            signed: None,
        };
        let json = serde_json::to_value(&assignment).unwrap();
        assert_eq!(json["matmul"]["k"], 2);
        assert!(json.get("request").is_none());
        assert_eq!(json["price_wei"], "10");
        let back: Assignment = serde_json::from_value(json).unwrap();
        assert_eq!(back, assignment);
    }

    fn submission_body(workloads: serde_json::Value) -> serde_json::Value {
        use crate::order::{self, Intent, SigningKey};
        let intent = Intent {
            want: "llama-8b".into(),
            adapter_id: None,
            request_hash: B256::repeat_byte(1),
            deadline_s: 2_000,
            max_price_wei: 5_000_000,
            market_limit: false,
            min_tier: Tier::T1,
            determinism: DeterminismClass::D,
            tab_id: 3,
            nonce: 1,
            expiry_s: 1_500,
        };
        let signed = order::sign(
            intent,
            &order::domain(31337, Address::repeat_byte(0x5e)),
            &SigningKey::from_slice(&[7; 32]).unwrap(),
            &crate::pq::Identity::from_seed([9; 32]),
        )
        .unwrap();
        let mut body = workloads;
        body["intent"] = serde_json::to_value(signed).unwrap();
        body
    }

    #[test]
    fn an_intent_submission_carries_exactly_one_workload_and_names_the_key_to_blame() {
        let matmul = MatmulRequest {
            m: 1,
            k: 2,
            n: 3,
            seed_a: 4,
            seed_b: 5,
        };
        let inference = serde_json::json!({"prompt": "hi", "max_tokens": 1});
        let read = |workloads| -> IntentSubmission {
            serde_json::from_value(submission_body(workloads)).unwrap()
        };
        let blamed = |submission: IntentSubmission| match submission.workload() {
            Err(Error::InvalidField { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        // One: read under its key, and written back the same.
        let one = read(serde_json::json!({"matmul": matmul}));
        assert_eq!(one.workload().unwrap(), &Workload::Matmul(matmul));
        let again: IntentSubmission =
            serde_json::from_value(serde_json::to_value(&one).unwrap()).unwrap();
        assert_eq!(again, one);
        // None names `request`; two name the later kind whatever their order in the body.
        assert_eq!(blamed(read(serde_json::json!({}))), "request");
        assert_eq!(
            blamed(read(
                serde_json::json!({"matmul": matmul, "request": inference})
            )),
            "matmul"
        );
        // An unknown key is refused, naming it.
        let err = serde_json::from_value::<IntentSubmission>(submission_body(
            serde_json::json!({"request": inference, "priority": 1}),
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `priority`"),
            "{err}"
        );
    }
}

/// What a job placed by intake became (`POST /v1/intents` and the other ways in answer it, 202).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Accepted {
    /// The job id (the order's EIP-712 digest).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub job_id: B256,
    /// Its state.
    pub status: JobStatus,
    /// The bundle it was cleared onto.
    pub bundle_id: String,
    /// What it holds on the tab, wei (the bundle's charge, at most the buyer's limit; with its
    /// verification runs' holds).
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub held_wei: u128,
    /// The tier the job is verified at (the intent's `min_tier`, or the first stronger one a
    /// bundle offers).
    pub tier: Tier,
    /// The chosen bundle's cost terms (the whole decision is in the job's [`JobRecord`]).
    pub terms: Terms,
    /// The verification runs placed with it (T1 and T3 re-execute the job on other providers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verification_runs: Vec<PlacedRun>,
    /// The catalog model a want naming a task (`task:<name>`, `cx/auto`) was routed to; the
    /// route's reasons are in the job's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_to: Option<String>,
}

/// What an accepted standing order became (`POST /v1/reserves`, `/v1/rents`, `/v1/searches`
/// answer it, 202).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StandingAccepted {
    /// The order's id (its EIP-712 digest): `GET /v1/orders/{id}`.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub order_id: B256,
    /// `reserve`, `rent` or `search`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: crate::order::Kind,
    /// `open` until a provider fills it; a rent is `committed` to its bundle at once.
    pub status: String,
    /// What it holds on the tab, wei: the most it can cost.
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub held_wei: u128,
    /// When it ends, unix seconds.
    pub ends_s: u64,
}

/// A verification run placed with a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlacedRun {
    /// The run's job id (derived from the job's: [`crate::replica::run_job_id`]).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub job_id: B256,
    /// Which run (1..=[`crate::replica::MAX_RUNS`]).
    pub run: u8,
    /// The bundle it was cleared onto.
    pub bundle_id: String,
    /// What it holds on the tab, wei.
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub held_wei: u128,
}

/// A job as `GET /v1/jobs/{id}` (and each entry of `GET /v1/jobs`) reports it to its buyer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobRecord {
    /// The job id.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub id: B256,
    /// The account that ordered it.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$"))]
    pub account: Address,
    /// The tab's chain.
    pub chain_id: u64,
    /// The tab's escrow id.
    pub escrow_id: u64,
    /// The model.
    pub model: String,
    /// Lifecycle state.
    pub status: JobStatus,
    /// The bundle it was cleared onto.
    #[serde(default)]
    pub bundle_id: Option<String>,
    /// What it holds on its tab, wei.
    #[serde(with = "crate::price::wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub held_wei: u128,
    /// The clearing decision.
    #[serde(default)]
    pub decision: DecisionRecord,
    /// When a result must be back, unix seconds.
    #[serde(default)]
    pub deadline_s: u64,
    /// The adapter it runs with (content id), if any.
    #[serde(default)]
    pub adapter: Option<String>,
    /// The session whose call made it, if one did (its order is that session's grant).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub session_id: Option<B256>,
    /// What the provider returned, once the buyer owes for it ([`JobRecord::output_released`]).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub result: Option<serde_json::Value>,
    /// The provider's signed receipt for the result (in `GET /v1/jobs/{id}`; lists leave it
    /// out), under the same rule as `result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub receipt: Option<SignedReceipt>,
    /// Every state it went through, in order.
    #[serde(default)]
    pub events: Vec<JobEvent>,
}

impl JobRecord {
    /// Whether its buyer may see the output: once it owes for it — the job is done, or it is a
    /// replicated job whose own provider was outvoted, which carries the majority's verified
    /// output. Never while a verdict is pending, nor for a job that ended unpaid (a buyer who
    /// stalls its own replica must not get the honest answer for free).
    pub fn output_released(&self) -> bool {
        match self.status {
            JobStatus::Done => true,
            JobStatus::Failed => self
                .events
                .iter()
                .any(|e| e.status == "verification_failed"),
            _ => false,
        }
    }

    /// A training job's result, checked against the provider's receipt: its adapter id must be
    /// the receipt's `output_hash`. `None` while the job has no trained adapter (not done, or
    /// not a train order).
    pub fn trained(&self) -> Result<Option<crate::train::Trained>, Error> {
        let Some(value) = self.result.as_ref().and_then(|r| r.get("trained")) else {
            return Ok(None);
        };
        let trained: crate::train::Trained =
            serde_json::from_value(value.clone()).map_err(|e| Error::InvalidField {
                field: "result.trained".to_owned(),
                reason: e.to_string(),
            })?;
        let receipt = self.receipt.as_ref().ok_or_else(|| Error::InvalidField {
            field: "receipt".to_owned(),
            reason: "is missing: a trained adapter is checked against it".into(),
        })?;
        if trained.output_hash()? != receipt.receipt.output_hash {
            return Err(Error::InvalidField {
                field: "receipt.output_hash".to_owned(),
                reason: "is not the trained adapter's content id".into(),
            });
        }
        Ok(Some(trained))
    }

    /// A done `cx/matmul-f32` job's product `C` (`f32` little-endian bytes), checked against its
    /// receipt: the bytes must be base64 and their SHA-256 the receipt's `output_hash`. `None`
    /// while the job has no product (not done, or not a matmul job).
    pub fn checked_product(&self) -> Result<Option<Vec<u8>>, Error> {
        use base64::Engine as _;
        let invalid = |field: &str, reason: String| Error::InvalidField {
            field: field.to_owned(),
            reason,
        };
        let Some(text) = self
            .result
            .as_ref()
            .and_then(|r| r.get("product"))
            .and_then(serde_json::Value::as_str)
        else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| invalid("result.product", format!("is not base64: {e}")))?;
        let receipt = self.receipt.as_ref().ok_or_else(|| {
            invalid(
                "receipt",
                "is missing: a product is checked against it".into(),
            )
        })?;
        if crate::matmul::product_hash(&bytes) != receipt.receipt.output_hash {
            return Err(invalid(
                "receipt.output_hash",
                "is not the SHA-256 of the returned product".into(),
            ));
        }
        Ok(Some(bytes))
    }
}

/// One state transition of a job (a [`JobStatus`], or a step beside one: `verified`,
/// `verification_failed`, `re-cleared`, `slashed`, …).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobEvent {
    /// The state entered.
    pub status: String,
    /// What came with it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub detail: serde_json::Value,
    /// When, unix milliseconds.
    pub at_ms: i64,
}
