// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Deployment} from "./utils/Deployment.sol";
import {IProviderRegistry} from "../src/interfaces/IProviderRegistry.sol";
import {FrostVerifier} from "../src/FrostVerifier.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {Settlement} from "../src/Settlement.sol";
import {AssetTransfers} from "../src/AssetTransfers.sol";

/// @notice ProviderRegistry: metadata, stake, unbonding, withdrawal and threshold-signed slashing.
contract ProviderRegistryTest is Deployment {
    bytes32 internal constant EVIDENCE = keccak256("receipt 42: output hash mismatch");

    function _stake(address who, uint256 amount) internal {
        vm.prank(who);
        registry.stake(amount);
    }

    function _slashSig(address provider, uint256 amount, address recipient, bytes32 evidence)
        internal
        returns (FrostVerifier.Signature memory)
    {
        return schnorrSign(GROUP_SECRET, registry.slashDigest(provider, amount, recipient, evidence, SLASH_EXPIRY));
    }

    /// What broke: a slash signature was good forever, so evidence the committee checked once
    /// stayed a licence to slash long after (a stale signature could be held back and used when
    /// the provider had restaked). The expiry is inside the signed digest and enforced.
    function test_RevertWhen_SlashAfterItsExpiry() public {
        _stake(PROVIDER, 2 * MIN_STAKE);
        uint64 expiresAt = uint64(block.timestamp + 1 hours);
        FrostVerifier.Signature memory sig =
            schnorrSign(GROUP_SECRET, registry.slashDigest(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, expiresAt));
        // Another expiry than the signed one breaks the signature.
        vm.expectRevert(IProviderRegistry.InvalidSignature.selector);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, expiresAt + 1, sig);
        vm.warp(expiresAt + 1);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.SlashExpired.selector, expiresAt));
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, expiresAt, sig);
        vm.assertEq(registry.providers(PROVIDER).staked, 2 * MIN_STAKE);
        vm.warp(expiresAt);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, expiresAt, sig);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE);
    }

    function test_SetMetadata() public {
        vm.expectEmit(address(registry));
        emit IProviderRegistry.MetadataSet(PROVIDER, "https://p1.example:9001", bytes32("mldsa"));
        vm.prank(PROVIDER);
        registry.setMetadata("https://p1.example:9001", bytes32("mldsa"));
        ProviderRegistry.Provider memory p = registry.providers(PROVIDER);
        vm.assertEq(p.mlDsaKeyHash, bytes32("mldsa"));
        vm.assertEq(keccak256(bytes(p.endpoint)), keccak256("https://p1.example:9001"));
    }

    /// What broke: the registry kept only the current key, and the committee checks evidence
    /// against the key registered for the provider; a provider that signed a wrong result could
    /// change its key before the slash landed and the evidence no longer matched. A replaced key
    /// now answers for `UNBONDING_S` more, as long as stake stays slashable after an unbond.
    function test_AReplacedKeyAnswersForTheUnbondingDelay() public {
        vm.assertFalse(registry.keyAnswers(PROVIDER, bytes32("old")), "never registered");
        vm.startPrank(PROVIDER);
        registry.setMetadata("https://p1.example", bytes32("old"));
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("old")));
        vm.assertEq(registry.keyRetiredAt(PROVIDER, bytes32("old")), registry.KEY_CURRENT());
        // The same key again (a new endpoint) retires nothing.
        registry.setMetadata("https://p1.example:9001", bytes32("old"));
        vm.assertEq(registry.keyRetiredAt(PROVIDER, bytes32("old")), registry.KEY_CURRENT());
        uint256 changedAt = block.timestamp;
        vm.expectEmit(address(registry));
        emit IProviderRegistry.KeyRetired(PROVIDER, bytes32("old"), changedAt);
        registry.setMetadata("https://p1.example:9001", bytes32("new"));
        vm.stopPrank();
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("new")));
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("old")), "within the delay");
        vm.assertFalse(registry.keyAnswers(BUYER, bytes32("old")), "per provider");
        vm.warp(changedAt + UNBONDING_S - 1);
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("old")));
        vm.warp(changedAt + UNBONDING_S);
        vm.assertFalse(registry.keyAnswers(PROVIDER, bytes32("old")), "past the delay");
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("new")));
        // Taking an old key back makes it current again.
        vm.prank(PROVIDER);
        registry.setMetadata("https://p1.example:9001", bytes32("old"));
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("old")));
    }

    /// Clearing the key (zero) retires the old one like any change and never makes zero a key.
    function test_ClearingTheKeyRetiresIt() public {
        vm.startPrank(PROVIDER);
        registry.setMetadata("https://p1.example", bytes32("old"));
        registry.setMetadata("https://p1.example", bytes32(0));
        vm.stopPrank();
        vm.assertFalse(registry.keyAnswers(PROVIDER, bytes32(0)));
        vm.assertTrue(registry.keyAnswers(PROVIDER, bytes32("old")));
        vm.warp(block.timestamp + UNBONDING_S);
        vm.assertFalse(registry.keyAnswers(PROVIDER, bytes32("old")));
    }

    function test_Stake() public {
        vm.expectEmit(address(registry));
        emit IProviderRegistry.Staked(PROVIDER, MIN_STAKE, MIN_STAKE);
        _stake(PROVIDER, MIN_STAKE);
        _stake(PROVIDER, 1);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE + 1);
        vm.assertEq(token.balanceOf(address(registry)), MIN_STAKE + 1);
    }

    function test_RevertWhen_StakeBelowMinimum() public {
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.BelowMinimumStake.selector, MIN_STAKE - 1, MIN_STAKE));
        registry.stake(MIN_STAKE - 1);
        vm.assertEq(token.balanceOf(address(registry)), 0);
    }

    function test_RevertWhen_StakeZero() public {
        vm.prank(PROVIDER);
        vm.expectRevert(IProviderRegistry.ZeroAmount.selector);
        registry.stake(0);
    }

    function test_UnbondAndWithdraw() public {
        _stake(PROVIDER, 3 * MIN_STAKE);
        vm.expectEmit(address(registry));
        emit IProviderRegistry.UnbondStarted(PROVIDER, MIN_STAKE, block.timestamp + UNBONDING_S);
        vm.prank(PROVIDER);
        registry.unbond(MIN_STAKE);
        vm.warp(block.timestamp + UNBONDING_S);
        uint256 before = token.balanceOf(PROVIDER);
        vm.expectEmit(address(registry));
        emit IProviderRegistry.StakeWithdrawn(PROVIDER, MIN_STAKE);
        vm.prank(PROVIDER);
        registry.withdrawUnbonded();
        vm.assertEq(token.balanceOf(PROVIDER), before + MIN_STAKE);
        vm.assertEq(registry.providers(PROVIDER).staked, 2 * MIN_STAKE);
        vm.assertEq(registry.providers(PROVIDER).unbonding, 0);
    }

    function test_UnbondEverything() public {
        _stake(PROVIDER, MIN_STAKE);
        vm.prank(PROVIDER);
        registry.unbond(MIN_STAKE);
        vm.assertEq(registry.providers(PROVIDER).staked, 0);
    }

    function test_RevertWhen_UnbondLeavesLessThanMinimum() public {
        _stake(PROVIDER, MIN_STAKE + 10);
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.BelowMinimumStake.selector, 10, MIN_STAKE));
        registry.unbond(MIN_STAKE);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE + 10);
    }

    function test_RevertWhen_UnbondMoreThanStaked() public {
        _stake(PROVIDER, MIN_STAKE);
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.InsufficientStake.selector, MIN_STAKE, MIN_STAKE + 1));
        registry.unbond(MIN_STAKE + 1);
    }

    function test_RevertWhen_UnbondZero() public {
        vm.prank(PROVIDER);
        vm.expectRevert(IProviderRegistry.ZeroAmount.selector);
        registry.unbond(0);
    }

    function test_RevertWhen_WithdrawBeforeDelay() public {
        _stake(PROVIDER, MIN_STAKE);
        vm.prank(PROVIDER);
        registry.unbond(MIN_STAKE);
        vm.warp(block.timestamp + UNBONDING_S - 1);
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.UnbondingNotFinished.selector, block.timestamp + 1));
        registry.withdrawUnbonded();
        vm.assertEq(token.balanceOf(address(registry)), MIN_STAKE);
    }

    function test_RevertWhen_WithdrawWithNothingUnbonding() public {
        _stake(PROVIDER, MIN_STAKE);
        vm.prank(PROVIDER);
        vm.expectRevert(IProviderRegistry.NothingUnbonding.selector);
        registry.withdrawUnbonded();
    }

    function test_Slash() public {
        _stake(PROVIDER, 2 * MIN_STAKE);
        FrostVerifier.Signature memory sig = _slashSig(PROVIDER, MIN_STAKE, BUYER, EVIDENCE);
        uint256 before = token.balanceOf(BUYER);
        vm.expectEmit(address(registry));
        emit IProviderRegistry.Slashed(PROVIDER, EVIDENCE, MIN_STAKE, BUYER);
        vm.prank(STRANGER);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, sig);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE);
        vm.assertEq(token.balanceOf(BUYER), before + MIN_STAKE);
        vm.assertTrue(registry.evidenceUsed(EVIDENCE));
    }

    /// Unbonding does not escape a slash: the rest comes from the unbonding stake.
    function test_SlashReachesUnbondingStake() public {
        _stake(PROVIDER, 2 * MIN_STAKE);
        vm.prank(PROVIDER);
        registry.unbond(MIN_STAKE);
        registry.slash(
            PROVIDER, 5 * MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, _slashSig(PROVIDER, 5 * MIN_STAKE, BUYER, EVIDENCE)
        );
        vm.assertEq(registry.providers(PROVIDER).staked, 0);
        vm.assertEq(registry.providers(PROVIDER).unbonding, 0);
        vm.assertEq(token.balanceOf(address(registry)), 0);
    }

    function test_RevertWhen_SlashWithoutValidSignature() public {
        _stake(PROVIDER, MIN_STAKE);
        bytes32 digest = registry.slashDigest(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY);
        FrostVerifier.Signature memory bad = schnorrSign(GROUP_SECRET + 1, digest);
        vm.expectRevert(IProviderRegistry.InvalidSignature.selector);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, bad);
        // A valid signature for other terms does not fit these.
        FrostVerifier.Signature memory forLess = _slashSig(PROVIDER, 1, BUYER, EVIDENCE);
        vm.expectRevert(IProviderRegistry.InvalidSignature.selector);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, forLess);
        vm.expectRevert(IProviderRegistry.InvalidSignature.selector);
        registry.slash(PROVIDER, 1, STRANGER, EVIDENCE, SLASH_EXPIRY, forLess);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE);
        vm.assertFalse(registry.evidenceUsed(EVIDENCE));
    }

    function test_RevertWhen_EvidenceReused() public {
        _stake(PROVIDER, 3 * MIN_STAKE);
        FrostVerifier.Signature memory sig = _slashSig(PROVIDER, MIN_STAKE, BUYER, EVIDENCE);
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, sig);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.EvidenceAlreadyUsed.selector, EVIDENCE));
        registry.slash(PROVIDER, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, sig);
        vm.assertEq(registry.providers(PROVIDER).staked, 2 * MIN_STAKE);
    }

    function test_RevertWhen_SlashNothingStaked() public {
        FrostVerifier.Signature memory sig = _slashSig(PROVIDER2, MIN_STAKE, BUYER, EVIDENCE);
        vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.NothingToSlash.selector, PROVIDER2));
        registry.slash(PROVIDER2, MIN_STAKE, BUYER, EVIDENCE, SLASH_EXPIRY, sig);
    }

    function test_RevertWhen_SlashZeroOrToNobody() public {
        _stake(PROVIDER, MIN_STAKE);
        FrostVerifier.Signature memory sig = _slashSig(PROVIDER, 0, BUYER, EVIDENCE);
        vm.expectRevert(IProviderRegistry.ZeroAmount.selector);
        registry.slash(PROVIDER, 0, BUYER, EVIDENCE, SLASH_EXPIRY, sig);
        sig = _slashSig(PROVIDER, 1, address(0), EVIDENCE);
        vm.expectRevert(IProviderRegistry.ZeroRecipient.selector);
        registry.slash(PROVIDER, 1, address(0), EVIDENCE, SLASH_EXPIRY, sig);
        vm.assertEq(registry.providers(PROVIDER).staked, MIN_STAKE);
    }

    function testFuzz_StakeUnbondConserves(uint256 stakeAmount, uint256 unbondAmount) public {
        stakeAmount = bound(stakeAmount, MIN_STAKE, 100 * MIN_STAKE);
        unbondAmount = bound(unbondAmount, 1, stakeAmount);
        _stake(PROVIDER, stakeAmount);
        vm.prank(PROVIDER);
        uint256 left = stakeAmount - unbondAmount;
        if (left != 0 && left < MIN_STAKE) {
            vm.expectRevert(abi.encodeWithSelector(IProviderRegistry.BelowMinimumStake.selector, left, MIN_STAKE));
            registry.unbond(unbondAmount);
            return;
        }
        registry.unbond(unbondAmount);
        ProviderRegistry.Provider memory p = registry.providers(PROVIDER);
        vm.assertEq(p.staked + p.unbonding, stakeAmount);
        vm.assertEq(token.balanceOf(address(registry)), stakeAmount);
    }
}

