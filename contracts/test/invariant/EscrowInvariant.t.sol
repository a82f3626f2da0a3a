// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Base} from "../utils/Base.sol";
import {FrostVerifier} from "../../src/FrostVerifier.sol";
import {Escrow} from "../../src/Escrow.sol";
import {Settlement} from "../../src/Settlement.sol";
import {TestStablecoin} from "../../src/TestStablecoin.sol";

/// @notice Drives the escrow with random deposits, withdrawals, escrows, reclaims, signed batches
/// (honest roots: each settled escrow credits 90% to a provider and 10% back to its buyer) and
/// claims, recording ghost state for the invariants.
contract EscrowHandler is Base {
    uint256 internal constant SECRET = 0xA11CE;
    uint64 internal constant GRACE_S = 300;

    TestStablecoin public token;
    Settlement public settlement;
    address[4] public actors = [address(0xA1), address(0xA2), address(0xA3), address(0xA4)];

    mapping(address => uint256) public ghostCredited;
    mapping(uint64 => uint256) public ghostSettleCount;
    mapping(uint64 => bool) public ghostReclaimed;
    uint256 public ghostEarlyReclaims;
    uint256 public ghostOverpaidClaims;
    uint256 public ghostSettledAndReclaimed;
    uint256 public ghostBatches;
    uint256 public ghostClaims;
    uint256 public ghostReclaims;
    uint64 internal nonce;
    bytes32[] internal leaves;

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

    function actorCount() external pure returns (uint256) {
        return 4;
    }

    function deposit(uint256 who, uint256 amount) external {
        address a = actors[who % 4];
        amount = bound(amount, 1, 1e24);
        vm.prank(a);
        settlement.deposit(amount);
    }

    function withdraw(uint256 who, uint256 amount) external {
        address a = actors[who % 4];
        uint256 bal = settlement.balanceOf(a);
        if (bal == 0) return;
        vm.prank(a);
        settlement.withdraw(bound(amount, 1, bal));
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

    /// Tries to reclaim any job at any time; records a success that came too early.
    function reclaim(uint256 who, uint256 job) external {
        uint64 n = settlement.nextJobId();
        if (n == 0) return;
        uint64 id = uint64(job % n);
        Escrow.Job memory j = settlement.jobs(id);
        address caller = who % 3 == 0 ? actors[who % 4] : j.buyer;
        vm.prank(caller);
        try settlement.reclaim(id) {
            if (block.timestamp <= uint256(j.deadline) + GRACE_S) ++ghostEarlyReclaims;
            if (ghostSettleCount[id] > 0) ++ghostSettledAndReclaimed;
            ghostReclaimed[id] = true;
            ++ghostReclaims;
        } catch {}
    }

    /// Settles a random id range (which may include closed jobs: then the batch must revert).
    function settle(uint256 start, uint256 len, uint256 providerIndex) external {
        uint64 n = settlement.nextJobId();
        if (n == 0) return;
        uint64 s = uint64(start % n);
        uint64 e = uint64(s + bound(len, 1, n - s));
        uint256[] memory ranges = new uint256[](1);
        ranges[0] = range(s, e);
        address provider = actors[providerIndex % 4];
        for (uint64 id = s; id < e; ++id) {
            Escrow.Job memory j = settlement.jobs(id);
            uint256 toProvider = (uint256(j.amount) * 9) / 10;
            ghostCredited[provider] += toProvider;
            ghostCredited[j.buyer] += j.amount - toProvider;
        }
        bytes32 root = _root();
        uint64 next = nonce + 1;
        bytes32 digest = settlement.batchDigest(0, next, bytes32(uint256(next)), root, ranges);
        FrostVerifier.Signature memory sig = schnorrSign(SECRET, digest);
        try settlement.settleBatch(next, bytes32(uint256(next)), root, ranges, sig) {
            nonce = next;
            ++ghostBatches;
            for (uint64 id = s; id < e; ++id) {
                ++ghostSettleCount[id];
                if (ghostReclaimed[id]) ++ghostSettledAndReclaimed;
            }
        } catch {
            // Roll the credits back: the batch did not happen.
            for (uint64 id = s; id < e; ++id) {
                Escrow.Job memory j = settlement.jobs(id);
                uint256 toProvider = (uint256(j.amount) * 9) / 10;
                ghostCredited[provider] -= toProvider;
                ghostCredited[j.buyer] -= j.amount - toProvider;
            }
        }
    }

    function claim(uint256 who) external {
        if (nonce == 0) return;
        uint256 i = who % 4;
        address a = actors[i];
        // Between calls ghostCredited always equals what the posted root proves (a failed batch
        // rolls its credits back), so the tree rebuilt here is the posted one.
        _root();
        uint256 amount = ghostCredited[a];
        uint256 before = token.balanceOf(a);
        vm.prank(a);
        try settlement.claim(amount, merkleProof(leaves, i)) {
            if (token.balanceOf(a) - before > amount) ++ghostOverpaidClaims;
            ++ghostClaims;
        } catch {}
    }

    function _root() internal returns (bytes32) {
        delete leaves;
        for (uint256 i = 0; i < actors.length; ++i) {
            leaves.push(leafOf(actors[i], ghostCredited[actors[i]]));
        }
        return merkleRoot(leaves);
    }
}

/// @notice Escrow invariants under random sequences of every user action.
contract EscrowInvariantTest is Base {
    EscrowHandler internal handler;

    function setUp() public {
        handler = new EscrowHandler();
    }

    function targetContracts() public view returns (address[] memory targets) {
        targets = new address[](1);
        targets[0] = address(handler);
    }

    /// The handler is not vacuous: a fixed sequence reaches a batch, a claim and a reclaim.
    function test_HandlerReachesEveryPath() public {
        handler.deposit(0, 1e20);
        handler.openJob(0, 1e18, 10);
        handler.openJob(0, 1e18, 10);
        handler.settle(0, 0, 2); // job 0 only
        handler.claim(2);
        handler.warp(2 hours - 1); // bound() maps this to 2 hours
        handler.reclaim(1, 1);
        vm.assertEq(handler.ghostBatches(), 1);
        vm.assertEq(handler.ghostClaims(), 1);
        vm.assertEq(handler.ghostReclaims(), 1);
        invariant_FundsConserved();
    }

    /// The contract holds at least everything anyone can still take out: free deposits, open
    /// escrows, and credited-but-unclaimed amounts.
    function invariant_FundsConserved() public view {
        Settlement s = handler.settlement();
        uint256 owed = 0;
        for (uint256 i = 0; i < 4; ++i) {
            address a = handler.actors(i);
            owed += s.balanceOf(a);
            owed += handler.ghostCredited(a) - s.claimed(a);
        }
        uint64 n = s.nextJobId();
        for (uint64 id = 0; id < n; ++id) {
            if (s.isOpen(id)) owed += s.jobs(id).amount;
        }
        vm.assertGe(handler.token().balanceOf(address(s)), owed, "contract holds less than it owes");
    }

    function invariant_NoJobPaidTwice() public view {
        uint64 n = handler.settlement().nextJobId();
        for (uint64 id = 0; id < n; ++id) {
            vm.assertLe(handler.ghostSettleCount(id), 1, "job settled twice");
        }
    }

    function invariant_NoEscrowBothSettledAndReclaimed() public view {
        vm.assertEq(handler.ghostSettledAndReclaimed(), 0, "settled and reclaimed");
    }

    function invariant_NothingReclaimedBeforeDeadline() public view {
        vm.assertEq(handler.ghostEarlyReclaims(), 0, "reclaimed early");
    }

    function invariant_WithdrawalNeverExceedsProvenAmount() public view {
        Settlement s = handler.settlement();
        vm.assertEq(handler.ghostOverpaidClaims(), 0, "claim paid more than its delta");
        for (uint256 i = 0; i < 4; ++i) {
            address a = handler.actors(i);
            vm.assertLe(s.claimed(a), handler.ghostCredited(a), "claimed beyond credited");
        }
        vm.assertLe(s.totalClaimed(), uint256(_totalSettled(s)), "claims beyond settled funds");
    }

    function _totalSettled(Settlement s) internal view returns (uint128 total) {
        (,,,, total) = s.batchState();
    }
}
