// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @notice The few Forge cheatcodes these tests use (our own interface: the npm `forge-std` is an
/// unofficial old copy, so we do not depend on it). Signatures follow Foundry's `Vm.sol`.
interface Vm {
    struct Wallet {
        address addr;
        uint256 publicKeyX;
        uint256 publicKeyY;
        uint256 privateKey;
    }

    function warp(uint256 newTimestamp) external;
    function cool(address target) external;
    function chainId(uint256 newChainId) external;
    function prank(address msgSender) external;
    function startPrank(address msgSender) external;
    function stopPrank() external;
    function deal(address account, uint256 newBalance) external;
    function mockCall(address callee, bytes calldata data, bytes calldata returnData) external;
    function clearMockedCalls() external;
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 revertData) external;
    function expectRevert() external;
    function expectEmit() external;
    function expectEmit(address emitter) external;
    function assume(bool condition) external pure;
    function label(address account, string calldata newLabel) external;
    function createWallet(uint256 privateKey) external returns (Wallet memory wallet);
    function projectRoot() external view returns (string memory path);
    function readFile(string calldata path) external view returns (string memory data);
    function parseJsonUint(string calldata json, string calldata key) external pure returns (uint256);
    function parseJsonBool(string calldata json, string calldata key) external pure returns (bool);
    function parseJsonBytes32(string calldata json, string calldata key) external pure returns (bytes32);
    function parseJsonString(string calldata json, string calldata key) external pure returns (string memory);
    function parseJsonKeys(string calldata json, string calldata key) external pure returns (string[] memory keys);
    function toString(uint256 value) external pure returns (string memory);
    function assertEq(uint256 left, uint256 right, string calldata err) external pure;
    function assertEq(uint256 left, uint256 right) external pure;
    function assertEq(address left, address right) external pure;
    function assertEq(bytes32 left, bytes32 right) external pure;
    function assertEq(bool left, bool right, string calldata err) external pure;
    function assertEq(bool left, bool right) external pure;
    function assertTrue(bool condition) external pure;
    function assertTrue(bool condition, string calldata err) external pure;
    function assertFalse(bool condition) external pure;
    function assertFalse(bool condition, string calldata err) external pure;
    function assertGe(uint256 left, uint256 right, string calldata err) external pure;
    function assertLe(uint256 left, uint256 right, string calldata err) external pure;
}
