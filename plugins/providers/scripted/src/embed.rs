//! The scripted provider's embedder: a hashed bag of words. Not a model.
//!
//! Rules, and why:
//! - Its one model is `bag-of-words`; any other name is refused as
//!   `unsupported`, so a company cannot believe it runs a real embedding
//!   model through this plugin.
//! - A text is split into words (runs of letters and digits), lower-cased;
//!   each word adds ±1 to one of `dimensions` slots (default 256), both
//!   chosen by the word's FNV-1a hash; the vector is then L2-normalised.
//!   So texts sharing words are near (cosine well above zero), texts
//!   sharing none are far (near zero), and the same text is always the same
//!   vector: a test or a demo can say exactly what recall will find.
//! - A text with no word is the zero vector (nothing to be near to).
//! - Tokens are a quarter of the characters (at least 1 per text), as the
//!   provider's completions count them.

use crewlet_plugin_sdk::provider::{EmbedError, EmbedRequest, Embedded};
use serde_json::Value;

/// The one model this embedder answers for.
pub const MODEL: &str = "bag-of-words";
/// The dimension when the entry's options name none.
pub const DEFAULT_DIMENSIONS: usize = 256;
/// The largest `dimensions` an entry may ask for.
pub const MAX_DIMENSIONS: usize = 4096;

pub fn embed(req: &EmbedRequest) -> Result<Embedded, EmbedError> {
    if req.model != MODEL {
        return Err(EmbedError::Unsupported(format!(
            "the scripted provider is not a real model: its one embedder is `{MODEL}`, not {:?}",
            req.model
        )));
    }
    let dimensions = dimensions(&req.options_json)?;
    let vectors = req.inputs.iter().map(|t| vector(t, dimensions)).collect();
    let tokens: usize = req
        .inputs
        .iter()
        .map(|t| (t.chars().count() / 4).max(1))
        .sum();
    Ok(Embedded {
        vectors,
        input_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
        request_id: Some(format!("scripted-embed-{}", req.inputs.len())),
    })
}

/// `options.dimensions`, or the default; anything else is `unsupported`
/// naming the bound (a typo in the company must read as a message).
fn dimensions(options_json: &str) -> Result<usize, EmbedError> {
    let options: Value = serde_json::from_str(options_json).unwrap_or(Value::Null);
    match options.get("dimensions") {
        None => Ok(DEFAULT_DIMENSIONS),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (1..=MAX_DIMENSIONS).contains(n))
            .ok_or_else(|| {
                EmbedError::Unsupported(format!(
                    "scripted provider: `options.dimensions` must be a whole number from 1 to {MAX_DIMENSIONS}, found {v}"
                ))
            }),
    }
}

/// The hashed, normalised bag of `text`'s lower-cased words.
pub fn vector(text: &str, dimensions: usize) -> Vec<f32> {
    let mut v = vec![0f32; dimensions];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let h = fnv1a(word.to_lowercase().as_bytes());
        let slot = (h % dimensions as u64) as usize;
        v[slot] += if h >> 63 == 0 { 1.0 } else { -1.0 };
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn the_same_text_is_the_same_unit_vector_whatever_its_case() {
        let a = vector("Deploy the billing service", 256);
        assert_eq!(a, vector("deploy THE billing service", 256));
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn shared_words_are_near_and_unrelated_texts_far() {
        let q = vector("the billing service failed to deploy", 256);
        let near = vector("deploy of the billing service", 256);
        let far = vector("lunch menu on friday", 256);
        assert!(cosine(&q, &near) > 0.5, "{}", cosine(&q, &near));
        assert!(cosine(&q, &far).abs() < 0.2, "{}", cosine(&q, &far));
    }

    #[test]
    fn a_text_without_words_is_the_zero_vector() {
        assert!(vector(" -- !", 8).iter().all(|x| *x == 0.0));
    }
}
