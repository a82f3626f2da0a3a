// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Base} from "./Base.sol";
import {FrostVerifier} from "../../src/FrostVerifier.sol";
import {Settlement} from "../../src/Settlement.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {TestStablecoin} from "../../src/TestStablecoin.sol";

/// @notice A deployment like the devnet's (test stablecoin, Settlement, ProviderRegistry) with a
/// committee key held by the test, and helpers to sign and post batches.
abstract contract Deployment is Base {
    uint256 internal constant GROUP_SECRET = 0xC0FFEE1234567890ABCDEF;
    uint64 internal constant GRACE_S = 600;
    uint256 internal constant MIN_STAKE = 1_000e6;
    uint64 internal constant UNBONDING_S = 7 days;
    /// Slash signatures in the tests are good until then (the tests start at 1_700_000_000).
    uint64 internal constant SLASH_EXPIRY = 1_800_000_000;

    TestStablecoin internal token;
    Settlement internal settlement;
    ProviderRegistry internal registry;
    uint256 internal groupX;
    uint8 internal groupParity;

    address internal constant BUYER = address(0xB0B);
    address internal constant BUYER2 = address(0xB0B2);
    address internal constant PROVIDER = address(0x9A1);
    address internal constant PROVIDER2 = address(0x9A2);
    address internal constant STRANGER = address(0x5742);

    function setUp() public virtual {
        vm.warp(1_700_000_000);
        (groupX, groupParity) = keyOf(GROUP_SECRET);
        token = new TestStablecoin();
        settlement = new Settlement(address(token), GRACE_S, groupX, groupParity);
        registry = new ProviderRegistry(settlement, MIN_STAKE, UNBONDING_S);
        address[5] memory people = [BUYER, BUYER2, PROVIDER, PROVIDER2, STRANGER];
        for (uint256 i = 0; i < people.length; ++i) {
            token.mint(people[i], 1_000_000e6);
            vm.prank(people[i]);
            token.approve(address(settlement), type(uint256).max);
            vm.prank(people[i]);
            token.approve(address(registry), type(uint256).max);
        }
    }

    function depositAs(address who, uint256 amount) internal {
        vm.prank(who);
        settlement.deposit(amount);
    }

    function openAs(address who, uint128 amount, uint64 deadline) internal returns (uint64) {
        vm.prank(who);
        return settlement.openJob(amount, deadline, keccak256(abi.encode(who, amount, deadline)));
    }

    function signBatch(uint64 nonce, bytes32 receiptsRoot, bytes32 balancesRoot, uint256[] memory ranges)
        internal
        returns (FrostVerifier.Signature memory)
    {
        return schnorrSign(GROUP_SECRET, _digest(nonce, receiptsRoot, balancesRoot, ranges));
    }

    function _digest(uint64 nonce, bytes32 receiptsRoot, bytes32 balancesRoot, uint256[] memory ranges)
        internal
        view
        returns (bytes32)
    {
        (,, uint32 epoch) = settlement.groupKey();
        return settlement.batchDigest(epoch, nonce, receiptsRoot, balancesRoot, ranges);
    }

    function settle(uint64 nonce, bytes32 balancesRoot, uint256[] memory ranges) internal {
        bytes32 receiptsRoot = keccak256(abi.encode("receipts", nonce));
        FrostVerifier.Signature memory sig = signBatch(nonce, receiptsRoot, balancesRoot, ranges);
        settlement.settleBatch(nonce, receiptsRoot, balancesRoot, ranges, sig);
    }

    function one(uint256 r) internal pure returns (uint256[] memory a) {
        a = new uint256[](1);
        a[0] = r;
    }
}