/// @notice The registry of a native-ETH deployment.
contract NativeProviderRegistryTest is Deployment {
    ProviderRegistry internal nativeRegistry;

    function setUp() public override {
        super.setUp();
        Settlement native = new Settlement(address(0), GRACE_S, groupX, groupParity);
        nativeRegistry = new ProviderRegistry(native, 1 ether, UNBONDING_S);
        vm.deal(PROVIDER, 5 ether);
    }

    function test_NativeStakeUnbondWithdrawAndSlash() public {
        vm.prank(PROVIDER);
        nativeRegistry.stake{value: 3 ether}(3 ether);
        vm.prank(PROVIDER);
        nativeRegistry.unbond(1 ether);
        bytes32 evidence = keccak256("native evidence");
        bytes32 digest = nativeRegistry.slashDigest(PROVIDER, 1 ether, BUYER, evidence, SLASH_EXPIRY);
        nativeRegistry.slash(PROVIDER, 1 ether, BUYER, evidence, SLASH_EXPIRY, schnorrSign(GROUP_SECRET, digest));
        vm.assertEq(BUYER.balance, 1 ether);
        vm.warp(block.timestamp + UNBONDING_S);
        vm.prank(PROVIDER);
        nativeRegistry.withdrawUnbonded();
        vm.assertEq(PROVIDER.balance, 3 ether);
        vm.assertEq(address(nativeRegistry).balance, 1 ether);
    }

    function test_RevertWhen_NativeStakeValueMismatch() public {
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(AssetTransfers.AssetWrongMsgValue.selector, 2 ether, 1 ether));
        nativeRegistry.stake{value: 1 ether}(2 ether);
        vm.assertEq(PROVIDER.balance, 5 ether);
    }
}
