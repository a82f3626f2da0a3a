//! Hostile committee members against the coordinator's [`Committee`]: each attack is made by a
//! signer that speaks the real protocol over the real transport (ML-KEM-768 + X25519 handshake,
//! ML-DSA-65 identities pinned, sealed frames, the `wire` requests) and deviates in one way — a
//! share that does not verify, no answer to round 2, a refusal that names a job it has no reason
//! to name.
//!
//! The members here are signers in this test process holding shares from a trusted dealer, not
//! `cx-signer` processes: a real signer's round 2 re-checks the batch against Anvil, and what is
//! under test is what the coordinator does with the answers, which are the same bytes either way.
//! (The production binary has no hostile modes; the end-to-end committee tests in cx-e2e run the
//! honest processes.)

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy::primitives::B256;
use cx_protocol::pq::{Identity, PublicIdentity};
use cx_settlement::config::Member;
use cx_settlement::coordinator::Committee;
use cx_settlement::dkg;
use cx_settlement::transport::{Channel, Directory, Limits};
use cx_settlement::wire::{Committed, Request, Response, Share, SignRotationRequest, SignerInfo};
use cx_settlement::{Error, Refusal};
use frost_secp256k1 as frost;
use tokio::net::TcpListener;

/// How a test member behaves.
#[derive(Clone, Copy, Debug)]
enum Conduct {
    /// Follows the protocol.
    Honest,
    /// Commits honestly, then signs another message than the one asked: its share does not
    /// verify (what a corrupted key package or a cheater sends).
    BadShare,
    /// Commits, then never answers round 2 (the session stays open).
    StallAtSign,
    /// Commits, then refuses round 2 naming this job, as an honest signer does when a receipt's
    /// provider is not registered.
    RefuseNaming([u8; 32]),
}

/// What a member was asked, counted.
#[derive(Debug, Default)]
struct Asked {
    commits: AtomicUsize,
    signs: AtomicUsize,
}

/// One member serving on a free port of this host.
struct TestSigner {
    index: u16,
    operator: &'static str,
    identity: Identity,
    key: frost::keys::KeyPackage,
    conduct: Conduct,
    nonces: Mutex<HashMap<B256, frost::round1::SigningNonces>>,
    asked: Arc<Asked>,
}

impl TestSigner {
    fn answer(&self, request: Request) -> Option<Response> {
        let refused = |reason: &str| Response::Refused {
            reason: reason.into(),
        };
        Some(match request {
            Request::Ping => Response::Pong,
            Request::Info => Response::Info(SignerInfo {
                index: self.index,
                operator: self.operator.into(),
                region: format!("region-{}", self.index),
                epochs: vec![0],
            }),
            Request::Commit(c) => {
                self.asked.commits.fetch_add(1, Ordering::SeqCst);
                if c.group_key != *self.key.verifying_key() {
                    return Some(refused("no share of that key"));
                }
                let (nonces, commitments) =
                    frost::round1::commit(self.key.signing_share(), &mut dkg::os_rng());
                self.nonces.lock().unwrap().insert(c.round_id, nonces);
                Response::Committed(Committed {
                    round_id: c.round_id,
                    commitments,
                })
            }
            Request::SignRotation(r) => {
                self.asked.signs.fetch_add(1, Ordering::SeqCst);
                let Some(nonces) = self.nonces.lock().unwrap().remove(&r.round_id) else {
                    return Some(refused("no commitment for that round"));
                };
                let package = match self.conduct {
                    Conduct::Honest => r.signing_package,
                    Conduct::BadShare => frost::SigningPackage::new(
                        r.signing_package.signing_commitments().clone(),
                        b"not the message asked",
                    ),
                    Conduct::StallAtSign => return None,
                    Conduct::RefuseNaming(job) => {
                        return Some(refused(&format!(
                            "receipt of job {}: provider 0x11 has not registered key 0x22",
                            hex::encode(job)
                        )));
                    }
                };
                match frost::round2::sign(&package, &nonces, &self.key) {
                    Ok(share) => Response::Share(Share {
                        round_id: r.round_id,
                        share,
                    }),
                    Err(e) => refused(&format!("FROST round 2: {e}")),
                }
            }
            _ => refused("not part of this test"),
        })
    }

