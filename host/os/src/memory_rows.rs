//! The rows of a seat's memory that both the turn engine and the node
//! store speak: one definition, so what a turn leaves is what the store
//! keeps, field for field, with nothing copied between them.
//!
//! Why here: the turns must not reach the store and the store must not
//! depend on the turns; this crate is below both.

use serde::{Deserialize, Serialize};

/// A vector and the model it came from (`provider/model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vector {
    pub model: String,
    pub values: Vec<f32>,
}

impl Vector {
    /// Little-endian f32, as the store's `embedding` column holds it.
    pub fn to_blob(&self) -> Vec<u8> {
        self.values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The vector back from [`Vector::to_blob`]'s bytes (a trailing
    /// partial value is dropped).
    pub fn from_blob(model: String, blob: &[u8]) -> Vector {
        Vector {
            model,
            values: blob
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        }
    }
}

/// One thing a seat said in a conversation (its session's lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Said {
    pub turn_id: String,
    pub text: String,
    pub at_ms: i64,
}

/// One ended turn of a seat, as its memory keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    pub seat: String,
    pub turn_id: String,
    pub conversation: Option<String>,
    /// The trigger as the executor read it (bounded).
    pub trigger: String,
    /// Who asked: the delivery's sender ids.
    pub asked_by: Vec<String>,
    /// The tools called, in order.
    pub tools: Vec<String>,
    /// What was posted as the reply (bounded), if anything.
    pub reply: Option<String>,
    /// The outcome label (`delivered`, `no_action`, …).
    pub outcome: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The bounded text recall shows and embeds.
    pub summary: String,
    pub ended_ms: i64,
    pub updated_ms: i64,
    pub vector: Option<Vector>,
    /// The node store's stamp (not carried on the stream; 0 until stored).
    #[serde(skip)]
    pub change_seq: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_survives_its_blob_and_an_episode_its_json_without_the_stamp() {
        let v = Vector {
            model: "local/m".into(),
            values: vec![0.5, -1.25, 3.0],
        };
        assert_eq!(v.to_blob().len(), 12);
        assert_eq!(Vector::from_blob(v.model.clone(), &v.to_blob()), v);
        let e = Episode {
            seat: "ada".into(),
            turn_id: "t1".into(),
            conversation: None,
            trigger: "hi".into(),
            asked_by: vec!["u1".into()],
            tools: vec![],
            reply: Some("hello".into()),
            outcome: "delivered".into(),
            input_tokens: 3,
            output_tokens: 4,
            summary: "said hello".into(),
            ended_ms: 10,
            updated_ms: 10,
            vector: Some(v),
            change_seq: 7,
        };
        let back: Episode = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back.change_seq, 0);
        assert_eq!(
            Episode {
                change_seq: 7,
                ..back
            },
            e
        );
    }
}
