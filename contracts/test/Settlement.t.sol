// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Deployment} from "./utils/Deployment.sol";
import {ISettlement, IEscrow} from "../src/interfaces/IEscrow.sol";
import {FrostVerifier} from "../src/FrostVerifier.sol";
import {Settlement} from "../src/Settlement.sol";

/// @notice Settlement: batches (acceptance, replay, nonce order, signature, ranges) and group-key
/// rotation.
contract SettlementTest is Deployment {
    function _openMany(uint256 count) internal {
        depositAs(BUYER, count * 10);
        for (uint256 i = 0; i < count; ++i) {
            openAs(BUYER, 10, uint64(block.timestamp + 1000));
        }
    }

    function test_SettleBatch() public {
        _openMany(300);
        uint256[] memory ranges = new uint256[](2);
        ranges[0] = range(0, 10);
        ranges[1] = range(250, 300); // spans two bitmap words
        bytes32 root = bytes32(uint256(42));
        bytes32 receipts = keccak256(abi.encode("receipts", uint64(1)));
        vm.expectEmit(address(settlement));
        emit ISettlement.BatchSettled(1, receipts, root, 600);
        settle(1, root, ranges);
        (uint64 nonce,,,, uint128 totalSettled) = settlement.batchState();
        vm.assertEq(nonce, 1);
        vm.assertEq(totalSettled, 600);
        vm.assertEq(settlement.balancesRoot(), root);
        vm.assertFalse(settlement.isOpen(0));
        vm.assertFalse(settlement.isOpen(9));
        vm.assertTrue(settlement.isOpen(10));
        vm.assertTrue(settlement.isOpen(249));
        vm.assertFalse(settlement.isOpen(250));
        vm.assertFalse(settlement.isOpen(299));
    }

    function test_RevertWhen_BatchReplayed() public {
        _openMany(2);
        bytes32 receipts = bytes32("r");
        uint256[] memory ranges = one(range(0, 1));
        FrostVerifier.Signature memory sig = signBatch(1, receipts, bytes32("b"), ranges);
        settlement.settleBatch(1, receipts, bytes32("b"), ranges, sig);
        vm.expectRevert(abi.encodeWithSelector(ISettlement.BatchNonceNotIncreasing.selector, 1, 1));
        settlement.settleBatch(1, receipts, bytes32("b"), ranges, sig);
        (,,,, uint128 totalSettled) = settlement.batchState();
        vm.assertEq(totalSettled, 10);
    }

    function test_RevertWhen_NonceGoesBack() public {
        _openMany(2);
        settle(5, bytes32("b"), one(range(0, 1)));
        bytes32 receipts = bytes32("r");
        uint256[] memory ranges = one(range(1, 2));
        FrostVerifier.Signature memory sig = signBatch(4, receipts, bytes32("c"), ranges);
        vm.expectRevert(abi.encodeWithSelector(ISettlement.BatchNonceNotIncreasing.selector, 4, 5));
        settlement.settleBatch(4, receipts, bytes32("c"), ranges, sig);
        vm.assertTrue(settlement.isOpen(1));
    }

    function test_RevertWhen_SignatureByOtherKey() public {
        _openMany(1);
        uint256[] memory ranges = one(range(0, 1));
        bytes32 digest = settlement.batchDigest(0, 1, bytes32("r"), bytes32("b"), ranges);
        FrostVerifier.Signature memory sig = schnorrSign(GROUP_SECRET + 1, digest);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, sig);
        vm.assertTrue(settlement.isOpen(0));
        vm.assertEq(settlement.balancesRoot(), settlement.NO_BALANCES_ROOT());
    }

    /// The signature binds every field: changing the root, the ranges, or the chain breaks it.
    function test_RevertWhen_SignedFieldsChanged() public {
        _openMany(3);
        uint256[] memory ranges = one(range(0, 2));
        FrostVerifier.Signature memory sig = signBatch(1, bytes32("r"), bytes32("b"), ranges);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("X"), ranges, sig);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), one(range(0, 3)), sig);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(2, bytes32("r"), bytes32("b"), ranges, sig);
        vm.chainId(31338);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, sig);
        vm.assertTrue(settlement.isOpen(0));
    }

    function test_RevertWhen_JobSettledTwice() public {
        _openMany(4);
        settle(1, bytes32("b"), one(range(0, 2)));
        uint256[] memory ranges = one(range(1, 4));
        bytes32 receipts = keccak256(abi.encode("receipts", uint64(2)));
        FrostVerifier.Signature memory sig = signBatch(2, receipts, bytes32("c"), ranges);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 1));
        settlement.settleBatch(2, receipts, bytes32("c"), ranges, sig);
        vm.assertTrue(settlement.isOpen(2));
        (,,,, uint128 totalSettled) = settlement.batchState();
        vm.assertEq(totalSettled, 20);
    }

    function test_RevertWhen_JobReclaimedThenSettled() public {
        _openMany(1);
        vm.warp(block.timestamp + 1000 + GRACE_S + 1);
        vm.prank(BUYER);
        settlement.reclaim(0);
        uint256[] memory ranges = one(range(0, 1));
        FrostVerifier.Signature memory sig = signBatch(1, bytes32("r"), bytes32("b"), ranges);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 0));
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, sig);
        vm.assertEq(settlement.balanceOf(BUYER), 10);
    }

    /// Reclaim versus settle, in either order within one block after the reclaim time: whichever
    /// comes first closes the escrow, and the other reverts without moving anything.
    function test_ReclaimAndSettleInOneBlockOnlyTheFirstWins() public {
        _openMany(2);
        vm.warp(block.timestamp + 1000 + GRACE_S + 1);
        // Settle first: the reclaim of that escrow reverts.
        settle(1, bytes32("b1"), one(range(0, 1)));
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 0));
        settlement.reclaim(0);
        // Reclaim first: the batch naming that escrow reverts, whole.
        vm.prank(BUYER);
        settlement.reclaim(1);
        uint256[] memory ranges = one(range(1, 2));
        FrostVerifier.Signature memory sig = signBatch(2, bytes32("r"), bytes32("b2"), ranges);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 1));
        settlement.settleBatch(2, bytes32("r"), bytes32("b2"), ranges, sig);
        vm.assertEq(settlement.balanceOf(BUYER), 10, "the reclaimed escrow, once");
        (uint64 nonce,,,, uint128 settled) = settlement.batchState();
        vm.assertEq(nonce, 1);
        vm.assertEq(settled, 10, "only the settled escrow");
    }

    /// A reclaim between signing and mining (the race the signers' replacement rule answers):
    /// the signed batch reverts whole and can never land, and a replacement at the same nonce
    /// without the reclaimed escrow settles the rest.
    function test_ReplacementAtTheSameNonceSettlesTheRestAfterAReclaim() public {
        depositAs(BUYER, 30);
        openAs(BUYER, 10, uint64(block.timestamp + 100));
        openAs(BUYER, 10, uint64(block.timestamp + 5000));
        openAs(BUYER, 10, uint64(block.timestamp + 5000));
        uint256[] memory all = one(range(0, 3));
        FrostVerifier.Signature memory signed = signBatch(1, bytes32("r"), bytes32("b"), all);
        vm.warp(block.timestamp + 100 + GRACE_S + 1);
        vm.prank(BUYER);
        settlement.reclaim(0);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 0));
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), all, signed);
        vm.assertTrue(settlement.isOpen(1) && settlement.isOpen(2), "nothing of it settled");
        uint256[] memory rest = one(range(1, 3));
        settlement.settleBatch(1, bytes32("r2"), bytes32("b2"), rest, signBatch(1, bytes32("r2"), bytes32("b2"), rest));
        vm.assertFalse(settlement.isOpen(1) || settlement.isOpen(2));
        // The first digest stays dead: its nonce is taken, and its escrow closed for good.
        vm.expectRevert(abi.encodeWithSelector(ISettlement.BatchNonceNotIncreasing.selector, 1, 1));
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), all, signed);
    }

    function test_RevertWhen_JobNeverOpened() public {
        _openMany(1);
        uint256[] memory ranges = one(range(0, 2));
        FrostVerifier.Signature memory sig = signBatch(1, bytes32("r"), bytes32("b"), ranges);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, 1));
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, sig);
    }

    function test_RevertWhen_RangeEmpty() public {
        _openMany(1);
        uint256[] memory ranges = one(range(1, 1));
        FrostVerifier.Signature memory sig = signBatch(1, bytes32("r"), bytes32("b"), ranges);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.InvalidRange.selector, 1, 1));
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, sig);
    }

    function testFuzz_SettleRangeSumsAmounts(uint256 seed, uint256 start, uint256 len) public {
        uint256 count = 40;
        depositAs(BUYER, 1_000_000e6);
        uint256[] memory amounts = new uint256[](count);
        for (uint256 i = 0; i < count; ++i) {
            amounts[i] = bound(uint256(keccak256(abi.encode(seed, i))), 1, 1000e6);
            openAs(BUYER, uint128(amounts[i]), uint64(block.timestamp + 1000));
        }
        start = bound(start, 0, count - 1);
        len = bound(len, 1, count - start);
        uint256 expected = 0;
        for (uint256 i = start; i < start + len; ++i) {
            expected += amounts[i];
        }
        settle(1, bytes32("b"), one(range(uint64(start), uint64(start + len))));
        (,,,, uint128 totalSettled) = settlement.batchState();
        vm.assertEq(totalSettled, expected);
    }

    function test_RotateGroupKey() public {
        (uint256 newX, uint8 newParity) = keyOf(0xBEEF);
        FrostVerifier.Signature memory sig = schnorrSign(GROUP_SECRET, settlement.rotationDigest(0, newX, newParity));
        vm.expectEmit(address(settlement));
        emit ISettlement.GroupKeyRotated(1, newX, newParity);
        settlement.rotateGroupKey(newX, newParity, sig);
        _checkKey(newX, newParity, 1);
        // The old key no longer settles; the new one does.
        _openMany(2);
        uint256[] memory ranges = one(range(0, 1));
        bytes32 digest = settlement.batchDigest(1, 1, bytes32("r"), bytes32("b"), ranges);
        FrostVerifier.Signature memory old = schnorrSign(GROUP_SECRET, digest);
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, old);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, schnorrSign(0xBEEF, digest));
        vm.assertFalse(settlement.isOpen(0));
    }

    function _checkKey(uint256 newX, uint8 newParity, uint32 newEpoch) internal view {
        (uint256 x, uint8 parity, uint32 epoch) = settlement.groupKey();
        vm.assertEq(x, newX);
        vm.assertEq(parity, newParity);
        vm.assertEq(epoch, newEpoch);
    }

    function test_RevertWhen_RotationNotSignedByCurrentKey() public {
        (uint256 newX, uint8 newParity) = keyOf(0xBEEF);
        FrostVerifier.Signature memory sig = schnorrSign(0xBEEF, settlement.rotationDigest(0, newX, newParity));
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.rotateGroupKey(newX, newParity, sig);
        (uint256 x,,) = settlement.groupKey();
        vm.assertEq(x, groupX);
    }

    function test_RevertWhen_RotationReplayed() public {
        (uint256 newX, uint8 newParity) = keyOf(0xBEEF);
        FrostVerifier.Signature memory toNew = schnorrSign(GROUP_SECRET, settlement.rotationDigest(0, newX, newParity));
        settlement.rotateGroupKey(newX, newParity, toNew);
        FrostVerifier.Signature memory back = schnorrSign(0xBEEF, settlement.rotationDigest(1, groupX, groupParity));
        settlement.rotateGroupKey(groupX, groupParity, back);
        // Back at the first key, epoch 2: the epoch-0 message is stale.
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.rotateGroupKey(newX, newParity, toNew);
        (uint256 x,, uint32 epoch) = settlement.groupKey();
        vm.assertEq(x, groupX);
        vm.assertEq(epoch, 2);
    }

    /// What broke: the batch digest did not name the key epoch, so a batch the committee
    /// signed and someone held back stayed valid under a later epoch of the same key (a key
    /// rotated away and back). Now the digest binds the epoch it was signed under.
    function test_RevertWhen_BatchSignedUnderAnotherKeyEpoch() public {
        _openMany(1);
        uint256[] memory ranges = one(range(0, 1));
        FrostVerifier.Signature memory held = signBatch(1, bytes32("r"), bytes32("b"), ranges);
        (uint256 newX, uint8 newParity) = keyOf(0xBEEF);
        settlement.rotateGroupKey(
            newX, newParity, schnorrSign(GROUP_SECRET, settlement.rotationDigest(0, newX, newParity))
        );
        settlement.rotateGroupKey(
            groupX, groupParity, schnorrSign(0xBEEF, settlement.rotationDigest(1, groupX, groupParity))
        );
        // The same key is back (epoch 2); the batch it signed at epoch 0 does not land.
        vm.expectRevert(ISettlement.InvalidSignature.selector);
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, held);
        vm.assertTrue(settlement.isOpen(0));
        // Signed again under epoch 2, it does.
        settlement.settleBatch(1, bytes32("r"), bytes32("b"), ranges, signBatch(1, bytes32("r"), bytes32("b"), ranges));
        vm.assertFalse(settlement.isOpen(0));
    }

    function test_RevertWhen_RotationToInvalidKey() public {
        FrostVerifier.Signature memory sig = schnorrSign(GROUP_SECRET, settlement.rotationDigest(0, 5, 0));
        vm.expectRevert(abi.encodeWithSelector(ISettlement.InvalidGroupKey.selector, 5));
        settlement.rotateGroupKey(5, 0, sig);
    }

    function test_RevertWhen_DeployedWithInvalidKey() public {
        vm.expectRevert(abi.encodeWithSelector(ISettlement.InvalidGroupKey.selector, 0));
        new Settlement(address(token), GRACE_S, 0, 0);
    }

    function test_VerifyGroupSignature() public {
        bytes32 digest = keccak256("anything");
        vm.assertTrue(settlement.verifyGroupSignature(digest, schnorrSign(GROUP_SECRET, digest)));
        vm.assertFalse(settlement.verifyGroupSignature(digest, schnorrSign(GROUP_SECRET + 1, digest)));
    }
}

/// @notice Gas of the 100-job batch the bench measures, inside the EVM (no intrinsic or calldata
/// cost): a regression shows in the committed gas snapshot.
contract SettlementGasTest is Deployment {
    function test_Gas_SettleHundredJobs() public {
        depositAs(BUYER, 100e6);
        for (uint256 i = 0; i < 100; ++i) {
            openAs(BUYER, 1e6, uint64(block.timestamp + 1000));
        }
        uint256[] memory ranges = one(range(0, 100));
        bytes32 root = keccak256("root");
        FrostVerifier.Signature memory sig = signBatch(1, bytes32("r"), root, ranges);
        vm.cool(address(settlement)); // storage cold, as in a real transaction
        uint256 before = gasleft();
        settlement.settleBatch(1, bytes32("r"), root, ranges, sig);
        uint256 used = before - gasleft();
        vm.assertLe(used, 40_000, "settle execution gas regressed");
        (,,,, uint128 totalSettled) = settlement.batchState();
        vm.assertEq(totalSettled, 100e6);
    }
}