    /// Serves sessions from `coordinator` on `listener` until the test ends.
    async fn serve(self: Arc<Self>, listener: TcpListener, coordinator: PublicIdentity) {
        let directory: Directory = [(coordinator.id(), coordinator)].into();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let me = self.clone();
            let directory = directory.clone();
            tokio::spawn(async move {
                let Ok(mut channel) =
                    Channel::accept(stream, &me.identity, &directory, Limits::default()).await
                else {
                    return;
                };
                while let Ok(request) = channel.recv::<Request>().await {
                    match me.answer(request) {
                        Some(response) => {
                            if channel.send(&response).await.is_err() {
                                return;
                            }
                        }
                        // Holds the session open and says nothing, as a stalled process does.
                        None => std::future::pending::<()>().await,
                    }
                }
            });
        }
    }
}

/// A committee of members of `operators` (index 1 first) behaving as `conduct`, any `t` of which
/// sign with at least `k` operators, under a key dealt to them; what each was asked.
struct Bench {
    committee: Committee,
    public: frost::keys::PublicKeyPackage,
    asked: Vec<Arc<Asked>>,
}

impl Bench {
    async fn start(operators: &[&'static str], conduct: &[Conduct], t: u16, k: usize) -> Bench {
        let n = operators.len() as u16;
        let ids: Vec<frost::Identifier> = (1..=n).map(|i| dkg::identifier(i).unwrap()).collect();
        let (shares, public) = frost::keys::generate_with_dealer(
            n,
            t,
            frost::keys::IdentifierList::Custom(&ids),
            dkg::os_rng(),
        )
        .unwrap();
        let coordinator = Identity::generate();
        let mut members = Vec::new();
        let mut asked = Vec::new();
        for index in 1..=n {
            let share = shares[&dkg::identifier(index).unwrap()].clone();
            let identity = Identity::generate();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            members.push(Member {
                index,
                address: listener.local_addr().unwrap().to_string(),
                verification_key: identity.public().to_bytes().to_vec(),
                operator: operators[index as usize - 1].into(),
                region: format!("region-{index}"),
            });
            let signer = Arc::new(TestSigner {
                index,
                operator: operators[index as usize - 1],
                identity,
                key: frost::keys::KeyPackage::try_from(share).unwrap(),
                conduct: conduct[index as usize - 1],
                nonces: Mutex::new(HashMap::new()),
                asked: Arc::default(),
            });
            asked.push(signer.asked.clone());
            tokio::spawn(signer.serve(listener, coordinator.public()));
        }
        let committee = Committee::new(Arc::new(coordinator), members, t, k)
            .unwrap()
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(2));
        Bench {
            committee,
            public,
            asked,
        }
    }

    /// Has the committee sign `message` (as a rotation request: the test members check nothing).
    async fn sign(&self, message: &[u8]) -> cx_settlement::Result<frost::Signature> {
        self.committee
            .sign(message, &self.public, |round_id, signing_package| {
                Request::SignRotation(SignRotationRequest {
                    round_id,
                    chain_id: 31337,
                    new_epoch: 1,
                    signing_package,
                })
            })
            .await
    }

    fn signs_asked_of(&self, index: u16) -> usize {
        self.asked[index as usize - 1].signs.load(Ordering::SeqCst)
    }

    fn commits_asked_of(&self, index: u16) -> usize {
        self.asked[index as usize - 1]
            .commits
            .load(Ordering::SeqCst)
    }
}

use Conduct::{BadShare, Honest, RefuseNaming, StallAtSign};

const OPERATORS: [&str; 5] = ["a", "a", "b", "b", "c"];

/// What broke: aggregation failed on the cheater's share and `sign` returned that error at once,
/// naming no one; the next settlement pass chose the same set (signer 1 is in the first choice),
/// so one member stopped every signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_sending_a_bad_share_is_named_and_left_out_and_the_rest_sign() {
    let bench = Bench::start(
        &OPERATORS,
        &[BadShare, Honest, Honest, Honest, Honest],
        3,
        2,
    )
    .await;
    let signature = bench
        .sign(b"batch 1")
        .await
        .expect("the honest members sign");
    assert!(
        bench
            .public
            .verifying_key()
            .verify(b"batch 1", &signature)
            .is_ok()
    );
    let signers = bench.committee.last_signers();
    assert!(!signers.contains(&1), "{signers:?}");
    let cooling = bench.committee.cooling_down();
    assert!(
        matches!(&cooling[..], [(1, why)] if why.contains("does not verify")),
        "the cheater is named: {cooling:?}"
    );
    let left_out = bench.committee.last_left_out();
    assert!(
        matches!(&left_out[..], [(1, why)] if why.contains("does not verify")),
        "for the record: {left_out:?}"
    );
    // The next signing does not start with it again.
    let asked = bench.commits_asked_of(1);
    bench.sign(b"batch 2").await.expect("signed again");
    assert_eq!(
        bench.commits_asked_of(1),
        asked,
        "the cheater was asked again"
    );
    assert!(!bench.committee.last_signers().contains(&1));
}

