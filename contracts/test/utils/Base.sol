// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Vm} from "./Vm.sol";
import {FrostVerifier} from "../../src/FrostVerifier.sol";

/// @notice Shared test plumbing: the cheatcode handle, `bound`, a Schnorr signer whose signatures
/// are RFC 9591 FROST signatures (a FROST signature is a Schnorr signature (R, z) with
/// z = k + c·x; a single signer holding x produces exactly what t-of-n signers aggregate to), and a
/// Merkle tree builder matching the contract's (and the Rust crate's) convention.
abstract contract Base {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));
    uint256 internal constant N = FrostVerifier.N;

    /// @dev Clamps x into [min, max] (uniform enough for fuzzing).
    function bound(uint256 x, uint256 min, uint256 max) internal pure returns (uint256) {
        if (min == max) return min;
        return min + (x % (max - min + 1));
    }

    /// @dev The group key (x, parity) of secret `secret`.
    function keyOf(uint256 secret) internal returns (uint256 x, uint8 parity) {
        Vm.Wallet memory w = vm.createWallet(secret);
        return (w.publicKeyX, uint8(w.publicKeyY & 1));
    }

    /// @dev Signs `message` with `secret` using deterministic nonce derived from (secret, message).
    function schnorrSign(uint256 secret, bytes32 message) internal returns (FrostVerifier.Signature memory sig) {
        (uint256 pkX, uint8 pkParity) = keyOf(secret);
        uint256 k = uint256(keccak256(abi.encode("nonce", secret, message))) % (N - 1) + 1;
        Vm.Wallet memory r = vm.createWallet(k);
        uint256 c = FrostVerifier.challenge(pkX, pkParity, r.publicKeyX, r.publicKeyY, message);
        sig = FrostVerifier.Signature({rX: r.publicKeyX, rY: r.publicKeyY, z: addmod(k, mulmod(c, secret, N), N)});
    }

    /// @dev Leaf of the cumulative-balances tree (see Escrow.balanceLeaf).
    function leafOf(address party, uint256 cumulative) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(party, cumulative))));
    }

    function hashPair(bytes32 a, bytes32 b) internal pure returns (bytes32) {
        return a < b ? keccak256(abi.encode(a, b)) : keccak256(abi.encode(b, a));
    }

    /// @dev Root of `leaves`: pairs hashed sorted, an odd last node promoted unchanged.
    function merkleRoot(bytes32[] memory leaves) internal pure returns (bytes32) {
        require(leaves.length > 0, "empty tree");
        bytes32[] memory level = leaves;
        while (level.length > 1) {
            bytes32[] memory next = new bytes32[]((level.length + 1) / 2);
            for (uint256 i = 0; i < next.length; ++i) {
                next[i] = 2 * i + 1 < level.length ? hashPair(level[2 * i], level[2 * i + 1]) : level[2 * i];
            }
            level = next;
        }
        return level[0];
    }

    /// @dev Proof of leaf `index` (siblings bottom-up; promoted levels add nothing).
    function merkleProof(bytes32[] memory leaves, uint256 index) internal pure returns (bytes32[] memory proof) {
        bytes32[] memory buffer = new bytes32[](64);
        uint256 count = 0;
        bytes32[] memory level = leaves;
        while (level.length > 1) {
            uint256 sibling = index ^ 1;
            if (sibling < level.length) buffer[count++] = level[sibling];
            bytes32[] memory next = new bytes32[]((level.length + 1) / 2);
            for (uint256 i = 0; i < next.length; ++i) {
                next[i] = 2 * i + 1 < level.length ? hashPair(level[2 * i], level[2 * i + 1]) : level[2 * i];
            }
            level = next;
            index /= 2;
        }
        proof = new bytes32[](count);
        for (uint256 i = 0; i < count; ++i) proof[i] = buffer[i];
    }

    /// @dev A range of job ids [start, end) packed as the contract expects.
    function range(uint64 start, uint64 end) internal pure returns (uint256) {
        return (uint256(start) << 64) | end;
    }
}
