// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Deployment} from "./utils/Deployment.sol";
import {IEscrow} from "../src/interfaces/IEscrow.sol";
import {Escrow} from "../src/Escrow.sol";
import {Settlement} from "../src/Settlement.sol";
import {AssetTransfers} from "../src/AssetTransfers.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {FeeOnTransferToken} from "./mocks/FeeOnTransferToken.sol";

/// @notice Escrow: deposits, withdrawals, per-job escrows, reclaims and claims, each function and
/// each refusal (every refusal also checks that balances did not move).
contract EscrowTest is Deployment {
    function test_Deposit() public {
        vm.expectEmit(address(settlement));
        emit IEscrow.Deposited(BUYER, 500e6);
        depositAs(BUYER, 500e6);
        vm.assertEq(settlement.balanceOf(BUYER), 500e6);
        vm.assertEq(token.balanceOf(address(settlement)), 500e6);
    }

    function test_RevertWhen_DepositZero() public {
        vm.expectRevert(IEscrow.ZeroAmount.selector);
        depositAs(BUYER, 0);
        vm.assertEq(settlement.balanceOf(BUYER), 0);
    }

    function test_RevertWhen_DepositSendsEtherToTokenDeployment() public {
        vm.deal(BUYER, 1 ether);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(AssetTransfers.AssetWrongMsgValue.selector, 0, 1));
        settlement.deposit{value: 1}(5);
        vm.assertEq(settlement.balanceOf(BUYER), 0);
    }

    function test_RevertWhen_DepositWithoutAllowance() public {
        vm.prank(STRANGER);
        token.approve(address(settlement), 0);
        vm.expectRevert();
        depositAs(STRANGER, 5);
        vm.assertEq(settlement.balanceOf(STRANGER), 0);
    }

    function test_Withdraw() public {
        depositAs(BUYER, 500e6);
        uint256 before = token.balanceOf(BUYER);
        vm.expectEmit(address(settlement));
        emit IEscrow.Withdrawn(BUYER, 200e6);
        vm.prank(BUYER);
        settlement.withdraw(200e6);
        vm.assertEq(settlement.balanceOf(BUYER), 300e6);
        vm.assertEq(token.balanceOf(BUYER), before + 200e6);
    }

    function test_RevertWhen_WithdrawMoreThanBalance() public {
        depositAs(BUYER, 100);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.InsufficientBalance.selector, BUYER, 100, 101));
        settlement.withdraw(101);
        vm.assertEq(settlement.balanceOf(BUYER), 100);
    }

    function test_RevertWhen_WithdrawZero() public {
        vm.prank(BUYER);
        vm.expectRevert(IEscrow.ZeroAmount.selector);
        settlement.withdraw(0);
    }

    function test_OpenJob() public {
        depositAs(BUYER, 1000);
        uint64 deadline = uint64(block.timestamp + 3600);
        vm.expectEmit(address(settlement));
        emit IEscrow.JobOpened(0, BUYER, 300, deadline, keccak256(abi.encode(BUYER, uint128(300), deadline)));
        uint64 id = openAs(BUYER, 300, deadline);
        vm.assertEq(id, 0);
        uint64 id2 = openAs(BUYER, 200, deadline);
        vm.assertEq(id2, 1);
        Escrow.Job memory job = settlement.jobs(id2);
        vm.assertEq(job.buyer, BUYER);
        vm.assertEq(job.amount, 200);
        vm.assertEq(job.openedBefore, 300);
        vm.assertEq(settlement.balanceOf(BUYER), 500);
        vm.assertTrue(settlement.isOpen(0) && settlement.isOpen(1));
        vm.assertFalse(settlement.isOpen(2));
    }

    function test_RevertWhen_OpenJobZeroAmount() public {
        depositAs(BUYER, 1000);
        vm.prank(BUYER);
        vm.expectRevert(IEscrow.ZeroAmount.selector);
        settlement.openJob(0, uint64(block.timestamp + 1), bytes32(0));
        vm.assertEq(settlement.balanceOf(BUYER), 1000);
    }

    function test_RevertWhen_OpenJobDeadlineInPast() public {
        depositAs(BUYER, 1000);
        vm.prank(BUYER);
        vm.expectRevert(
            abi.encodeWithSelector(IEscrow.DeadlineInPast.selector, uint64(block.timestamp), block.timestamp)
        );
        settlement.openJob(10, uint64(block.timestamp), bytes32(0));
        vm.assertEq(settlement.balanceOf(BUYER), 1000);
    }

    function test_RevertWhen_OpenJobBeyondBalance() public {
        depositAs(BUYER, 10);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.InsufficientBalance.selector, BUYER, 10, 11));
        settlement.openJob(11, uint64(block.timestamp + 1), bytes32(0));
        vm.assertEq(settlement.balanceOf(BUYER), 10);
        vm.assertEq(settlement.nextJobId(), 0);
    }

    function test_ReclaimAfterDeadlineAndGrace() public {
        depositAs(BUYER, 1000);
        uint64 deadline = uint64(block.timestamp + 100);
        uint64 id = openAs(BUYER, 400, deadline);
        vm.warp(uint256(deadline) + GRACE_S + 1);
        vm.expectEmit(address(settlement));
        emit IEscrow.JobReclaimed(id, BUYER, 400);
        vm.prank(BUYER);
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(BUYER), 1000);
        vm.assertFalse(settlement.isOpen(id));
    }

    function test_RevertWhen_ReclaimAtDeadlinePlusGrace() public {
        depositAs(BUYER, 1000);
        uint64 deadline = uint64(block.timestamp + 100);
        uint64 id = openAs(BUYER, 400, deadline);
        vm.warp(uint256(deadline) + GRACE_S);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.ReclaimTooEarly.selector, id, uint256(deadline) + GRACE_S));
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(BUYER), 600);
        vm.assertTrue(settlement.isOpen(id));
    }

    function test_RevertWhen_ReclaimByOther() public {
        depositAs(BUYER, 1000);
        uint64 id = openAs(BUYER, 400, uint64(block.timestamp + 1));
        vm.warp(block.timestamp + 10 days);
        vm.prank(STRANGER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.NotBuyer.selector, id, STRANGER));
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(STRANGER), 0);
        vm.assertEq(settlement.balanceOf(BUYER), 600);
    }

    function test_RevertWhen_ReclaimUnknownJob() public {
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.UnknownJob.selector, 9));
        settlement.reclaim(9);
    }

    function test_RevertWhen_ReclaimTwice() public {
        depositAs(BUYER, 1000);
        uint64 id = openAs(BUYER, 400, uint64(block.timestamp + 1));
        vm.warp(block.timestamp + 10 days);
        vm.prank(BUYER);
        settlement.reclaim(id);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, id));
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(BUYER), 1000);
    }

    function test_RevertWhen_ReclaimAfterSettled() public {
        depositAs(BUYER, 1000);
        uint64 id = openAs(BUYER, 400, uint64(block.timestamp + 1));
        settle(1, bytes32(uint256(1)), one(range(id, id + 1)));
        vm.warp(block.timestamp + 10 days);
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.EscrowNotOpen.selector, id));
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(BUYER), 600);
    }

    /// Two batches credit a provider 300 then 700 cumulatively; two claims pay 300 then 400.
    function test_ClaimCumulativeAcrossBatches() public {
        depositAs(BUYER, 1000);
        openAs(BUYER, 300, uint64(block.timestamp + 1000));
        openAs(BUYER, 700, uint64(block.timestamp + 1000));
        bytes32[] memory leaves = new bytes32[](2);
        leaves[0] = leafOf(PROVIDER, 300);
        leaves[1] = leafOf(BUYER, 0);
        settle(1, merkleRoot(leaves), one(range(0, 1)));
        uint256 before = token.balanceOf(PROVIDER);
        vm.expectEmit(address(settlement));
        emit IEscrow.Claimed(PROVIDER, 300, 300);
        vm.prank(PROVIDER);
        settlement.claim(300, merkleProof(leaves, 0));
        leaves[0] = leafOf(PROVIDER, 700);
        leaves[1] = leafOf(BUYER, 300);
        settle(2, merkleRoot(leaves), one(range(1, 2)));
        vm.prank(PROVIDER);
        settlement.claim(700, merkleProof(leaves, 0));
        vm.prank(BUYER);
        settlement.claim(300, merkleProof(leaves, 1));
        vm.assertEq(token.balanceOf(PROVIDER), before + 700);
        vm.assertEq(settlement.claimed(PROVIDER), 700);
        vm.assertEq(settlement.totalClaimed(), 1000);
        vm.assertEq(token.balanceOf(address(settlement)), 0);
    }

    function test_RevertWhen_ClaimWithBadProof() public {
        depositAs(BUYER, 1000);
        openAs(BUYER, 300, uint64(block.timestamp + 1000));
        bytes32[] memory leaves = new bytes32[](2);
        leaves[0] = leafOf(PROVIDER, 300);
        leaves[1] = leafOf(BUYER, 0);
        settle(1, merkleRoot(leaves), one(range(0, 1)));
        bytes32[] memory proof = merkleProof(leaves, 0);
        uint256 before = token.balanceOf(PROVIDER);
        vm.prank(PROVIDER);
        vm.expectRevert(IEscrow.InvalidProof.selector);
        settlement.claim(301, proof); // more than proven
        vm.prank(STRANGER);
        vm.expectRevert(IEscrow.InvalidProof.selector);
        settlement.claim(300, proof); // someone else's leaf
        vm.assertEq(token.balanceOf(PROVIDER), before);
        vm.assertEq(settlement.claimed(PROVIDER), 0);
    }

    /// Before any batch the root is a constant no leaf hashes to: nothing can be claimed.
    function test_RevertWhen_ClaimBeforeAnyBatch() public {
        depositAs(BUYER, 1000);
        vm.prank(BUYER);
        vm.expectRevert(IEscrow.InvalidProof.selector);
        settlement.claim(0, new bytes32[](0));
        vm.prank(BUYER);
        vm.expectRevert(IEscrow.InvalidProof.selector);
        settlement.claim(1000, new bytes32[](0));
        vm.assertEq(settlement.totalClaimed(), 0);
        vm.assertEq(token.balanceOf(address(settlement)), 1000);
    }

    function test_RevertWhen_ClaimTwice() public {
        depositAs(BUYER, 1000);
        openAs(BUYER, 300, uint64(block.timestamp + 1000));
        bytes32[] memory leaves = new bytes32[](1);
        leaves[0] = leafOf(PROVIDER, 300);
        settle(1, merkleRoot(leaves), one(range(0, 1)));
        vm.prank(PROVIDER);
        settlement.claim(300, new bytes32[](0));
        uint256 before = token.balanceOf(PROVIDER);
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.NothingToClaim.selector, 300, 300));
        settlement.claim(300, new bytes32[](0));
        vm.assertEq(token.balanceOf(PROVIDER), before);
    }

    /// A root that credits more than the batches settled can never reach open escrows or
    /// deposits: the claim is capped by totalSettled.
    function test_RevertWhen_ClaimExceedsSettledFunds() public {
        depositAs(BUYER, 1000);
        openAs(BUYER, 300, uint64(block.timestamp + 1000));
        openAs(BUYER, 500, uint64(block.timestamp + 1000));
        bytes32[] memory leaves = new bytes32[](1);
        leaves[0] = leafOf(PROVIDER, 301);
        settle(1, merkleRoot(leaves), one(range(0, 1)));
        vm.prank(PROVIDER);
        vm.expectRevert(abi.encodeWithSelector(IEscrow.ClaimExceedsSettledFunds.selector, 301, 300));
        settlement.claim(301, new bytes32[](0));
        vm.assertEq(token.balanceOf(address(settlement)), 1000);
    }

    function testFuzz_DepositOpenReclaimRoundTrip(uint128 amount, uint64 lifetime) public {
        amount = uint128(bound(amount, 1, 1_000_000e6));
        lifetime = uint64(bound(lifetime, 1, 365 days));
        depositAs(BUYER, amount);
        uint64 id = openAs(BUYER, amount, uint64(block.timestamp) + lifetime);
        vm.assertEq(settlement.balanceOf(BUYER), 0);
        vm.warp(block.timestamp + lifetime + GRACE_S + 1);
        vm.prank(BUYER);
        settlement.reclaim(id);
        vm.assertEq(settlement.balanceOf(BUYER), amount);
    }

    function testFuzz_ClaimNeverExceedsProvenAmount(uint256 credit, uint256 ask) public {
        credit = bound(credit, 1, 1000);
        depositAs(BUYER, 1000);
        openAs(BUYER, 1000, uint64(block.timestamp + 1000));
        bytes32[] memory leaves = new bytes32[](2);
        leaves[0] = leafOf(PROVIDER, credit);
        leaves[1] = leafOf(BUYER, 1000 - credit);
        settle(1, merkleRoot(leaves), one(range(0, 1)));
        uint256 before = token.balanceOf(PROVIDER);
        vm.prank(PROVIDER);
        if (ask != credit) vm.expectRevert(IEscrow.InvalidProof.selector);
        settlement.claim(ask, merkleProof(leaves, 0));
        vm.assertLe(token.balanceOf(PROVIDER) - before, credit, "paid more than proven");
    }
}

