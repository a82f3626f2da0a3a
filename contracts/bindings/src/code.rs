//! The runtime code each contract must have on chain, from the committed artifacts: what
//! `cx chain deploy` compares a deployment with before it writes the deployments entry.
//!
//! Solc leaves the words of `immutable` variables zero in the runtime code and fills them at
//! construction; the artifacts list their byte ranges (`deployedBytecode.immutableRanges`, from
//! solc's `immutableReferences`), so a comparison skips exactly those and nothing else. What the
//! immutables hold is then read through the contracts' own getters by the deployer.

use serde::Deserialize;

/// A deployable contract whose code can be checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    /// `Settlement`.
    Settlement,
    /// `ProviderRegistry`.
    ProviderRegistry,
    /// `TestStablecoin`.
    TestStablecoin,
}

#[derive(Deserialize)]
struct Artifact {
    #[serde(rename = "deployedBytecode")]
    deployed: Deployed,
}

#[derive(Deserialize)]
struct Deployed {
    object: String,
    #[serde(rename = "immutableRanges")]
    immutable_ranges: Vec<(usize, usize)>,
}

impl Contract {
    /// Its name in the artifacts.
    pub fn name(self) -> &'static str {
        match self {
            Self::Settlement => "Settlement",
            Self::ProviderRegistry => "ProviderRegistry",
            Self::TestStablecoin => "TestStablecoin",
        }
    }

    fn artifact(self) -> Deployed {
        let text = match self {
            Self::Settlement => include_str!("../../artifacts/Settlement.json"),
            Self::ProviderRegistry => include_str!("../../artifacts/ProviderRegistry.json"),
            Self::TestStablecoin => include_str!("../../artifacts/TestStablecoin.json"),
        };
        serde_json::from_str::<Artifact>(text)
            .expect("the committed artifacts parse (export-artifacts.cjs writes them)")
            .deployed
    }

    /// Compares `on_chain` (what `eth_getCode` returned) with the artifact's runtime code,
    /// skipping the immutables' ranges; `Err` says where they first differ.
    pub fn check_code(self, on_chain: &[u8]) -> Result<(), String> {
        let artifact = self.artifact();
        let expected =
            alloy::hex::decode(&artifact.object).expect("the committed artifacts hold hex");
        if on_chain.is_empty() {
            return Err("no code at the address".into());
        }
        if on_chain.len() != expected.len() {
            return Err(format!(
                "{} bytes of code, {} expected",
                on_chain.len(),
                expected.len()
            ));
        }
        let mut skip = artifact.immutable_ranges.iter().peekable();
        let mut i = 0;
        while i < expected.len() {
            if let Some(&&(start, len)) = skip.peek()
                && start == i
            {
                i += len;
                skip.next();
                continue;
            }
            if on_chain[i] != expected[i] {
                return Err(format!("code differs at byte {i}"));
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_artifacts_own_code_passes_and_a_changed_byte_does_not() {
        for contract in [
            Contract::Settlement,
            Contract::ProviderRegistry,
            Contract::TestStablecoin,
        ] {
            let artifact = contract.artifact();
            let mut code = alloy::hex::decode(&artifact.object).unwrap();
            assert_eq!(contract.check_code(&code), Ok(()));
            // An immutable's word may hold anything.
            if let Some(&(start, len)) = artifact.immutable_ranges.first() {
                code[start..start + len].fill(0xab);
                assert_eq!(contract.check_code(&code), Ok(()), "{}", contract.name());
            }
            let last = code.len() - 1;
            code[last] ^= 1;
            assert!(contract.check_code(&code).is_err());
            assert!(contract.check_code(&code[..last]).is_err());
            assert!(contract.check_code(&[]).is_err());
        }
    }
}