/// What broke: a member that commits and then never answers round 2 cost a dropped round; the
/// set chosen next was the same (the choice was deterministic), so three rounds were lost and the
/// signing failed, and the next settlement pass started with the same set again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalling_signer_does_not_stop_signing() {
    let bench = Bench::start(
        &OPERATORS,
        &[StallAtSign, Honest, Honest, Honest, Honest],
        3,
        2,
    )
    .await;
    bench
        .sign(b"batch 1")
        .await
        .expect("the members that answer sign");
    assert!(!bench.committee.last_signers().contains(&1));
    assert_eq!(bench.signs_asked_of(1), 1, "asked once, then left out");
    assert!(
        matches!(&bench.committee.cooling_down()[..], [(1, why)] if why.contains("dropped out")),
        "{:?}",
        bench.committee.cooling_down()
    );
    // Cooled down: the next pass signs without waiting on it (2 s is its round-2 limit).
    let started = Instant::now();
    bench.sign(b"batch 2").await.expect("signed again");
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "waited on the staller"
    );
    assert_eq!(bench.signs_asked_of(1), 1);
}

/// One refusal is one signer's word: it is left out and the others sign. (A refusal used to be
/// acted on by the exchange whatever its author; see cx-server's
/// `one_lying_signer_cannot_drop_a_job_from_settlement`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_refusing_a_good_batch_is_left_out_and_the_rest_sign() {
    let bench = Bench::start(
        &OPERATORS,
        &[RefuseNaming([7; 32]), Honest, Honest, Honest, Honest],
        3,
        2,
    )
    .await;
    bench.sign(b"batch 1").await.expect("the others sign");
    assert!(!bench.committee.last_signers().contains(&1));
    // Recorded with its reason, and not cooled down: a refusal concerns one message.
    let left_out = bench.committee.last_left_out();
    assert!(
        matches!(&left_out[..], [(1, why)] if why.contains(&hex::encode([7; 32]))),
        "{left_out:?}"
    );
    assert!(bench.committee.cooling_down().is_empty());
}

/// When no set can sign, the refusals come back one per signer, and every member that answers
/// has been heard first: the liar's claim (job 7…) stands alone, the reason the honest members
/// give (job 9…) is given by four — enough for the exchange's t-agreement rule. Before, the
/// committee stopped after the first set (three signers), so a reason only two honest members
/// gave could never reach t while the liar sat in that set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_is_heard_before_a_refusal_is_returned_and_each_refusal_stays_apart() {
    let (lie, bad) = ([7; 32], [9; 32]);
    let bench = Bench::start(
        &OPERATORS,
        &[
            RefuseNaming(lie),
            RefuseNaming(bad),
            RefuseNaming(bad),
            RefuseNaming(bad),
            RefuseNaming(bad),
        ],
        3,
        2,
    )
    .await;
    let err = bench.sign(b"batch 1").await.unwrap_err();
    let Error::Refused { refusals } = &err else {
        panic!("{err}");
    };
    let by_signer: BTreeMap<u16, &str> = refusals
        .iter()
        .map(|Refusal { signer, reason }| (*signer, reason.as_str()))
        .collect();
    assert_eq!(by_signer.len(), 5, "{err}");
    assert!(by_signer[&1].contains(&hex::encode(lie)));
    for i in 2..=5 {
        assert!(by_signer[&i].contains(&hex::encode(bad)), "{err}");
    }
}

/// A liar that cannot be avoided (3 of 3) still only speaks for itself: the error carries its
/// refusal alone, the two others having approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_liar_no_set_can_avoid_is_returned_alone() {
    let bench = Bench::start(
        &["a", "b", "c"],
        &[RefuseNaming([7; 32]), Honest, Honest],
        3,
        2,
    )
    .await;
    let err = bench.sign(b"batch 1").await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused { refusals } if refusals.len() == 1 && refusals[0].signer == 1),
        "{err}"
    );
}