/// @notice The native-ETH deployment of the same escrow.
contract NativeEscrowTest is Deployment {
    Settlement internal native;

    function setUp() public override {
        super.setUp();
        native = new Settlement(address(0), GRACE_S, groupX, groupParity);
        vm.deal(BUYER, 10 ether);
    }

    function test_NativeDepositOpenSettleClaim() public {
        vm.prank(BUYER);
        native.deposit{value: 1 ether}(1 ether);
        vm.prank(BUYER);
        native.openJob(0.4 ether, uint64(block.timestamp + 100), bytes32(0));
        bytes32[] memory leaves = new bytes32[](2);
        leaves[0] = leafOf(PROVIDER, 0.3 ether);
        leaves[1] = leafOf(BUYER, 0.1 ether);
        bytes32 root = merkleRoot(leaves);
        uint256[] memory ranges = one(range(0, 1));
        bytes32 digest = native.batchDigest(0, 1, bytes32("r"), root, ranges);
        native.settleBatch(1, bytes32("r"), root, ranges, schnorrSign(GROUP_SECRET, digest));
        vm.prank(PROVIDER);
        native.claim(0.3 ether, merkleProof(leaves, 0));
        vm.assertEq(PROVIDER.balance, 0.3 ether);
        vm.prank(BUYER);
        native.withdraw(0.6 ether);
        vm.assertEq(BUYER.balance, 9.6 ether);
        vm.assertEq(address(native).balance, 0.1 ether);
    }

    /// What it guards: native payouts call the recipient, which may call back. Claims and
    /// withdrawals update the books before they pay (checks-effects-interactions), so a reentrant
    /// claim or withdrawal finds nothing more to take, and the attacker is paid exactly once.
    function test_NativeClaimAndWithdrawResistReentrancy() public {
        Reenterer attacker = new Reenterer(native);
        vm.deal(address(attacker), 1 ether);
        attacker.depositAndOpen(1 ether, 0.5 ether);
        bytes32[] memory leaves = new bytes32[](2);
        leaves[0] = leafOf(address(attacker), 0.5 ether);
        leaves[1] = leafOf(BUYER, 0);
        bytes32 root = merkleRoot(leaves);
        uint256[] memory ranges = one(range(0, 1));
        bytes32 digest = native.batchDigest(0, 1, bytes32("r"), root, ranges);
        native.settleBatch(1, bytes32("r"), root, ranges, schnorrSign(GROUP_SECRET, digest));

        attacker.claimTwice(0.5 ether, merkleProof(leaves, 0));
        vm.assertEq(address(attacker).balance, 0.5 ether, "claim paid once");
        vm.assertTrue(attacker.reentered() && !attacker.reentrySucceeded(), "reentrant claim refused");
        vm.assertEq(native.claimed(address(attacker)), 0.5 ether);

        attacker.withdrawTwice(0.5 ether);
        vm.assertEq(address(attacker).balance, 1 ether, "withdrawal paid once");
        vm.assertFalse(attacker.reentrySucceeded(), "reentrant withdrawal refused");
        vm.assertEq(native.balanceOf(address(attacker)), 0);
        vm.assertEq(address(native).balance, 0);
    }

    function test_RevertWhen_NativeDepositValueMismatch() public {
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(AssetTransfers.AssetWrongMsgValue.selector, 2 ether, 1 ether));
        native.deposit{value: 1 ether}(2 ether);
        vm.assertEq(BUYER.balance, 10 ether);
    }

    function test_RevertWhen_NativeRecipientRefuses() public {
        Refuser refuser = new Refuser();
        vm.deal(address(refuser), 1 ether);
        vm.prank(address(refuser));
        native.deposit{value: 1 ether}(1 ether);
        refuser.setRefuse(true);
        vm.prank(address(refuser));
        vm.expectRevert(
            abi.encodeWithSelector(AssetTransfers.AssetNativeTransferFailed.selector, address(refuser), 1 ether)
        );
        native.withdraw(1 ether);
        vm.assertEq(native.balanceOf(address(refuser)), 1 ether);
    }
}

