// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title IProviderRegistry
/// @notice Errors and events of provider staking, unbonding and slashing.
interface IProviderRegistry {
    /// @notice An amount of zero was given where a positive amount is required.
    error ZeroAmount();
    /// @notice The stake left (or reached) would be positive but below the minimum.
    error BelowMinimumStake(uint256 stake, uint256 minimum);
    /// @notice More was asked to unbond than is staked.
    error InsufficientStake(uint256 staked, uint256 requested);
    /// @notice Nothing is unbonding for this provider.
    error NothingUnbonding();
    /// @notice The unbonding delay has not passed yet.
    error UnbondingNotFinished(uint256 unlockAt);
    /// @notice The slash message's signature does not verify under the committee's group key.
    error InvalidSignature();
    /// @notice This evidence was already used for a slash.
    error EvidenceAlreadyUsed(bytes32 evidenceHash);
    /// @notice The provider has nothing staked or unbonding to slash.
    error NothingToSlash(address provider);
    /// @notice The slash recipient must not be the zero address.
    error ZeroRecipient();
    /// @notice The slash signature's validity ended at `expiresAt` (unix seconds).
    error SlashExpired(uint64 expiresAt);

    /// @notice `provider` added `amount`; its stake is now `totalStake`.
    event Staked(address indexed provider, uint256 amount, uint256 totalStake);
    /// @notice `provider` moved `amount` to unbonding, withdrawable at `unlockAt`.
    event UnbondStarted(address indexed provider, uint256 amount, uint256 unlockAt);
    /// @notice `provider` withdrew `amount` of unbonded stake.
    event StakeWithdrawn(address indexed provider, uint256 amount);
    /// @notice `provider` lost `amount` (paid to `recipient`) for `evidenceHash`.
    event Slashed(address indexed provider, bytes32 indexed evidenceHash, uint256 amount, address recipient);
    /// @notice `provider` published its endpoint and the hash of its ML-DSA public key.
    event MetadataSet(address indexed provider, string endpoint, bytes32 mlDsaKeyHash);
    /// @notice `provider` replaced key `keyHash` at `retiredAt` (unix seconds); it still answers
    /// for what it signed until `retiredAt + unbondingDelay_s`.
    event KeyRetired(address indexed provider, bytes32 indexed keyHash, uint256 retiredAt);
}
