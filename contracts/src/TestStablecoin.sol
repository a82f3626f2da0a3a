// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title TestStablecoin
/// @notice The devnet's payment asset: a 6-decimal ERC-20 anyone may mint. Never deploy it to a
/// real chain.
contract TestStablecoin is ERC20 {
    constructor() ERC20("Compute Exchange Test USD", "cxUSD") {}

    /// @notice 6 decimals, like the stablecoins it stands in for.
    function decimals() public pure override returns (uint8) {
        return 6;
    }

    /// @notice Mints `amount` to `to` (devnet faucet).
    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}
