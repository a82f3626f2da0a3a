// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Escrow} from "./Escrow.sol";
import {FrostVerifier} from "./FrostVerifier.sol";

/// @title Settlement
/// @notice The escrow of one deployment plus the gate that settles batches: a batch is accepted
/// once, only with a FROST(secp256k1, SHA-256) signature (RFC 9591) by the signer committee's
/// group key over a domain-separated batch message.
/// @dev The batch message is `batchDigest(...)`: keccak256 of the ABI encoding of
/// (BATCH_TAG, chain id, this contract, key epoch, nonce, receiptsRoot, balancesRoot, keccak256 of
/// the packed settled ranges). Chain id and address keep a signature from being replayed on
/// another chain or deployment; the strictly increasing nonce keeps it from being replayed here;
/// the key epoch keeps a batch signed under one key epoch from landing under another (a key
/// rotated away and back, or a signature a retired committee made and held back). The 32-byte digest
/// is the FROST message. A batch moves no funds: it posts the cumulative-balances root, closes the
/// settled escrows and adds their amount to `totalSettled`.
contract Settlement is Escrow {
    /// @notice Domain tag of batch messages.
    bytes32 public constant BATCH_TAG = keccak256("compute-exchange/settlement/batch/v2");
    /// @notice Domain tag of group-key rotation messages.
    bytes32 public constant ROTATE_TAG = keccak256("compute-exchange/settlement/rotate-key/v1");

    /// @notice x-coordinate of the committee's group key (its y parity lives in `batchState`).
    uint256 public groupKeyX;

    /// @param asset_ payment asset (address(0) = native ETH)
    /// @param gracePeriod_s_ seconds after a deadline before a buyer may reclaim
    /// @param groupKeyX_ x-coordinate of the initial FROST group key
    /// @param groupKeyParity_ y parity of the initial key (0 even, 1 odd: SEC1 prefix 0x02/0x03)
    constructor(address asset_, uint64 gracePeriod_s_, uint256 groupKeyX_, uint8 groupKeyParity_)
        Escrow(asset_, gracePeriod_s_)
    {
        if (!FrostVerifier.isValidKeyX(groupKeyX_) || groupKeyParity_ > 1) revert InvalidGroupKey(groupKeyX_);
        groupKeyX = groupKeyX_;
        batchState.keyParity = groupKeyParity_;
        emit GroupKeyRotated(0, groupKeyX_, groupKeyParity_);
    }

    /// @notice The message a batch's signature covers under key epoch `keyEpoch` (see the
    /// contract's notes); `settleBatch` checks it with the current epoch.
    function batchDigest(
        uint32 keyEpoch,
        uint64 nonce,
        bytes32 receiptsRoot,
        bytes32 newBalancesRoot,
        uint256[] calldata ranges
    ) public view returns (bytes32) {
        return _batchDigest(keyEpoch, nonce, receiptsRoot, newBalancesRoot, ranges);
    }

    /// @dev keccak256(abi.encode(BATCH_TAG, chainid, this, keyEpoch, nonce, receiptsRoot,
    /// balancesRoot, keccak256(abi.encodePacked(ranges)))) in assembly: the same bytes without the
    /// allocations.
    function _batchDigest(
        uint256 keyEpoch,
        uint64 nonce,
        bytes32 receiptsRoot,
        bytes32 newBalancesRoot,
        uint256[] calldata ranges
    ) internal view returns (bytes32 digest) {
        bytes32 tag = BATCH_TAG;
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            let size := shl(5, ranges.length)
            calldatacopy(ptr, ranges.offset, size)
            let rangesHash := keccak256(ptr, size)
            mstore(ptr, tag)
            mstore(add(ptr, 0x20), chainid())
            mstore(add(ptr, 0x40), address())
            mstore(add(ptr, 0x60), keyEpoch)
            mstore(add(ptr, 0x80), nonce)
            mstore(add(ptr, 0xa0), receiptsRoot)
            mstore(add(ptr, 0xc0), newBalancesRoot)
            mstore(add(ptr, 0xe0), rangesHash)
            digest := keccak256(ptr, 0x100)
        }
    }

    /// @notice The message a key rotation's signature covers: binds chain, contract, the current
    /// key epoch (so an old rotation can never be replayed) and the new key.
    function rotationDigest(uint32 epoch, uint256 newX, uint8 newParity) public view returns (bytes32) {
        return keccak256(abi.encode(ROTATE_TAG, block.chainid, address(this), epoch, newX, newParity));
    }

    /// @notice Accepts batch `nonce`: checks the committee's signature, closes the escrows in
    /// `ranges` (each `start << 64 | end`, end exclusive) as settled and posts `newBalancesRoot`.
    function settleBatch(
        uint64 nonce,
        bytes32 receiptsRoot,
        bytes32 newBalancesRoot,
        uint256[] calldata ranges,
        FrostVerifier.Signature calldata signature
    ) external {
        // batchState is read and written as one word (layout of BatchState: nonce bits 0-63,
        // keyEpoch 64-95, keyParity 96-103, live 104-111, totalSettled 112-239).
        uint256 state;
        assembly ("memory-safe") {
            state := sload(batchState.slot)
        }
        uint64 lastNonce = uint64(state);
        if (nonce <= lastNonce) revert BatchNonceNotIncreasing(nonce, lastNonce);
        bytes32 digest = _batchDigest(uint32(state >> 64), nonce, receiptsRoot, newBalancesRoot, ranges);
        if (!FrostVerifier.verify(groupKeyX, uint8(state >> 96), digest, signature)) revert InvalidSignature();
        (uint256 settledAmount,) = _settleRanges(ranges);
        // totalSettled <= totalOpened < 2^128 (every escrow is counted once), so it cannot overflow.
        uint256 totalSettled = uint128(state >> 112) + settledAmount;
        state = (state & ~(uint256(type(uint64).max) | (uint256(type(uint128).max) << 112))) | nonce
            | (totalSettled << 112);
        assembly ("memory-safe") {
            sstore(batchState.slot, state)
        }
        balancesRoot = newBalancesRoot;
        emit BatchSettled(nonce, receiptsRoot, newBalancesRoot, settledAmount);
    }

    /// @notice Replaces the group key; only with a signature by the current key over
    /// `rotationDigest(currentEpoch, newX, newParity)`.
    function rotateGroupKey(uint256 newX, uint8 newParity, FrostVerifier.Signature calldata signature) external {
        BatchState memory state = batchState;
        if (!FrostVerifier.isValidKeyX(newX) || newParity > 1) revert InvalidGroupKey(newX);
        bytes32 digest = rotationDigest(state.keyEpoch, newX, newParity);
        if (!FrostVerifier.verify(groupKeyX, state.keyParity, digest, signature)) revert InvalidSignature();
        state.keyEpoch += 1;
        state.keyParity = newParity;
        batchState = state;
        groupKeyX = newX;
        emit GroupKeyRotated(state.keyEpoch, newX, newParity);
    }

    /// @notice True iff `signature` is the current committee's signature of `digest` (used by the
    /// provider registry for slashing evidence).
    function verifyGroupSignature(bytes32 digest, FrostVerifier.Signature calldata signature)
        external
        view
        returns (bool)
    {
        return FrostVerifier.verify(groupKeyX, batchState.keyParity, digest, signature);
    }

    /// @notice The current group key: x, y parity and epoch.
    function groupKey() external view returns (uint256 x, uint8 parity, uint32 epoch) {
        BatchState memory state = batchState;
        return (groupKeyX, state.keyParity, state.keyEpoch);
    }
}
