// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {ISettlement} from "./interfaces/IEscrow.sol";
import {AssetTransfers} from "./AssetTransfers.sol";

/// @title Escrow
/// @notice Holds the payment asset of one deployment (native ETH or one ERC-20):
/// - free deposits (`deposit`, `withdraw`);
/// - per-job escrows opened by a buyer from its free balance with an amount and a deadline; the
///   buyer alone reclaims an escrow no batch settled, once `deadline + gracePeriod_s` has passed;
/// - withdrawals of cumulative credits: each batch posts the Merkle root of every party's
///   cumulative credited amount; a party withdraws the difference to what it already withdrew
///   with one proof of its latest leaf, so one claim covers every past batch.
/// @dev Why the layout looks the way it does (settlement cost per job must shrink with batch size):
/// - open escrows are bits in `openBits`, set when opened and cleared when settled or reclaimed.
///   Clearing a whole word of bits is one SSTORE for up to 256 jobs and earns a refund; a job
///   whose bit is clear can neither be settled again nor reclaimed.
/// - every job stores `openedBefore`, the running total of escrow opened before it, so the escrow
///   of a contiguous id range [a, b) is `openedBefore[b-1] + amount[b-1] - openedBefore[a]`: two
///   storage reads per range however many jobs it holds. That total feeds `totalSettled`, and
///   claims can never exceed it, so a wrong balances root can never reach open escrows or free
///   deposits.
/// This contract is abstract: `Settlement` adds the threshold-signature gate that calls
/// `_settleRanges` (one contract, so a batch pays no cross-contract call).
abstract contract Escrow is ISettlement {
    /// @notice One per-job escrow. Two storage slots: (buyer, deadline) and (amount, openedBefore).
    struct Job {
        address buyer;
        uint64 deadline;
        uint128 amount;
        uint128 openedBefore;
    }

    /// @notice State written by every batch, packed into one slot so a batch pays one SSTORE.
    struct BatchState {
        uint64 nonce;
        uint32 keyEpoch;
        uint8 keyParity;
        /// Always true: keeps the slot non-zero from deployment on, so no batch ever pays for
        /// creating it (20,000 gas once, at deployment, instead of on the first batch).
        bool live;
        uint128 totalSettled;
    }

    /// @notice The balances root before any batch: a constant no leaf hashes to, so nothing can
    /// be claimed, and non-zero so the first batch pays a storage update, not a creation.
    bytes32 public constant NO_BALANCES_ROOT = keccak256("compute-exchange/settlement/no-balances");

    /// @notice The payment asset: address(0) for native ETH, else an ERC-20.
    address public immutable asset;
    /// @notice Seconds after a job's deadline during which only a batch may close its escrow.
    uint64 public immutable gracePeriod_s;

    /// @notice Free (unlocked) deposit of each party.
    mapping(address party => uint256) public balanceOf;
    /// @notice What each party has withdrawn by proof so far (cumulative).
    mapping(address party => uint256) public claimed;
    /// @notice Per-job escrows by id (ids are assigned in order from 0).
    mapping(uint64 jobId => Job) internal _jobs;
    /// @notice Bit (id % 256) of word (id / 256) is set while escrow `id` is open.
    mapping(uint256 word => uint256) public openBits;

    /// @notice Next job id to assign.
    uint64 public nextJobId;
    /// @notice Escrow opened so far, all jobs together (the running total behind openedBefore).
    uint128 public totalOpened;
    /// @notice Merkle root of (party, cumulative credited amount) leaves of the latest batch.
    bytes32 public balancesRoot;
    /// @notice Sum of every party's `claimed`.
    uint256 public totalClaimed;
    /// @notice Batch nonce, group-key epoch and parity, and escrow settled by batches so far.
    BatchState public batchState;

    constructor(address asset_, uint64 gracePeriod_s_) {
        asset = asset_;
        gracePeriod_s = gracePeriod_s_;
        balancesRoot = NO_BALANCES_ROOT;
        batchState.live = true;
    }

    /// @notice Adds `amount` of the asset to the caller's free balance (send it as msg.value for
    /// native ETH; approve this contract first for an ERC-20).
    function deposit(uint256 amount) external payable {
        if (amount == 0) revert ZeroAmount();
        balanceOf[msg.sender] += amount;
        emit Deposited(msg.sender, amount);
        // Effects before the transfer (checks-effects-interactions); a failed pull reverts both.
        AssetTransfers.pullIn(asset, amount);
    }

    /// @notice Pays `amount` of the caller's free balance back to the caller.
    function withdraw(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 available = balanceOf[msg.sender];
        if (available < amount) revert InsufficientBalance(msg.sender, available, amount);
        balanceOf[msg.sender] = available - amount;
        emit Withdrawn(msg.sender, amount);
        AssetTransfers.pushOut(asset, msg.sender, amount);
    }

    /// @notice Locks `amount` of the caller's free balance for one job until `deadline` (unix
    /// seconds) and returns the job's escrow id. `ref` (the exchange's order id) is only logged.
    function openJob(uint128 amount, uint64 deadline, bytes32 ref) external returns (uint64 jobId) {
        if (amount == 0) revert ZeroAmount();
        if (deadline <= block.timestamp) revert DeadlineInPast(deadline, block.timestamp);
        uint256 available = balanceOf[msg.sender];
        if (available < amount) revert InsufficientBalance(msg.sender, available, amount);
        balanceOf[msg.sender] = available - amount;
        jobId = nextJobId;
        uint128 before = totalOpened;
        _jobs[jobId] = Job({buyer: msg.sender, deadline: deadline, amount: amount, openedBefore: before});
        nextJobId = jobId + 1;
        totalOpened = before + amount;
        openBits[jobId >> 8] |= uint256(1) << (jobId & 0xff);
        emit JobOpened(jobId, msg.sender, amount, deadline, ref);
    }

    /// @notice Returns an escrow that no batch settled to its buyer's free balance. Only the
    /// buyer, only after `deadline + gracePeriod_s`; no signature and no operator involved.
    function reclaim(uint64 jobId) external {
        Job storage job = _jobs[jobId];
        address buyer = job.buyer;
        if (buyer == address(0)) revert UnknownJob(jobId);
        if (buyer != msg.sender) revert NotBuyer(jobId, msg.sender);
        uint256 reclaimableAt = uint256(job.deadline) + gracePeriod_s;
        if (block.timestamp <= reclaimableAt) revert ReclaimTooEarly(jobId, reclaimableAt);
        uint256 word = openBits[jobId >> 8];
        uint256 bit = uint256(1) << (jobId & 0xff);
        if (word & bit == 0) revert EscrowNotOpen(jobId);
        openBits[jobId >> 8] = word & ~bit;
        uint128 amount = job.amount;
        balanceOf[buyer] += amount;
        emit JobReclaimed(jobId, buyer, amount);
    }

    /// @notice Withdraws what the caller is owed: `cumulativeAmount` is its leaf in the latest
    /// balances root (everything ever credited to it), `proof` the sibling hashes; it receives
    /// `cumulativeAmount - claimed[caller]`.
    function claim(uint256 cumulativeAmount, bytes32[] calldata proof) external {
        bytes32 leaf = balanceLeaf(msg.sender, cumulativeAmount);
        if (!MerkleProof.verifyCalldata(proof, balancesRoot, leaf)) revert InvalidProof();
        uint256 already = claimed[msg.sender];
        if (cumulativeAmount <= already) revert NothingToClaim(cumulativeAmount, already);
        uint256 amount = cumulativeAmount - already;
        uint256 newTotalClaimed = totalClaimed + amount;
        uint256 settled = batchState.totalSettled;
        if (newTotalClaimed > settled) revert ClaimExceedsSettledFunds(amount, settled - totalClaimed);
        claimed[msg.sender] = cumulativeAmount;
        totalClaimed = newTotalClaimed;
        emit Claimed(msg.sender, amount, cumulativeAmount);
        AssetTransfers.pushOut(asset, msg.sender, amount);
    }

    /// @notice The leaf of the cumulative-balances tree: keccak256(keccak256(abi.encode(party,
    /// cumulativeAmount))), hashed twice so no inner node can pass for a leaf (OpenZeppelin's
    /// standard-tree convention). Inner nodes hash the sorted pair (commutative).
    function balanceLeaf(address party, uint256 cumulativeAmount) public pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(party, cumulativeAmount))));
    }

    /// @notice The escrow of `jobId` (zero buyer if never opened).
    function jobs(uint64 jobId) external view returns (Job memory) {
        return _jobs[jobId];
    }

    /// @notice True while escrow `jobId` is neither settled nor reclaimed.
    function isOpen(uint64 jobId) public view returns (bool) {
        return openBits[jobId >> 8] & (uint256(1) << (jobId & 0xff)) != 0;
    }

    /// @notice Closes every escrow in `ranges` as settled and returns their total amount and count.
    /// Each range packs `start << 64 | end` (job ids, end exclusive). Reverts with
    /// `EscrowNotOpen(id)` if any of them is already settled, reclaimed or was never opened.
    function _settleRanges(uint256[] calldata ranges) internal returns (uint256 settledAmount, uint256 jobCount) {
        // Assembly for the hot path (a batch pays it once per range): mapping slots are computed
        // as Solidity does (keccak256(key . slot)); Job slot 1 holds amount (low 128 bits) and
        // openedBefore (high 128 bits).
        uint256 bitsSlot;
        uint256 jobsSlot;
        assembly ("memory-safe") {
            bitsSlot := openBits.slot
            jobsSlot := _jobs.slot
        }
        for (uint256 i = 0; i < ranges.length; ++i) {
            uint256 packed = ranges[i];
            uint256 start = uint64(packed >> 64);
            uint256 end = uint64(packed);
            if (start >= end) revert InvalidRange(uint64(start), uint64(end));
            bool closed;
            uint256 failWord;
            uint256 failBits;
            uint256 failMask;
            uint256 amount;
            assembly ("memory-safe") {
                let w := shr(8, start)
                let lastWord := shr(8, sub(end, 1))
                let lo := and(start, 0xff)
                for {} 1 {} {
                    let hi := 256
                    if eq(w, lastWord) { hi := add(and(sub(end, 1), 0xff), 1) }
                    // bits lo..hi-1 (width 1..256)
                    let mask := shl(lo, shr(sub(256, sub(hi, lo)), not(0)))
                    mstore(0x00, w)
                    mstore(0x20, bitsSlot)
                    let slot := keccak256(0x00, 0x40)
                    let bits := sload(slot)
                    if iszero(eq(and(bits, mask), mask)) {
                        closed := 1
                        failWord := w
                        failBits := bits
                        failMask := mask
                        break
                    }
                    sstore(slot, and(bits, not(mask)))
                    if eq(w, lastWord) { break }
                    w := add(w, 1)
                    lo := 0
                }
                if iszero(closed) {
                    mstore(0x00, sub(end, 1))
                    mstore(0x20, jobsSlot)
                    let lastJob := sload(add(keccak256(0x00, 0x40), 1))
                    mstore(0x00, start)
                    let firstJob := sload(add(keccak256(0x00, 0x40), 1))
                    amount := sub(add(shr(128, lastJob), and(lastJob, 0xffffffffffffffffffffffffffffffff)), shr(128, firstJob))
                }
            }
            if (closed) revert EscrowNotOpen(_firstClosed(failBits, failMask, failWord));
            unchecked {
                settledAmount += amount;
                jobCount += end - start;
            }
        }
    }

    function _firstClosed(uint256 bits, uint256 mask, uint256 word) private pure returns (uint64) {
        uint256 missing = mask & ~bits;
        uint256 index = 0;
        while (missing & 1 == 0) {
            missing >>= 1;
            ++index;
        }
        return uint64((word << 8) + index);
    }
}
