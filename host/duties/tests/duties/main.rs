//! The duties against the in-memory coordination twin (two coordination
//! handles on one twin are two nodes of one fleet) and a real nats-server
//! for the stream a fire is published to: the scheduler fires each due
//! instant once across contenders and a lapsed holder fires nothing; one
//! holder per duty, handed over on release; a maintenance tick trims what
//! is past its retention and nothing else.

mod fixture;
mod maintenance;
mod scheduler;
mod tenure;
