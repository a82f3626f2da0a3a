// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";
import {AssetTransfers} from "./AssetTransfers.sol";
import {FrostVerifier} from "./FrostVerifier.sol";
import {Settlement} from "./Settlement.sol";

/// @title ProviderRegistry
/// @notice Provider stake (with a minimum), unbonding with a delay, and slashing that only a
/// threshold signature by the settlement committee can trigger; plus provider metadata (endpoint
/// and the hash of the provider's ML-DSA receipt-signing key).
/// @dev Stake is in the same asset as the deployment's `Settlement`. Unbonding stake stays
/// slashable until withdrawn, so unbonding cannot dodge a slash for earlier misbehaviour; for the
/// same reason a key the provider replaces keeps answering for what it signed
/// (`keyAnswers`) for `unbondingDelay_s` after it was replaced, so changing keys cannot either.
contract ProviderRegistry is IProviderRegistry {
    /// @notice Domain tag of slash messages.
    bytes32 public constant SLASH_TAG = keccak256("compute-exchange/registry/slash/v2");

    /// @notice One provider's record.
    struct Provider {
        uint256 staked;
        uint256 unbonding;
        uint256 unlockAt;
        bytes32 mlDsaKeyHash;
        string endpoint;
    }

    /// @notice Staking asset (address(0) = native ETH).
    address public immutable asset;
    /// @notice Settlement contract whose group key signs slash messages.
    Settlement public immutable settlement;
    /// @notice Smallest positive stake a provider may hold.
    uint256 public immutable minStake;
    /// @notice Seconds between `unbond` and `withdrawUnbonded`.
    uint64 public immutable unbondingDelay_s;

    /// @notice Provider records by address.
    mapping(address provider => Provider) internal _providers;
    /// @notice Evidence hashes already used for a slash.
    mapping(bytes32 evidenceHash => bool) public evidenceUsed;
    /// @notice The key history: when each ML-DSA key hash a provider registered stopped being its
    /// key (unix seconds); `KEY_CURRENT` while it is, 0 for a key it never registered.
    mapping(address provider => mapping(bytes32 keyHash => uint64 retiredAt)) public keyRetiredAt;

    /// @notice `keyRetiredAt` of a provider's current key.
    uint64 public constant KEY_CURRENT = type(uint64).max;

    constructor(Settlement settlement_, uint256 minStake_, uint64 unbondingDelay_s_) {
        settlement = settlement_;
        asset = settlement_.asset();
        minStake = minStake_;
        unbondingDelay_s = unbondingDelay_s_;
    }

    /// @notice The record of `provider`.
    function providers(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    /// @notice Publishes the caller's endpoint and ML-DSA key hash. A replaced key is retired, not
    /// forgotten: it answers for what it signed for `unbondingDelay_s` more (`keyAnswers`).
    function setMetadata(string calldata endpoint, bytes32 mlDsaKeyHash) external {
        Provider storage p = _providers[msg.sender];
        bytes32 previous = p.mlDsaKeyHash;
        if (previous != mlDsaKeyHash) {
            if (previous != bytes32(0)) {
                keyRetiredAt[msg.sender][previous] = uint64(block.timestamp);
                emit KeyRetired(msg.sender, previous, block.timestamp);
            }
            if (mlDsaKeyHash != bytes32(0)) keyRetiredAt[msg.sender][mlDsaKeyHash] = KEY_CURRENT;
        }
        p.endpoint = endpoint;
        p.mlDsaKeyHash = mlDsaKeyHash;
        emit MetadataSet(msg.sender, endpoint, mlDsaKeyHash);
    }

    /// @notice Whether `keyHash` answers for `provider` now: it is the provider's key, or was
    /// until less than `unbondingDelay_s` ago. The committee checks slashing evidence against
    /// this, not against the current key alone: otherwise a provider could sign a wrong result
    /// and change its key before the slash lands. The window is the unbonding delay because it is
    /// how long stake stays slashable after a provider decides to leave: a key change buys no
    /// more time than a withdrawal would.
    function keyAnswers(address provider, bytes32 keyHash) external view returns (bool) {
        uint64 retiredAt = keyRetiredAt[provider][keyHash];
        if (retiredAt == 0) return false;
        return retiredAt == KEY_CURRENT || block.timestamp < uint256(retiredAt) + unbondingDelay_s;
    }

    /// @notice Adds `amount` to the caller's stake; the result must reach `minStake`.
    function stake(uint256 amount) external payable {
        if (amount == 0) revert ZeroAmount();
        Provider storage p = _providers[msg.sender];
        uint256 total = p.staked + amount;
        if (total < minStake) revert BelowMinimumStake(total, minStake);
        p.staked = total;
        emit Staked(msg.sender, amount, total);
        // Effects before the transfer: a token that calls back cannot see a stale stake.
        AssetTransfers.pullIn(asset, amount);
    }

    /// @notice Moves `amount` of stake to unbonding; what stays staked must be zero or at least
    /// `minStake`. Restarts the delay for everything unbonding.
    function unbond(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        Provider storage p = _providers[msg.sender];
        uint256 staked = p.staked;
        if (amount > staked) revert InsufficientStake(staked, amount);
        uint256 left = staked - amount;
        if (left != 0 && left < minStake) revert BelowMinimumStake(left, minStake);
        p.staked = left;
        p.unbonding += amount;
        uint256 unlockAt = block.timestamp + unbondingDelay_s;
        p.unlockAt = unlockAt;
        emit UnbondStarted(msg.sender, amount, unlockAt);
    }

    /// @notice Pays out everything unbonding once the delay has passed.
    function withdrawUnbonded() external {
        Provider storage p = _providers[msg.sender];
        uint256 amount = p.unbonding;
        if (amount == 0) revert NothingUnbonding();
        if (block.timestamp < p.unlockAt) revert UnbondingNotFinished(p.unlockAt);
        p.unbonding = 0;
        emit StakeWithdrawn(msg.sender, amount);
        AssetTransfers.pushOut(asset, msg.sender, amount);
    }

    /// @notice The message a slash signature covers. `expiresAt` (unix seconds) bounds how long
    /// the signature is good for: evidence the committee checked today is not a standing licence
    /// to slash whenever a holder of the signature likes (the stake and the provider may have
    /// moved on, and evidence may turn out to be stale).
    function slashDigest(address provider, uint256 amount, address recipient, bytes32 evidenceHash, uint64 expiresAt)
        public
        view
        returns (bytes32)
    {
        return keccak256(
            abi.encode(SLASH_TAG, block.chainid, address(this), provider, amount, recipient, evidenceHash, expiresAt)
        );
    }

    /// @notice Slashes up to `amount` of `provider`'s stake (staked first, then unbonding) and
    /// pays it to `recipient`; only with the committee's signature over `slashDigest(...)`, once
    /// per evidence hash, until `expiresAt`. Anyone may submit it.
    function slash(
        address provider,
        uint256 amount,
        address recipient,
        bytes32 evidenceHash,
        uint64 expiresAt,
        FrostVerifier.Signature calldata signature
    ) external {
        if (amount == 0) revert ZeroAmount();
        if (recipient == address(0)) revert ZeroRecipient();
        if (block.timestamp > expiresAt) revert SlashExpired(expiresAt);
        if (evidenceUsed[evidenceHash]) revert EvidenceAlreadyUsed(evidenceHash);
        bytes32 digest = slashDigest(provider, amount, recipient, evidenceHash, expiresAt);
        if (!settlement.verifyGroupSignature(digest, signature)) revert InvalidSignature();
        Provider storage p = _providers[provider];
        uint256 staked = p.staked;
        uint256 unbonding = p.unbonding;
        if (staked + unbonding == 0) revert NothingToSlash(provider);
        uint256 fromStake = amount < staked ? amount : staked;
        uint256 rest = amount - fromStake;
        uint256 fromUnbonding = rest < unbonding ? rest : unbonding;
        p.staked = staked - fromStake;
        p.unbonding = unbonding - fromUnbonding;
        evidenceUsed[evidenceHash] = true;
        uint256 taken = fromStake + fromUnbonding;
        emit Slashed(provider, evidenceHash, taken, recipient);
        AssetTransfers.pushOut(asset, recipient, taken);
    }
}
