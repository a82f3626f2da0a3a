// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title IEscrow
/// @notice Errors and events of the escrow half of settlement: free deposits, per-job escrows with
/// a deadline, and withdrawals of cumulative credits by Merkle proof.
interface IEscrow {
    /// @notice An amount of zero was given where a positive amount is required.
    error ZeroAmount();
    /// @notice The free balance of `party` is smaller than `requested`.
    error InsufficientBalance(address party, uint256 available, uint256 requested);
    /// @notice A job's deadline must lie in the future when the escrow is opened.
    error DeadlineInPast(uint64 deadline, uint256 nowTimestamp);
    /// @notice No escrow was ever opened with this id.
    error UnknownJob(uint64 jobId);
    /// @notice Only the buyer who opened the escrow may reclaim it.
    error NotBuyer(uint64 jobId, address caller);
    /// @notice The escrow can be reclaimed only after its deadline plus the grace period.
    error ReclaimTooEarly(uint64 jobId, uint256 reclaimableAt);
    /// @notice The escrow was already settled by a batch or reclaimed by its buyer.
    error EscrowNotOpen(uint64 jobId);
    /// @notice The Merkle proof does not prove (party, cumulativeAmount) under the balances root.
    error InvalidProof();
    /// @notice The proven cumulative amount has already been withdrawn in full.
    error NothingToClaim(uint256 cumulativeAmount, uint256 alreadyClaimed);
    /// @notice Paying this claim would exceed the funds settled by batches (a safety cap that
    /// keeps claims from ever reaching open escrows or free deposits).
    error ClaimExceedsSettledFunds(uint256 requested, uint256 available);
    /// @notice A settled range is empty or reversed (start must be < end).
    error InvalidRange(uint64 start, uint64 end);

    /// @notice `party` added `amount` to its free balance.
    event Deposited(address indexed party, uint256 amount);
    /// @notice `party` took `amount` out of its free balance.
    event Withdrawn(address indexed party, uint256 amount);
    /// @notice The buyer locked `amount` for job `jobId` until `deadline` (unix seconds); `ref`
    /// is the exchange's order id.
    event JobOpened(uint64 indexed jobId, address indexed buyer, uint128 amount, uint64 deadline, bytes32 indexed ref);
    /// @notice The buyer took back the unsettled escrow of `jobId` after its deadline.
    event JobReclaimed(uint64 indexed jobId, address indexed buyer, uint128 amount);
    /// @notice `party` withdrew `amount`, bringing its withdrawn total to `cumulativeAmount`.
    event Claimed(address indexed party, uint256 amount, uint256 cumulativeAmount);
}

/// @title ISettlement
/// @notice Errors and events of batch settlement and group-key management.
interface ISettlement is IEscrow {
    /// @notice The batch nonce must be strictly greater than the last accepted one.
    error BatchNonceNotIncreasing(uint64 nonce, uint64 lastNonce);
    /// @notice The FROST signature does not verify under the current group key.
    error InvalidSignature();
    /// @notice The group key's x-coordinate is not a usable secp256k1 point (0 < x < n, on curve).
    error InvalidGroupKey(uint256 x);

    /// @notice Batch `nonce` was accepted: receipts root, new cumulative balances root and the
    /// total escrow it settled. (Which escrows: the batch's ranges, in the transaction's calldata
    /// and in the exchange's books; kept out of the log because every byte here is paid per batch.)
    event BatchSettled(uint64 indexed nonce, bytes32 receiptsRoot, bytes32 balancesRoot, uint256 settledAmount);
    /// @notice The group key changed to (x, parity) at `epoch`.
    event GroupKeyRotated(uint32 indexed epoch, uint256 x, uint8 parity);
}
