// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// @title AssetTransfers
/// @notice Moves the one payment asset of a deployment: native ETH when `asset == address(0)`,
/// otherwise an ERC-20 through OpenZeppelin's SafeERC20 (tokens that return nothing or false).
library AssetTransfers {
    using SafeERC20 for IERC20;

    /// @notice Raised when msg.value does not fit the asset.
    error AssetWrongMsgValue(uint256 expected, uint256 actual);
    /// @notice Raised when a native transfer is refused.
    error AssetNativeTransferFailed(address to, uint256 amount);

    /// @notice Raised when a token delivers less than the amount transferred (a fee-on-transfer or
    /// rebasing token): crediting `amount` would promise funds the contract does not hold.
    error AssetTransferShortfall(uint256 expected, uint256 received);

    /// @notice Takes exactly `amount` from msg.sender into this contract.
    /// @dev The caller credits `amount` before calling (checks-effects-interactions), so the
    /// token must deliver all of it: the balance delta is checked, and a token that delivers less
    /// is refused rather than credited at face value. (A balance that grows during the transfer
    /// by more than `amount` is refused too: only an exact delta is known to be this deposit.)
    function pullIn(address asset, uint256 amount) internal {
        if (asset == address(0)) {
            if (msg.value != amount) revert AssetWrongMsgValue(amount, msg.value);
        } else {
            if (msg.value != 0) revert AssetWrongMsgValue(0, msg.value);
            uint256 before = IERC20(asset).balanceOf(address(this));
            IERC20(asset).safeTransferFrom(msg.sender, address(this), amount);
            uint256 received = IERC20(asset).balanceOf(address(this)) - before;
            if (received != amount) revert AssetTransferShortfall(amount, received);
        }
    }

    /// @notice Pays `amount` out of this contract to `to`.
    function pushOut(address asset, address to, uint256 amount) internal {
        if (asset == address(0)) {
            (bool ok,) = to.call{value: amount}("");
            if (!ok) revert AssetNativeTransferFailed(to, amount);
        } else {
            IERC20(asset).safeTransfer(to, amount);
        }
    }
}
