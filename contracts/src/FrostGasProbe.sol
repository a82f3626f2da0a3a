// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {FrostVerifier} from "./FrostVerifier.sol";

/// @title FrostGasProbe
/// @notice Measures the gas of one FROST verification inside a real transaction (used by
/// `cx-signer bench gas` for `frost_verify_gas`): the key is passed in calldata, so no storage
/// read is counted, only the challenge hashing and the ecrecover check.
contract FrostGasProbe {
    /// @notice The result of one measured verification.
    event Measured(bool valid, uint256 gasUsed);

    /// @notice Verifies and logs (valid, gas used by the verification alone).
    function measure(uint256 pkX, uint8 pkParity, bytes32 message, FrostVerifier.Signature calldata signature)
        external
        returns (bool valid, uint256 gasUsed)
    {
        uint256 before = gasleft();
        valid = FrostVerifier.verify(pkX, pkParity, message, signature);
        gasUsed = before - gasleft();
        emit Measured(valid, gasUsed);
    }
}
