// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Base} from "../utils/Base.sol";
import {FrostVerifier} from "../../src/FrostVerifier.sol";
import {Escrow} from "../../src/Escrow.sol";
import {Settlement} from "../../src/Settlement.sol";
import {TestStablecoin} from "../../src/TestStablecoin.sol";

/// @notice A committee gone bad: every batch it signs posts an ARBITRARY balances root (any
/// cumulative amount for any actor, up to far more than was ever deposited), and every actor
/// claims greedily whatever that root promises. Deposits, withdrawals, escrows and reclaims run
/// as usual. The contract's promise under test: a wrong root can move at most what batches
/// settled — never open escrows, never free deposits.
/// (EscrowInvariant's handler posts only honest roots, which makes conservation nearly true by
/// construction; this one does not.)
contract HostileRootHandler is Base {
    uint256 internal constant SECRET = 0xBADC0DE;
    uint64 internal constant GRACE_S = 300;

    TestStablecoin public token;
    Settlement public settlement;
    address[4] public actors = [address(0xB1), address(0xB2), address(0xB3), address(0xB4)];
    /// The cumulative amounts the latest root promises.
    uint256[4] public promised;
    uint64 internal nonce;
    uint256 public ghostBatches;
    uint256 public ghostClaims;
    uint256 public ghostClaimed;
    uint256 public ghostReclaims;
    uint256 public ghostWithdrawFailures;

    constructor() {
        vm.warp(1_700_000_000);
        (uint256 x, uint8 parity) = keyOf(SECRET);
        token = new TestStablecoin();
        settlement = new Settlement(address(token), GRACE_S, x, parity);
        for (uint256 i = 0; i < actors.length; ++i) {
            token.mint(actors[i], 1e30);
            vm.prank(actors[i]);
            token.approve(address(settlement), type(uint256).max);
        }
    }

    function deposit(uint256 who, uint256 amount) external {
        address a = actors[who % 4];
        vm.prank(a);
        settlement.deposit(bound(amount, 1, 1e24));
    }

    /// Withdrawing one's free balance must always work, whatever roots were posted.
    function withdraw(uint256 who, uint256 amount) external {
        address a = actors[who % 4];
        uint256 bal = settlement.balanceOf(a);
        if (bal == 0) return;
        vm.prank(a);
        try settlement.withdraw(bound(amount, 1, bal)) {}
        catch {
            ++ghostWithdrawFailures;
        }
    }

    function openJob(uint256 who, uint256 amount, uint256 lifetime) external {
        address a = actors[who % 4];
        uint256 bal = settlement.balanceOf(a);
        if (bal == 0) return;
        vm.prank(a);
        settlement.openJob(uint128(bound(amount, 1, bal)), uint64(block.timestamp + bound(lifetime, 1, 3600)), 0);
    }

    function warp(uint256 seconds_) external {
        vm.warp(block.timestamp + bound(seconds_, 1, 2 hours));
    }

    function reclaim(uint256 job) external {
        uint64 n = settlement.nextJobId();
        if (n == 0) return;
        uint64 id = uint64(job % n);
        vm.prank(settlement.jobs(id).buyer);
        try settlement.reclaim(id) {
            ++ghostReclaims;
        } catch {}
    }

    /// A batch over a random range (reverts if it names a closed escrow) posting a root of
    /// arbitrary cumulative amounts, unrelated to what the range settles.
    function settleArbitrary(uint256 start, uint256 len, uint256[4] calldata amounts) external {
        uint64 n = settlement.nextJobId();
        uint256[] memory ranges;
        if (n == 0) {
            ranges = new uint256[](0);
        } else {
            uint64 s = uint64(start % n);
            ranges = new uint256[](1);
            ranges[0] = range(s, uint64(s + bound(len, 1, n - s)));
        }
        uint256[4] memory next;
        bytes32[] memory leaves = new bytes32[](4);
        uint256 plausible = 2 * uint256(settlement.totalOpened()) + 1;
        for (uint256 i = 0; i < 4; ++i) {
            // With the top bit set: anything up to 10^30 (more than all deposits ever made);
            // else up to twice all escrow ever opened, so greedy claims often fit and land.
            uint256 a = amounts[i];
            next[i] = a >> 255 == 1 ? (a & ~(uint256(1) << 255)) % 1e30 : a % plausible;
            leaves[i] = leafOf(actors[i], next[i]);
        }
        bytes32 root = merkleRoot(leaves);
        uint64 batch = nonce + 1;
        (,, uint32 epoch) = settlement.groupKey();
        bytes32 digest = settlement.batchDigest(epoch, batch, bytes32(0), root, ranges);
        try settlement.settleBatch(batch, bytes32(0), root, ranges, schnorrSign(SECRET, digest)) {
            nonce = batch;
            promised = next;
            ++ghostBatches;
        } catch {}
    }

    /// Every actor takes everything the latest root promises it.
    function claimGreedily() external {
        if (nonce == 0) return;
        bytes32[] memory leaves = new bytes32[](4);
        for (uint256 i = 0; i < 4; ++i) {
            leaves[i] = leafOf(actors[i], promised[i]);
        }
        for (uint256 i = 0; i < 4; ++i) {
            address a = actors[i];
            uint256 before = token.balanceOf(a);
            vm.prank(a);
            try settlement.claim(promised[i], merkleProof(leaves, i)) {
                ghostClaimed += token.balanceOf(a) - before;
                ++ghostClaims;
            } catch {}
        }
    }
}

