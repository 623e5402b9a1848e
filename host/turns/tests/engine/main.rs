//! The turn engine tested at its ports (one test binary).

mod bounds;
mod budgets;
mod delivery;
mod events;
mod follows;
mod harness;
mod ledger;
mod recall;
mod replies;
mod script;
mod surface;