/// @notice A contract that refuses ETH (to exercise the native transfer failure path).
contract Refuser {
    bool public refuse;

    function setRefuse(bool value) external {
        refuse = value;
    }

    receive() external payable {
        if (refuse) revert("no");
    }
}

/// @notice A deployment whose asset charges a fee on transfer.
/// What broke: `deposit(amount)` credited `amount` whatever arrived, so with a fee-on-transfer
/// token every deposit promised more than the contract held, and the last withdrawals would
/// fail (or be paid from other parties' funds).
contract FeeOnTransferEscrowTest is Deployment {
    FeeOnTransferToken internal feeToken;
    Settlement internal feeSettlement;
    ProviderRegistry internal feeRegistry;

    function setUp() public override {
        super.setUp();
        feeToken = new FeeOnTransferToken();
        feeSettlement = new Settlement(address(feeToken), GRACE_S, groupX, groupParity);
        feeRegistry = new ProviderRegistry(feeSettlement, MIN_STAKE, UNBONDING_S);
        feeToken.mint(BUYER, 1_000_000e6);
        vm.prank(BUYER);
        feeToken.approve(address(feeSettlement), type(uint256).max);
        vm.prank(BUYER);
        feeToken.approve(address(feeRegistry), type(uint256).max);
    }

    function test_RevertWhen_DepositOfFeeOnTransferTokenDeliversLess() public {
        vm.prank(BUYER);
        vm.expectRevert(abi.encodeWithSelector(AssetTransfers.AssetTransferShortfall.selector, 1_000e6, 990e6));
        feeSettlement.deposit(1_000e6);
        vm.assertEq(feeSettlement.balanceOf(BUYER), 0);
        vm.assertEq(feeToken.balanceOf(address(feeSettlement)), 0);
    }

    function test_RevertWhen_StakeOfFeeOnTransferTokenDeliversLess() public {
        vm.prank(BUYER);
        vm.expectRevert(
            abi.encodeWithSelector(AssetTransfers.AssetTransferShortfall.selector, MIN_STAKE, MIN_STAKE * 99 / 100)
        );
        feeRegistry.stake(MIN_STAKE);
        vm.assertEq(feeToken.balanceOf(address(feeRegistry)), 0);
    }

    /// The credited balance always equals what the contract received.
    function testFuzz_DepositCreditsWhatArrived(uint256 amount) public {
        amount = bound(amount, 1, 1_000_000e6);
        uint256 before = token.balanceOf(address(settlement));
        depositAs(BUYER, amount);
        vm.assertEq(settlement.balanceOf(BUYER), token.balanceOf(address(settlement)) - before);
    }
}

/// @notice Calls back into the escrow from its receive hook: once per payout, the same call again.
contract Reenterer {
    Settlement internal immutable target;
    bytes internal again;
    bool public reentered;
    bool public reentrySucceeded;

    constructor(Settlement target_) {
        target = target_;
    }

    function depositAndOpen(uint256 amount, uint128 escrow) external {
        target.deposit{value: amount}(amount);
        target.openJob(escrow, uint64(block.timestamp + 100), bytes32(0));
    }

    function claimTwice(uint256 cumulative, bytes32[] calldata proof) external {
        again = abi.encodeCall(Escrow.claim, (cumulative, proof));
        target.claim(cumulative, proof);
        delete again;
    }

    function withdrawTwice(uint256 amount) external {
        again = abi.encodeCall(Escrow.withdraw, (amount));
        target.withdraw(amount);
        delete again;
    }

    receive() external payable {
        if (again.length == 0) return;
        bytes memory call = again;
        delete again;
        reentered = true;
        (bool ok,) = address(target).call(call);
        if (ok) reentrySucceeded = true;
    }
}