/// @notice Under arbitrary roots and greedy claims, open escrows and free deposits stay whole.
contract HostileRootInvariantTest is Base {
    HostileRootHandler internal handler;

    function setUp() public {
        handler = new HostileRootHandler();
    }

    function targetContracts() public view returns (address[] memory targets) {
        targets = new address[](1);
        targets[0] = address(handler);
    }

    /// Not vacuous: an inflated root is posted and claimed against, and the claim is capped.
    function test_HandlerReachesEveryPath() public {
        handler.deposit(0, 1e20);
        handler.openJob(0, 1e18, 10);
        handler.openJob(0, 1e18, 10);
        uint256 settledAmount = handler.settlement().jobs(0).amount;
        // Settles job 0 only; promises actor 0 10^29 and actor 1 exactly what job 0 holds.
        uint256[4] memory greedy = [(uint256(1) << 255) | 1e29, settledAmount, 0, 0];
        handler.settleArbitrary(0, 0, greedy);
        handler.claimGreedily();
        vm.assertEq(handler.ghostBatches(), 1);
        vm.assertEq(handler.ghostClaims(), 1, "only a claim within what was settled lands");
        vm.assertEq(handler.ghostClaimed(), settledAmount);
        handler.warp(2 hours - 1); // bound() maps this to 2 hours
        handler.reclaim(1);
        vm.assertEq(handler.ghostReclaims(), 1);
        invariant_OpenEscrowsAndDepositsAreNeverReached();
    }

    /// The contract always holds every free deposit and every open escrow in full, and claims
    /// never exceed what batches settled.
    function invariant_OpenEscrowsAndDepositsAreNeverReached() public view {
        Settlement s = handler.settlement();
        uint256 untouchable = 0;
        for (uint256 i = 0; i < 4; ++i) {
            untouchable += s.balanceOf(handler.actors(i));
        }
        uint64 n = s.nextJobId();
        for (uint64 id = 0; id < n; ++id) {
            if (s.isOpen(id)) untouchable += s.jobs(id).amount;
        }
        vm.assertGe(handler.token().balanceOf(address(s)), untouchable, "deposits or escrows reached");
        (,,,, uint128 settled) = s.batchState();
        vm.assertLe(s.totalClaimed(), settled, "claimed beyond settled");
        vm.assertEq(handler.ghostClaimed(), s.totalClaimed(), "claims paid what was recorded");
    }

    function invariant_FreeDepositsCanAlwaysBeWithdrawn() public view {
        vm.assertEq(handler.ghostWithdrawFailures(), 0, "a withdrawal of a free balance failed");
    }
}
