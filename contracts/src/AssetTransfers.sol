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

    /// @notice Takes `amount` from msg.sender into this contract.
    function pullIn(address asset, uint256 amount) internal {
        if (asset == address(0)) {
            if (msg.value != amount) revert AssetWrongMsgValue(amount, msg.value);
        } else {
            if (msg.value != 0) revert AssetWrongMsgValue(0, msg.value);
            IERC20(asset).safeTransferFrom(msg.sender, address(this), amount);
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
