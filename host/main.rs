//! The `crewlet` binary. Everything lives in `crewlet-node`.

fn main() {
    std::process::exit(crewlet_node::main());
}
