//! Test data: a component built against `crewlet:plugin@1.0.0`, a major
//! version the host does not know.

wit_bindgen::generate!({ world: "webhook", path: "wit" });

struct Plugin;

impl exports::crewlet::plugin::inbound::Guest for Plugin {
    fn verify(body: Vec<u8>) -> bool {
        !body.is_empty()
    }
}

export!(Plugin);
