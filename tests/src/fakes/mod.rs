//! Contract fakes of remote sandbox services that cannot run here.

pub mod modal;
