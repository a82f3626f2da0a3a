//! The committee's post-quantum sessions: the handshake and the sealed frames after it.

use std::cell::RefCell;

use cx_protocol::pq::{Initiator, Responder, Session};
use cx_settlement::transport::Limits;
use cx_settlement::wire::{Request, Response};

use crate::assert_json_round_trip;
use crate::fixtures::{fixtures, frames, initiator_limits, responder_limits};

/// Handshake frames as they come off a socket (4-byte big-endian length, body), read with the
/// transport's own `read_frame` under the limits `Channel` reads them with. The first byte picks
/// who reads them:
///
/// - 0: a signer (responder) reads M1 from the first frame, answers, then reads M3 from the
///   second;
/// - 1: the coordinator (initiator) has sent a genuine M1 and reads M2 from the first frame;
/// - 2: a signer has read a genuine M1 and reads M3 from the first frame.
///
/// Asserts: nothing panics; no bytes fixed before the session's fresh randomness existed open a
/// session (M2 and M3 sign a transcript that includes the other side's ephemeral keys).
pub fn pq_handshake(data: &[u8]) {
    let fx = fixtures();
    let Some((&who, rest)) = data.split_first() else {
        return;
    };
    let directory = |id: &cx_protocol::pq::IdentityId| {
        (*id == fx.coordinator.id()).then(|| fx.coordinator.public())
    };
    match who % 3 {
        0 => {
            let frames = frames(rest, &responder_limits());
            let Some(m1) = frames.first() else {
                return;
            };
            let Ok((responder, _m2)) = Responder::respond(&fx.signer, directory, m1) else {
                return;
            };
            if let Some(m3) = frames.get(1) {
                assert!(
                    responder.finish(m3).is_err(),
                    "a forged M3 opened a session"
                );
            }
        }
        1 => {
            let (initiator, _m1) = Initiator::start(&fx.coordinator, fx.signer.public());
            if let Some(m2) = frames(rest, &initiator_limits()).first() {
                assert!(
                    initiator.finish(m2).is_err(),
                    "a forged M2 opened a session"
                );
            }
        }
        _ => {
            let (_initiator, m1) = Initiator::start(&fx.coordinator, fx.signer.public());
            let (responder, _m2) =
                Responder::respond(&fx.signer, directory, &m1).expect("a genuine M1 is answered");
            if let Some(m3) = frames(rest, &responder_limits()).first() {
                assert!(
                    responder.finish(m3).is_err(),
                    "a forged M3 opened a session"
                );
            }
        }
    }
}

/// Frames on an established session (a real handshake between the coordinator and a signer),
/// as a signer reads them: `read_frame` under the default limits, then `Session::open`, then
/// the JSON of a `wire::Request` (and of a `wire::Response`, what the coordinator reads).
///
/// Each frame's bytes are used twice: as a sealed frame itself, which must not open (and must not
/// move the session: a genuine frame still opens after it), and as the plaintext the peer seals,
/// which must open to exactly those bytes and is then decoded as the signer decodes it.
///
/// Asserts: nothing panics; forged frames never open; genuine frames always do, in order;
/// requests and responses that decode re-encode and decode to the same JSON.
pub fn pq_frames(data: &[u8]) {
    thread_local! {
        static PAIR: RefCell<Option<(Session, Session)>> = const { RefCell::new(None) };
    }
    PAIR.with(|pair| {
        let mut pair = pair.borrow_mut();
        let (coordinator, signer) = pair.get_or_insert_with(established);
        for frame in frames(data, &Limits::default()) {
            assert!(
                signer.open(&frame).is_err(),
                "a frame the peer never sealed opened"
            );
            let sealed = coordinator.seal(&frame).expect("a frame seals");
            let opened = signer
                .open(&sealed)
                .expect("a frame the peer sealed opens after a refused one");
            assert_eq!(opened, frame, "a frame opens to other bytes");
            if let Ok(request) = serde_json::from_slice::<Request>(&opened) {
                assert_json_round_trip(&request, "wire::Request");
            }
            if let Ok(response) = serde_json::from_slice::<Response>(&opened) {
                assert_json_round_trip(&response, "wire::Response");
            }
        }
    });
}

/// A session pair from a genuine handshake: (coordinator's end, signer's end).
fn established() -> (Session, Session) {
    let fx = fixtures();
    let directory = |id: &cx_protocol::pq::IdentityId| {
        (*id == fx.coordinator.id()).then(|| fx.coordinator.public())
    };
    let (initiator, m1) = Initiator::start(&fx.coordinator, fx.signer.public());
    let (responder, m2) = Responder::respond(&fx.signer, directory, &m1).expect("M1 is answered");
    let (coordinator, m3) = initiator.finish(&m2).expect("M2 is accepted");
    let signer = responder.finish(&m3).expect("M3 is accepted");
    (coordinator, signer)
}
