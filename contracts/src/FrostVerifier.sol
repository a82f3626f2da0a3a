// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @title FrostVerifier
/// @notice Verifies a FROST(secp256k1, SHA-256) Schnorr signature exactly as RFC 9591 defines it,
/// which is what the Zcash Foundation's `frost-secp256k1` crate produces.
/// @dev RFC 9591 §6.5 (FROST(secp256k1, SHA-256)):
///   challenge c = H2(enc(R) || enc(PK) || msg), where H2 is hash_to_field with
///   expand_message_xmd(SHA-256) (RFC 9380 §5.3.1), DST = "FROST-secp256k1-SHA256-v1chal",
///   48 output bytes reduced modulo the group order n; enc() is the 33-byte SEC1 compressed point.
///   The signature is valid iff z·G == R + c·PK.
/// The scalar multiplications are done by the ecrecover precompile (the "ecrecover trick"):
/// ecrecover(e, v, r, s) returns address(r⁻¹·(s·P − e·G)) where P is the point with x = r and the
/// y parity in v. With P = PK, r = PK.x, s = −c·r and e = −z·r it returns address(z·G − c·PK),
/// which must equal address(R) = keccak256(R.x || R.y)[12:]. Equality of 160-bit addresses stands
/// in for point equality (finding a collision costs ~2^80 work, the usual bound for this trick).
/// Requirements on the key (checked where a key is installed): 0 < PK.x < n, PK on the curve.
library FrostVerifier {
    /// @dev secp256k1 group order.
    uint256 internal constant N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;
    /// @dev secp256k1 field prime.
    uint256 internal constant P = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEFFFFFC2F;

    /// @notice A FROST signature with its commitment R given as affine coordinates (x, y): the
    /// contract needs y to derive R's address; the wire form (33-byte R) only carries y's parity.
    struct Signature {
        uint256 rX;
        uint256 rY;
        uint256 z;
    }

    /// @notice The RFC 9591 challenge c = H2(enc(R) || enc(PK) || message) for a 32-byte message.
    function challenge(uint256 pkX, uint8 pkParity, uint256 rX, uint256 rY, bytes32 message)
        internal
        view
        returns (uint256 c)
    {
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            // msg' = Z_pad(64 zero bytes) || msg || I2OSP(48, 2) || I2OSP(0, 1) || DST'
            mstore(ptr, 0)
            mstore(add(ptr, 32), 0)
            mstore8(add(ptr, 64), or(2, and(rY, 1)))
            mstore(add(ptr, 65), rX)
            mstore8(add(ptr, 97), or(2, and(pkParity, 1)))
            mstore(add(ptr, 98), pkX)
            mstore(add(ptr, 130), message)
            // 0x0030 || 0x00 || "FROST-secp256k1-SHA256-v1chal" || 0x1d (DST length 29)
            mstore(add(ptr, 162), 0x00300046524f53542d736563703235366b312d5348413235362d76316368616c)
            mstore8(add(ptr, 194), 0x1d)
            let ok := staticcall(gas(), 0x02, ptr, 195, 0x00, 32)
            let b0 := mload(0x00)
            // b1 = H(b0 || 0x01 || DST')
            mstore(ptr, b0)
            mstore(add(ptr, 32), 0x0146524f53542d736563703235366b312d5348413235362d76316368616c1d00)
            ok := and(ok, staticcall(gas(), 0x02, ptr, 63, 0x00, 32))
            let b1 := mload(0x00)
            // b2 = H(strxor(b0, b1) || 0x02 || DST')
            mstore(ptr, xor(b0, b1))
            mstore(add(ptr, 32), 0x0246524f53542d736563703235366b312d5348413235362d76316368616c1d00)
            ok := and(ok, staticcall(gas(), 0x02, ptr, 63, 0x00, 32))
            let b2 := mload(0x00)
            if iszero(ok) { revert(0, 0) }
            // OS2IP(b1 || b2[0..16]) mod n
            c := addmod(mulmod(b1, 0x100000000000000000000000000000000, N), shr(128, b2), N)
        }
    }

    /// @notice True iff `sig` is a valid RFC 9591 FROST(secp256k1, SHA-256) signature of the
    /// 32-byte `message` under the group key (pkX, pkParity).
    /// @dev One assembly block (this runs once per batch, and every gas unit here is paid by the
    /// batch): range and curve checks, challenge, then the ecrecover check. Scratch memory above the free
    /// memory pointer is used and not reserved.
    function verify(uint256 pkX, uint8 pkParity, bytes32 message, Signature calldata sig)
        internal
        view
        returns (bool valid)
    {
        assembly ("memory-safe") {
            let rX := calldataload(sig)
            let rY := calldataload(add(sig, 0x20))
            let z := calldataload(add(sig, 0x40))
            // z must be a canonical scalar and R a point of the curve: field elements with
            // rY² = rX³ + 7 (mod p), as RFC 9591 §4 requires of a decoded element. Without the
            // curve equation rY would be free (the challenge reads only its parity), and the
            // address comparison below a ~2^80 birthday search that needs no key.
            let onCurve := eq(mulmod(rY, rY, P), addmod(mulmod(mulmod(rX, rX, P), rX, P), 7, P))
            if and(and(lt(z, N), onCurve), and(lt(rX, P), lt(rY, P))) {
                let ptr := mload(0x40)
                // challenge: see `challenge` for the layout of msg'.
                mstore(ptr, 0)
                mstore(add(ptr, 32), 0)
                mstore8(add(ptr, 64), or(2, and(rY, 1)))
                mstore(add(ptr, 65), rX)
                mstore8(add(ptr, 97), or(2, and(pkParity, 1)))
                mstore(add(ptr, 98), pkX)
                mstore(add(ptr, 130), message)
                mstore(add(ptr, 162), 0x00300046524f53542d736563703235366b312d5348413235362d76316368616c)
                mstore8(add(ptr, 194), 0x1d)
                let ok := staticcall(gas(), 0x02, ptr, 195, 0x00, 32)
                let b0 := mload(0x00)
                mstore(ptr, b0)
                mstore(add(ptr, 32), 0x0146524f53542d736563703235366b312d5348413235362d76316368616c1d00)
                ok := and(ok, staticcall(gas(), 0x02, ptr, 63, 0x00, 32))
                let b1 := mload(0x00)
                mstore(ptr, xor(b0, b1))
                mstore(add(ptr, 32), 0x0246524f53542d736563703235366b312d5348413235362d76316368616c1d00)
                ok := and(ok, staticcall(gas(), 0x02, ptr, 63, 0x00, 32))
                let c := addmod(mulmod(b1, 0x100000000000000000000000000000000, N), shr(128, mload(0x00)), N)
                // ecrecover(e = −z·r, v, r = PK.x, s = −c·r) = address(z·G − c·PK)
                mstore(ptr, mulmod(sub(N, z), pkX, N))
                mstore(add(ptr, 32), add(27, and(pkParity, 1)))
                mstore(add(ptr, 64), pkX)
                mstore(add(ptr, 96), mulmod(sub(N, c), pkX, N))
                mstore(0x00, 0)
                ok := and(ok, staticcall(gas(), 0x01, ptr, 128, 0x00, 32))
                let recovered := mload(0x00)
                mstore(ptr, rX)
                mstore(add(ptr, 32), rY)
                let expected := and(keccak256(ptr, 64), 0xffffffffffffffffffffffffffffffffffffffff)
                valid := and(ok, and(iszero(iszero(recovered)), eq(recovered, expected)))
            }
        }
    }

    /// @notice True iff (x, y) is an affine secp256k1 point: x, y < p and y² = x³ + 7 (mod p).
    /// (The identity has no affine form, so it is never "on the curve" here.)
    function isOnCurve(uint256 x, uint256 y) internal pure returns (bool) {
        return x < P && y < P && mulmod(y, y, P) == addmod(mulmod(mulmod(x, x, P), x, P), 7, P);
    }

    /// @notice True iff x is the x-coordinate of a secp256k1 point usable as a group key here:
    /// 0 < x < n (the ecrecover trick needs r < n) and x³ + 7 is a square mod p.
    function isValidKeyX(uint256 x) internal view returns (bool) {
        if (x == 0 || x >= N) return false;
        uint256 rhs = addmod(mulmod(mulmod(x, x, P), x, P), 7, P);
        // y = rhs^((p+1)/4) via the modexp precompile (p ≡ 3 mod 4); valid iff y² == rhs.
        uint256 y;
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            mstore(ptr, 32)
            mstore(add(ptr, 32), 32)
            mstore(add(ptr, 64), 32)
            mstore(add(ptr, 96), rhs)
            mstore(add(ptr, 128), 0x3fffffffffffffffffffffffffffffffffffffffffffffffffffffffbfffff0c)
            mstore(add(ptr, 160), 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEFFFFFC2F)
            if iszero(staticcall(gas(), 0x05, ptr, 192, ptr, 32)) { revert(0, 0) }
            y := mload(ptr)
        }
        return mulmod(y, y, P) == rhs;
    }
}
