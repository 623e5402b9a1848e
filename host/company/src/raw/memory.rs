//! `[memory]`: what a company's seats remember with.
//!
//! `embedding` names the model recall compares meanings with, as a chain
//! entry names a model: `"PROVIDER/MODEL"` for a keyless one (the scripted
//! provider's `"scripted/bag-of-words"`), or a table `{ provider, model,
//! credentials, options }` like any executor entry. `"none"`, or no key at
//! all, is a decision, not a gap: recall is then by recency.

use serde::Deserialize;

use crate::ModelRef;
use crate::raw::{Errors, RawModel};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    embedding: Option<RawEmbedding>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawEmbedding {
    Named(String),
    Entry(RawModel),
}

/// The embedding model the company names; `None` for `"none"` or absent.
pub fn validate(raw: RawMemory, errors: &mut Errors) -> Option<ModelRef> {
    const PATH: &str = "memory.embedding";
    match raw.embedding? {
        RawEmbedding::Named(s) if s == "none" => None,
        RawEmbedding::Named(s) => {
            let Some((provider, model)) = s.split_once('/') else {
                errors.add(
                    PATH,
                    format!(
                        "expected \"PROVIDER/MODEL\" (e.g. \"scripted/bag-of-words\"), a table {{ provider, model, credentials }}, or \"none\"; found {s:?}"
                    ),
                );
                return None;
            };
            Some(
                RawModel {
                    provider: provider.to_owned(),
                    model: model.to_owned(),
                    credentials: None,
                    options: Default::default(),
                }
                .validate(PATH, errors),
            )
        }
        RawEmbedding::Entry(entry) => Some(entry.validate(PATH, errors)),
    }
}

#[cfg(test)]
mod tests {
    use crate::Company;

    fn doc(memory: &str) -> String {
        format!(
            "[org]\nname = \"Acme\"\n[roles.r]\nsystem_prompt = \"x\"\nexecutor = [{{ provider = \"p\", model = \"m\" }}]\nreviewer = {{ provider = \"p\", model = \"m\" }}\n[seats]\nada = {{ role = \"r\" }}\n{memory}"
        )
    }

    #[test]
    fn none_or_absent_is_no_embedding_model() {
        for memory in ["", "[memory]\n", "[memory]\nembedding = \"none\"\n"] {
            let c = Company::parse(&doc(memory)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.embedding, None, "{memory:?}");
        }
    }

    #[test]
    fn a_provider_slash_model_or_a_chain_entry_names_the_model() {
        let c = Company::parse(&doc("[memory]\nembedding = \"scripted/bag-of-words\"\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        let e = c.embedding.expect("named");
        assert_eq!(
            (e.provider.as_str(), e.model.as_str()),
            ("scripted", "bag-of-words")
        );
        assert!(e.credentials.is_empty());

        let c = Company::parse(&doc(
            "[memory]\nembedding = { provider = \"openai\", model = \"text-embedding-3-small\", credentials = \"${OPENAI_API_KEY}\" }\n",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let e = c.embedding.expect("named");
        assert_eq!(e.model, "text-embedding-3-small");
        assert_eq!(e.credentials[0].name_str(), "OPENAI_API_KEY");
    }

    #[test]
    fn a_bad_embedding_is_refused_at_its_path() {
        for (memory, says) in [
            ("[memory]\nembedding = \"bag-of-words\"\n", "PROVIDER/MODEL"),
            ("[memory]\nembedding = \"sc ripted/x\"\n", "is not a name"),
            (
                "[memory]\nembedding = { provider = \"openai\", model = \"m\", credentials = \"sk-live\" }\n",
                "",
            ),
        ] {
            let err = Company::parse(&doc(memory)).expect_err(memory);
            assert!(
                err.errors[0].path.starts_with("memory.embedding")
                    && err.to_string().contains(says),
                "{memory:?}: {err}"
            );
        }
    }
}
