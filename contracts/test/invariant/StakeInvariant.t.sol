// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Base} from "../utils/Base.sol";
import {Settlement} from "../../src/Settlement.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {TestStablecoin} from "../../src/TestStablecoin.sol";

/// @notice Random stakes, unbonds, withdrawals, time and committee-signed slashes of arbitrary
/// amounts (to arbitrary recipients) against the registry, with ghost totals of what went in and
/// out.
contract StakeHandler is Base {
    uint256 internal constant SECRET = 0x57A4E;
    uint256 internal constant MIN_STAKE = 1_000e6;
    uint64 internal constant UNBONDING_S = 1 days;

    TestStablecoin public token;
    Settlement public settlement;
    ProviderRegistry public registry;
    address[3] public providers = [address(0xC1), address(0xC2), address(0xC3)];
    address public constant SINK = address(0x5111C);
    uint256 public ghostIn;
    uint256 public ghostOut;
    uint256 public ghostSlashes;
    uint256 internal evidenceCount;

    constructor() {
        vm.warp(1_700_000_000);
        (uint256 x, uint8 parity) = keyOf(SECRET);
        token = new TestStablecoin();
        settlement = new Settlement(address(token), 600, x, parity);
        registry = new ProviderRegistry(settlement, MIN_STAKE, UNBONDING_S);
        for (uint256 i = 0; i < providers.length; ++i) {
            token.mint(providers[i], 1e30);
            vm.prank(providers[i]);
            token.approve(address(registry), type(uint256).max);
        }
    }

    function stake(uint256 who, uint256 amount) external {
        amount = bound(amount, MIN_STAKE, 1e24);
        vm.prank(providers[who % 3]);
        try registry.stake(amount) {
            ghostIn += amount;
        } catch {}
    }

    function unbond(uint256 who, uint256 amount) external {
        address p = providers[who % 3];
        uint256 staked = registry.providers(p).staked;
        if (staked == 0) return;
        vm.prank(p);
        try registry.unbond(bound(amount, 1, staked)) {} catch {}
    }

    function withdrawUnbonded(uint256 who) external {
        address p = providers[who % 3];
        uint256 before = token.balanceOf(p);
        vm.prank(p);
        try registry.withdrawUnbonded() {
            ghostOut += token.balanceOf(p) - before;
        } catch {}
    }

    function warp(uint256 seconds_) external {
        vm.warp(block.timestamp + bound(seconds_, 1, 2 days));
    }

    function slash(uint256 who, uint256 amount) external {
        address p = providers[who % 3];
        amount = bound(amount, 1, 1e25);
        bytes32 evidence = keccak256(abi.encode("evidence", ++evidenceCount));
        uint64 expiresAt = uint64(block.timestamp + 1 hours);
        bytes32 digest = registry.slashDigest(p, amount, SINK, evidence, expiresAt);
        uint256 before = token.balanceOf(SINK);
        try registry.slash(p, amount, SINK, evidence, expiresAt, schnorrSign(SECRET, digest)) {
            ghostOut += token.balanceOf(SINK) - before;
            ++ghostSlashes;
        } catch {}
    }
}

/// @notice Stake is conserved: the registry holds exactly every provider's staked plus
/// unbonding amounts, and that equals all stake paid in minus all paid out (withdrawals and
/// slashes).
contract StakeInvariantTest is Base {
    StakeHandler internal handler;

    function setUp() public {
        handler = new StakeHandler();
    }

    function targetContracts() public view returns (address[] memory targets) {
        targets = new address[](1);
        targets[0] = address(handler);
    }

    function test_HandlerReachesEveryPath() public {
        // (The handler bounds its inputs modulo their range, so these are approximate amounts.)
        handler.stake(0, 5_000e6);
        handler.unbond(0, 1_000e6);
        handler.slash(0, 4_500e6); // takes the ~5,000 staked, then from the unbonding
        handler.warp(1 days);
        handler.withdrawUnbonded(0);
        vm.assertEq(handler.ghostSlashes(), 1);
        vm.assertGe(handler.ghostOut(), 4_500e6, "slash and withdrawal paid out");
        vm.assertEq(handler.registry().providers(handler.providers(0)).unbonding, 0);
        invariant_StakeIsConserved();
    }

    function invariant_StakeIsConserved() public view {
        ProviderRegistry r = handler.registry();
        uint256 held = 0;
        for (uint256 i = 0; i < 3; ++i) {
            ProviderRegistry.Provider memory p = r.providers(handler.providers(i));
            held += p.staked + p.unbonding;
        }
        uint256 balance = handler.token().balanceOf(address(r));
        vm.assertEq(balance, held, "registry balance is not the sum of stakes");
        vm.assertEq(balance, handler.ghostIn() - handler.ghostOut(), "stake in minus out");
    }
}
