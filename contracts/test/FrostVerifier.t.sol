// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Base} from "./utils/Base.sol";
import {FrostVerifier} from "../src/FrostVerifier.sol";

/// @notice External wrapper so calldata signatures can be passed to the library.
contract FrostHarness {
    function verify(uint256 pkX, uint8 pkParity, bytes32 message, FrostVerifier.Signature calldata sig)
        external
        view
        returns (bool)
    {
        return FrostVerifier.verify(pkX, pkParity, message, sig);
    }

    function challenge(uint256 pkX, uint8 pkParity, uint256 rX, uint256 rY, bytes32 message)
        external
        view
        returns (uint256)
    {
        return FrostVerifier.challenge(pkX, pkParity, rX, rY, message);
    }

    function isValidKeyX(uint256 x) external view returns (bool) {
        return FrostVerifier.isValidKeyX(x);
    }
}

/// @notice FrostVerifier against signatures made by the Rust `frost-secp256k1` crate (fixtures
/// written by `settlement/tests/it/fixtures.rs`) and against fuzzed Schnorr signatures.
contract FrostVerifierTest is Base {
    FrostHarness internal harness;
    string internal fixtures;

    function setUp() public {
        harness = new FrostHarness();
        fixtures = vm.readFile(string.concat(vm.projectRoot(), "/test/fixtures/frost.json"));
    }

    /// Every fixture case (valid, tampered z, tampered R, wrong key, wrong message) gives the
    /// verdict frost-secp256k1 gave, and the challenge matches the crate's for valid cases.
    function test_FixturesFromFrostCrate() public view {
        string[] memory names = vm.parseJsonKeys(fixtures, ".cases");
        vm.assertTrue(names.length >= 5, "fixture file has too few cases");
        uint256 valid = 0;
        for (uint256 i = 0; i < names.length; ++i) {
            string memory p = string.concat(".cases.", names[i]);
            FrostVerifier.Signature memory sig = FrostVerifier.Signature({
                rX: vm.parseJsonUint(fixtures, string.concat(p, ".r_x")),
                rY: vm.parseJsonUint(fixtures, string.concat(p, ".r_y")),
                z: vm.parseJsonUint(fixtures, string.concat(p, ".z"))
            });
            uint256 pkX = vm.parseJsonUint(fixtures, string.concat(p, ".key_x"));
            uint8 parity = uint8(vm.parseJsonUint(fixtures, string.concat(p, ".key_parity")));
            bytes32 message = vm.parseJsonBytes32(fixtures, string.concat(p, ".message"));
            bool expected = vm.parseJsonBool(fixtures, string.concat(p, ".valid"));
            vm.assertEq(harness.verify(pkX, parity, message, sig), expected, names[i]);
            if (expected) {
                ++valid;
                uint256 c = vm.parseJsonUint(fixtures, string.concat(p, ".challenge"));
                vm.assertEq(harness.challenge(pkX, parity, sig.rX, sig.rY, message), c, "challenge");
            }
        }
        vm.assertTrue(valid >= 1, "no valid case");
    }

    function testFuzz_SignedMessageVerifies(uint256 secret, bytes32 message) public {
        secret = bound(secret, 1, N - 1);
        (uint256 x, uint8 parity) = keyOf(secret);
        vm.assume(x < N);
        FrostVerifier.Signature memory sig = schnorrSign(secret, message);
        vm.assertTrue(harness.verify(x, parity, message, sig));
    }

    function testFuzz_OtherMessageFails(uint256 secret, bytes32 message, bytes32 other) public {
        vm.assume(message != other);
        secret = bound(secret, 1, N - 1);
        (uint256 x, uint8 parity) = keyOf(secret);
        FrostVerifier.Signature memory sig = schnorrSign(secret, message);
        vm.assertFalse(harness.verify(x, parity, other, sig));
    }

    function testFuzz_TamperedZFails(uint256 secret, bytes32 message, uint256 delta) public {
        secret = bound(secret, 1, N - 1);
        delta = bound(delta, 1, N - 1);
        (uint256 x, uint8 parity) = keyOf(secret);
        FrostVerifier.Signature memory sig = schnorrSign(secret, message);
        sig.z = addmod(sig.z, delta, N);
        vm.assertFalse(harness.verify(x, parity, message, sig));
    }

    function testFuzz_WrongParityFails(uint256 secret, bytes32 message) public {
        secret = bound(secret, 1, N - 1);
        (uint256 x, uint8 parity) = keyOf(secret);
        FrostVerifier.Signature memory sig = schnorrSign(secret, message);
        vm.assertFalse(harness.verify(x, parity ^ 1, message, sig));
    }

    function test_ZOutOfRangeFails() public {
        (uint256 x, uint8 parity) = keyOf(7);
        FrostVerifier.Signature memory sig = schnorrSign(7, bytes32("m"));
        // Same residue where it fits, else the largest word: either way not a canonical scalar.
        unchecked {
            sig.z = sig.z + N > sig.z ? sig.z + N : type(uint256).max;
        }
        vm.assertFalse(harness.verify(x, parity, bytes32("m"), sig));
    }

    /// A commitment R that differs from the signer's in y alone (same x, same parity, so the same
    /// challenge) is not the signer's point: the address check refuses it.
    function test_RWithOtherYFails() public {
        (uint256 x, uint8 parity) = keyOf(7);
        FrostVerifier.Signature memory sig = schnorrSign(7, bytes32("m"));
        sig.rY = addmod(sig.rY, 2, FrostVerifier.P);
        vm.assertFalse(harness.verify(x, parity, bytes32("m"), sig));
    }

    /// What broke: R's coordinates were range-checked but never checked against y² = x³ + 7, so an
    /// attacker could pick rY freely (the challenge reads only its parity) and turn the address
    /// comparison into a ~2^80 birthday search with no key. The mock stands in for the search's
    /// success: ecrecover returns exactly address(rX ‖ rY) for an off-curve rY, and every other
    /// check passes, so only the curve equation can refuse it.
    function test_ROffCurveRefusedEvenWhenAddressMatches() public {
        (uint256 x, uint8 parity) = keyOf(7);
        FrostVerifier.Signature memory sig = schnorrSign(7, bytes32("m"));
        // Same parity, same x: the challenge is unchanged; (rX, rY + 2) is off the curve since the
        // only points with x = rX have y = rY or p − rY (other parity).
        sig.rY = addmod(sig.rY, 2, FrostVerifier.P);
        vm.assertFalse(FrostVerifier.isOnCurve(sig.rX, sig.rY), "chosen R is on the curve");
        address forged = address(uint160(uint256(keccak256(abi.encode(sig.rX, sig.rY)))));
        vm.mockCall(address(1), "", abi.encode(forged));
        vm.assertFalse(harness.verify(x, parity, bytes32("m"), sig), "off-curve R accepted");
        // Control: with the mock answering for an on-curve R, the same path accepts, so the refusal
        // above is the curve check's and nothing else's.
        FrostVerifier.Signature memory honest = schnorrSign(7, bytes32("m"));
        vm.mockCall(
            address(1), "", abi.encode(address(uint160(uint256(keccak256(abi.encode(honest.rX, honest.rY))))))
        );
        vm.assertTrue(harness.verify(x, parity, bytes32("m"), honest), "control refused");
        vm.clearMockedCalls();
    }

    /// (0, 0) — what an encoding of the identity could decode to — is not on the curve.
    function test_RZeroRefused() public {
        (uint256 x, uint8 parity) = keyOf(7);
        FrostVerifier.Signature memory sig = schnorrSign(7, bytes32("m"));
        sig.rX = 0;
        sig.rY = 0;
        vm.mockCall(address(1), "", abi.encode(address(uint160(uint256(keccak256(abi.encode(0, 0)))))));
        vm.assertFalse(harness.verify(x, parity, bytes32("m"), sig));
        vm.clearMockedCalls();
    }

    function test_IsValidKeyX() public {
        (uint256 x,) = keyOf(12345);
        vm.assertTrue(harness.isValidKeyX(x));
        vm.assertFalse(harness.isValidKeyX(0));
        vm.assertFalse(harness.isValidKeyX(N));
        // x = 5: 5³ + 7 = 132 is not a square mod p (no point has x = 5).
        vm.assertFalse(harness.isValidKeyX(5));
    }
}
